"""Echo servers that misbehave on purpose, for testing the load engine's error accounting,
and a small client (``connect``, ``exchange``) that talks to any echo server.

    with BrokenServer("flip", at=200) as server:
        run the load against server.address

Each server runs in a daemon thread of the test process, on non-blocking sockets and a
selector; __exit__ stops it within STOP_TIMEOUT and closes every socket it opened.  Faults
apply to the first accepted connection ("connection 0") unless said otherwise:

    echo          a correct echo server, for comparison
    flip          flips the lowest bit of the byte at stream offset ``at``
    close_mid     once ``at`` bytes are echoed, echoes half of the next chunk and closes (FIN)
    stop_reading  every connection: accepted, then never read nor written
    delay_one     connection 0 is never answered; the others are echoed
    duplicate     every chunk is echoed twice
    reset         echoes ``at`` bytes, then closes with SO_LINGER 0 (RST)
    truncate      every connection: echoes ``at`` bytes, then half-closes (FIN) and discards
                  whatever else it reads
    capped        every connection: at most ``at`` are served at once; the others wait, accepted
                  but unread, until one of those closes (a fixed pool of workers)

``serve_function(kind, at)`` is the same server as a ``serve(sock, stop_fd, stats)`` function,
for ``python -m pyconcbench.serve`` (``deaf=True``: it never looks at ``stop_fd``, so only
SIGKILL ends it).

For "connection refused", ``unused_tcp_address()`` names a port nobody listens on.  The
client, ``connect`` and ``exchange``, is the conformance properties' (``pyconcbench.conformance``).
"""
from __future__ import annotations

import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time

from pyconcbench.conformance import connect, exchange  # noqa: F401 (the tests' client)

KINDS = ("echo", "flip", "close_mid", "stop_reading", "delay_one", "duplicate", "reset", "truncate", "capped")
STOP_TIMEOUT = 1.0
MAX_LIFETIME = 120.0  # a server nobody stops ends itself after this long
READ_SIZE = 65536


class _Conn:
    __slots__ = ("sock", "index", "received", "out", "then", "discard")

    def __init__(self, sock: socket.socket, index: int) -> None:
        self.sock = sock
        self.index = index
        self.received = 0  # bytes read from the client
        self.out = bytearray()  # bytes still to send
        self.then = None  # None, "close", "reset" or "half_close": what to do once `out` is flushed
        self.discard = False  # half-closed: what it reads is dropped


