"""ZeroMQ request/response loops as plain callables: aiozmq against raw pyzmq and zmq.asyncio.

A DEALER client sends requests (an 8-byte id frame and a payload frame) to a ROUTER server
that sends them back; every reply is checked against its request (id and payload, byte for
byte).  The server binds 127.0.0.1 on a port the kernel chooses, or an ``ipc://`` path in a
temporary directory removed afterwards.  Every socket has LINGER 0, every context is
terminated, every wait is bounded: a server that stops answering ends the round with a
one-line ``RoundError`` after ``timeout`` seconds::

    from pyconcbench import zmq as pcbzmq
    r = pcbzmq.run_round("pyzmq_single", requests=1000)
    r.requests_per_s, r.latency_percentiles((50, 99))

For several rounds on the same sockets (what the benchmarks do)::

    with pcbzmq.Session("aiozmq_rpc-uvloop", size=200, inflight=1, cpus=(0, 1)) as s:
        s.warmup(500)
        results = [s.round(5000) for _ in range(5)]

Thread placement (``placement``, with ``cpus`` = (server CPU, client CPU)): ``1cpu``, the
default, puts every thread of the measurement on the client CPU -- the client thread, the
server (the same thread, its own thread, or its process), every libzmq I/O and reaper thread
-- so a request never waits for a wake-up on another CPU (threads hand over on the one CPU
instead), and the figures are the library's, not the VM's (a cross-vCPU wake-up can cost tens
of µs and dominate; aiozmq's own ``benchmarks/simple.py`` is run pinned to one CPU for the
same reason).  ``2cpu`` keeps the client thread on the client CPU
and puts everything else on the server CPU: the cross-CPU cost, as a labelled variant
(``-2cpu`` in the case id).  ``cpus=None``: nothing pinned.  ``Session.threads()`` reads every
thread's CPUs back from /proc (see ``_placement``).

Modes (``MODES``; the ``-uvloop`` ones run the same code on uvloop instead of asyncio's
default loop) are listed with ``python -c "import pyconcbench.zmq as z; print(*z.MODES)"``.
A mode whose dependency is not installed, or is installed but does not import on this Python,
raises ``Unavailable`` with the reason when a session opens (decided before the mode's own
module is imported: the skip reasons); a mode whose own module, code of this project, does not
import raises ``Broken`` with one line naming the error and where: a bug, never a skip.

Requests in flight (``inflight`` = k): ``pyzmq_single`` sends k, serves k, receives k (one
thread cannot do otherwise with blocking calls); ``aiozmq_rpc`` runs k coroutines that each
await one call at a time; every other mode keeps a window of k, sending the next request as
each reply arrives.  k = 1 is the study's loop everywhere.

This package never imports pyzmq or aiozmq at import time: the modes load them on first use.
Inside it ``import zmq`` is absolute and means pyzmq.

Size: the mode catalogue, ``Case``, ``RoundResult``/``summarize`` and ``Session`` (open, place
the threads, warm up, rounds, close) belong together; the workloads themselves are in
``_pyzmq``/``_asyncio``/``_aiozmq*``, the runner in ``zmq.runner``, placement in ``_placement``.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import procs
from ..broken import Broken, describe
from . import _placement
from ._common import FAULT_KINDS, ID, Fault, Ledger, RoundError, Spec, Unavailable
from ._placement import DEFAULT_PLACEMENT, PLACEMENTS

__all__ = [
    "Broken",
    "Case",
    "DEFAULT_PLACEMENT",
    "FAULT_KINDS",
    "Fault",
    "MODES",
    "Mode",
    "PLACEMENTS",
    "RoundError",
    "RoundResult",
    "STUDY",
    "Session",
    "Unavailable",
    "cases",
    "percentiles",
    "run_round",
    "summarize",
    "versions",
]

DEFAULT_SIZE = 200
DEFAULT_TIMEOUT = 10.0
#: A round's hard limit when none is given: this, or ten timeouts if longer.
DEFAULT_DEADLINE = 120.0
MIN_SIZE = ID.size  # aiozmq_rpc carries the request id inside its argument
MAX_SIZE = 1 << 20
#: Requests in flight at most: below pyzmq's default high-water mark (1000 messages).
MAX_INFLIGHT = 500
TRANSPORTS = ("tcp", "ipc")

#: The aiozmq study's figures (requests/s, 200 B, 1 in flight, loopback TCP, asyncio's
#: default loop of 2014; "core aiozmq" ran on aiozmq's own ZmqEventLoop).
STUDY: Dict[str, int] = {
    "aiozmq_rpc": 2469,
    "aiozmq_core": 5064,
    "pyzmq_single": 9895,
    "pyzmq_poller": 12574,
    "pyzmq_thread": 9702,
}

# import name -> (what pip installs, the pyconcbench extra that brings it)
_INSTALL = {
    "zmq": ("pyzmq", "zmq"),
    "aiozmq": ("aiozmq", "zmq"),
    "aiozmq.rpc": ("aiozmq[rpc]", "zmq"),
    "msgpack": ("msgpack", "zmq"),
    "uvloop": ("uvloop", "uvloop"),
}


@dataclass(frozen=True)
class Mode:
    """One way of running the request/response loop.  ``name`` is the baseline key."""

    name: str
    workload: str  # the name without its loop: study figures and tables use it
    loop: Optional[str]  # None (no event loop), "asyncio" (the default loop) or "uvloop"
    module: str  # implementation module in this package
    cls: str
    requires: Tuple[str, ...]  # import names
    description: str
    in_process: bool = True  # server in this process (a thread, the same thread or loop)

    @property
    def study_requests_per_s(self) -> Optional[int]:
        return STUDY.get(self.workload) if self.loop in (None, "asyncio") else None

    def check(self) -> None:
        """Raises Unavailable (with what to install) when a package this mode needs is not
        installed, or is installed but does not import on this Python -- both decided before
        the mode's own module runs -- and Broken (one line) when that module, code of this
        project, does not import: a bug, never a skip."""
        for name in self.requires:
            if not _installed(name):
                pip, extra = _INSTALL.get(name, (name, "all"))
                raise Unavailable("%s needs %s (pip install %s, or 'pyconcbench[%s]'): not installed"
                                  % (self.name, pip, pip, extra))
            try:
                importlib.import_module(name)
            except Exception as exc:  # installed, but this release does not import on this Python
                raise Unavailable("%s: %s does not import on Python %s: %s: %s"
                                  % (self.name, name, _python(), type(exc).__name__, exc)) from None
        try:
            importlib.import_module("." + self.module, __name__)
        except Exception as exc:  # our own code
            raise Broken("%s: its implementation pyconcbench.zmq.%s does not import: %s"
                         % (self.name, self.module, describe(exc))) from None

    def load(self) -> Any:
        self.check()
        return getattr(importlib.import_module("." + self.module, __name__), self.cls)


def _python() -> str:
    return "%d.%d.%d" % sys.version_info[:3]


def _installed(name: str) -> bool:
    """Whether the package of import name ``name`` is installed, found without running any of
    it (its top-level package; a submodule is then checked by importing it)."""
    try:
        return importlib.util.find_spec(name.partition(".")[0]) is not None
    except ValueError:  # imported already, without a spec
        return True


def _modes() -> Dict[str, Mode]:
    zmq_only = ("zmq",)
    aiozmq_core = ("zmq", "aiozmq")
    aiozmq_rpc = ("zmq", "aiozmq", "msgpack", "aiozmq.rpc")
    out = [
        Mode("pyzmq_single", "pyzmq_single", None, "_pyzmq", "Single", zmq_only,
             "raw pyzmq, client and server sockets in one thread, blocking send/recv in turn"),
        Mode("pyzmq_poller", "pyzmq_poller", None, "_pyzmq", "Poller", zmq_only,
             "raw pyzmq in one thread, both sockets driven by one zmq.Poller"),
        Mode("pyzmq_thread", "pyzmq_thread", None, "_pyzmq", "Thread", zmq_only,
             "raw pyzmq, the server in its own thread"),
        Mode("pyzmq_process", "pyzmq_process", None, "_pyzmq", "Process", zmq_only,
             "raw pyzmq, the server in its own process pinned to the other CPU", in_process=False),
    ]
    for loop in ("asyncio", "uvloop"):
        suffix = "" if loop == "asyncio" else "-uvloop"
        extra = ("uvloop",) if loop == "uvloop" else ()
        on = "asyncio's default loop" if loop == "asyncio" else "uvloop"
        out += [
            Mode("zmq_asyncio" + suffix, "zmq_asyncio", loop, "_asyncio", "ZmqAsyncio", zmq_only + extra,
                 "zmq.asyncio sockets, server task and client on %s" % on),
            Mode("aiozmq_core" + suffix, "aiozmq_core", loop, "_aiozmq", "AiozmqCore", aiozmq_core + extra,
                 "aiozmq transports and protocols (create_zmq_connection) on %s" % on),
            Mode("aiozmq_rpc" + suffix, "aiozmq_rpc", loop, "_aiozmq_rpc", "AiozmqRpc", aiozmq_rpc + extra,
                 "aiozmq.rpc server and client, a method returning its argument, on %s" % on),
        ]
    order = ["pyzmq_single", "pyzmq_poller", "pyzmq_thread", "pyzmq_process",
             "zmq_asyncio", "zmq_asyncio-uvloop", "aiozmq_core", "aiozmq_core-uvloop",
             "aiozmq_rpc", "aiozmq_rpc-uvloop"]
    by_name = {m.name: m for m in out}
    return {name: by_name[name] for name in order}


MODES: Dict[str, Mode] = _modes()


def get_mode(mode: Union[str, Mode]) -> Mode:
    if isinstance(mode, Mode):
        return mode
    try:
        return MODES[mode]
    except (KeyError, TypeError):
        raise ValueError("unknown mode %r; known: %s" % (mode, ", ".join(MODES))) from None


# ---- results ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RoundResult:
    """One round: ``requests`` verified request/reply pairs in ``elapsed`` wall seconds, each
    one's latency, and the CPU spent: ``cpu`` by this process (every thread: the client, an
    in-process server, libzmq's I/O threads), ``server_cpu`` by the server process
    (``pyzmq_process`` only, else None), ``other_cpu`` by every other process on the machine
    (clock ticks of /proc/stat: a busy machine shows here; None when unreadable)."""

    requests: int
    elapsed: float
    latencies_ns: Tuple[int, ...]
    cpu: float = 0.0
    server_cpu: Optional[float] = None
    other_cpu: Optional[float] = None

    def __post_init__(self) -> None:
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 1:
            raise ValueError("RoundResult.requests: expected an integer >= 1, got %r" % (self.requests,))
        if not isinstance(self.elapsed, (int, float)) or not self.elapsed > 0 or math.isinf(self.elapsed):
            raise ValueError("RoundResult.elapsed: expected seconds > 0, got %r" % (self.elapsed,))
        if len(self.latencies_ns) != self.requests:
            raise ValueError("RoundResult.latencies_ns: %d values for %d requests"
                             % (len(self.latencies_ns), self.requests))
        for name in ("cpu", "server_cpu", "other_cpu"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError("RoundResult.%s: expected seconds >= 0, got %r" % (name, value))

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed

    def latency_percentiles(self, pcts: Sequence[float] = (50, 99)) -> List[int]:
        """Latency percentiles in ns (log-linear histogram, <= 1 % relative error)."""
        return percentiles(self.latencies_ns, pcts)

    def as_dict(self) -> Dict[str, Any]:
        """The round as plain values (no raw latencies): what extra_info keeps per round."""
        p50, p90, p95, p99 = self.latency_percentiles((50, 90, 95, 99))
        return {
            "requests": self.requests,
            "elapsed": round(self.elapsed, 6),
            "requests_per_s": round(self.requests_per_s, 1),
            "latency_p50_us": _us(p50),
            "latency_p90_us": _us(p90),
            "latency_p95_us": _us(p95),
            "latency_p99_us": _us(p99),
            "cpu_us_per_req": round(self.cpu / self.requests * 1e6, 3),
            "server_cpu_us_per_req": (None if self.server_cpu is None
                                      else round(self.server_cpu / self.requests * 1e6, 3)),
            "other_cpu_share": (None if self.other_cpu is None
                                else round(self.other_cpu / self.elapsed, 3)),
        }


def percentiles(latencies_ns: Sequence[int], pcts: Sequence[float] = (50, 99)) -> List[int]:
    """Percentiles (ns) of latency values, by the engine's log-linear histogram (the same code
    the echo family's percentiles come from)."""
    from pyconcbench import _native

    hist = _native.Histogram()
    hist.record_many(latencies_ns)
    return hist.percentiles(list(pcts))


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


