"""Echo server: one thread, a selectors.DefaultSelector loop over non-blocking sockets."""
import argparse
import selectors
import socket

sel = selectors.DefaultSelector()


def accept(server):
    conn, _ = server.accept()
    conn.setblocking(False)
    if conn.family != socket.AF_UNIX:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sel.register(conn, selectors.EVENT_READ, [b""])


def close(conn):
    sel.unregister(conn)
    conn.close()


def handle(conn, pending, mask):
    try:
        if mask & selectors.EVENT_READ:
            data = conn.recv(65536)
            if not data:
                close(conn)
                return
            pending[0] = data
        sent = conn.send(pending[0])
        pending[0] = pending[0][sent:]
    except BlockingIOError:
        pass
    except ConnectionError:
        close(conn)
        return
    # Wait for the socket to drain before reading more.
    sel.modify(conn, selectors.EVENT_WRITE if pending[0] else selectors.EVENT_READ, pending)


def main(args):
    if args.unix:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(args.unix)
    else:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((args.host, args.port))
    server.listen(1024)
    server.setblocking(False)
    sel.register(server, selectors.EVENT_READ, None)
    address = server.getsockname()
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    while True:
        for key, mask in sel.select():
            if key.data is None:
                accept(key.fileobj)
            else:
                handle(key.fileobj, key.data, mask)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    main(parser.parse_args())
