"""What every ZeroMQ workload shares: the request ledger that checks each reply against its
request, the round's time bounds, endpoints, server faults for the tests, and the bounded
run of an asyncio round.  Imports neither pyzmq nor aiozmq (the sockets come in as objects).
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: The request id frame: a 64-bit little-endian sequence number, unique within a session.
ID = struct.Struct("<Q")
#: Distinct payloads a session rotates through (so a reply carrying another request's payload
#: is caught even when its id is right).
PAYLOAD_POOL = 16
#: A wrong-id fault adds this to the id, far from any id in flight.
WRONG_ID_OFFSET = 1 << 40
#: How often a blocking wait wakes up to check the server is alive and the round's bounds.
CHECK_INTERVAL = 0.1
#: TCP endpoints: the loopback address the servers bind (port chosen by the kernel).
LOOPBACK = "127.0.0.1"
IPC_NAME = "server.sock"

FAULT_KINDS = ("wrong_id", "wrong_payload", "silent", "exit")


class RoundError(RuntimeError):
    """A round failed: a wrong reply, no reply within the timeout, a dead server.  The message
    is one line, prefixed with the mode."""


class Unavailable(Exception):
    """The mode cannot run here: a dependency is missing or does not import on this Python.
    The message says which and what to install."""


@dataclass(frozen=True)
class Fault:
    """A server that misbehaves after answering ``after`` requests correctly (for tests).

    ``wrong_id``: answers with another id; ``wrong_payload``: with a changed payload;
    ``silent``: receives and never answers; ``exit``: stops serving (the process exits with
    code 3, the thread returns, the asyncio server task ends; silent where the server shares
    the client's thread and loop)."""

    kind: str
    after: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError("Fault.kind: %r is not one of %s" % (self.kind, ", ".join(FAULT_KINDS)))
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ValueError("Fault.after: expected an integer >= 0, got %r" % (self.after,))

    def __str__(self) -> str:
        return "%s@%d" % (self.kind, self.after)

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """'silent@3' -> Fault('silent', 3); 'exit' -> Fault('exit', 0)."""
        kind, _, after = text.partition("@")
        if after and not after.isdigit():
            raise ValueError("%r is not KIND[@AFTER] (e.g. wrong_id@3)" % text)
        return cls(kind, int(after or 0))


class FaultyEcho:
    """The server side of a Fault: what to send back for each request it receives."""

    def __init__(self, fault: Fault) -> None:
        self.kind = fault.kind
        self.left = fault.after

    @property
    def stopped(self) -> bool:
        """True once an ``exit`` fault has fired: the server should stop serving."""
        return self.kind == "exit" and self.left < 0

    def _fire(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return False
        self.left = -1
        return True

    def frames(self, frames: List[bytes]) -> Optional[List[bytes]]:
        """A ROUTER's received frames [routing id, ..., request id, payload] -> the frames to
        send back, or None to send nothing."""
        if not self._fire():
            return frames
        out = list(frames)
        if self.kind == "wrong_id":
            out[-2] = ID.pack((ID.unpack(out[-2])[0] + WRONG_ID_OFFSET) & 0xFFFFFFFFFFFFFFFF)
            return out
        if self.kind == "wrong_payload":
            out[-1] = _flip(out[-1])
            return out
        return None

    def value(self, data: bytes) -> Optional[bytes]:
        """An RPC argument (request id + payload) -> the value to return, or None for none."""
        if not self._fire():
            return data
        if self.kind == "wrong_id":
            seq = (ID.unpack_from(data)[0] + WRONG_ID_OFFSET) & 0xFFFFFFFFFFFFFFFF
            return ID.pack(seq) + data[ID.size:]
        if self.kind == "wrong_payload":
            return data[:ID.size] + _flip(data[ID.size:])
        return None


def _flip(payload: bytes) -> bytes:
    if not payload:
        return b"\x00"
    return bytes([payload[0] ^ 0xFF]) + payload[1:]


@dataclass(frozen=True)
class Spec:
    """What a workload is asked to do; validated by ``pyconcbench.zmq.Session``."""

    mode: str
    workload: str
    loop: Optional[str]
    size: int
    inflight: int
    transport: str
    timeout: float
    ipc_dir: Optional[str] = None
    #: The CPU of the server process (``pyzmq_process``) and its threads; None: not pinned.
    server_cpu: Optional[int] = None
    fault: Optional[Fault] = None
    #: The CPU for libzmq's I/O and reaper threads of the contexts made here (libzmq's
    #: ZMQ_THREAD_AFFINITY_CPU_ADD); None: left to inheritance.
    io_cpu: Optional[int] = None

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    @property
    def check_ms(self) -> int:
        """A blocking wait's slice: short enough to notice a dead server or thread promptly."""
        return max(1, int(min(self.timeout, CHECK_INTERVAL) * 1000))


def new_context(spec: Spec, factory: Any = None) -> Any:
    """A new pyzmq context (``factory``, default ``zmq.Context``) whose I/O and reaper threads
    libzmq pins to ``spec.io_cpu`` when given (ZMQ_THREAD_AFFINITY_CPU_ADD, libzmq >= 4.3;
    set before its first socket starts them).  Without the option the threads still inherit
    the CPU of the thread that creates the first socket, which the session has pinned."""
    import zmq

    ctx = (factory or zmq.Context)()
    option = getattr(zmq, "THREAD_AFFINITY_CPU_ADD", None)
    if spec.io_cpu is not None and option is not None:
        try:
            ctx.set(option, spec.io_cpu)
        except zmq.ZMQError:  # a libzmq built without it: inheritance places the threads
            pass
    return ctx


def bind(sock: Any, spec: Spec) -> str:
    """Binds a server socket on loopback (port chosen by the kernel) or on an ipc:// path in
    the session's temporary directory; returns the endpoint to connect to."""
    if spec.transport == "tcp":
        port = sock.bind_to_random_port("tcp://" + LOOPBACK)
        return "tcp://%s:%d" % (LOOPBACK, port)
    if not spec.ipc_dir:
        raise ValueError("an ipc:// endpoint needs the session's temporary directory")
    endpoint = "ipc://" + os.path.join(spec.ipc_dir, IPC_NAME)
    sock.bind(endpoint)
    return endpoint


class Ledger:
    """The client's record of a session's requests: makes each request (a unique id and a
    payload from a small pool), checks each reply against the request it answers, keeps the
    round's latencies, and knows when the round has waited too long.

    Latency is from just before the request is handed to the socket to just after its reply
    is received and checked."""

    def __init__(self, mode: str, size: int, timeout: float, deadline: float) -> None:
        self.mode = mode
        self.size = size
        self.timeout = timeout
        self.timeout_ns = int(timeout * 1e9)
        self.deadline = deadline
        self.payloads = [os.urandom(size) for _ in range(PAYLOAD_POOL)]
        self.seq = 0
        self.outstanding: Dict[bytes, Tuple[bytes, int]] = {}
        self.latencies: List[int] = []
        self.requests = 0
        self.sent = 0
        self.answered = 0
        self.started_ns = 0
        self.last_progress_ns = 0
        self.deadline_ns = 0

    # -- a round ---------------------------------------------------------------------------

    def begin(self, requests: int) -> None:
        if self.outstanding:
            raise RoundError("%s: %d requests of an earlier round are still unanswered"
                             % (self.mode, len(self.outstanding)))
        self.requests = requests
        self.sent = 0
        self.answered = 0
        self.latencies = []
        now = time.perf_counter_ns()
        self.started_ns = self.last_progress_ns = now
        self.deadline_ns = now + int(self.deadline * 1e9)

    def request(self) -> Tuple[bytes, bytes]:
        """The next request as frames (id, payload), recorded as in flight from now."""
        seq = self.seq
        self.seq = seq + 1
        self.sent += 1
        idb = ID.pack(seq)
        payload = self.payloads[seq % PAYLOAD_POOL]
        self.outstanding[idb] = (payload, time.perf_counter_ns())
        return idb, payload

    def reply(self, frames: Sequence[bytes]) -> None:
        """Checks a reply's frames (id, payload) against the request with that id."""
        now = time.perf_counter_ns()
        if len(frames) != 2:
            raise RoundError("%s: a reply has %d frames, expected 2 (id, payload)" % (self.mode, len(frames)))
        idb, payload = frames
        entry = self.outstanding.pop(idb, None)
        if entry is None:
            raise RoundError("%s: %s" % (self.mode, self._unknown(idb)))
        if payload != entry[0]:
            raise RoundError("%s: the reply to request %d %s"
                             % (self.mode, ID.unpack(idb)[0], _differs(entry[0], payload)))
        self._answered(now, entry[1])

    def request_value(self) -> Tuple[bytes, bytes]:
        """The next request as one RPC argument: id + payload (``size`` bytes in all)."""
        seq = self.seq
        self.seq = seq + 1
        self.sent += 1
        idb = ID.pack(seq)
        data = idb + self.payloads[seq % PAYLOAD_POOL][ID.size:]
        self.outstanding[idb] = (data, time.perf_counter_ns())
        return idb, data

    def reply_value(self, idb: bytes, value: Any) -> None:
        """Checks what an RPC call for request ``idb`` returned: its own argument."""
        now = time.perf_counter_ns()
        entry = self.outstanding.pop(idb)
        if value != entry[0]:
            seq = ID.unpack(idb)[0]
            if not isinstance(value, bytes):
                raise RoundError("%s: the call for request %d returned a %s, not its bytes argument"
                                 % (self.mode, seq, type(value).__name__))
            if len(value) >= ID.size and value[:ID.size] != idb:
                raise RoundError("%s: the call for request %d returned the id %d"
                                 % (self.mode, seq, ID.unpack_from(value)[0]))
            raise RoundError("%s: the call for request %d returned a value that %s"
                             % (self.mode, seq, _differs(entry[0], value)))
        self._answered(now, entry[1])

    def _answered(self, now: int, sent_ns: int) -> None:
        self.latencies.append(now - sent_ns)
        self.answered += 1
        self.last_progress_ns = now
        if now > self.deadline_ns:
            raise RoundError("%s: the round took longer than its deadline of %g s (%d of %d answered)"
                             % (self.mode, self.deadline, self.answered, self.requests))

    # -- bounds ----------------------------------------------------------------------------

    def overdue(self) -> Optional[str]:
        """Why the round should end now (no reply for ``timeout``, or past its deadline), or
        None."""
        now = time.perf_counter_ns()
        if now - self.last_progress_ns > self.timeout_ns:
            return self.stall_message()
        if now > self.deadline_ns:
            return ("%s: the round took longer than its deadline of %g s (%d of %d answered)"
                    % (self.mode, self.deadline, self.answered, self.requests))
        return None

    def check(self, problem: Optional[Callable[[], Optional[str]]] = None) -> None:
        """Raises RoundError when the server has a problem or the round is overdue."""
        text = problem() if problem is not None else None
        if text is not None:
            raise RoundError("%s: %s (%d of %d answered)" % (self.mode, text, self.answered, self.requests))
        text = self.overdue()
        if text is not None:
            raise RoundError(text)

    def stall_message(self) -> str:
        return ("%s: no reply within %g s (%d of %d answered, %d in flight)"
                % (self.mode, self.timeout, self.answered, self.requests, len(self.outstanding)))

    def _unknown(self, idb: bytes) -> str:
        shown = ID.unpack(idb)[0] if len(idb) == ID.size else idb[:16]
        return "a reply carries the id %r, which no request in flight has (%d in flight)" % (
            shown, len(self.outstanding))


def _differs(expected: bytes, got: bytes) -> str:
    if len(got) != len(expected):
        return "has %d bytes, expected %d" % (len(got), len(expected))
    at = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    return "differs from the request's payload at byte %d" % at


def run_bounded(loop: Any, coro: Any, ledger: Ledger,
                problem: Optional[Callable[[], Optional[str]]] = None) -> None:
    """Runs one asyncio round to completion on ``loop``, cancelling it with a RoundError when
    ``problem()`` reports one (a dead server task) or the ledger says it is overdue.  A
    watchdog timer checks every CHECK_INTERVAL; the hot path pays nothing for it."""
    import asyncio

    task = loop.create_task(coro)
    reasons: List[str] = []
    interval = min(CHECK_INTERVAL, ledger.timeout / 10)

    def watch() -> None:
        if task.done():
            return
        text = problem() if problem is not None else None
        if text is not None:
            text = "%s: %s (%d of %d answered)" % (ledger.mode, text, ledger.answered, ledger.requests)
        else:
            text = ledger.overdue()
        if text is not None:
            reasons.append(text)
            task.cancel()
            return
        timer[0] = loop.call_later(interval, watch)

    timer = [loop.call_later(interval, watch)]
    failure: Optional[str] = None
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        if not reasons:
            raise
        failure = reasons[0]
    finally:
        timer[0].cancel()
        if not task.done():  # interrupted (KeyboardInterrupt, pytest-timeout): stop the round
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:
                pass
    if failure is not None:
        raise RoundError(failure)


def new_loop(kind: Optional[str]) -> Any:
    """A fresh event loop of the kind a mode names, not installed as the thread's loop."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    import asyncio

    return asyncio.new_event_loop()


def close_loop(loop: Any) -> None:
    """Cancels what is left on the loop, then closes it."""
    import asyncio

    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
