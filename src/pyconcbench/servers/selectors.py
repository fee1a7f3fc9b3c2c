"""Echo server in one thread on selectors.DefaultSelector (epoll on Linux), non-blocking sockets.

A connection is registered for reading; when a send is partial it is registered for writing
only, and not read again until the rest is flushed: at most one read's worth of data is ever
buffered per connection.
"""
from __future__ import annotations

import selectors  # absolute import: the standard library module, not this one
import socket
import time

from pyconcbench.servers import Stats, TRANSIENT_ACCEPT_ERRORS

READ_SIZE = 65536
ACCEPT_BATCH = 64  # connections accepted per readiness event, so accepting cannot starve echoing
ACCEPT_PAUSE = 0.01



class _Conn:
    __slots__ = ("sock", "pending")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""


_LISTENER = object()
_STOP = object()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    is_tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    conns = set()
    paused_until = None  # accepting paused until then (monotonic s) after EMFILE and the like
    try:
        sel.register(sock, selectors.EVENT_READ, _LISTENER)
        sel.register(stop_fd, selectors.EVENT_READ, _STOP)
        while True:
            timeout = None if paused_until is None else max(0.0, paused_until - time.monotonic())
            events = sel.select(timeout)
            if paused_until is not None and time.monotonic() >= paused_until:
                sel.register(sock, selectors.EVENT_READ, _LISTENER)
                paused_until = None
            for key, _ in events:
                data = key.data
                if data is _STOP:
                    return
                if data is _LISTENER:
                    if not _accept(sock, sel, conns, stats, is_tcp):
                        sel.unregister(sock)
                        paused_until = time.monotonic() + ACCEPT_PAUSE
                elif data.pending:
                    _flush(data, sel, conns, stats)
                else:
                    _echo(data, sel, conns, stats)
    finally:
        for conn in conns:
            conn.sock.close()
        sel.close()


def _accept(sock, sel, conns, stats, is_tcp) -> bool:
    """Accepts up to ACCEPT_BATCH connections; returns False when accepting must pause."""
    for _ in range(ACCEPT_BATCH):
        try:
            client, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            if exc.errno in TRANSIENT_ACCEPT_ERRORS:
                continue
            stats.errors += 1  # EMFILE, ENFILE, ENOBUFS, ENOMEM, or worse
            return False
        client.setblocking(False)
        if is_tcp:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(client)
        conns.add(conn)
        sel.register(client, selectors.EVENT_READ, conn)
        stats.accepted += 1
    return True


def _echo(conn: _Conn, sel, conns, stats: Stats) -> None:
    try:
        data = conn.sock.recv(READ_SIZE)
    except (BlockingIOError, InterruptedError):
        return
    except OSError as exc:
        _close(conn, sel, conns, stats, exc)
        return
    if not data:
        _close(conn, sel, conns, stats, None)
        return
    conn.pending = memoryview(data)
    _flush(conn, sel, conns, stats, reading=True)


def _flush(conn: _Conn, sel, conns, stats: Stats, reading: bool = False) -> None:
    """Sends what is pending; switches the registration between reading and writing."""
    try:
        sent = conn.sock.send(conn.pending)
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError as exc:
        _close(conn, sel, conns, stats, exc)
        return
    stats.bytes += sent
    conn.pending = conn.pending[sent:]
    if conn.pending and reading:
        sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
    elif not conn.pending and not reading:
        sel.modify(conn.sock, selectors.EVENT_READ, conn)


def _close(conn: _Conn, sel, conns, stats: Stats, exc) -> None:
    if exc is not None and not isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        stats.errors += 1
    sel.unregister(conn.sock)
    conns.discard(conn)
    conn.sock.close()