def summarize(results: Sequence[RoundResult]) -> Dict[str, Any]:
    """Rounds -> requests/s (over all of them, and the median round), latency percentiles over
    all their requests, CPU per request, the largest share of a CPU other processes used during
    a round (a busy machine), and each round's own figures under ``rounds``."""
    if not results:
        raise ValueError("summarize: no rounds")
    total = sum(r.requests for r in results)
    elapsed = sum(r.elapsed for r in results)
    merged: List[int] = []
    for r in results:
        merged.extend(r.latencies_ns)
    p50, p90, p95, p99, p999 = percentiles(merged, (50, 90, 95, 99, 99.9))
    server = [r.server_cpu for r in results]
    others = [r.other_cpu / r.elapsed for r in results if r.other_cpu is not None]
    return {
        "requests_per_round": results[0].requests,
        "requests_per_s": round(total / elapsed, 1),
        "requests_per_s_median": round(statistics.median(r.requests_per_s for r in results), 1),
        "latency_p50_us": _us(p50),
        "latency_p90_us": _us(p90),
        "latency_p95_us": _us(p95),
        "latency_p99_us": _us(p99),
        "latency_p99_9_us": _us(p999),
        "latency_max_us": _us(max(merged)),
        "cpu_us_per_req": round(sum(r.cpu for r in results) / total * 1e6, 3),
        "server_cpu_us_per_req": (None if any(s is None for s in server)
                                  else round(sum(server) / total * 1e6, 3)),
        "other_cpu_share_max": (round(max(others), 3) if others else None),
        "rounds": [r.as_dict() for r in results],
    }


