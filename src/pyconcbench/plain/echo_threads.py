"""Echo server: socketserver's ThreadingTCPServer, one thread per connection."""
import argparse
import socket
import socketserver


class Echo(socketserver.BaseRequestHandler):
    def setup(self):
        if self.request.family != socket.AF_UNIX:
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self):
        try:
            while True:
                data = self.request.recv(65536)
                if not data:
                    break
                self.request.sendall(data)
        except ConnectionError:
            pass


class TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024


class UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 1024


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--unix")
    args = parser.parse_args()
    server = UnixServer(args.unix, Echo) if args.unix else TCPServer((args.host, args.port), Echo)
    address = server.server_address
    print("serving on", address if args.unix else "%s:%d" % address[:2], flush=True)
    server.serve_forever()
