"""An echo server of your own: pyconcbench run --pcb-impl echo_server.py:serve"""
import asyncio


class Echo(asyncio.Protocol):
    def __init__(self, stats):
        self.stats = stats  # optional counts: accepted, bytes, errors

    def connection_made(self, transport):
        self.transport = transport
        self.stats.accepted += 1

    def data_received(self, data):
        self.stats.bytes += len(data)
        self.transport.write(data)

    def pause_writing(self):  # a client that does not read: stop reading from it
        self.transport.pause_reading()

    def resume_writing(self):
        self.transport.resume_reading()


def serve(sock, stop_fd, stats):
    """Serves the listening socket `sock` until the file descriptor `stop_fd` is readable."""
    async def main():
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        loop.add_reader(stop_fd, lambda: stop.done() or stop.set_result(None))
        server = await loop.create_server(lambda: Echo(stats), sock=sock)
        await stop
        server.close()
    asyncio.run(main())