def versions() -> Dict[str, str]:
    """Versions of the libraries the numbers depend on (those installed)."""
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover
        return {}
    out: Dict[str, str] = {}
    for dist in ("pyzmq", "aiozmq", "msgpack", "uvloop"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        import zmq

        out["libzmq"] = zmq.zmq_version()
    except Exception:
        pass
    return out


# ---- the benchmark matrix ---------------------------------------------------------------

def _size_label(size: int) -> str:
    for unit, n in (("MiB", 1 << 20), ("KiB", 1024)):
        if size % n == 0:
            return "%d%s" % (size // n, unit)
    return "%dB" % size


@dataclass(frozen=True)
class Case:
    """One benchmark: a mode at a payload size, requests in flight, transport and thread
    placement.  ``id`` (``aiozmq_rpc-uvloop-200B-if1``; ``-ipc`` appended for ipc, then
    ``-2cpu`` for the 2cpu placement) is the baseline key; ``group`` (``zmq-200B-if1``,
    ``zmq-200B-if1-2cpu``) puts the modes doing the same work on the same placement side by
    side."""

    mode: str
    size: int = DEFAULT_SIZE
    inflight: int = 1
    transport: str = "tcp"
    placement: str = DEFAULT_PLACEMENT

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError("placement: %r is not one of %s" % (self.placement, ", ".join(PLACEMENTS)))

    @property
    def scale(self) -> str:
        """The work without the mode: ``200B-if1``, ``200B-if1-ipc``, ``200B-if1-2cpu``."""
        label = "%s-if%d" % (_size_label(self.size), self.inflight)
        if self.transport != "tcp":
            label += "-" + self.transport
        return label if self.placement == DEFAULT_PLACEMENT else label + "-" + self.placement

    @property
    def id(self) -> str:
        return "%s-%s" % (self.mode, self.scale)

    @property
    def group(self) -> str:
        return "zmq-" + self.scale

    @property
    def requests(self) -> int:
        """Requests per round by default: about a second for the slowest mode (aiozmq.rpc),
        and no more than ~128 MiB of payload."""
        return max(200, min(3000, (128 << 20) // self.size))


SIZES = (200, 1024, 64 * 1024)
INFLIGHTS = (1, 10, 100)


def cases(profile: str = "quick") -> Tuple[Case, ...]:
    """The benchmark matrix, on the ``1cpu`` placement unless ``-2cpu`` is said.  ``quick``:
    every mode at 200 B, 1 in flight, TCP (the study), on 1cpu and on 2cpu, plus every mode at
    100 in flight and over ipc, and 64 KiB for the fastest and slowest of each family.
    ``full``: every mode x 200 B, 1 KiB, 64 KiB x 1, 10, 100 in flight x tcp, ipc, and every
    mode at 200 B, 1 in flight on 2cpu over tcp and ipc."""
    if profile == "full":
        out = [Case(m, s, k, t) for t in TRANSPORTS for s in SIZES for k in INFLIGHTS for m in MODES]
        out += [Case(m, transport=t, placement="2cpu") for t in TRANSPORTS for m in MODES]
        return tuple(out)
    if profile != "quick":
        raise ValueError("unknown profile %r (quick, full)" % (profile,))
    out = [Case(m) for m in MODES]
    out += [Case(m, placement="2cpu") for m in MODES]
    out += [Case(m, inflight=100) for m in MODES]
    out += [Case(m, transport="ipc") for m in MODES]
    out += [Case(m, size=64 * 1024) for m in ("pyzmq_single", "zmq_asyncio-uvloop", "aiozmq_rpc")]
    return tuple(out)


# ---- sessions -----------------------------------------------------------------------------

def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError("%s: expected an integer in %d .. %d, got %r" % (name, low, high, value))
    return value


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError("%s: expected seconds > 0, got %r" % (name, value))
    return float(value)


class Session:
    """One mode's sockets (and server thread, process or task), open across rounds.

    ``cpus`` = (server CPU, client CPU) or None (nothing pinned), and ``placement``:

    - ``1cpu`` (default): every thread of the measurement on the client CPU -- this thread
      (the client), the server (this same thread, its own thread, or its process and that
      process's threads) and every libzmq I/O and reaper thread (the client's and the
      server's);
    - ``2cpu``: this thread on the client CPU, every other thread of the measurement on the
      server CPU.

    ``open()`` pins this thread to the CPU the other threads belong on *before* the workload
    starts, so everything the workload and libzmq create inherits it (and the contexts made
    here ask libzmq to pin their I/O threads there too); under 2cpu it then moves this thread
    to the client CPU.  Every thread that appeared in this process during ``open()``, and the
    server process's, are then pinned explicitly, and again after ``warmup()`` (threads a
    library starts lazily, e.g. an executor); ``warmup()`` raises RoundError when a thread of
    the measurement is not where the placement puts it.  ``close()`` restores this thread's
    affinity.  Use a session from the thread that opened it.

    ``timeout``: the longest wait for any reply (or for a request to be queued) before the
    round fails; ``deadline``: the longest a round may take (default max(120 s, 10 x timeout)).
    ``fault`` makes the server misbehave (tests).
    """

    def __init__(self, mode: Union[str, Mode], *, size: int = DEFAULT_SIZE, inflight: int = 1,
                 transport: str = "tcp", timeout: float = DEFAULT_TIMEOUT,
                 deadline: Optional[float] = None, cpus: Optional[Tuple[int, int]] = None,
                 placement: str = DEFAULT_PLACEMENT, fault: Optional[Fault] = None) -> None:
        self.mode = get_mode(mode)
        self.size = _check_int("size", size, MIN_SIZE, MAX_SIZE)
        self.inflight = _check_int("inflight", inflight, 1, MAX_INFLIGHT)
        if transport not in TRANSPORTS:
            raise ValueError("transport: %r is not one of %s" % (transport, ", ".join(TRANSPORTS)))
        self.transport = transport
        self.timeout = _check_seconds("timeout", timeout)
        self.deadline = (max(DEFAULT_DEADLINE, 10 * self.timeout) if deadline is None
                         else _check_seconds("deadline", deadline))
        if cpus is not None:
            allowed = sorted(os.sched_getaffinity(0))
            if (len(cpus) != 2 or cpus[0] == cpus[1]
                    or any(isinstance(c, bool) or not isinstance(c, int) or c not in allowed for c in cpus)):
                raise ValueError("cpus: expected two different CPUs of %s (server, client), got %r"
                                 % (allowed, cpus))
            cpus = (cpus[0], cpus[1])
        self.cpus = cpus
        if placement not in PLACEMENTS:
            raise ValueError("placement: %r is not one of %s" % (placement, ", ".join(PLACEMENTS)))
        self.placement = placement
        if fault is not None and not isinstance(fault, Fault):
            raise ValueError("fault: expected a Fault, got %r" % (fault,))
        self.fault = fault
        self._workload: Any = None
        self._ledger: Optional[Ledger] = None
        self._tmpdir: Optional[str] = None
        self._saved_affinity: Optional[set] = None
        self._failed: Optional[str] = None
        self._client_tid: Optional[int] = None
        self._tids_before: set = set()
        self._threads_seen: Optional[List[Dict[str, Any]]] = None

    def __repr__(self) -> str:
        state = "open" if self._workload is not None else "closed"
        return "<Session %s %s %s>" % (self.mode.name, self.case.scale, state)

    @property
    def case(self) -> Case:
        return Case(self.mode.name, self.size, self.inflight, self.transport, self.placement)

    @property
    def client_cpu(self) -> Optional[int]:
        """The CPU of the calling (client) thread; None when nothing is pinned."""
        return self.cpus[1] if self.cpus else None

    @property
    def others_cpu(self) -> Optional[int]:
        """The CPU of every other thread of the measurement: the client CPU under 1cpu, the
        server CPU under 2cpu; None when nothing is pinned."""
        if self.cpus is None:
            return None
        return self.cpus[1] if self.placement == "1cpu" else self.cpus[0]

    @property
    def pinning(self) -> str:
        """Where the client and server run, in words (saved with the results)."""
        if self.cpus is None:
            return "pinning off"
        client, others = self.client_cpu, self.others_cpu
        zmq_threads = "every libzmq I/O and reaper thread"
        if not self.mode.in_process:
            server = "the server process (all its threads)"
            zmq_threads += " (the client's and the server's)"
        elif self.mode.workload == "pyzmq_thread":
            server = "the server thread"
        else:
            server = None  # the client's own thread or event loop
        if self.placement == "1cpu":
            if server is None:
                return "1cpu: client and server (one thread) and %s on CPU %d" % (zmq_threads, client)
            return "1cpu: client thread, %s and %s on CPU %d" % (server, zmq_threads, client)
        if server is None:
            return ("2cpu: client and server (one thread) on CPU %d; %s on CPU %d"
                    % (client, zmq_threads, others))
        return "2cpu: client thread on CPU %d; %s and %s on CPU %d" % (client, server, zmq_threads, others)

    def describe(self) -> Dict[str, Any]:
        """The session's settings as plain values; ``placement`` is ``1cpu``, ``2cpu`` or
        ``off`` (cpus None), ``threads`` every thread of the measurement as read back after the
        warm-up (None before one)."""
        mode = self.mode
        return {
            "mode": mode.name,
            "workload": mode.workload,
            "loop": mode.loop,
            "size": self.size,
            "inflight": self.inflight,
            "transport": self.transport,
            "timeout": self.timeout,
            "placement": self.placement if self.cpus else "off",
            "pinning": self.pinning,
            "threads": self._threads_seen,
            "study_requests_per_s": mode.study_requests_per_s,
            "versions": versions(),
            "python": _python(),
        }

    # -- life cycle ------------------------------------------------------------------------

    def open(self) -> "Session":
        """Starts the server and connects the client; raises Unavailable when the mode cannot
        run here (a package not installed or not importable on this Python), Broken when its
        own module does not import, RoundError when its setup fails."""
        if self._workload is not None:
            raise RuntimeError("session already open")
        cls = self.mode.load()
        others = self.others_cpu
        self._client_tid = threading.get_native_id()
        self._tids_before = _placement.tids()
        self._threads_seen = None
        if self.transport == "ipc":
            self._tmpdir = procs.make_tmpdir("zmq")  # its maker's pid in the name: a later run sweeps it
        spec = Spec(mode=self.mode.name, workload=self.mode.workload, loop=self.mode.loop,
                    size=self.size, inflight=self.inflight, transport=self.transport,
                    timeout=self.timeout, ipc_dir=self._tmpdir, server_cpu=others,
                    fault=self.fault, io_cpu=others)
        workload = cls(spec)
        try:
            if others is not None:
                self._saved_affinity = os.sched_getaffinity(0)
                # Before start(): every thread libzmq and the workload create (and the server
                # process) inherits this CPU.
                os.sched_setaffinity(0, {others})
            workload.start()
        except BaseException:
            self._restore_affinity()
            self._remove_tmpdir()
            raise
        self._workload = workload
        self._ledger = Ledger(self.mode.name, self.size, self.timeout, self.deadline)
        self._failed = None
        if others is not None:
            try:
                os.sched_setaffinity(0, {self.client_cpu})
                self._place()
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Stops the server, closes every socket, terminates the contexts, removes the ipc
        directory and restores this thread's CPU affinity.  Idempotent."""
        workload, self._workload = self._workload, None
        try:
            if workload is not None:
                workload.stop()
        finally:
            self._restore_affinity()
            self._remove_tmpdir()

    def _restore_affinity(self) -> None:
        if self._saved_affinity is not None:
            os.sched_setaffinity(0, self._saved_affinity)
            self._saved_affinity = None

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "Session":
        if self._workload is None:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    # -- placement -------------------------------------------------------------------------

    def _measurement_tasks(self) -> List[Tuple[str, "_placement.Task"]]:
        """(role, thread) for every thread of the measurement now: ``client`` (the calling
        thread), ``in-process`` (every thread of this process that appeared since open()
        began: libzmq's, a server thread, anything a library started), ``server process``."""
        out: List[Tuple[str, _placement.Task]] = []
        for task in _placement.tasks():
            if task.tid == self._client_tid:
                out.append(("client", task))
            elif task.tid not in self._tids_before:
                out.append(("in-process", task))
        pid = self.server_pid
        if pid:
            out += [("server process", task) for task in _placement.tasks(pid)]
        return out

    def threads(self) -> List[Dict[str, Any]]:
        """Every thread of the measurement now, read back from /proc: role (``client``,
        ``in-process``, ``server process``), pid, tid, name (``ZMQbg/IO/0``, ...), the CPUs it
        may run on, and the CPUs the placement wants (None when nothing is pinned).  Empty
        while the session is closed."""
        if self._workload is None:
            return []
        out = []
        for role, task in self._measurement_tasks():
            want = self._wanted(role)
            out.append({"role": role, "pid": task.pid, "tid": task.tid, "name": task.name,
                        "cpus": sorted(task.cpus), "expected": None if want is None else [want]})
        return out

    def _wanted(self, role: str) -> Optional[int]:
        return self.client_cpu if role == "client" else self.others_cpu

    def misplaced(self) -> List[str]:
        """The threads of the measurement that are not where the placement puts them (empty
        when nothing is pinned)."""
        if self.cpus is None:
            return []
        return ["%s thread %s (tid %d) on CPUs %s, expected %d"
                % (t["role"], t["name"], t["tid"], _placement.format_cpus(t["cpus"]), t["expected"][0])
                for t in self.threads() if t["cpus"] != t["expected"]]

    def _place(self) -> None:
        """Pins every thread of the measurement but this one to ``others_cpu`` (they should be
        there already: this catches threads started lazily after open())."""
        others = self.others_cpu
        if others is None:
            return
        for role, task in self._measurement_tasks():
            if role != "client" and task.cpus != {others}:
                _placement.pin(task.tid, others)

    # -- rounds ----------------------------------------------------------------------------

    @property
    def ipc_dir(self) -> Optional[str]:
        """The temporary directory holding the ipc:// socket while the session is open."""
        return self._tmpdir

    @property
    def server_pid(self) -> Optional[int]:
        return getattr(self._workload, "server_pid", None)

    def round(self, requests: int) -> RoundResult:
        """One timed loop of ``requests`` verified requests; RoundError if it fails (the
        session is then unusable)."""
        _check_int("requests", requests, 1, 1 << 40)
        if self._workload is None or self._ledger is None:
            raise RuntimeError("session not open")
        if self._failed is not None:
            raise RoundError("%s: the session is unusable after an earlier failure: %s"
                             % (self.mode.name, self._failed))
        from pyconcbench import instruments

        workload, ledger = self._workload, self._ledger
        pid = workload.server_pid
        try:
            ledger.begin(requests)
            before = instruments.snapshot(pid)
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            workload.run(requests, ledger)
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            after = instruments.snapshot(pid)
        except RoundError as exc:
            self._failed = str(exc)
            raise
        except BaseException:
            self._failed = "interrupted"
            raise
        server = None
        if pid:
            if before.server_runtime is None or after.server_runtime is None:
                raise RoundError("%s: cannot read the server's CPU time from /proc/%d/task/*/schedstat"
                                 % (self.mode.name, pid))
            server = after.server_runtime - before.server_runtime
        other = after.other_since(before)
        return RoundResult(requests=requests, elapsed=elapsed, latencies_ns=tuple(ledger.latencies),
                           cpu=max(0.0, cpu), server_cpu=None if server is None else max(0.0, server),
                           other_cpu=other)

    def warmup(self, requests: int) -> None:
        """Runs requests that are not measured (connections, caches, the JIT-less interpreter's
        own warm-up), then places any thread started since open() and reads every thread of
        the measurement back (``describe()["threads"]``): RoundError if one is not where the
        placement puts it."""
        self.round(requests)
        self._place()
        self._threads_seen = [{"role": t["role"], "name": t["name"], "cpus": t["cpus"]}
                              for t in self.threads()]
        wrong = self.misplaced()
        if wrong:
            self._failed = "placement %s not held" % self.placement
            raise RoundError("%s: the %s placement does not hold: %s"
                             % (self.mode.name, self.placement, "; ".join(wrong)))


def run_round(mode: Union[str, Mode], requests: int, size: int = DEFAULT_SIZE, inflight: int = 1,
              transport: str = "tcp", timeout: float = DEFAULT_TIMEOUT, **options: Any) -> RoundResult:
    """Opens a session, runs one round of ``requests`` and closes it (``options``: ``cpus``,
    ``placement``, ``deadline``, ``fault``, and ``warmup``, a number of unmeasured requests
    first)."""
    warmup = options.pop("warmup", 0)
    with Session(mode, size=size, inflight=inflight, transport=transport, timeout=timeout, **options) as session:
        if warmup:
            session.warmup(warmup)
        return session.round(requests)
