"""The echo workload: its cases (``EchoCase``, one per test id), the measured rounds of one case
against a started server (``EchoRunner``) and what they add up to (``EchoOutcome``: the
extra_info saved with the benchmark).  No pytest here: the plugin wires these to fixtures.

    options (Settings) -> echo_cases -> EchoRunner(server from harness, rounds, loadgen)
                                          -> EchoOutcome.extra -> saved JSON (metrics: "echo")
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import engines, explain, harness, instruments, loadgen, machine, metrics, netsim, plain, rounds, servers, syscalls
from .options import PROFILES, Settings, per_connection
from .report.echo_tables import size_label

#: Clock ticks of server CPU needed before its user/system split is reported.
#: The latency percentiles a case saves (latency_p50_us .. latency_p99_9_us).
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
MIN_TICKS_FOR_SPLIT = 20

@dataclass(frozen=True)
class EchoCase:
    """One echo benchmark.  ``plain``: the plain reference server of ``impl``
    (``pyconcbench.plain``) instead of the project's; ``command``: a program the user brings
    (``harness.CommandServer``), named ``impl``; ``count_alloc``: count the server's
    allocator syscalls in one untimed round after the measured ones (set where a run compares
    allocator states); ``network``: where the server and the load generator talk
    (``netsim.Network``: the local loopback, or a namespace of their own with netem on its lo)."""

    impl: str
    connections: int
    size: int
    transport: str
    malloc: str = harness.MALLOC_DEFAULT
    plain: bool = False
    count_alloc: bool = field(default=False, compare=False)
    explain: bool = field(default=False, compare=False)  # trace one untimed round (pyconcbench.explain)
    #: a server the user brings (--pcb-server-cmd): its command line; ``impl`` is its name
    command: Optional[str] = None
    #: messages in flight per connection (--pcb-pipeline): 1 is ping-pong
    pipeline: int = 1
    network: netsim.Network = netsim.LOCAL
    #: worker processes of the server (--pcb-workers; pyconcbench.serve --workers)
    workers: int = 1

    @property
    def scale(self) -> str:
        label = f"c{self.connections}-{size_label(self.size)}"
        if self.pipeline != 1:
            label += f"-p{self.pipeline}"
        return label if self.transport == "tcp" else label + "-unix"

    @property
    def id(self) -> str:
        """Baseline key: ``[plain_]impl-cN-SIZE[-pK][-unix][-wN][-malloc_STATE][-netns_dDELAY[_rRATE]]``."""
        suffix = "" if self.malloc == harness.MALLOC_DEFAULT else f"-malloc_{self.malloc}"
        prefix = plain.PREFIX if self.plain else ""
        workers = "" if self.workers == 1 else f"-w{self.workers}"
        return f"{prefix}{self.impl}-{self.scale}{workers}{suffix}{self.network.id_suffix}"

    @property
    def label(self) -> str:
        """The implementation as the summary table names it:
        ``impl[+plain][+wN][+STATE_malloc][+netns(DELAY[,RATE])]``."""
        label = self.impl + ("+plain" if self.plain else "")
        label += "" if self.workers == 1 else f"+w{self.workers}"
        label = label if self.malloc == harness.MALLOC_DEFAULT else f"{label}+{self.malloc}_malloc"
        return label + self.network.label

    @property
    def counterpart(self) -> Optional["EchoCase"]:
        """The case this one is compared with: a plain server's project counterpart, a special
        allocator state's representative one, a simulated network's local one; None for a
        representative project case on the local loopback."""
        if self.plain:
            return dataclasses.replace(self, plain=False)
        if self.malloc != harness.MALLOC_DEFAULT:
            return dataclasses.replace(self, malloc=harness.MALLOC_DEFAULT)
        if not self.network.local:
            return dataclasses.replace(self, network=netsim.LOCAL)
        return None

    @property
    def group(self) -> str:
        return f"echo-{self.scale}"


def echo_cases(settings: Settings) -> List[EchoCase]:
    """Every echo case of a run, in the order measured: per scale, each implementation in each
    allocator state, then (where --pcb-reference puts one) its plain reference server, so that a
    server and what it is compared with run back to back.  A simulated network (--pcb-network)
    repeats the chosen allocator states of the project's and the command's servers over TCP;
    the plain references and the profile's variants stay local.  Each worker count
    (--pcb-workers) repeats a project server's cases, right after its 1-worker ones; the peers
    (go_net, node_net), plain references and --pcb-server-cmd programs run their own processes,
    at 1 worker only (``servers.one_process``)."""
    out: List[EchoCase] = []
    remote = [n for n in settings.networks if not n.local]
    local = not settings.networks or any(n.local for n in settings.networks)
    for conns, size, transport in settings.cases:
        before = len(out)
        reference = settings.reference == "all" or (settings.reference == "auto" and (conns, size, transport) == (100, 64, "tcp"))
        for impl in settings.impls:
            mallocs = list(settings.mallocs) + [v[4] for v in settings.variants
                                                if (v[0], v[1], v[2], v[3]) == (impl, conns, size, transport)]
            mallocs = list(dict.fromkeys(mallocs))
            # (a count of workers that cannot hold the connections is generated, and skips saying
            # so: fixtures.echo_servers; options refuses a run where no count can)
            counts = (1,) if servers.one_process(impl) else settings.workers
            for malloc in mallocs:  # the profile's variants (a state not chosen) at 1 worker only
                out += [EchoCase(impl, conns, size, transport, malloc, pipeline=settings.pipeline, workers=n)
                        for n in (counts if malloc in settings.mallocs else (1,))]
            if reference and impl in plain.PLAIN and conns <= loadgen.max_connections():
                out += [EchoCase(impl, conns, size, transport, malloc, plain=True, pipeline=settings.pipeline)
                        for malloc in mallocs if malloc != "tuned"]
        if settings.server_cmd and transport in harness.command_transports(settings.server_cmd):
            out += [EchoCase(settings.server_name, conns, size, transport, malloc, command=settings.server_cmd,
                             pipeline=settings.pipeline)
                    for malloc in settings.mallocs]
        if transport == "tcp" and remote:
            chosen = [c for c in out[before:] if not c.plain and c.malloc in settings.mallocs]
            if local:  # each one's network variants right after it: they run back to back
                for case in chosen:
                    at = out.index(case) + 1
                    out[at:at] = [dataclasses.replace(case, network=n) for n in remote]
            else:  # only simulated networks asked for: the scale's local cases are not run
                out[before:] = [dataclasses.replace(c, network=n) for c in chosen for n in remote]
    # Where a run compares allocator states of a server, count their allocator syscalls.
    states: Dict[Tuple[Any, ...], int] = {}
    for case in out:
        key = (case.impl, case.connections, case.size, case.transport, case.network, case.workers)
        states[key] = states.get(key, 0) + (not case.plain)
    # (one process's syscalls are traced: a server with workers is left out, as below)
    out = [dataclasses.replace(c, count_alloc=c.workers == 1 and states[
        (c.impl, c.connections, c.size, c.transport, c.network, c.workers)] > 1) for c in out]
    if not settings.explain:
        return out
    # One traced round per implementation: at 100 connections x 64 B over TCP when the run has
    # it (where every implementation is compared), else at its first representative case.
    def rank(case: EchoCase) -> Tuple[bool, bool, bool]:  # representative first, then c100-64B, then local
        return case.malloc == harness.MALLOC_DEFAULT, case.scale == "c100-64B", case.network.local

    chosen: Dict[str, int] = {}
    for i, case in enumerate(out):
        if case.plain or case.workers != 1:  # the tracer follows one process
            continue
        if case.impl not in chosen or rank(case) > rank(out[chosen[case.impl]]):
            chosen[case.impl] = i
    for i in chosen.values():
        out[i] = dataclasses.replace(out[i], explain=True)
    return out


_TOOL_CACHE: Dict[str, Optional[str]] = {}
#: Round trips of a traced, untimed round (or a measured round's, when fewer).
TRACED_MESSAGES = 5000


def syscall_tool() -> Optional[str]:
    """syscalls.available_tool(), probed once per process."""
    if "tool" not in _TOOL_CACHE:
        _TOOL_CACHE["tool"] = syscalls.available_tool()
    return _TOOL_CACHE["tool"]


@dataclass
class RoundRecord:
    result: loadgen.LoadResult
    server_cpu: float   # on-CPU seconds, ns-precise
    server_user: float  # clock-tick split, 10 ms resolution
    server_sys: float
    other_cpu: Optional[float]  # None: /proc/stat unreadable, the other-CPU check could not run
    probe_before: Optional[float]
    probe_after: Optional[float]
    noisy: str  # why it was noisy, "" when clean
    attempt: int
    kept: str = rounds.CLEAN  # why this try stands for the round (rounds.Outcome.kept_because)
    speed_before: Optional[Dict[int, float]] = None  # cpu -> loop time / the best seen
    speed_after: Optional[Dict[int, float]] = None
    rss_kib: Optional[int] = None  # the server's resident memory right after the round


class EchoRunner:
    """Runs the measured rounds of one echo case against a started server."""

    def __init__(self, settings: Settings, case: EchoCase, server: harness.ServerProcess,
                 probe_baseline: Optional[float], speed: Optional[instruments.SpeedGauge] = None):
        self.settings = settings
        self.speed = speed
        self.case = case
        self.server = server
        self.probe_baseline = probe_baseline
        self.records: List[RoundRecord] = []
        self.rejected: List[RoundRecord] = []
        #: the server's resident memory before the load generator connects, and with its
        #: connections open after the warm-up (``read_idle_rss``, ``read_connected_rss``)
        self.rss_idle_kib: Optional[int] = None
        self.rss_connected_kib: Optional[int] = None
        cpus = settings.cpus
        self.judge = rounds.NoiseJudge(speed, probe_baseline, cpus)
        if settings.duration:
            messages, duration = 0, settings.duration
        else:
            messages = settings.messages or PROFILES[settings.profile]().messages_for(case.connections, case.size)
            duration = 0.0
        self.messages = messages
        self.plan = settings.plan_for(case.connections)
        #: what each measured round passes to LoadSession.round (the open loop: its rate)
        self.round_kwargs: Dict[str, Any] = {}
        #: load engine processes (pyconcbench.engines): --pcb-engines, else as many as the
        #: connections need (one holds a process's sockets, below the port range)
        self.engines = settings.engines or engines.engines_for(case.connections)
        address = server.address
        common = dict(
            connections=case.connections, size=case.size, messages=messages, duration=duration,
            warmup_messages=max(2000, per_connection(case.connections) * case.connections // 5) if messages else 0,
            warmup_seconds=0.0 if messages else min(1.0, duration),
            cpu=cpus[1] if cpus else None, stall_timeout=settings.stall_timeout,
            # paced (--pcb-connect-rate), the engine counts this from the last connect due
            connect_timeout=max(30.0, case.connections / 200.0), connect_rate=settings.connect_rate,
            # a hard bound on each phase: slower than 100 round trips a second is a failure
            deadline=max(120.0, 10 * settings.stall_timeout, 2 * duration + 60, messages / 100.0),
            pipeline=case.pipeline,
        )
        if case.transport == "unix":
            self.spec = loadgen.LoadSpec(transport="unix", path=address, **common)
        else:
            self.spec = loadgen.LoadSpec(transport="tcp", host=address[0], port=address[1], **common)

    def read_idle_rss(self) -> None:
        """The server's resident memory before the load generator connects (after its start
        and the allocator pre-flight): what memory per connection is counted from.
        ServerError when it cannot be read (the server died)."""
        self.rss_idle_kib = self.server.rss_kib()

    def read_connected_rss(self) -> None:
        """The server's resident memory with the connections open, after the warm-up and
        before the first measured round."""
        self.rss_connected_kib = self.server.rss_kib()

    def _measure(self, session: loadgen.LoadSession, attempt: int) -> Tuple[RoundRecord, str, float]:
        """One try of a round, with the machine probed around it (rounds.measure_round)."""
        judge = self.judge
        probes_before = judge.probe()
        self.server.check_alive()
        pids = self.server.measured_pids  # a command server's whole process tree
        load_pids = getattr(session, "pids", ())  # several engine processes: the load generator's own
        before = instruments.snapshot(pids, load_pids)
        started = time.perf_counter()
        result = session.round(**self.round_kwargs)
        finished = time.perf_counter()
        after = instruments.snapshot(pids, load_pids)
        if before.server_runtime is None or after.server_runtime is None:
            self.server.check_alive()
            raise harness.ServerError(
                f"cannot read server {self.case.impl!r}'s CPU time from "
                f"/proc/{self.server.measured_pid}/task/*/schedstat: its CPU per message would be unknown")
        rss = self.server.rss_kib()  # ServerError when unreadable: its memory per connection would be unknown
        probes_after = judge.probe()
        rec = RoundRecord(
            result=result,
            server_cpu=after.server_runtime - before.server_runtime,
            server_user=after.server_user - before.server_user,
            server_sys=after.server_sys - before.server_sys,
            other_cpu=after.other_since(before),
            probe_before=probes_before.cacheline_ns, probe_after=probes_after.cacheline_ns, noisy="",
            attempt=attempt, speed_before=judge.slowdown(probes_before), speed_after=judge.slowdown(probes_after),
            rss_kib=rss,
        )
        rec.noisy = judge.reason(probes_before, probes_after, rec.other_cpu, result.elapsed)
        return rec, rec.noisy, finished - started

    def one_round(self, session: loadgen.LoadSession) -> float:
        """One round: measured until a try is clean (rounds.measure_round); returns the kept
        try's load-phase seconds, the round's time."""
        outcome = rounds.measure_round(lambda attempt: self._measure(session, attempt),
                                       self.settings.noise_retries, settle=self.judge.settle)
        self.keep(outcome.kept.value, outcome.kept_because, [t.value for t in outcome.rejected])
        return outcome.timed

    def keep(self, record: RoundRecord, because: str, rejected: List[RoundRecord]) -> None:
        """Saves a round's kept try (and why it was kept) and its rejected tries."""
        record.kept = because
        self.records.append(record)
        for rec in rejected:
            rec.kept = rounds.REJECTED
            self.rejected.append(rec)

    def clean_figures(self) -> List[float]:
        """msgs/s of the clean rounds so far (what Plan.done reads)."""
        return [r.result.msgs_per_s for r in self.records if not r.noisy]

    def traced_round(self, session: loadgen.LoadSession,
                     names: Tuple[str, ...]) -> Tuple[Optional[Dict[str, int]], int, str]:
        """One extra round after the measured ones with the server's syscalls counted (untimed:
        perf's tracepoints slow the calls they count): (counts, round trips, tool), or (None, 0,
        why) when they cannot be counted here."""
        tool = syscall_tool()
        if tool is None:
            return None, 0, "not counted: needs perf (linux-perf) or strace on PATH"
        try:
            counter = syscalls.SyscallCounter(self.server.measured_pid, tool, names=names).start()
        except syscalls.SyscallCountError as exc:
            return None, 0, f"not counted: {exc}"
        try:
            # counts per round trip settle within a few thousand; tracing slows the calls it counts
            if self.spec.messages:
                result = session.round(messages=min(self.spec.messages, TRACED_MESSAGES))
            else:
                result = session.round(duration=min(self.spec.duration, 1.0))
        except loadgen.LoadError as exc:  # untimed and diagnostic: the measured rounds stand
            result, failed = None, f"not counted: the traced round failed ({exc})"
        finally:
            try:
                counts = counter.stop()
            except syscalls.SyscallCountError as exc:
                counts, why = None, f"not counted: {exc}"
        if result is None:
            return None, 0, failed
        if counts is None:
            return None, 0, why
        return counts, result.completed, tool

    @staticmethod
    def allocator_record(counts: Optional[Dict[str, int]], completed: int, tool: str) -> Dict[str, Any]:
        """The allocator's syscalls per round trip of a traced round, to show the state the
        server ran in; ``alloc_syscalls_per_msg`` is None with the reason when not counted."""
        if counts is None or completed <= 0:
            return {"alloc_syscalls_per_msg": None, "alloc_syscalls_note": tool}
        per = {name: round(counts.get(name, 0) / completed, 3) for name in syscalls.ALLOCATOR}
        per["total"] = round(counts.get("total", 0) / completed, 3)
        return {"alloc_syscalls_per_msg": per,
                "alloc_syscalls_note": f"counted with {tool} over one extra, untimed round of "
                                       f"{completed} round trips after the measured ones"}

    def count_allocator(self, session: loadgen.LoadSession) -> Dict[str, Any]:
        """The allocator record over one traced round of the allocator's calls only."""
        return self.allocator_record(*self.traced_round(session, syscalls.ALLOCATOR))

    @contextlib.contextmanager
    def session(self) -> Iterator[loadgen.LoadSession]:
        """The load generator's connections, made in the server's network namespace (its
        ``netns``; this thread enters it for the connects only), warmed up, closed at the end."""
        netns = getattr(self.server, "netns", None)  # a stand-in server may have none
        if self.engines > 1:  # past one process's sockets, or asked for: several engine processes
            engine_set = engines.EngineSet(self.spec, self.engines, netns=netns)
            engine_set.open()
            try:
                yield engine_set
            finally:
                engine_set.close()
            return
        if netns is None:
            with loadgen.LoadSession(self.spec) as session:
                yield session
            return
        session = loadgen.LoadSession(self.spec)
        try:
            with netsim.entered(netns):
                session.open()
        except netsim.NetworkError as exc:
            raise harness.ServerError(f"{self.case.id}: {exc}") from None
        try:
            session.warmup()
            yield session
        finally:
            session.close()

    def probe_network(self) -> Optional[float]:
        """The round trip of one byte over a fresh loopback connection where this case's load
        runs (``netsim.round_trip_us``), in microseconds; None on the local loopback."""
        if self.case.network.local:
            return None
        try:
            return netsim.round_trip_us(getattr(self.server, "netns", None))
        except netsim.NetworkError as exc:
            raise harness.ServerError(f"{self.case.id}: {exc}") from None

    def run(self, benchmark: Any) -> "EchoOutcome":
        counts = None
        rtt = self.probe_network()
        self.read_idle_rss()
        with self.session() as session:
            self.read_connected_rss()
            counter = None
            if self.settings.syscalls:
                counter = syscalls.SyscallCounter(self.server.measured_pid).start()
            try:
                rounds.run_rounds(benchmark.pedantic, lambda: self.one_round(session), self.plan,
                                  self.clean_figures)
            finally:
                if counter is not None:
                    counts = counter.stop()
            alloc = explained = None
            if self.case.explain and counts is None:
                # one traced round of every named call: the explanation, and the allocator's share
                traced, completed, tool = self.traced_round(session, syscalls.EXPLAIN)
                explained = (explain.record(syscalls.per_message(traced, completed), completed, tool,
                                            self.case.id, self.case.size)
                             if traced is not None
                             else explain.unavailable(tool, self.case.id))
                if self.case.count_alloc:
                    alloc = self.allocator_record(traced, completed, tool)
            elif self.case.count_alloc:
                alloc = self.count_allocator(session)
        outcome = EchoOutcome.from_records(self, session.connect_seconds)
        if rtt is not None:
            outcome.extra["network_rtt_us"] = rtt
        if alloc is not None:
            outcome.extra.update(alloc)
        if self.spec.connect_rate:
            outcome.extra["connect_paced_per_s"] = self.spec.connect_rate  # --pcb-connect-rate
        if counts is not None:
            # every round trip in the counted window, rejected noisy rounds included
            messages = sum(r.result.completed for r in self.records + self.rejected)
            outcome.extra["syscalls_tool"] = counter.tool
            outcome.extra["syscalls_per_msg"] = syscalls.per_message(counts, messages)
            outcome.extra["syscalls_note"] = "counted with tracing on: rates are lower than without"
            if self.case.explain:  # the measured rounds were traced already: explained from them
                explained = explain.record(outcome.extra["syscalls_per_msg"], messages, counter.tool, self.case.id,
                                           self.case.size)
                explained["note"] = "the measured rounds, traced (--pcb-syscalls)"
        if explained is not None:
            outcome.extra["explain"] = explained
        outcome.fill(benchmark.extra_info)
        return outcome


