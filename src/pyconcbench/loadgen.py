"""The Python face of the C load engine.

``LoadSpec`` says what load to put on one echo server; ``run(spec)`` connects, warms up,
measures and returns a ``LoadResult``.  ``LoadSession`` keeps the connections open across
several measured rounds (what the benchmark suite does: connect once, then each
pytest-benchmark round is one phase of a fixed number of verified round trips).

The engine runs in the calling thread with the GIL released; it re-takes the GIL about every
100 ms to run signal handlers, so Ctrl-C and pytest-timeout stop a long run promptly.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _native, loopback, stats

__all__ = [
    "FdLimitError",
    "Fairness",
    "LoadError",
    "LoadResult",
    "LoadSession",
    "LoadSpec",
    "Histogram",
    "merged",
    "ensure_fd_limit",
    "fairness",
    "fd_limit",
    "max_connections",
    "run",
]

#: The engine's limits (native/pcb_load.h), which it checks itself too.
MAX_SIZE = _native.MAX_SIZE
MAX_CONNECTIONS = _native.MAX_CONNECTIONS
MAX_MESSAGES = _native.MAX_MESSAGES
MAX_ERRORS = _native.MAX_ERRORS
#: Paced connects per second, when paced (LoadSpec.connect_rate).
MIN_CONNECT_RATE = _native.MIN_CONNECT_RATE
MAX_CONNECT_RATE = _native.MAX_CONNECT_RATE
#: Message buffers the engine may allocate (connections x size) before refusing.
MAX_PAYLOAD_MEMORY = _native.MAX_PAYLOAD_MEMORY
#: Messages in flight per connection (LoadSpec.pipeline), and over every connection.
MAX_PIPELINE = _native.MAX_PIPELINE
MAX_INFLIGHT = _native.MAX_INFLIGHT
#: An open-loop round's rate, round trips per second over every connection.
MIN_OPEN_RATE = _native.MIN_OPEN_RATE
MAX_OPEN_RATE = _native.MAX_OPEN_RATE
#: How an open loop's intended send times are spread (LoadSession.round's ``arrival``).
ARRIVALS = ("uniform", "poisson")
#: Sockets, pipes and files the process needs besides the load's connections.
FD_MARGIN = 64
#: A load generator busier than this share of one CPU may be what limits the rate.
LOADGEN_BOUND_SHARE = 0.90
#: A connection that completed fewer round trips than this share of the mean is starving
#: (defined in stats, which the report can import without the C extension).
STARVING_SHARE = stats.STARVING_SHARE

#: The engine's latency histogram (native/pcb_hist.c), the one percentile code of the project.
Histogram = _native.Histogram

ERROR_KINDS = ("connect_refused", "connect_other", "reset", "early_eof", "timeout",
               "payload_mismatch", "io")


class LoadError(RuntimeError):
    """A load that could not run to its end: ``kind`` is one of connect, payload_mismatch,
    stall, deadline, errors, interrupted, system (the engine's status), or latency_range (a
    round trip outside the latency histogram's range: the phase ran, but its percentiles and
    max would leave it out); ``result`` holds what the engine counted until then."""

    def __init__(self, kind: str, message: str, result: Optional[Dict[str, Any]] = None):
        super().__init__(f"load {kind}: {message}")
        self.kind = kind
        self.detail = message
        self.result = result or {}

    @property
    def errors(self) -> Dict[str, int]:
        return dict(self.result.get("errors", {}))


class FdLimitError(RuntimeError):
    """The process cannot hold the sockets a load needs."""


def _fail(field_name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"LoadSpec.{field_name}: {why}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def loopback_host(host: str) -> str:
    """``host`` as a numeric loopback address; ValueError for anything else (the one rule,
    ``pyconcbench.loopback``)."""
    return loopback.address(host)


@dataclass(frozen=True)
class LoadSpec:
    """What load to put on one echo server.  Every field is checked on construction.

    Closed loop: each connection keeps ``pipeline`` messages of ``size`` bytes in flight (1:
    ping-pong), checks each echo byte for byte, in order, and sends the next as one comes back.
    ``LoadSession.round(rate=R)`` runs a round as an open loop instead (see there).
    """

    transport: str = "tcp"             #: "tcp" or "unix"
    host: str = "127.0.0.1"            #: tcp: a loopback address
    port: int = 0                      #: tcp: the server's port
    path: Optional[str] = None         #: unix: the server's socket path
    connections: int = 10
    size: int = 64                     #: bytes per message, 1 .. 1 MiB
    messages: int = 10_000             #: measured round trips (0: run for ``duration``)
    duration: float = 0.0              #: measured seconds, when messages is 0
    warmup_messages: int = 1_000       #: round trips before measuring
    warmup_seconds: float = 0.0        #: or seconds of warm-up (used when > 0)
    #: seconds: any finite number > 0; the engine counts more than about 31 years as 31 years
    connect_timeout: float = 30.0      #: for all connections together
    stall_timeout: float = 10.0        #: no round trip completed for this long: fail
    deadline: float = 300.0            #: hard limit on each phase, seconds
    cpu: Optional[int] = None          #: pin the engine's thread to this CPU
    max_errors: int = 0                #: connection errors tolerated per phase
    seed: int = 0                      #: varies the payloads
    #: connects started per second (0: unpaced, up to 512 in flight at once); paced, the
    #: connect_timeout runs from when the last connect is due, (connections - 1) / rate after
    #: the first
    connect_rate: float = 0.0
    #: messages in flight per connection: 1 is ping-pong, more is pipelining (each echo still
    #: verified, in order)
    pipeline: int = 1
    #: tcp: a loopback address each connection binds before it connects (None: the kernel's
    #: choice); each source address has its own local port range towards the server
    source: Optional[str] = None

    def __post_init__(self) -> None:
        if self.transport not in ("tcp", "unix"):
            raise _fail("transport", self.transport, "must be 'tcp' or 'unix'")
        if self.transport == "tcp":
            if not isinstance(self.host, str):
                raise _fail("host", self.host, "must be a string")
            try:
                object.__setattr__(self, "host", loopback_host(self.host))
            except ValueError as exc:
                raise ValueError(f"LoadSpec.host: {exc}") from None
            if not _is_int(self.port) or not 1 <= self.port <= 65535:
                raise _fail("port", self.port, "must be an int in 1..65535")
        else:
            if not isinstance(self.path, str) or not self.path:
                raise _fail("path", self.path, "must be the server's UNIX socket path")
            if len(os.fsencode(self.path)) > 107:
                raise _fail("path", self.path, "is longer than the 107 bytes a UNIX socket path may have")
        for name, low, high in (("connections", 1, MAX_CONNECTIONS), ("size", 1, None),
                                ("messages", 0, MAX_MESSAGES), ("warmup_messages", 0, MAX_MESSAGES),
                                ("max_errors", 0, MAX_ERRORS), ("seed", 0, None),
                                ("pipeline", 1, MAX_PIPELINE)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise _fail(name, value, f"must be an int >= {low}")
            if high is not None and value > high:
                raise _fail(name, value, f"must be at most {high}")
        if self.size > MAX_SIZE:
            raise _fail("size", self.size, f"must be at most {MAX_SIZE} bytes (1 MiB)")
        if self.seed >= 2 ** 64:
            raise _fail("seed", self.seed, "must fit in 64 bits")
        for name in ("duration", "warmup_seconds"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise _fail(name, value, "must be a number of seconds >= 0")
        for name in ("connect_timeout", "stall_timeout", "deadline"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise _fail(name, value, "must be a number of seconds > 0")
        if not _is_number(self.connect_rate) or not (
                self.connect_rate == 0 or MIN_CONNECT_RATE <= self.connect_rate <= MAX_CONNECT_RATE):
            raise _fail("connect_rate", self.connect_rate,
                        f"must be 0 (unpaced) or {MIN_CONNECT_RATE:g} .. {MAX_CONNECT_RATE:g} connections a second")
        if self.messages == 0 and self.duration <= 0:
            raise _fail("messages", self.messages, "is 0, so duration must be > 0")
        if self.cpu is not None:
            allowed = sorted(os.sched_getaffinity(0))
            if not _is_int(self.cpu) or self.cpu not in allowed:
                raise _fail("cpu", self.cpu, f"must be one of this process's CPUs {allowed} or None")
        if self.source is not None:
            if self.transport != "tcp":
                raise _fail("source", self.source, "is for tcp only (a UNIX socket has no source address)")
            try:
                object.__setattr__(self, "source", loopback_host(self.source))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"LoadSpec.source: {exc}") from None
            if (":" in self.source) != (":" in self.host):
                raise _fail("source", self.source, f"is not of the family of host {self.host!r}")
        if self.connections * self.pipeline > MAX_INFLIGHT:
            raise _fail("pipeline", self.pipeline,
                        f"times {self.connections} connections is more than {MAX_INFLIGHT} messages in flight")
        if self.connections * self.size > MAX_PAYLOAD_MEMORY:
            raise _fail("size", self.size,
                        f"times {self.connections} connections needs more than "
                        f"{MAX_PAYLOAD_MEMORY >> 30} GiB of message buffers")

    def with_(self, **changes: Any) -> "LoadSpec":
        values = asdict(self)
        values.update(changes)
        return LoadSpec(**values)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Fairness:
    """How evenly the round trips were spread over the connections."""

    min: int
    median: float
    max: int
    jain: float       #: (sum x)^2 / (n sum x^2): 1.0 perfectly even, 1/n one connection got all
    starving: int     #: connections below STARVING_SHARE of the mean


def fairness(counts: Sequence[int]) -> Fairness:
    if not counts:
        return Fairness(0, 0.0, 0, 0.0, 0)
    total = sum(counts)
    squares = sum(c * c for c in counts)
    mean = total / len(counts)
    jain = (total * total) / (len(counts) * squares) if squares else 0.0
    starving = sum(1 for c in counts if c < STARVING_SHARE * mean)
    return Fairness(min(counts), float(statistics.median(counts)), max(counts), jain, starving)


@dataclass(frozen=True)
class LoadResult:
    """One measured phase.  Latencies are in nanoseconds; CPU in seconds."""

    connections: int
    size: int
    transport: str
    completed: int                       #: verified round trips in the measured phase
    elapsed: float                       #: seconds, from the phase's first send to its last echo
    connect_seconds: float               #: to establish every connection (0 when reused)
    latency: Dict[str, float]            #: count, out_of_range, min, mean, p50, p90, p95, p99, p99_9, max
    fairness: Fairness
    errors: Dict[str, int]
    loadgen_cpu_user: float
    loadgen_cpu_sys: float
    bytes: int
    #: the phase's whole latency histogram (``_native.Histogram``): rounds merge exactly; in an
    #: open loop, from each message's intended send time (corrected for coordinated omission)
    histogram: Any = field(default=None, repr=False, compare=False)
    #: open loop: the rate asked (round trips per second, all connections; 0: a closed loop),
    #: how the sends were spread, and the latency from each message's actual send (uncorrected)
    rate: float = 0.0
    arrival: str = ""
    latency_uncorrected: Optional[Dict[str, float]] = None
    histogram_uncorrected: Any = field(default=None, repr=False, compare=False)
    #: open loop: messages sent, those sent more than 1 ms after their intended time (they
    #: queued behind the connection's messages in flight, or the engine was late), and the mean
    #: and largest such lag in seconds
    sent: int = 0
    late: int = 0
    lag_mean: float = 0.0
    lag_max: float = 0.0
    pipeline: int = 1

    @property
    def msgs_per_s(self) -> float:
        return self.completed / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def connect_rate(self) -> float:
        """Connections established per second (0 when the connections were reused)."""
        return self.connections / self.connect_seconds if self.connect_seconds > 0 else 0.0

    @property
    def loadgen_cpu_share(self) -> float:
        """The engine's CPU time over the phase's wall time: 1.0 is one core busy."""
        cpu = self.loadgen_cpu_user + self.loadgen_cpu_sys
        return cpu / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def loadgen_bound(self) -> bool:
        """True when the load generator was busy enough to be what limited the rate: the
        msgs/s is then a lower bound for the server."""
        return self.loadgen_cpu_share >= LOADGEN_BOUND_SHARE

    def as_dict(self) -> Dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("histogram", "histogram_uncorrected")}
        d["latency"] = dict(self.latency)
        d["errors"] = dict(self.errors)
        d["fairness"] = asdict(self.fairness)
        d.update(msgs_per_s=self.msgs_per_s, connect_rate=self.connect_rate,
                 loadgen_cpu_share=self.loadgen_cpu_share, loadgen_bound=self.loadgen_bound)
        return d


def fd_limit() -> Tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def max_connections() -> int:
    """The most connections one load can open in this process (hard fd limit less a margin)."""
    _, hard = fd_limit()
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    return max(0, hard - FD_MARGIN)


def ensure_fd_limit(connections: int) -> int:
    """Raises the soft RLIMIT_NOFILE (up to the hard limit) so ``connections`` sockets fit;
    returns the soft limit now in force.  FdLimitError when even the hard limit is too low."""
    need = connections + FD_MARGIN
    soft, hard = fd_limit()
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise FdLimitError(
                f"need {need} file descriptors for {connections} connections, limit is {hard} "
                f"(ulimit -n, hard): at most {max(0, hard - FD_MARGIN)} connections fit in one "
                "process here")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))
        soft = fd_limit()[0]
    return soft


def _raise_for(res: Dict[str, Any]) -> None:
    """The one place an engine result becomes a LoadError: a failed status (a stall says what
    connections that were never served at all likely mean: ``unserved_note``), or a phase with a
    latency outside the histogram's range (counted there, never in its percentiles)."""
    if res["status"] != "ok":
        raise LoadError(res["status"], res["message"] + unserved_note(res), res)
    hist = res.get("latency")
    if hist is not None and hist.out_of_range:
        slowest = f"{hist.max / 1e6:.3f} ms" if hist.count else "none"
        raise LoadError(
            "latency_range",
            f"{hist.out_of_range} of {hist.count + hist.out_of_range} round trips took longer "
            f"than {_native.HIST_MAX_NS / 1e9:g} s (or under {_native.HIST_MIN_NS} ns), outside "
            f"the latency histogram's range; p99 and max would leave them out (slowest in "
            f"range: {slowest})", res)


