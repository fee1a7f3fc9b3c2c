"""Echo server: asyncio streams (start_server), one coroutine per connection."""
import argparse
import asyncio


async def echo(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(args):
    if args.unix:
        server = await asyncio.start_unix_server(echo, args.unix)
    else:
        server = await asyncio.start_server(echo, args.host, args.port)
    address = server.sockets[0].getsockname()
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    asyncio.run(main(parser.parse_args()))
