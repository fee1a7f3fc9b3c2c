"""Echo server on the loop's low-level socket coroutines: one task per connection doing
``await loop.sock_recv(conn, 65536)`` then ``await loop.sock_sendall(conn, data)``.

The plain idiom, as the asyncio study measured it ("raw sockets"), with no fairness tricks: a
connection whose data is always ready can be served again and again while others wait, so
some connections may starve.  sock_sendall does not return until everything is sent and the
task reads nothing meanwhile: at most one read's worth is buffered per connection.
"""
from __future__ import annotations

import asyncio
import socket

from pyconcbench.servers import Stats, TRANSIENT_ACCEPT_ERRORS
from pyconcbench.servers.asyncio_protocol import CLOSE_TIMEOUT, run, wait_readable

READ_SIZE = 65536
ACCEPT_PAUSE = 0.01  # seconds without accepting after EMFILE and the like



async def echo(conn: socket.socket, stats: Stats) -> None:
    """Echoes one connection until EOF; closes it."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await loop.sock_recv(conn, READ_SIZE)
            if not data:
                break
            stats.bytes += len(data)
            await loop.sock_sendall(conn, data)
    except (ConnectionResetError, BrokenPipeError):
        pass
    except OSError:
        stats.errors += 1
    finally:
        conn.close()


class EchoServer:
    """Accepts on the listening socket and starts one echo task per connection; close() stops
    accepting, cancels every task and closes every connection, even one whose task never ran."""

    def __init__(self, sock: socket.socket, stats: Stats) -> None:
        self.sock = sock
        self.stats = stats
        self.conns: set = set()
        self.tasks: set = set()
        self.acceptor = None

    def start(self) -> None:
        self.sock.setblocking(False)  # the loop's sock_* coroutines require it
        self.acceptor = asyncio.get_running_loop().create_task(self.accept_forever())

    async def accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        is_tcp = self.sock.family in (socket.AF_INET, socket.AF_INET6)
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:
                if exc.errno in TRANSIENT_ACCEPT_ERRORS:
                    continue
                self.stats.errors += 1  # EMFILE, ENFILE, ENOBUFS, ENOMEM
                await asyncio.sleep(ACCEPT_PAUSE)
                continue
            conn.setblocking(False)
            if is_tcp:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats.accepted += 1
            self.conns.add(conn)
            task = loop.create_task(echo(conn, self.stats))
            self.tasks.add(task)
            task.add_done_callback(lambda t, c=conn: (self.tasks.discard(t), self.conns.discard(c)))

    async def close(self) -> None:
        if self.acceptor is not None:
            self.acceptor.cancel()
            await asyncio.gather(self.acceptor, return_exceptions=True)
        # Cancelling a pending sock_recv/sock_sendall unregisters the socket from the loop
        # before the task's finally closes it.
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=CLOSE_TIMEOUT)
        for conn in list(self.conns):
            conn.close()
        self.conns.clear()


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    """Serves on the running loop (any asyncio loop, uvloop included) until stop_fd is readable."""
    server = EchoServer(sock, stats)
    server.start()
    try:
        await wait_readable(stop_fd)
    finally:
        await server.close()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(serve_async(sock, stop_fd, stats))
