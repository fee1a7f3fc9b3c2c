"""The benchmark fixtures of the pytest plugin: each calls a pytest-free workload runner and
turns what it raises into a skip (a package or tool missing here; a failure too in a strict
run, ``--pcb-strict``, on when CI is set) or a one-line failure (everything else, our own code
broken included).

    echo_servers, echo_server,       pyconcbench.harness + pyconcbench.echo.EchoRunner
    echo_bench                       (+ pyconcbench.ab.ABRunner in an interleaved A/B run)
    openloop_bench                   pyconcbench.openloop.OpenLoopRunner (on echo_servers)
    ceiling_server, ceiling_bench    pyconcbench.echo.run_ceiling
    zmq_bench                        pyconcbench.zmq.runner.Runner
    switch_bench                     pyconcbench.micro.Runner
                                     (both: pyconcbench.ab.PairedRunner, a worker per side, in an
                                     interleaved A/B run)

Registered by ``pyconcbench.plugin`` (the ``pytest11`` entry point), which holds the hooks;
the stash keys they share are here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from . import ab, echo, harness, instruments, loadgen, micro, netsim, openloop, options, servers
from . import zmq as pcbzmq
from .echo import EchoCase, EchoOutcome, EchoRunner
from .options import Settings

SETTINGS_KEY = pytest.StashKey[Settings]()
RESULTS_KEY = pytest.StashKey[List[Dict[str, Any]]]()
CEILING_KEY = pytest.StashKey[List[Dict[str, Any]]]()
SWITCH_KEY = pytest.StashKey[List[Dict[str, Any]]]()
AB_KEY = pytest.StashKey[List[Dict[str, Any]]]()
OPENLOOP_KEY = pytest.StashKey[List[Dict[str, Any]]]()

#: Why the load generator's ceiling skips in an A/B run: it has no environment to compare.
AB_NOTHING_TO_COMPARE = ("not measured in an A/B run: the load generator's ceiling runs no code of either "
                         "environment (select the suite's test_echo.py, test_switch.py or test_zmq.py)")
SERVER_REPORTED_KEY = pytest.StashKey[bool]()
CALL_FAILED_KEY = pytest.StashKey[bool]()


# ---- session fixtures -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def pcb_settings(pytestconfig: pytest.Config) -> Settings:
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def pcb_speed_gauge(pcb_settings: Settings) -> Optional[instruments.SpeedGauge]:
    """Times a fixed loop on the two pinned CPUs around each round: a round measured in one of
    the host's slow spells is noisy (see instruments.SpeedGauge)."""
    cpus = pcb_settings.cpus
    return instruments.SpeedGauge(cpus).warm() if cpus else None


@pytest.fixture(scope="session")
def pcb_probe_baseline(pcb_settings: Settings) -> Optional[float]:
    """The quiet machine's cache-line round trip between the two pinned CPUs (the lowest of
    a few probes), the reference each round's probes are judged against."""
    cpus = pcb_settings.cpus
    if not cpus:
        return None
    return min(instruments.cacheline_rtt(cpus[0], cpus[1], 50000) for _ in range(3))


@pytest.fixture(scope="session")
def pcb_libuv_pipe() -> None:
    """libuv opens one process-wide pipe (its signal lock) with the first uvloop loop and keeps
    it: open it once, before any test's fd-leak check starts counting."""
    try:
        import uvloop
    except Exception:  # not installed, or does not import on this Python: nothing to reserve
        return
    uvloop.new_event_loop().close()


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)  # one line, no traceback


def strict_reason(settings: Settings) -> str:
    """Why a run is strict, in a few words: the option that made it so."""
    source = settings.sources.get("strict", "default")
    return f"CI is set ({options.CI_ENV}={os.environ.get(options.CI_ENV, '')!r})" if source == "default" else source


def skip_missing(reason: str, settings: Settings) -> None:
    """A package or tool missing here: a skip, or in a strict run (--pcb-strict, on when CI is
    set) a failure with the same one line."""
    if settings.strict:
        _fail(f"{reason} [not skipped: strict run, {strict_reason(settings)}; --pcb-strict no allows the skip]")
    pytest.skip(reason)


