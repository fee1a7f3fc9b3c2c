"""What every echo server must do: the conformance properties, as plain functions over a
started server.

A server is anything with the interface of ``harness.ServerProcess``: ``address`` ((host,
port) for TCP, a path for UNIX), ``transport`` ('tcp' or 'unix'), ``pid`` (and ``measured_pid``
when another process does the serving), ``check_alive()``, ``rss_kib()`` and ``stop()``.  A
property returns None when it holds and raises ``PropertyFailed`` when it does not, with one line
that says what was expected and what happened ("echo of 65536 B over tcp: got 65535 B back
before EOF"); ``PropertyUnchecked`` when this machine cannot check it (a tool missing, too few
file descriptors), which says nothing about the server.  Every property is bounded in time
(socket timeouts and deadlines) and closes every socket it opens.  ``sigterm`` stops the server:
it runs last.

    for outcome in conformance.run(start, conformance.names()):   # pyconcbench check
        ...

The test suite runs the same functions over every implementation (tests/test_conformance.py,
tests/test_serve.py).
"""
from __future__ import annotations

import errno
import os
import random
import selectors
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from pyconcbench import harness, loadgen

READ_SIZE = 65536
CONNECT_TIMEOUT = 5.0
ECHO_TIMEOUT = 10.0
#: Echo sizes, on one connection: 1 B .. 1 MiB.
ECHO_SIZES = (1, 64, 4 * 1024, 64 * 1024, 100 * 1024, 1024 * 1024)
SECOND_MESSAGE = b"second connection"
#: What ``echo`` sends in all (its usage report counts as many bytes echoed).
ECHO_BYTES = sum(ECHO_SIZES) + len(SECOND_MESSAGE)
ECHO_CONNECTIONS = 2
PARTIAL_SIZE, PARTIAL_WRITE, PARTIAL_READ = 3000, 7, 5
LOAD_MESSAGES, LOAD_WARMUP, LOAD_SIZE = 2000, 100, 1024
CONCURRENT, CONCURRENT_MESSAGES, CONCURRENT_WARMUP, CONCURRENT_STALL = 1000, 10_000, 2000, 20.0
LOAD_DEADLINE = 120.0  # s: each load phase's hard limit (the stall timeout fails a hung server sooner)
VANISH_SIZE = 100_000
IDLE_CONNECTIONS, IDLE_SECONDS = 50, 1.5
#: How much a server may grow while a client sends without reading: what it holds of that
#: client's data must be bounded; garbage-collected runtimes (Node's V8 heap, measured here
#: +46 MiB for 8 MiB sent) need the headroom.
BACKPRESSURE_RSS_BOUND_KIB = 64 * 1024
BACKPRESSURE_LIMIT = 256 << 20  # bytes a server may read from a client that never reads
BACKPRESSURE_TIMEOUT = 30.0
#: SIGTERM to exit: a server still running this long after SIGTERM is killed, and fails.
#: Generous, so a descheduled server cannot fail it; one that waits for its connections to end
#: (they never do) always does.
STOP_TIMEOUT = 15.0
SIGTERM_IDLE = 5
#: Connections ``sigterm`` holds open: idle ones, one held back by backpressure, one active.
SIGTERM_CONNECTIONS = SIGTERM_IDLE + 2


class PropertyFailed(Exception):
    """The server does not have the property; the message is one line: what was expected and
    what happened."""


class PropertyUnchecked(Exception):
    """This machine cannot check the property (a tool missing, too few file descriptors): says
    nothing about the server.  One line."""


# -- a client ----------------------------------------------------------------------------------

