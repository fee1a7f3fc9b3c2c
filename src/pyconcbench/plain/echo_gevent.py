"""Echo server: gevent's StreamServer, one greenlet per connection."""
import argparse
import socket

from gevent import socket as gsocket
from gevent.server import StreamServer


def echo(conn, address):
    if conn.family != socket.AF_UNIX:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
    except ConnectionError:
        pass
    finally:
        conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    args = parser.parse_args()
    if args.unix:
        listener = gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(args.unix)
        listener.listen(1024)
    else:
        listener = (args.host, args.port)
    server = StreamServer(listener, echo, backlog=None if args.unix else 1024)
    server.start()
    address = server.socket.getsockname()
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    server.serve_forever()