def _call(fn: Callable[[], Any], skip: Tuple[type, ...], fail: Tuple[type, ...],
          prefix: str = "", typed: bool = False, settings: Optional[Settings] = None) -> Any:
    """fn(), with an exception in ``skip`` made a skip (a package or tool missing here; a
    failure in a strict run) and one in ``fail`` a failure (our own code broken included), each
    in one line: the pytest calls sit outside the except blocks, so no chained traceback."""
    skipped = failed = None
    try:
        return fn()
    except skip as exc:
        skipped = str(exc)
    except fail as exc:
        failed = f"{prefix}{type(exc).__name__}: {exc}" if typed else f"{prefix}{exc}"
    if skipped is not None:
        if settings is None:
            pytest.skip(skipped)
        skip_missing(skipped, settings)
    _fail(failed)


# ---- echo -----------------------------------------------------------------------------------

def _start_echo_server(case: EchoCase, settings: Settings, python: Optional[str] = None,
                       env: Optional[Dict[str, str]] = None, side: str = "",
                       netns: Optional[str] = None) -> harness.ServerProcess:
    cpus = settings.cpus
    kind = harness.PlainServer if case.plain else harness.ServerProcess
    extra: Dict[str, Any] = {}
    if netns is not None:
        extra["netns"] = netns
    if python is not None:
        extra["python"] = python
    if env:
        extra["env"] = env
    # Thread-per-connection models take seconds to wind down 10k threads on one CPU.
    if case.workers != 1:
        extra["workers"] = case.workers
    server_cpus = settings.server_cpus or (cpus[:1] if cpus else ())  # a set: the workers spread over it
    common = dict(transport=case.transport, cpu=server_cpus or None, malloc=case.malloc,
                  stop_timeout=max(10.0, case.connections / 500.0), **extra)
    if case.command is not None:  # a program the user brings (--pcb-server-cmd)
        server = harness.CommandServer(case.command, case.impl, ready_timeout=settings.server_ready_timeout,
                                       **common)
    else:
        server = kind(case.impl, **common)
    # not installed, not on PATH, not on this Python: a skip; ServerBroken (our own code): a failure.
    # In an A/B run, side A or B not having it is a failure: the comparison would be lost silently.
    where = f"A/B side {side.upper()}: " if side else ""
    skip = () if side else (harness.ServerUnavailable,)
    unsupported: List[str] = []

    def start() -> None:
        try:
            server.start()
        except harness.ServerUnsupported as exc:
            if side:
                raise  # in an A/B run a side that cannot is a lost comparison: a failure
            unsupported.append(str(exc))

    _call(start, skip, (harness.ServerError,), where, settings=settings)
    if unsupported:
        # the implementation as installed does not do this (nothing is missing): a skip, strict or not
        pytest.skip(unsupported[0])
    return server


#: Tasks (processes and threads) the rest of the machine is left when a server starts a thread
#: per connection.
PID_MARGIN = 2000