def connect(address, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A connected client socket: ``address`` is (host, port) for TCP or a path for UNIX."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def roundtrip(sock: socket.socket, payload: bytes, timeout: float = ECHO_TIMEOUT) -> Tuple[bytes, str]:
    """Sends ``payload`` while reading the answer, until at least len(payload) bytes came back,
    EOF, an error or ``timeout``; returns what came back and why it stopped short ('' when it did
    not: "before EOF", "within 10 s", "before ECONNRESET").  Sending and reading together means a
    server with backpressure cannot deadlock against this client."""
    deadline = time.monotonic() + timeout
    sock.setblocking(False)
    view = memoryview(payload)
    received = bytearray()
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while len(received) < len(payload):
                left = deadline - time.monotonic()
                if left <= 0:
                    return bytes(received), f"within {timeout:g} s"
                for _, mask in sel.select(left):
                    if mask & selectors.EVENT_WRITE and view:
                        try:
                            view = view[sock.send(view[:READ_SIZE]):]
                        except BlockingIOError:
                            pass
                        if not view:
                            sel.modify(sock, selectors.EVENT_READ)
                    if mask & selectors.EVENT_READ:
                        try:
                            chunk = sock.recv(READ_SIZE)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            return bytes(received), "before EOF"
                        received += chunk
    except OSError as exc:
        return bytes(received), f"before {_errno_name(exc)}"
    return bytes(received), ""


def exchange(sock: socket.socket, payload: bytes, timeout: float = ECHO_TIMEOUT) -> bytes:
    """What came back for ``payload`` (``roundtrip`` without the why)."""
    return roundtrip(sock, payload, timeout)[0]


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` pseudo-random bytes (the same for the same seed): a misplaced chunk shows."""
    return random.Random(size * 1_000_003 + seed).randbytes(size)


def difference(sent: bytes, got: bytes, why: str = "") -> Optional[str]:
    """None when ``got`` is ``sent``; else what differs, in a few words."""
    if got == sent:
        return None
    if len(got) < len(sent) and sent.startswith(got):
        return f"got {len(got)} B back {why or 'only'}".rstrip()
    for i, (a, b) in enumerate(zip(sent, got)):
        if a != b:
            return f"byte {i} differs (sent 0x{a:02x}, got 0x{b:02x}; {len(got)} B back)"
    return f"got {len(got)} B back, {len(got) - len(sent)} B more than sent"


def _echoed(sock: socket.socket, data: bytes, what: str, timeout: float = ECHO_TIMEOUT) -> None:
    got, why = roundtrip(sock, data, timeout)
    problem = difference(data, got, why)
    if problem:
        raise PropertyFailed(f"{what}: {problem}")


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__


def one_line(text: str) -> str:
    """A (harness) message as one line: its first line, then its last stderr line if it has any."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0]
    if len(lines) > 1:
        first = first.removesuffix("; stderr:").rstrip(";") + f" (stderr: {lines[-1]})"
    return first


# -- the properties ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Property:
    name: str
    summary: str
    check: Callable[[object], None]
    stops_server: bool = False

    def __call__(self, server) -> None:
        """Runs the check: None when it holds; PropertyFailed (one line) when not: a connection
        refused or reset, a failed load, or a server found dead become that too."""
        try:
            self.check(server)
        except (PropertyFailed, PropertyUnchecked):
            raise
        except harness.ServerError as exc:
            raise PropertyFailed(f"{self.summary} over {server.transport}: {one_line(exc)}") from None
        except (loadgen.FdLimitError, subprocess.SubprocessError) as exc:  # this machine, not the server
            raise PropertyUnchecked(f"{self.summary}: cannot be checked here: {one_line(exc)}") from None
        except loadgen.LoadError as exc:  # its message begins "load KIND:"
            raise PropertyFailed(f"{self.summary} over {server.transport}: {one_line(exc)}") from None
        except OSError as exc:
            raise PropertyFailed(f"{self.summary} over {server.transport}: {type(exc).__name__}: "
                                 f"{one_line(exc)}") from None


PROPERTIES: List[Property] = []


def _property(name: str, summary: str, stops_server: bool = False):
    def register(func: Callable[[object], None]) -> Property:
        prop = Property(name, summary, func, stops_server)
        PROPERTIES.append(prop)
        return prop
    return register


def names() -> List[str]:
    return [p.name for p in PROPERTIES]


def by_name(name: str) -> Property:
    for prop in PROPERTIES:
        if prop.name == name:
            return prop
    raise KeyError(f"unknown property {name!r}; known: {', '.join(names())}")


def _load_spec(server, **kwargs) -> loadgen.LoadSpec:
    if server.transport == "unix":
        return loadgen.LoadSpec(transport="unix", path=server.address, deadline=LOAD_DEADLINE, **kwargs)
    host, port = server.address[:2]
    return loadgen.LoadSpec(host=host, port=port, deadline=LOAD_DEADLINE, **kwargs)


@_property("echo", "echoes of 1 B .. 1 MiB")
def echo(server) -> None:
    """Echoes of 1 B .. 1 MiB (``ECHO_SIZES``) come back byte for byte on one connection; a
    second connection is echoed too."""
    over = server.transport
    with connect(server.address) as sock:
        for size in ECHO_SIZES:
            _echoed(sock, payload(size), f"echo of {size} B over {over}")
    with connect(server.address) as other:
        _echoed(other, SECOND_MESSAGE, f"echo of {len(SECOND_MESSAGE)} B on a second connection over {over}")


@_property("partial_io", "a message dribbled in and read back in small pieces")
def partial_io(server) -> None:
    """A message dribbled in 7-byte pieces, with pauses, comes back whole and in order; so does
    one read back 5 bytes at a time."""
    data = payload(PARTIAL_SIZE, 1)
    over = server.transport
    with connect(server.address) as sock:
        if server.transport == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each piece its own segment
        for i in range(0, len(data), PARTIAL_WRITE):
            sock.sendall(data[i:i + PARTIAL_WRITE])
            if i % 700 == 0:
                time.sleep(0.01)
        got, why = _read(sock, len(data), len(data), ECHO_TIMEOUT)
        problem = difference(data, got, why)
        if problem:
            raise PropertyFailed(f"{PARTIAL_SIZE} B sent in {PARTIAL_WRITE}-byte pieces over {over}: {problem}")
        sock.sendall(data)
        got, why = _read(sock, len(data), PARTIAL_READ, ECHO_TIMEOUT)
        problem = difference(data, got, why)
        if problem:
            raise PropertyFailed(f"{PARTIAL_SIZE} B read back in {PARTIAL_READ}-byte pieces over {over}: {problem}")


def _read(sock: socket.socket, size: int, piece: int, timeout: float) -> Tuple[bytes, str]:
    """Up to ``size`` bytes read ``piece`` bytes at most at a time, within ``timeout`` in all;
    what came, and why it stopped short ('' when it did not)."""
    deadline = time.monotonic() + timeout
    sock.setblocking(True)
    got = bytearray()
    try:
        while len(got) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(got), f"within {timeout:g} s"
            sock.settimeout(left)
            chunk = sock.recv(min(piece, size - len(got)))
            if not chunk:
                return bytes(got), "before EOF"
            got += chunk
    except socket.timeout:
        return bytes(got), f"within {timeout:g} s"
    except OSError as exc:
        return bytes(got), f"before {_errno_name(exc)}"
    return bytes(got), ""


@_property("one_connection_load", f"{LOAD_MESSAGES} round trips of {LOAD_SIZE} B on one connection")
def one_connection_load(server) -> None:
    """One connection, many round trips (the load engine checks every echo)."""
    r = loadgen.run(_load_spec(server, connections=1, messages=LOAD_MESSAGES, warmup_messages=LOAD_WARMUP,
                               size=LOAD_SIZE))
    errors = {k: v for k, v in r.errors.items() if v}
    if r.completed != LOAD_MESSAGES or errors:
        raise PropertyFailed(f"{LOAD_MESSAGES} round trips of {LOAD_SIZE} B on one connection over "
                             f"{server.transport}: {r.completed} completed, errors {errors or 'none'}")


@_property("concurrent_connections", f"{CONCURRENT} concurrent connections")
def concurrent_connections(server) -> None:
    """1,000 connections at once: the load engine's round trips all complete (the engine gives
    every connection its share, so a connection left waiting stalls the load) without a
    connection error."""
    try:
        loadgen.ensure_fd_limit(CONCURRENT)
    except loadgen.FdLimitError as exc:
        raise PropertyUnchecked(f"{CONCURRENT} concurrent connections: {exc}") from None
    r = loadgen.run(_load_spec(server, connections=CONCURRENT, messages=CONCURRENT_MESSAGES,
                               warmup_messages=CONCURRENT_WARMUP, stall_timeout=CONCURRENT_STALL))
    errors = {k: v for k, v in r.errors.items() if v}
    if r.completed != CONCURRENT_MESSAGES or errors or r.fairness.max <= 0:
        raise PropertyFailed(f"{CONCURRENT_MESSAGES} round trips over {CONCURRENT} concurrent connections over "
                             f"{server.transport}: {r.completed} completed, errors {errors or 'none'}")


@_property("client_vanishes", "clients vanishing mid-message")
def client_vanishes(server) -> None:
    """Clients that vanish halfway through a message (FIN, and RST) hurt nobody else: another
    connection is still echoed, a new one is served, the server still runs."""
    over = server.transport
    data = payload(VANISH_SIZE, 2)
    with connect(server.address) as keeper:
        _echoed(keeper, b"before", f"echo before clients vanish over {over}")
        for linger in (False, True):
            rude = connect(server.address)
            try:
                if linger:
                    rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                rude.sendall(data[:VANISH_SIZE // 2])
            finally:
                rude.close()
        time.sleep(0.2)
        _echoed(keeper, data, f"echo of {VANISH_SIZE} B on another connection after two clients vanished "
                              f"mid-message (FIN, RST) over {over}")
    with connect(server.address) as fresh:
        _echoed(fresh, b"after", f"echo on a new connection after two clients vanished mid-message over {over}")
    try:
        server.check_alive()
    except harness.ServerError as exc:
        raise PropertyFailed(f"the server after two clients vanished mid-message over {over}: "
                             f"{one_line(exc)}") from None


@_property("idle_connections", f"{IDLE_CONNECTIONS} connections idle for {IDLE_SECONDS:g} s")
def idle_connections(server) -> None:
    """Connections left idle stay open and are echoed afterwards."""
    over = server.transport
    conns: List[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            conns.append(connect(server.address))
        time.sleep(IDLE_SECONDS)
        for i, sock in enumerate(conns):
            _echoed(sock, b"idle %d" % i, f"echo on connection {i} of {IDLE_CONNECTIONS} after {IDLE_SECONDS:g} s "
                                         f"idle over {over}")
    finally:
        for sock in conns:
            sock.close()


# -- backpressure, proven from the kernel's side -----------------------------------------------
#
# A client that stops reading and finds its sends blocked cannot tell a server that stopped
# reading on purpose (backpressure) from one that was merely descheduled for a moment.  The
# kernel can: the server-side socket of that connection holds unread bytes, and every thread of
# the server is asleep (not runnable), twice in a row and with the same unread count.  A
# descheduled server is runnable; a server that keeps reading drains its receive queue.

def server_side_recv_q(client: socket.socket) -> Optional[int]:
    """Unread bytes in the receive queue of the server's end of ``client``'s connection (``ss``),
    None when that socket is not listed."""
    if client.family == socket.AF_UNIX:
        args, peer = ["ss", "-Hxn"], str(os.fstat(client.fileno()).st_ino)
    else:
        host, port = client.getsockname()[:2]
        args, peer = ["ss", "-Htn"], (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    out = subprocess.run(args, capture_output=True, text=True, timeout=10, check=True).stdout
    for line in out.splitlines():
        tokens = line.split()
        if tokens and tokens[-1] == peer and "ESTAB" in tokens:
            return int(tokens[tokens.index("ESTAB") + 1])
    return None


def thread_states(pid: int) -> List[str]:
    """The scheduler state letter of each thread of ``pid`` (R runnable, S/D asleep, ...)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass  # the thread exited
    return states


def send_until_backpressure(sock: socket.socket, pid: int, chunk_size: int = 65536,
                            limit: int = 64 << 20, timeout: float = BACKPRESSURE_TIMEOUT) -> bytes:
    """Sends distinct random chunks on ``sock``, reading nothing, until the server (process
    ``pid``) is proven to hold back (unread bytes in its end of the connection while all its
    threads sleep, the same on two looks; while it is not, sending goes on); returns every byte
    sent.  PropertyFailed when it reads ``limit`` bytes without holding back (unbounded
    buffering) or after ``timeout`` seconds."""
    sock.setblocking(False)
    sent = bytearray()
    chunk = os.urandom(chunk_size)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline and len(sent) < limit:
        try:
            n = sock.send(chunk)
        except BlockingIOError:
            queued = server_side_recv_q(sock)
            asleep = all(state in "SDI" for state in thread_states(pid))
            if queued and asleep and queued == last:
                sock.setblocking(True)
                return bytes(sent)
            last = queued if queued and asleep else None
            time.sleep(0.1)
            continue
        sent += chunk[:n]
        chunk = chunk[n:] or os.urandom(chunk_size)
        last = None
    sock.setblocking(True)
    if len(sent) >= limit:
        raise PropertyFailed(f"the server read {len(sent)} B and still reads (unbounded buffering)")
    raise PropertyFailed(f"no backpressure within {timeout:g} s after {len(sent)} B: the server's end holds "
                         f"{server_side_recv_q(sock)} unread bytes, its threads are {''.join(thread_states(pid))}")


@_property("backpressure", "a client that sends and never reads")
def backpressure(server) -> None:
    """A client that sends and does not read: once the kernel buffers are full, the server must
    stop reading (its RSS stays bounded), still serve everybody else, and give that client
    back every byte, in order, once it reads."""
    over = server.transport
    if shutil.which("ss") is None:
        raise PropertyUnchecked("backpressure is proven from the kernel's side with `ss` (iproute2), which is "
                                "not on PATH")
    pid = getattr(server, "measured_pid", server.pid)
    before = server.rss_kib()
    with connect(server.address) as hog:
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        try:
            data = send_until_backpressure(hog, pid, 65536, BACKPRESSURE_LIMIT, BACKPRESSURE_TIMEOUT)
        except PropertyFailed as exc:
            raise PropertyFailed(f"a client that sends and never reads over {over}: {exc}") from None
        sent = len(data)
        grown = server.rss_kib() - before
        if grown >= BACKPRESSURE_RSS_BOUND_KIB:
            raise PropertyFailed(f"a client that sends and never reads over {over}: the server grew by {grown} KiB "
                                 f"(bound {BACKPRESSURE_RSS_BOUND_KIB} KiB) while {sent} B were sent")
        with connect(server.address) as other:
            _echoed(other, b"still serving", f"echo on another connection while one client is held back over {over}")
        got, why = _read(hog, sent, 1 << 20, BACKPRESSURE_TIMEOUT)
        problem = difference(data, got, why)
        if problem:
            raise PropertyFailed(f"the held-back client over {over}, once it reads, should get its {sent} B back: "
                                 f"{problem}")


@_property("sigterm", "a clean stop on SIGTERM with connections open", stops_server=True)
def sigterm(server) -> None:
    """With connections open (idle ones, one held back by backpressure, one active), SIGTERM
    stops the server with exit status 0 within its stop timeout (``STOP_TIMEOUT`` when started
    by ``pyconcbench check``).  Stops the server."""
    over = server.transport
    socks: List[socket.socket] = []
    try:
        for _ in range(SIGTERM_IDLE):
            socks.append(connect(server.address))
        # One client that sends a lot and reads nothing: the server is stuck on backpressure.
        stuck = connect(server.address)
        socks.append(stuck)
        stuck.setblocking(False)
        try:
            for _ in range(1000):
                stuck.send(b"x" * 65536)
        except BlockingIOError:
            pass
        busy = connect(server.address)
        socks.append(busy)
        _echoed(busy, b"ping", f"echo before SIGTERM over {over}")
        try:
            server.stop()
        except harness.ServerError as exc:
            raise PropertyFailed(f"SIGTERM with {SIGTERM_CONNECTIONS} connections open over {over}, expected exit "
                                 f"status 0: {one_line(exc)}") from None
    finally:
        for sock in socks:
            sock.close()


# -- running them ------------------------------------------------------------------------------

HOLDS, FAILED, UNCHECKED = "holds", "failed", "unchecked"


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  #: HOLDS, FAILED or UNCHECKED
    message: str  #: one line ('' when it holds)
    seconds: float


def ordered(selected: Sequence[str]) -> List[Property]:
    """The properties named, in PROPERTIES order with those that stop the server last;
    KeyError (one line) for an unknown name."""
    chosen = {by_name(name).name for name in selected}
    props = [p for p in PROPERTIES if p.name in chosen]
    return [p for p in props if not p.stops_server] + [p for p in props if p.stops_server]


def run(start: Callable[[], object], selected: Sequence[str]) -> Iterator[Outcome]:
    """Checks the properties named against servers from ``start()`` (returns a started server),
    yielding each one's Outcome as it is known.  One server serves them all while they hold; after
    a property fails, or the server is found dead, the next gets a fresh one, so each verdict is
    its own.  What ``start()`` raises (harness.ServerUnavailable, ServerBroken, ServerError)
    propagates.  Every server started is stopped."""
    server = None
    try:
        for prop in ordered(selected):
            if server is None:
                server = start()
            t0 = time.monotonic()
            try:
                prop(server)
                if not prop.stops_server:
                    try:
                        server.check_alive()
                    except harness.ServerError as exc:
                        raise PropertyFailed(f"the server died during the check: {one_line(exc)}") from None
            except PropertyFailed as exc:
                yield Outcome(prop.name, FAILED, str(exc), time.monotonic() - t0)
                _dispose(server)
                server = None
                continue
            except PropertyUnchecked as exc:
                yield Outcome(prop.name, UNCHECKED, str(exc), time.monotonic() - t0)
            else:
                yield Outcome(prop.name, HOLDS, "", time.monotonic() - t0)
            if prop.stops_server:
                server = None
    finally:
        if server is not None:
            _dispose(server)


def _dispose(server) -> None:
    """Stops a server whose verdict is in: how it stops no longer matters."""
    try:
        server.stop()
    except harness.ServerError:
        pass
