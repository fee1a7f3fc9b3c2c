"""Echo server: asyncio Protocol callbacks on uvloop."""
import argparse
import asyncio

import uvloop


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


async def main(args):
    loop = asyncio.get_running_loop()
    if args.unix:
        server = await loop.create_unix_server(Echo, args.unix)
    else:
        server = await loop.create_server(Echo, args.host, args.port)
    address = server.sockets[0].getsockname()
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    uvloop.run(main(parser.parse_args()))