def _sig(x: float) -> float:
    """Four significant digits: Jain's index is as small as 1/connections (5e-5 at 20k), which
    four decimals would save as 0.0."""
    return float(f"{x:.4g}")


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


@dataclass
class EchoOutcome:
    """What one echo benchmark measured, summarised over its accepted rounds."""

    case: EchoCase
    rounds: int
    messages_per_round: int
    completed: int
    errors: Dict[str, int]
    extra: Dict[str, Any]

    @classmethod
    def from_records(cls, runner: EchoRunner, connect_seconds: float) -> "EchoOutcome":
        # The figures are the clean rounds' (a round the judge found noisy ran while the host
        # was slowed or busy: it is saved, and counted, but does not move the headline); when no
        # round was clean, every round's, and the table says so.
        clean = [r for r in runner.records if not r.noisy]
        recs = clean or runner.records
        results = [r.result for r in recs]
        completed = sum(r.completed for r in results)
        elapsed = sum(r.elapsed for r in results)
        every = [rec.result for rec in runner.records]
        verified = sum(r.completed for r in every)  # every round's, for the outcome
        errors: Dict[str, int] = {}
        for r in every:  # an error in any round counts
            for kind, n in r.errors.items():
                if n:
                    errors[kind] = errors.get(kind, 0) + n
        pct = loadgen.merged(results).percentiles(PERCENTILES)
        s_cpu = sum(r.server_cpu for r in recs)
        ticks_user = sum(r.server_user for r in recs)
        ticks_sys = sum(r.server_sys for r in recs)
        # The user/system split comes from clock ticks: only trust it over enough of them.
        user_share = (ticks_user / (ticks_user + ticks_sys)
                      if ticks_user + ticks_sys >= MIN_TICKS_FOR_SPLIT / machine.CLK_TCK else None)
        s_user = s_cpu * user_share if user_share is not None else None
        s_sys = s_cpu - s_user if s_user is not None else None
        l_cpu = sum(r.loadgen_cpu_user + r.loadgen_cpu_sys for r in results)
        server = runner.server
        case = runner.case
        # Memory: each round's resident memory (read right after it) less the idle server's,
        # per connection; the headline is the median of the same rounds as the other figures'.
        idle = runner.rss_idle_kib
        loaded = [r.rss_kib for r in recs if r.rss_kib is not None]
        per_conn = [_per_conn(rss, idle, case.connections) for rss in loaded]
        extra: Dict[str, Any] = {
            **metrics.stamp(metrics.ECHO),
            "impl": case.impl,
            "label": case.label,
            "malloc": case.malloc,
            "plain": case.plain,
            **case.network.as_dict(),
            "malloc_probe_at_start": (server.ready or {}).get("malloc_probe"),
            "connections": case.connections,
            "size": case.size,
            "transport": case.transport,
            "pipeline": case.pipeline,
            "load_engines": runner.engines,
            "workers": case.workers,
            **({"workers_note": server.workers_note} if getattr(server, "workers_note", "") else {}),
            "messages_per_round": runner.messages,
            "msgs_per_s": round(completed / elapsed, 1) if elapsed else 0.0,
            "msgs_per_s_median": round(statistics.median(r.msgs_per_s for r in results), 1),
            "mib_per_s": round(completed * case.size / elapsed / (1 << 20), 3) if elapsed else 0.0,
            "latency_p50_us": _us(pct[0]),
            "latency_p90_us": _us(pct[1]),
            "latency_p95_us": _us(pct[2]),
            "latency_p99_us": _us(pct[3]),
            "latency_p99_9_us": _us(pct[4]),
            "latency_max_us": _us(max(r.latency["max"] for r in results)),
            # the worst round's, over every round (a starved connection is never noise)
            "fairness_jain": _sig(min(r.fairness.jain for r in every)),
            "fairness_min": min(r.fairness.min for r in every),
            "fairness_max": max(r.fairness.max for r in every),
            "starving_connections": max(r.fairness.starving for r in every),
            "errors": errors,
            "connect_seconds": round(connect_seconds, 4),
            "connect_rate": round(case.connections / connect_seconds, 1) if connect_seconds else 0.0,
            "loadgen_cpu_share": round(l_cpu / elapsed, 3) if elapsed else 0.0,
            "loadgen_bound": any(r.loadgen_bound for r in every),
            "server_cpu": round(s_cpu, 6),
            "server_cpu_user": None if s_user is None else round(s_user, 6),
            "server_cpu_sys": None if s_sys is None else round(s_sys, 6),
            "server_cpu_share": round(s_cpu / elapsed, 3) if elapsed else 0.0,
            "server_user_share": None if user_share is None else round(user_share, 3),
            "server_cpu_us_per_msg": round(s_cpu / completed * 1e6, 3) if completed else None,
            "loadgen_cpu_us_per_msg": round(l_cpu / completed * 1e6, 3) if completed else None,
            "server_rss_kib": instruments.status_kib_total(server.measured_pids, "VmRSS"),
            "server_rss_peak_kib": instruments.status_kib_total(server.measured_pids, "VmHWM"),
            "server_rss_idle_kib": idle,
            "server_rss_connected_kib": runner.rss_connected_kib,
            "server_rss_loaded_kib": round(statistics.median(loaded), 1) if loaded else None,
            "rss_per_conn_kib": (round(statistics.median(per_conn), 3)
                                 if per_conn and None not in per_conn else None),
            "pinning": runner.settings.pinning_note,
            "probe_baseline_ns": runner.probe_baseline,
            "cpu_speed_best_ns": ({str(c): round(v) for c, v in runner.speed.best.items()}
                                  if runner.speed is not None else None),
            "noise_rule": rounds.NoiseJudge.rule(runner.settings.noise_retries),
            "round_plan": runner.plan.describe(),
            # /proc/stat unreadable: the other-CPU part of the noise judge did not run; say so
            "other_cpu_check": ("unknown: /proc/stat was unreadable" if any(r.other_cpu is None for r in runner.records)
                                else "ran"),
            "noisy_rounds_rejected": len(runner.rejected),
            "noisy_rounds_kept": sum(1 for r in runner.records if r.noisy),
            "figures_from": (f"the {len(clean)} clean of {len(runner.records)} rounds" if clean
                             else f"all {len(runner.records)} rounds (none was clean)"),
            "timer": "wall time of the accepted load phase (perf_counter less probes and rejected noisy rounds)",
            "rounds": [_round_dict(r, idle, case.connections) for r in runner.records],
            "rejected_rounds": [_round_dict(r, idle, case.connections) for r in runner.rejected],
        }
        if case.command is not None:
            extra["server_command"] = getattr(server, "command", case.command)
        slow = os.environ.get(servers.SLOWDOWN_ENV, "").strip()
        if slow and case.impl in servers.SLOWDOWN_IMPLS:
            extra["test_slowdown_ns"] = int(slow)  # the test-only knob was on: not a real result
        return cls(case, len(runner.records), runner.messages, verified, errors, extra)

    def fill(self, extra_info: Dict[str, Any]) -> None:
        # pytest-benchmark keeps a reference to this very dict: mutate it, never rebind it.
        extra_info.update(self.extra)