def _pid_max() -> int:
    """kernel.pid_max: how many tasks the kernel numbers at most (0 when unreadable)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


@pytest.fixture
def echo_servers(request: pytest.FixtureRequest, echo_case: EchoCase,
                 pcb_settings: Settings) -> Dict[str, harness.ServerProcess]:
    """The server processes under test for this case, pinned to the server CPU: {"": one} in a
    normal run, {"a": A's, "b": B's} in an interleaved A/B run (--pcb-ab-a/--pcb-ab-b).  A case
    over a simulated network (--pcb-network netns...) gets a network namespace of its own, the
    server in it, removed after the server stopped; what it needs missing here is a skip."""
    per_process = loadgen.max_connections()
    if echo_case.connections > per_process * echo_case.workers:
        # the run's own settings, not something missing here: a skip even in a strict run
        need = -(-echo_case.connections // per_process)
        one = servers.one_process(echo_case.impl) or echo_case.plain or echo_case.command is not None
        pytest.skip(f"{echo_case.id}: {echo_case.connections} connections do not fit in "
                    f"{echo_case.workers} server process{'es' if echo_case.workers > 1 else ''} (one holds at most "
                    f"{per_process} sockets here)"
                    + (": it runs as one process only" if one else f": needs --pcb-workers {need} or more"))
    tasks = _pid_max()
    if echo_case.impl in servers.THREAD_PER_CONNECTION and tasks and echo_case.connections > tasks - PID_MARGIN:
        pytest.skip(f"{echo_case.id}: a thread per connection needs {echo_case.connections} threads, and this kernel "
                    f"numbers at most {tasks} tasks in all (kernel.pid_max)")
    # past one process's sockets the load runs in several engine processes (pyconcbench.engines)
    _call(lambda: loadgen.ensure_fd_limit(min(echo_case.connections, per_process)), (),
          (loadgen.FdLimitError,))
    started: Dict[str, harness.ServerProcess] = {}
    namespace: Optional[netsim.Namespace] = None
    try:
        if not echo_case.network.local:
            namespace = _call(netsim.Namespace(echo_case.network).create, (netsim.NetworkUnavailable,),
                              (netsim.NetworkError,), f"{echo_case.id}: ", settings=pcb_settings)
        if pcb_settings.ab is None:
            started[""] = _start_echo_server(echo_case, pcb_settings,
                                             netns=namespace.path if namespace is not None else None)
        else:
            for side, environment in pcb_settings.ab.items():
                started[side] = _start_echo_server(echo_case, pcb_settings, environment.python,
                                                   environment.env, side)
        yield started
    finally:
        failure = None
        for side, server in started.items():
            try:
                server.stop()
            except harness.ServerError as exc:
                # once per test: not again when the test itself already failed on it
                if failure is None and not (request.node.stash.get(SERVER_REPORTED_KEY, False)
                                            or request.node.stash.get(CALL_FAILED_KEY, False)):
                    failure = f"{echo_case.id}: " + (f"A/B side {side.upper()}: " if side else "") + str(exc)
        if namespace is not None:
            try:
                namespace.remove()
            except netsim.NetworkError as exc:
                failure = failure or f"{echo_case.id}: {exc}"
        if failure is not None:
            _fail(failure)


@pytest.fixture
def echo_server(echo_servers: Dict[str, harness.ServerProcess], pcb_settings: Settings) -> harness.ServerProcess:
    """The one server process under test for this case (a normal run's; an A/B run has two:
    ask for echo_servers)."""
    if "" not in echo_servers:
        _fail("this test uses echo_server, the one server of a normal run; an A/B run starts two "
              "(echo_servers)")
    return echo_servers[""]


@dataclass
class EchoRun:
    """What echo_bench measured: ``sides`` maps "" (a normal run) or "a"/"b" (an A/B run) to
    (EchoOutcome, the server it measured); ``ab`` is the A/B outcome, or None."""

    sides: Dict[str, Tuple[EchoOutcome, harness.ServerProcess]]
    ab: Optional[Any] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # what was saved as extra_info


def _load_failure(request: pytest.FixtureRequest, case_id: str, servers_: Dict[str, harness.ServerProcess],
                  exc: loadgen.LoadError) -> str:
    """A load that failed, in one line: the server's death when one died during it (then said
    once: the teardown does not repeat it), else the load's own error."""
    for side, server in servers_.items():
        try:
            server.check_alive()
        except harness.ServerError as died:
            request.node.stash[SERVER_REPORTED_KEY] = True
            where = f"A/B side {side.upper()}: " if side else ""
            return f"{case_id}: {where}the server died during the load ({exc}): {died}"
    return f"{case_id}: {exc}"


