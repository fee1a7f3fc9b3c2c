"""Echo server with one OS thread per connection on blocking sockets (recv, then sendall);
the calling thread accepts, polling the listening socket and stop_fd.

A worker reads nothing while its sendall blocks: at most one read's worth is buffered per
connection.  Threads get a 256 KiB stack (threading.stack_size, restored on return) instead of
the default 8 MiB, so 10k of them reserve 2.5 GiB of address space, not 80 GiB.  To stop,
every live connection is shut down (which wakes a worker blocked in recv or sendall), the
workers are joined for a bounded time, and what is left is closed.

Each worker counts its own bytes and the totals go into ``stats`` when serve() returns: no
counter is shared between threads, so none needs a lock on the hot path.
"""
from __future__ import annotations

import select
import socket
import threading
import time

from pyconcbench.servers import Stats, TRANSIENT_ACCEPT_ERRORS

READ_SIZE = 65536
STACK_SIZE = 256 * 1024
ACCEPT_BATCH = 64  # connections accepted per readiness event
ACCEPT_PAUSE = 0.01  # seconds without accepting after EMFILE, or when no thread can start
JOIN_TIMEOUT = 0.5  # for all workers together, once their connections are shut down



class _Conn:
    __slots__ = ("sock", "thread", "bytes", "error")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.thread = None
        self.bytes = 0  # written by its worker only
        self.error = False


class _Server:
    def __init__(self, sock: socket.socket, stats: Stats) -> None:
        self.sock = sock
        self.stats = stats
        self.is_tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        # A connection is in `live` until its worker has counted it into the totals below;
        # its worker closes it only after leaving `live` (under the lock), so the acceptor
        # never shuts down a socket whose descriptor may already be reused.
        self.lock = threading.Lock()
        self.live: set = set()
        self.done_bytes = 0
        self.done_errors = 0

    def accept(self) -> bool:
        """Accepts up to ACCEPT_BATCH connections, each with its own worker; returns False
        when accepting must pause."""
        for _ in range(ACCEPT_BATCH):
            try:
                client, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if exc.errno in TRANSIENT_ACCEPT_ERRORS:
                    continue
                self.stats.errors += 1  # EMFILE, ENFILE, ENOBUFS, ENOMEM
                return False
            client.setblocking(True)
            if self.is_tcp:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client)
            conn.thread = threading.Thread(target=self.echo, args=(conn,), daemon=True,
                                           name="echo-%d" % client.fileno())
            with self.lock:
                self.live.add(conn)
            try:
                conn.thread.start()
            except RuntimeError:  # can't start new thread
                with self.lock:
                    self.live.discard(conn)
                client.close()
                self.stats.errors += 1
                return False
            self.stats.accepted += 1
        return True

    def echo(self, conn: _Conn) -> None:
        sock = conn.sock
        try:
            while True:
                data = sock.recv(READ_SIZE)
                if not data:
                    break
                conn.bytes += len(data)
                sock.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            pass
        except OSError:
            conn.error = True
        finally:
            with self.lock:
                self.live.discard(conn)
                self.done_bytes += conn.bytes
                self.done_errors += conn.error
            sock.close()

    def close(self) -> None:
        """Wakes every worker by shutting its connection down, joins them (bounded), closes
        the connections of any that did not end, and adds up the counts."""
        with self.lock:
            live = list(self.live)
            for conn in live:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        deadline = time.monotonic() + JOIN_TIMEOUT
        for conn in live:
            conn.thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            for conn in self.live:
                conn.sock.close()
            self.stats.bytes += self.done_bytes + sum(conn.bytes for conn in self.live)
            self.stats.errors += self.done_errors + sum(conn.error for conn in self.live)


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    server = _Server(sock, stats)
    sock.setblocking(False)
    old_stack_size = threading.stack_size(STACK_SIZE)
    poller = select.poll()
    poller.register(stop_fd, select.POLLIN)
    poller.register(sock, select.POLLIN)
    accepting = True
    paused_until = 0.0
    try:
        while True:
            if accepting:
                timeout = None
            else:
                timeout = max(0, int((paused_until - time.monotonic()) * 1000) + 1)
            events = poller.poll(timeout)
            if not accepting and time.monotonic() >= paused_until:
                poller.register(sock, select.POLLIN)
                accepting = True
            for fd, _ in events:
                if fd == stop_fd:
                    return
                if accepting and not server.accept():
                    poller.unregister(sock)
                    accepting = False
                    paused_until = time.monotonic() + ACCEPT_PAUSE
    finally:
        threading.stack_size(old_stack_size)
        server.close()