def _per_conn(rss: Optional[int], idle: Optional[int], connections: int) -> Optional[float]:
    """KiB of resident memory per connection: (``rss`` with the connections open - ``idle``)
    / connections, None when either reading is missing."""
    if rss is None or idle is None or connections <= 0:
        return None
    return round((rss - idle) / connections, 3)


def _round_dict(rec: RoundRecord, idle: Optional[int] = None, connections: int = 0) -> Dict[str, Any]:
    r = rec.result
    cpu = rec.server_cpu
    return {
        "msgs_per_s": round(r.msgs_per_s, 1),
        "completed": r.completed,
        "elapsed": round(r.elapsed, 6),
        "latency_p50_us": _us(r.latency["p50"]),
        "latency_p90_us": _us(r.latency["p90"]),
        "latency_p95_us": _us(r.latency["p95"]),
        "latency_p99_us": _us(r.latency["p99"]),
        "fairness_jain": _sig(r.fairness.jain),
        "loadgen_cpu_share": round(r.loadgen_cpu_share, 3),
        "server_cpu": round(cpu, 6),
        "server_ticks_user": round(rec.server_user, 3),
        "server_ticks_sys": round(rec.server_sys, 3),
        "server_cpu_us_per_msg": round(cpu / r.completed * 1e6, 3) if r.completed else None,
        "other_cpu_share": round(rec.other_cpu / r.elapsed, 3) if r.elapsed and rec.other_cpu is not None else None,
        "probe_before_ns": round(rec.probe_before, 1) if rec.probe_before else None,
        "probe_after_ns": round(rec.probe_after, 1) if rec.probe_after else None,
        "cpu_speed_before": rounds.ratios(rec.speed_before),
        "cpu_speed_after": rounds.ratios(rec.speed_after),
        "rss_kib": rec.rss_kib,
        "rss_per_conn_kib": _per_conn(rec.rss_kib, idle, connections),
        "noisy": rec.noisy or None,
        "attempt": rec.attempt,
        "kept": rec.kept,
    }