def unserved_note(res: Dict[str, Any]) -> str:
    """For a stalled phase where some waiting TCP connections never received a single byte
    since they connected and the server's kernel never acknowledged theirs (the engine's
    ``unserved``: the client completed the handshake, the server's half was dropped) while
    others were served: what that likely means (an accept queue that overflowed), as the rest
    of the same line; '' otherwise.  A server that served no connection at all is broken in
    some other way, and one that accepted a connection and left it waiting (its bytes were
    acknowledged) does it itself: neither gets this note."""
    unserved, served = res.get("unserved", 0), res.get("served", 0)
    if res.get("status") != "stall" or not unserved or not served:
        return ""
    return (f": {unserved} of {res.get('live', unserved + served)} connections were established but never served "
            "(no echo at all): the server's accept queue probably overflowed (listen backlog smaller "
            "than the connections opened at once); raise its backlog or pace the connects with "
            "--pcb-connect-rate")


class LoadSession:
    """Connections to one server kept open across measured rounds.

    >>> with LoadSession(spec) as s:      # connects every connection, then warms up
    ...     r1 = s.round(); r2 = s.round()
    """

    def __init__(self, spec: LoadSpec):
        if not isinstance(spec, LoadSpec):
            raise TypeError(f"LoadSession needs a LoadSpec, got {type(spec).__name__}")
        self.spec = spec
        self.connect_seconds = 0.0
        #: the last round's completed round trips per connection (fairness is computed from them)
        self.last_per_conn: List[int] = []
        self._load: Optional[Any] = None

    def open(self) -> "LoadSession":
        spec = self.spec
        ensure_fd_limit(spec.connections)
        load = _native.Load(
            spec.transport,
            spec.host if spec.transport == "tcp" else spec.path,
            spec.port if spec.transport == "tcp" else 0,
            spec.connections,
            spec.size,
            connect_timeout=float(spec.connect_timeout),
            cpu=-1 if spec.cpu is None else spec.cpu,
            max_errors=spec.max_errors,
            seed=spec.seed,
            connect_rate=float(spec.connect_rate),
            pipeline=spec.pipeline,
            source=spec.source,
        )
        res = load.open()
        _raise_for(res)
        self._load = load
        self.connect_seconds = res["elapsed"]
        return self

    def warmup(self) -> None:
        """Runs the spec's warm-up: round trips or seconds, nothing recorded."""
        spec = self.spec
        if spec.warmup_seconds > 0:
            self._phase(0, spec.warmup_seconds)
        elif spec.warmup_messages > 0:
            self._phase(spec.warmup_messages, 0.0)

    def round(self, messages: Optional[int] = None, duration: Optional[float] = None,
              rate: float = 0.0, arrival: str = "uniform", deadline: Optional[float] = None) -> LoadResult:
        """One measured phase: ``messages`` round trips (default: the spec's), or ``duration``
        seconds.  LoadError when it cannot complete.

        ``rate`` > 0 makes it an open loop: each connection sends on its own schedule at rate /
        connections (``arrival`` "uniform": evenly spaced and staggered; "poisson": exponential
        gaps, adding up to a Poisson process at ``rate``), whether or not its echoes are back;
        a message due while the connection has ``pipeline`` messages in flight waits, and its
        wait counts.  The latency histogram is then from each message's intended send time, and
        ``latency_uncorrected`` from its actual send.  A rate the server cannot hold is not
        lowered: the round takes longer, and msgs_per_s says what was achieved.  ``deadline``
        (seconds, default the spec's) bounds this round."""
        spec = self.spec
        if messages is None and duration is None:
            messages, duration = spec.messages, spec.duration
        if not _is_number(rate) or not (rate == 0 or MIN_OPEN_RATE <= rate <= MAX_OPEN_RATE):
            raise ValueError(f"round: rate must be 0 (closed loop) or {MIN_OPEN_RATE:g} .. {MAX_OPEN_RATE:g} "
                             f"round trips a second, got {rate!r}")
        if arrival not in ARRIVALS:
            raise ValueError(f"round: arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
        if deadline is not None and (not _is_number(deadline) or deadline <= 0):
            raise ValueError(f"round: deadline must be a number of seconds > 0, got {deadline!r}")
        res = self._phase(messages or 0, duration or 0.0, rate=float(rate), arrival=arrival, deadline=deadline)
        hist = res["latency"]
        unc = res.get("latency_uncorrected")
        self.last_per_conn = list(res["per_conn"])
        return LoadResult(
            connections=spec.connections,
            size=spec.size,
            transport=spec.transport,
            completed=res["completed"],
            elapsed=res["elapsed"],
            connect_seconds=self.connect_seconds,
            latency=hist.summary(),
            fairness=fairness(res["per_conn"]),
            errors=dict(res["errors"]),
            loadgen_cpu_user=res["cpu_user"],
            loadgen_cpu_sys=res["cpu_sys"],
            bytes=res["bytes"],
            histogram=hist,
            rate=float(rate),
            arrival=arrival if rate else "",
            latency_uncorrected=unc.summary() if unc is not None else None,
            histogram_uncorrected=unc,
            sent=res["sent"],
            late=res["late"],
            lag_mean=res["lag_mean"],
            lag_max=res["lag_max"],
            pipeline=spec.pipeline,
        )

    def minimal_round(self, messages: int) -> Tuple[int, float, float]:
        """The ceiling client: the same connections and loop with no clock per message, no
        payload check and no histogram.  Returns (completed, elapsed, cpu seconds)."""
        res = self._phase(messages, 0.0, minimal=True)
        return res["completed"], res["elapsed"], res["cpu_user"] + res["cpu_sys"]

    def _phase(self, messages: int, duration: float, minimal: bool = False, rate: float = 0.0,
               arrival: str = "uniform", deadline: Optional[float] = None) -> Dict[str, Any]:
        if self._load is None:
            raise RuntimeError("LoadSession is not open")
        spec = self.spec
        res = self._load.phase(messages, duration, spec.stall_timeout, deadline or spec.deadline, minimal, rate,
                               arrival)
        _raise_for(res)
        return res

    def close(self) -> None:
        """Closes the connections.  RuntimeError while a round of this session runs (from
        another thread or a signal handler); the session then stays open."""
        if self._load is not None:
            self._load.close()
            self._load = None

    def __enter__(self) -> "LoadSession":
        self.open()
        try:
            self.warmup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run(spec: LoadSpec) -> LoadResult:
    """Connects, warms up, runs one measured phase, closes.  LoadError when the load cannot
    complete (the kind says why), FdLimitError when the sockets do not fit."""
    with LoadSession(spec) as session:
        return session.round()


def merged(results: Sequence[LoadResult], uncorrected: bool = False) -> Any:
    """One Histogram of every phase's latencies: percentiles over several rounds are then the
    same code and the same answer as over one phase with every sample.  ``uncorrected``: of
    open-loop rounds' histograms from each message's actual send."""
    name = "histogram_uncorrected" if uncorrected else "histogram"
    total = Histogram()
    for r in results:
        hist = getattr(r, name)
        if hist is None:
            raise ValueError(f"merged: a LoadResult without its {name}"
                             + (" (a closed loop has none)" if uncorrected else ""))
        total.merge(hist)
    return total