@pytest.fixture
def echo_bench(request: pytest.FixtureRequest, benchmark: Any, echo_case: EchoCase,
               echo_servers: Dict[str, harness.ServerProcess], pcb_settings: Settings,
               pcb_probe_baseline: Optional[float],
               pcb_speed_gauge: Optional[instruments.SpeedGauge]) -> Callable[[], EchoRun]:
    """Call it to run the measured rounds; returns an EchoRun (the saved record in extra_info)."""

    def run() -> EchoRun:
        if pcb_settings.syscalls and echo.syscall_tool() is None:
            skip_missing("--pcb-syscalls needs perf (linux-perf) or strace on PATH", pcb_settings)
        if pcb_settings.ab is not None and pcb_settings.syscalls:
            _fail("--pcb-syscalls is not available in an A/B run: count syscalls in a normal run")
        failure = None
        result = None
        try:
            if pcb_settings.ab is None:
                server = echo_servers[""]
                runner = EchoRunner(pcb_settings, echo_case, server, pcb_probe_baseline, pcb_speed_gauge)
                outcome = runner.run(benchmark)
                result = EchoRun({"": (outcome, server)}, extra=outcome.extra)
            else:
                ab_runner = ab.ABRunner(pcb_settings, echo_case, echo_servers, pcb_settings.ab,
                                        pcb_probe_baseline, pcb_speed_gauge)
                out = ab_runner.run(benchmark)
                result = EchoRun({s: (out.sides[s], echo_servers[s]) for s in ab.SIDES}, out, out.extra)
        except ab.ABError as exc:
            failure = f"{echo_case.id}: {exc}"
        except loadgen.LoadError as exc:
            failure = _load_failure(request, echo_case.id, echo_servers, exc)
        except harness.ServerError as exc:
            failure = f"{echo_case.id}: {exc}"
            request.node.stash[SERVER_REPORTED_KEY] = True
        if failure is not None:
            _fail(failure)  # outside the except blocks: no chained traceback
        key = RESULTS_KEY if result.ab is None else AB_KEY
        request.config.stash[key].append(result.extra)
        return result

    return run


#: Why the open-loop family skips in an A/B run.
AB_OPENLOOP = ("not measured in an A/B run: the open-loop family compares implementations at a rate set by each "
               "one's own maximum (select the suite's test_echo.py, test_switch.py or test_zmq.py)")


@pytest.fixture
def openloop_bench(request: pytest.FixtureRequest, benchmark: Any, openloop_case: openloop.OpenLoopCase,
                   echo_servers: Dict[str, harness.ServerProcess], pcb_settings: Settings,
                   pcb_probe_baseline: Optional[float],
                   pcb_speed_gauge: Optional[instruments.SpeedGauge]) -> Callable[[], EchoOutcome]:
    """Call it to run an open-loop case's rounds; returns its EchoOutcome (extra_info saved)."""

    def run() -> EchoOutcome:
        if pcb_settings.ab is not None:
            pytest.skip(AB_OPENLOOP)
        server = echo_servers[""]
        failure = None
        outcome = None
        try:
            runner = openloop.OpenLoopRunner(pcb_settings, openloop_case, server, pcb_probe_baseline,
                                             pcb_speed_gauge)
            outcome = runner.run(benchmark)
        except loadgen.LoadError as exc:
            failure = _load_failure(request, openloop_case.id, echo_servers, exc)
        except harness.ServerError as exc:
            failure = f"{openloop_case.id}: {exc}"
            request.node.stash[SERVER_REPORTED_KEY] = True
        if failure is not None:
            _fail(failure)
        request.config.stash[OPENLOOP_KEY].append(outcome.extra)
        return outcome

    return run


@pytest.fixture
def ceiling_server(pcb_settings: Settings):
    """native_epoll, the server the ceiling is measured against."""
    cpus = pcb_settings.cpus
    with harness.ServerProcess("native_epoll", cpu=cpus[0] if cpus else None) as server:
        yield server


@pytest.fixture
def ceiling_bench(request: pytest.FixtureRequest, benchmark: Any, ceiling_connections: int,
                  ceiling_server: harness.ServerProcess, pcb_settings: Settings) -> Callable[[], Dict[str, Any]]:
    """Call it to measure the load generator's ceiling; returns the extra_info dict."""

    def run() -> Dict[str, Any]:
        if pcb_settings.ab is not None:
            pytest.skip(AB_NOTHING_TO_COMPARE)
        extra = _call(lambda: echo.run_ceiling(pcb_settings, ceiling_server, ceiling_connections,
                                               benchmark.pedantic),
                      (), (loadgen.LoadError, harness.ServerError), f"loadgen_ceiling c{ceiling_connections}: ")
        # pytest-benchmark keeps a reference to this very dict: update it, never rebind it.
        benchmark.extra_info.update(extra)
        request.config.stash[CEILING_KEY].append(dict(extra))
        return benchmark.extra_info

    return run


# ---- ZeroMQ and switch ---------------------------------------------------------------------------

