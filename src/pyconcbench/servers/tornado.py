"""Echo server on Tornado 6 (on asyncio): a TCPServer whose handle_stream coroutine reads with
IOStream.read_bytes(partial=True) and awaits each write before reading again, so a client that
does not read cannot make the server buffer more than one read's worth."""
from __future__ import annotations

import asyncio
import socket

from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpserver import TCPServer

from pyconcbench.servers import Stats
from pyconcbench.servers.asyncio_protocol import SETTLE_ITERATIONS, wait_readable

READ_SIZE = 65536


class EchoServer(TCPServer):
    """Tracks its streams so close_all() ends every connection, even one stuck writing."""

    def __init__(self, stats: Stats) -> None:
        super().__init__()
        self.stats = stats
        self.streams: set = set()
        self.closing = False

    async def handle_stream(self, stream: IOStream, address) -> None:
        self.stats.accepted += 1
        if self.closing:
            stream.close()
            return
        self.streams.add(stream)
        stream.set_nodelay(True)  # TCP only; Tornado skips it for UNIX sockets
        try:
            while True:
                data = await stream.read_bytes(READ_SIZE, partial=True)
                self.stats.bytes += len(data)
                await stream.write(data)
        except StreamClosedError as exc:
            error = exc.real_error
            if isinstance(error, OSError) and not isinstance(
                error, (ConnectionResetError, BrokenPipeError)
            ):
                self.stats.errors += 1
        finally:
            self.streams.discard(stream)
            stream.close()

    async def close_all(self) -> None:
        self.closing = True
        self.stop()  # stops accepting and closes the listening socket
        for _ in range(SETTLE_ITERATIONS):
            for stream in list(self.streams):
                stream.close()  # fails its pending read or write with StreamClosedError
            await asyncio.sleep(0)  # lets the handlers finish


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    sock.setblocking(False)  # Tornado's accept handler loops until EAGAIN
    server = EchoServer(stats)
    server.add_socket(sock)
    try:
        await wait_readable(stop_fd)
    finally:
        await server.close_all()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    asyncio.run(serve_async(sock, stop_fd, stats))