# ---- the load generator's own ceiling -----------------------------------------------------

#: Connection counts of the ceiling benchmark (test_loadgen_ceiling[cN-64B]).
CEILING_COUNTS = (10, 100)


def ceiling_group(connections: int) -> str:
    return f"loadgen-ceiling-c{connections}-64B"


def run_ceiling(settings: Settings, server: harness.ServerProcess, connections: int,
                pedantic: Any) -> Dict[str, Any]:
    """The load generator's ceiling against ``server`` (native_epoll): the same connections and
    epoll loop as the measuring engine, with no clock read per message, no payload check and
    no histogram, timed by ``pedantic`` (pytest-benchmark's); between those rounds (untimed, in
    pedantic's setup) the full engine runs the same round trips on the same connections, so
    ``engine_to_ceiling`` compares the two under the same conditions.  Returns extra_info."""
    cpus = settings.cpus
    messages = settings.messages or 50_000
    host, port = server.address
    spec = loadgen.LoadSpec(host=host, port=port, connections=connections, size=64, messages=messages,
                            warmup_messages=2000, cpu=cpus[1] if cpus else None)
    minimal: List[Tuple[int, float, float]] = []
    engine: List[loadgen.LoadResult] = []

    def one_round(session: loadgen.LoadSession) -> None:
        minimal.append(session.minimal_round(messages))

    def engine_round(session: loadgen.LoadSession) -> Tuple[Tuple[loadgen.LoadSession], Dict[str, Any]]:
        engine.append(session.round())
        return (session,), {}

    with loadgen.LoadSession(spec) as session:
        pedantic(one_round, setup=lambda: engine_round(session), rounds=max(settings.rounds or 0, 9),
                 iterations=1)
    completed = sum(r[0] for r in minimal)
    elapsed = sum(r[1] for r in minimal)
    cpu = sum(r[2] for r in minimal)
    ceiling = completed / elapsed
    measured = sum(r.completed for r in engine) / sum(r.elapsed for r in engine)
    # Paired: each engine round ran just before its minimal round, so their ratio cancels
    # most of the machine's drift; the median of the pairs is the figure to read.
    paired = statistics.median(e.msgs_per_s / (n / t) for e, (n, t, _) in zip(engine, minimal))
    return dict(
        metrics.stamp(metrics.CEILING),
        impl="loadgen_ceiling", connections=connections, size=64, transport="tcp",
        messages_per_round=messages,
        msgs_per_s=round(ceiling, 1), loadgen_cpu_share=round(cpu / elapsed, 3),
        engine_msgs_per_s=round(measured, 1), engine_to_ceiling=round(measured / ceiling, 4),
        engine_to_ceiling_paired_median=round(paired, 4),
        rounds=[{"completed": c, "elapsed": round(e, 6), "cpu": round(u, 4)} for c, e, u in minimal],
        engine_rounds=[{"msgs_per_s": round(r.msgs_per_s, 1), "loadgen_cpu_share": round(r.loadgen_cpu_share, 3),
                        "completed": r.completed, "errors": sum(r.errors.values())}
                       for r in engine],
    )
