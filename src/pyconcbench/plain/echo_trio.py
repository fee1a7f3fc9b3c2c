"""Echo server: trio.serve_tcp / serve_listeners, one task per connection."""
import argparse

import trio


async def echo(stream):
    try:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def main(args):
    if args.unix:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(args.unix)
        sock.listen(1024)
        listeners = [trio.SocketListener(sock)]
    else:
        listeners = await trio.open_tcp_listeners(args.port, host=args.host, backlog=1024)
    address = listeners[0].socket.getsockname()
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    await trio.serve_listeners(echo, listeners)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    trio.run(main, parser.parse_args())