class BrokenServer:
    def __init__(self, kind: str, transport: str = "tcp", *, at: int = 200) -> None:
        if kind not in KINDS:
            raise ValueError("unknown kind %r; known: %s" % (kind, ", ".join(KINDS)))
        if transport not in ("tcp", "unix"):
            raise ValueError("transport must be 'tcp' or 'unix', not %r" % (transport,))
        if at < 0:
            raise ValueError("at must be >= 0, not %r" % (at,))
        self.kind = kind
        self.transport = transport
        self.at = at
        self.accepted = 0
        self.address = None
        self._listener = None
        self._tmpdir = None
        self._stop_r = self._stop_w = None
        self._thread = None
        self._error = None
        self._open = 0  # connections being served ("capped")
        self._parked = []  # connections waiting for a place ("capped")

    def __enter__(self) -> "BrokenServer":
        if self.transport == "unix":
            self._tmpdir = tempfile.mkdtemp(prefix="pcb-broken-")
            self.address = os.path.join(self._tmpdir, "s.sock")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self.address)
        else:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self.address = self._listener.getsockname()
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="BrokenServer-" + self.kind,
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(STOP_TIMEOUT)
        alive = self._thread.is_alive()
        if not alive:
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._listener.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if alive:
            raise RuntimeError("BrokenServer(%r) did not stop within %g s" % (self.kind, STOP_TIMEOUT))
        if self._error is not None:
            raise RuntimeError("BrokenServer(%r) failed" % self.kind) from self._error

    # -- the server thread -----------------------------------------------------------------

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        conns = []
        deadline = time.monotonic() + MAX_LIFETIME
        try:
            sel.register(self._listener, selectors.EVENT_READ, "accept")
            if self._stop_r is not None:
                sel.register(self._stop_r, selectors.EVENT_READ, "stop")
            while time.monotonic() < deadline:
                for key, _ in sel.select(1.0):
                    if key.data == "stop":
                        return
                    if key.data == "accept":
                        self._accept(sel, conns)
                    elif key.data.out:
                        self._flush(sel, key.data)
                    else:
                        self._read(sel, key.data)
        except BaseException as exc:  # reported by __exit__ rather than lost in the thread
            self._error = exc
        finally:
            for conn in conns:
                conn.sock.close()
            sel.close()

    def _accept(self, sel, conns) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        sock.setblocking(False)
        conn = _Conn(sock, self.accepted)
        self.accepted += 1
        conns.append(conn)
        silent = self.kind == "stop_reading" or (self.kind == "delay_one" and conn.index == 0)
        if self.kind == "capped" and self._open >= self.at:
            self._parked.append(conn)
        elif not silent:
            self._open += 1
            sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, sel, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(sel, conn)
            return
        if conn.discard:
            return
        conn.out += self._answer(conn, data)
        conn.received += len(data)
        self._flush(sel, conn)

    def _answer(self, conn: _Conn, data: bytes) -> bytes:
        """What connection ``conn`` sends back for ``data``; may schedule a close or reset."""
        if self.kind == "truncate":
            if conn.received + len(data) >= self.at:
                conn.then = "half_close"
                return data[: max(0, self.at - conn.received)]
            return data
        if conn.index != 0 or self.kind in ("echo", "delay_one", "capped"):
            return data
        if self.kind == "duplicate":
            return data + data
        if self.kind == "flip":
            offset = self.at - conn.received
            if 0 <= offset < len(data):
                flipped = bytearray(data)
                flipped[offset] ^= 0x01
                return bytes(flipped)
            return data
        if self.kind == "close_mid":
            if conn.received >= self.at:
                conn.then = "close"
                return data[: len(data) // 2]
            return data
        if self.kind == "reset":
            if conn.received + len(data) >= self.at:
                conn.then = "reset"
                return data[: max(0, self.at - conn.received)]
            return data
        raise AssertionError(self.kind)

    def _flush(self, sel, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(sel, conn)
            return
        del conn.out[:sent]
        if conn.out:
            # Not read again until flushed: backpressure, so the buffer stays bounded.
            sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        elif conn.then == "close":
            self._close(sel, conn)
        elif conn.then == "reset":
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._close(sel, conn)
        elif conn.then == "half_close":
            conn.then, conn.discard = None, True
            conn.sock.shutdown(socket.SHUT_WR)
            sel.modify(conn.sock, selectors.EVENT_READ, conn)
        else:
            sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _close(self, sel, conn: _Conn) -> None:
        try:
            sel.unregister(conn.sock)
        except KeyError:
            pass
        conn.sock.close()
        if self.kind == "capped":
            self._open -= 1
            if self._parked:  # its place goes to the longest waiting
                waiting = self._parked.pop(0)
                self._open += 1
                sel.register(waiting.sock, selectors.EVENT_READ, waiting)


def serve_function(kind: str, at: int = 200, deaf: bool = False):
    """BrokenServer ``kind`` as a ``serve(sock, stop_fd, stats)`` function (pyconcbench.servers'
    interface): it serves ``sock`` until ``stop_fd`` is readable, or, ``deaf``, until killed."""
    def serve(sock, stop_fd, stats):
        server = BrokenServer(kind, "unix" if sock.family == socket.AF_UNIX else "tcp", at=at)
        sock.setblocking(False)
        server._listener = sock
        server._stop_r = None if deaf else stop_fd
        server._run()
        stats.accepted = server.accepted
        if server._error is not None:
            raise server._error
    return serve


def unused_tcp_address():
    """A loopback (host, port) nothing listens on, for connection-refused tests only: the
    port is free when returned but may be taken by anyone afterwards."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()