def _ab_workers(request: pytest.FixtureRequest, benchmark: Any, settings: Settings, family: str, case: Any,
                case_rounds: int, job: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """An interleaved A/B run of a switch or ZeroMQ case: a worker per side (ab.PairedRunner);
    anything that goes wrong on a side, a package missing there included, is a one-line failure
    naming the side (the comparison would be lost silently as a skip)."""
    runner = ab.PairedRunner(settings, family, case, case_rounds, job)
    extra = _call(lambda: runner.run(benchmark), (), (ab.ABError,), f"{case.id}: ")
    request.config.stash[AB_KEY].append(extra)
    return benchmark.extra_info


@pytest.fixture
def zmq_bench(request: pytest.FixtureRequest, benchmark: Any, zmq_case: Any, pcb_settings: Settings,
              pcb_probe_baseline: Optional[float], pcb_speed_gauge: Optional[instruments.SpeedGauge],
              pcb_libuv_pipe: None) -> Callable[[], Dict[str, Any]]:
    """Call it to run the case's measured rounds; returns the extra_info dict.  A mode whose
    package is missing is a skip; one of our own modules that does not import, or a failed
    round, a failure (pyconcbench.zmq).  In an A/B run, the family "ab" record of a worker
    per side."""
    from .zmq.runner import Runner

    def run() -> Dict[str, Any]:
        cpus = pcb_settings.cpus
        if cpus is None and zmq_case.placement != pcbzmq.DEFAULT_PLACEMENT:
            pytest.skip(f"pinning off (--pcb-cpus none): the {zmq_case.placement} placement needs two CPUs")
        profile_rounds = options.PROFILES[pcb_settings.profile]().rounds
        if pcb_settings.ab is not None:
            job = {"requests": pcb_settings.messages or zmq_case.requests, "timeout": pcb_settings.stall_timeout,
                   "probe_baseline": pcb_probe_baseline}
            return _ab_workers(request, benchmark, pcb_settings, "zmq", zmq_case, profile_rounds, job)
        plan = pcb_settings.plan(profile_rounds)
        runner = Runner(zmq_case, requests=pcb_settings.messages or zmq_case.requests, plan=plan,
                        retries=pcb_settings.noise_retries, timeout=pcb_settings.stall_timeout, cpus=cpus,
                        probe_baseline=pcb_probe_baseline, speed=pcb_speed_gauge)
        # a package not installed or not importable here: a skip; our own module broken: a failure
        extra = _call(lambda: runner.run(benchmark.pedantic), (pcbzmq.Unavailable,),
                      (pcbzmq.RoundError, pcbzmq.Broken), f"{zmq_case.id}: ", settings=pcb_settings)
        benchmark.extra_info.update(extra)  # the very dict pytest-benchmark saves
        return benchmark.extra_info

    return run


@pytest.fixture
def switch_bench(request: pytest.FixtureRequest, benchmark: Any, switch_case: Any, pcb_settings: Settings,
                 pcb_libuv_pipe: None) -> Callable[[], Dict[str, Any]]:
    """Call it to measure the switch microbenchmark; returns the extra_info dict (a depth case
    also carries the fit over every depth of its kind measured so far).  A missing module or
    toolchain is a skip; Go baselines that do not build, or a failed workload, a failure.  In an
    A/B run, the family "ab" record of a worker per side."""

    def run() -> Dict[str, Any]:
        if pcb_settings.ab is not None:
            return _ab_workers(request, benchmark, pcb_settings, "switch", switch_case, switch_case.rounds)
        runner = micro.Runner(switch_case, pcb_settings.cpus)
        # not installed, not on PATH, one CPU: a skip; the Go baselines do not build: a failure
        _call(runner.check_available, (micro.Unavailable,), (micro.Broken,), f"{switch_case.id}: ",
              settings=pcb_settings)
        plan = pcb_settings.plan(switch_case.rounds)
        extra = _call(lambda: runner.run(benchmark.pedantic, plan=plan), (),
                      (micro.WorkloadError, OSError, RuntimeError), f"{switch_case.id}: ", typed=True)
        info = benchmark.extra_info  # the very dict pytest-benchmark saves
        info.update(extra)
        rows = request.config.stash[SWITCH_KEY]
        rows.append(info)
        if switch_case.depth is not None:
            micro.attach_depth_fit(switch_case, rows)
        return info

    return run
