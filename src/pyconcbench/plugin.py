"""pyconcbench's pytest plugin: options, the echo-benchmark fixtures, machine facts, summary.

Registered through the ``pytest11`` entry point.  Workloads and the harness know nothing of
pytest; this module only wires them to fixtures.

Settings come from the command line (``--pcb-*``), else the environment (``PCB_*``), else the
ini file (``pcb_*``), else the profile; a bad value names where it came from.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from . import gate, harness, loadgen, machine, plain, servers, syscalls
from .summary import ceiling_table, echo_table, size_label, syscall_table

# ---- settings ---------------------------------------------------------------------------

SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20,
              "mib": 1 << 20}


def parse_sizes(text: str) -> Tuple[int, ...]:
    """'64,1KiB,100k' -> (64, 1024, 102400); each 1 B .. 1 MiB."""
    out = []
    for part in _items(text):
        m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", part)
        if not m or m.group(2).lower() not in SIZE_UNITS:
            raise ValueError(f"{part!r} is not a size (e.g. 64, 64B, 1KiB, 100KiB, 1MiB)")
        size = int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]
        if not 1 <= size <= loadgen.MAX_SIZE:
            raise ValueError(f"{part!r} is outside 1 B .. 1 MiB")
        out.append(size)
    return tuple(out)


def parse_counts(text: str) -> Tuple[int, ...]:
    """'10,100,1k,max' -> connection counts; 'max' is the most the fd limit allows."""
    out = []
    for part in _items(text):
        if part.lower() == "max":
            out.append(loadgen.max_connections())
            continue
        m = re.fullmatch(r"(\d+)([kK]?)", part)
        if not m:
            raise ValueError(f"{part!r} is not a connection count (e.g. 10, 1k, max)")
        n = int(m.group(1)) * (1000 if m.group(2) else 1)
        if n < 1:
            raise ValueError(f"{part!r}: need at least 1 connection")
        out.append(n)
    return tuple(out)


def parse_impls(text: str) -> Tuple[str, ...]:
    out = []
    for part in _items(text):
        if part == "all":
            out.extend(servers.IMPLS)
        elif part in servers.IMPLS:
            out.append(part)
        else:
            raise ValueError(f"unknown implementation {part!r}; known: {', '.join(servers.IMPLS)}")
    return tuple(dict.fromkeys(out))


def parse_transports(text: str) -> Tuple[str, ...]:
    out = _items(text)
    for part in out:
        if part not in ("tcp", "unix"):
            raise ValueError(f"{part!r} is not a transport (tcp, unix)")
    return tuple(dict.fromkeys(out))


def parse_cpus(text: str) -> Optional[Tuple[int, int]]:
    """'0,1' -> (server CPU, load-generator CPU); 'none' turns pinning off."""
    if text.strip().lower() in ("none", "off"):
        return None
    parts = _items(text)
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not SERVER_CPU,LOADGEN_CPU (e.g. 0,1) or 'none'")
    server, load = int(parts[0]), int(parts[1])
    allowed = sorted(os.sched_getaffinity(0))
    for cpu in (server, load):
        if cpu not in allowed:
            raise ValueError(f"CPU {cpu} is not available to this process (allowed: {allowed})")
    if server == load:
        raise ValueError(f"server and load generator on the same CPU {server}: give two CPUs or 'none'")
    return server, load


def parse_positive_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise ValueError(f"{text!r} is not a whole number >= 1")
    return int(text)


def parse_seconds(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{text!r} must be > 0 seconds")
    return value


def parse_mallocs(text: str) -> Tuple[str, ...]:
    out = _items(text)
    for part in out:
        if part == "default":
            raise ValueError("'default' is gone: the default state is now 'representative' (a server that has "
                             "seen clients disconnect); the old default is 'pristine'")
        if part not in harness.MALLOC_STATES:
            raise ValueError(f"{part!r} is not an allocator state ({', '.join(harness.MALLOC_STATES)})")
    return tuple(dict.fromkeys(out))


def parse_reference(text: str) -> str:
    value = text.strip().lower()
    if value not in REFERENCE_MODES:
        raise ValueError(f"{text!r} is not one of {', '.join(REFERENCE_MODES)}")
    return value


#: Where the plain reference servers run: ``auto`` at 100 connections x 64 B over TCP, ``all``
#: at every case, ``none`` nowhere.
REFERENCE_MODES = ("auto", "all", "none")

def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off", ""):
        return False
    raise ValueError(f"{text!r} is not yes or no")


def parse_fail_on(text: str) -> str:
    """Checks a fail-on expression (see pyconcbench.gate); keeps its text."""
    try:
        gate.parse_fail_on(text)
    except gate.GateSpecError as exc:
        raise ValueError(str(exc)) from None
    return text


def parse_alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a significance level such as 0.05, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise ValueError(f"the significance level must be between 0 and 1, got {text!r}")
    return value


def parse_profile(text: str) -> str:
    if text not in PROFILES:
        raise ValueError(f"{text!r} is not a profile ({', '.join(PROFILES)})")
    return text


def _items(text: str) -> List[str]:
    items = [p.strip() for p in str(text).split(",") if p.strip()]
    if not items:
        raise ValueError(f"{text!r} is empty")
    return items


@dataclass(frozen=True)
class Profile:
    """A benchmark matrix: (connections, size, transport) cases, and the round sizes.
    ``variants``: (impl, connections, size, transport, allocator state) cases run besides the
    matrix when --pcb-malloc is not given, to show what a special state costs."""

    cases: Tuple[Tuple[int, int, str], ...]
    rounds: int
    min_messages: int
    variants: Tuple[Tuple[str, int, int, str, str], ...] = ()

    def messages_for(self, connections: int, size: int) -> int:
        """Round trips per round: ~20 per connection (fewer from 3,000 connections on, where
        the slowest models manage a few hundred a second), and large messages capped near
        256 MiB of payload per round."""
        per = per_connection(connections)
        n = max(self.min_messages, per * connections)
        if size > 1024:
            n = max(per * connections, min(n, (256 << 20) // size))
        return n

    def rounds_for(self, connections: int) -> int:
        """Measured rounds: the profile's, at most 3 from 3,000 connections on."""
        return self.rounds if connections < 3000 else min(self.rounds, 3)


def per_connection(connections: int) -> int:
    """Round trips each connection makes per round (and, times 1/5, in the warm-up)."""
    if connections < 3000:
        return 20
    return 5 if connections < 10_000 else 2


def _profile_quick() -> Profile:
    # UNIX sockets at 100 connections: ~1.4 us of kernel work per send+recv against ~6 us for
    # loopback TCP, so the concurrency model's own cost shows far more clearly.
    cases = tuple((c, 64, "tcp") for c in (10, 100, 1000)) + ((100, 64, "unix"),)
    return Profile(cases=cases, rounds=5, min_messages=20_000, variants=PRISTINE_VARIANTS)


def _profile_full() -> Profile:
    counts = [10, 32, 100, 316, 1000, 3000, 10000]
    top = loadgen.max_connections()
    counts = [c for c in counts if c <= top]
    if top > counts[-1]:
        counts.append(top)
    cases = [(c, 64, "tcp") for c in counts]
    cases += [(10, s, "tcp") for s in (1024, 10 * 1024, 100 * 1024)]
    cases += [(c, 64, "unix") for c in (10, 100)]
    return Profile(cases=tuple(cases), rounds=7, min_messages=50_000, variants=PRISTINE_VARIANTS)


#: The allocator-sensitive implementations, shown also in the pristine state at 100 connections,
#: 64 B over TCP: those that receive into a fresh 256 KiB buffer per read (asyncio's selector
#: transport) make an mmap, an mremap and a munmap per round trip when pristine.  Measured for
#: every implementation (docs/representative.md); the others make none in either state.
PRISTINE_VARIANTS = tuple((impl, 100, 64, "tcp", "pristine")
                          for impl in ("asyncio_protocol", "asyncio_streams", "anyio"))


PROFILES: Dict[str, Callable[[], Profile]] = {"quick": _profile_quick, "full": _profile_full}

# name -> (parser, default, help, metavar); the CLI option is --pcb-NAME, the environment
# variable PCB_NAME, the ini key pcb_NAME (dashes become underscores).
OPTIONS: Dict[str, Tuple[Callable[[str], Any], Optional[str], str, str]] = {
    "profile": (parse_profile, "quick", "benchmark matrix: quick (minutes) or full (the studies' matrix)", "NAME"),
    "impl": (parse_impls, "all", "implementations to run, comma-separated, or 'all'", "IDS"),
    "conns": (parse_counts, None, "connection counts, e.g. 10,100,1k,max (default: the profile's matrix; "
              "given conns, size and transport make a product, 64 B and tcp where not given)", "COUNTS"),
    "size": (parse_sizes, None, "message sizes, e.g. 64,1KiB,100KiB (default: the profile's)", "SIZES"),
    "transport": (parse_transports, None, "tcp, unix or both (default: the profile's)", "LIST"),
    "messages": (parse_positive_int, None, "round trips per round (default: by profile and scale)", "N"),
    "duration": (parse_seconds, None, "seconds per round instead of a fixed number of round trips", "SECONDS"),
    "rounds": (parse_positive_int, None, "measured rounds per benchmark (default: the profile's: quick 5, "
               "full 7, 3 from 3,000 connections on)", "N"),
    "cpus": (parse_cpus, None, "SERVER_CPU,LOADGEN_CPU to pin to, or 'none' (default: 0,1, or the "
             "first two CPUs this process may use; pinning off with only one)", "A,B"),
    "malloc": (parse_mallocs, None, "allocator states to measure each server in: representative (it has "
               "seen clients disconnect, as any server in use has), pristine (never: glibc then maps and "
               "unmaps asyncio's 256 KiB receive buffer per read), tuned (representative with glibc's "
               "thresholds fixed by MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_); other than "
               "representative adds -malloc_STATE to the test id (default: representative, plus the "
               "profile's pristine variants)", "LIST"),
    "reference": (parse_reference, "auto", "where the plain reference servers (pyconcbench.plain) run beside "
                  "their project counterparts: auto (100 connections, 64 B, TCP), all (every case), none", "WHERE"),
    "syscalls": (parse_bool, "no", "count the server's syscalls and context switches per round trip "
                 "(perf, else strace; slows the server)", "yes|no"),
    "noise-retries": (parse_positive_int, "3", "how often a noisy round is measured again", "N"),
    "stall-timeout": (parse_seconds, "10", "fail a round when no round trip completes for this long", "SECONDS"),
    "fail-on": (parse_fail_on, None, "regression gate against --benchmark-compare's baseline: comma-separated "
                "[SCOPE@]METRIC:THRESHOLD, e.g. 'msgs_per_s:-10%%,latency_p99:+25%%' (see pyconcbench.gate); "
                "a regression fails its test item", "EXPR"),
    "fail-alpha": (parse_alpha, "0.05", "significance level of the gate's one-sided Mann-Whitney U test "
                   "over the per-round samples", "P"),
    "gate-markdown": (str, None, "append the gate's Markdown summary to this file (e.g. $GITHUB_STEP_SUMMARY)",
                      "FILE"),
    "allow-machine-change": (parse_bool, "no", "gate even when the baseline's CPU model, CPU count, kernel "
                             "or Python differ from this machine's", "yes|no"),
}


@dataclass(frozen=True)
class Settings:
    profile: str
    impls: Tuple[str, ...]
    cases: Tuple[Tuple[int, int, str], ...]
    messages: Optional[int]
    duration: Optional[float]
    rounds: Optional[int]  # None: the profile's, by scale
    cpus: Optional[Tuple[int, int]]
    noise_retries: int
    stall_timeout: float
    mallocs: Tuple[str, ...] = ("representative",)
    variants: Tuple[Tuple[str, int, int, str, str], ...] = ()
    reference: str = "auto"
    syscalls: bool = False
    fail_on: Optional[str] = None
    fail_alpha: float = 0.05
    gate_markdown: Optional[str] = None
    allow_machine_change: bool = False
    pinning_note: str = ""
    sources: Dict[str, str] = field(default_factory=dict)


def _raw_setting(config: pytest.Config, name: str) -> Tuple[Optional[str], str]:
    dest = "pcb_" + name.replace("-", "_")
    value = config.getoption(dest, default=None)
    if value is not None:
        return str(value), f"--pcb-{name}"
    env = "PCB_" + name.replace("-", "_").upper()
    if os.environ.get(env, "") != "":
        return os.environ[env], f"{env} (environment)"
    ini = config.getini(dest)
    if ini:
        return str(ini), f"{dest} (ini)"
    return None, "default"


def resolve_settings(config: pytest.Config) -> Settings:
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for name, (parser, default, _, _) in OPTIONS.items():
        raw, source = _raw_setting(config, name)
        if raw is None:
            raw = default
        sources[name] = source
        if raw is None:
            values[name] = None
            continue
        try:
            values[name] = parser(raw)
        except ValueError as exc:
            raise pytest.UsageError(f"{source}: {exc}") from None
    if values["messages"] is not None and values["duration"] is not None:
        raise pytest.UsageError("--pcb-messages and --pcb-duration exclude each other: give one")
    profile = PROFILES[values["profile"]]()
    cases = list(profile.cases)
    conns, sizes, transports = values["conns"], values["size"], values["transport"]
    if conns or sizes or transports:
        # The given dimensions make a product; a dimension not given is the profile's
        # connection counts, 64 B, TCP.
        cases = list(itertools.product(
            conns or [c for c, s, t in profile.cases if (s, t) == (64, "tcp")],
            sizes or (64,),
            transports or ("tcp",),
        ))
    top = loadgen.max_connections()
    too_many = [c for c, _, _ in cases if c > top]
    if too_many:
        raise pytest.UsageError(
            f"{sources['conns']}: {too_many[0]} connections do not fit: one process holds at most "
            f"{top} sockets here (ulimit -n hard limit {loadgen.fd_limit()[1]}); use 'max'")
    cpus = values["cpus"]
    if cpus is None:
        note = f"pinning off ({sources['cpus']})"
    else:
        note = "server on CPU %d, load generator on CPU %d" % cpus
    if sources["cpus"] == "default":
        # The default 0,1 adapts to the CPUs this process may use; an explicit value does not.
        plan = harness.pinning_plan()
        cpus = None if plan.server_cpu is None else (plan.server_cpu, plan.load_cpu)
        note = plan.note
    return Settings(
        profile=values["profile"],
        impls=values["impl"],
        cases=tuple(dict.fromkeys(cases)),
        messages=values["messages"],
        duration=values["duration"],
        rounds=values["rounds"],
        cpus=cpus,
        noise_retries=values["noise-retries"],
        stall_timeout=values["stall-timeout"],
        mallocs=values["malloc"] or (harness.MALLOC_DEFAULT,),
        # the profile's variants only when the states were not chosen, and only at its cases
        variants=() if values["malloc"] else tuple(
            v for v in profile.variants if v[0] in values["impl"] and v[1:4] in cases),
        reference=values["reference"],
        syscalls=values["syscalls"],
        fail_on=values["fail-on"],
        fail_alpha=values["fail-alpha"],
        gate_markdown=values["gate-markdown"],
        allow_machine_change=values["allow-machine-change"],
        pinning_note=note,
        sources=sources,
    )


SETTINGS_KEY = pytest.StashKey[Settings]()
RESULTS_KEY = pytest.StashKey[List[Dict[str, Any]]]()
CEILING_KEY = pytest.StashKey[List[Dict[str, Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pyconcbench", "pyconcbench (echo benchmarks)")
    for name, (_, default, help_text, metavar) in OPTIONS.items():
        dest = "pcb_" + name.replace("-", "_")
        env = "PCB_" + name.replace("-", "_").upper()
        group.addoption(f"--pcb-{name}", dest=dest, metavar=metavar, default=None,
                        help=f"{help_text}; env {env}, ini {dest}. Default: {default!r}")
        parser.addini(dest, help="pyconcbench: " + help_text.replace("%%", "%"), default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pcb_fail_on(expr): this test's own regression-gate thresholds, e.g. "
                   "pcb_fail_on('latency_p99:+50%'); wins over --pcb-fail-on")
    if config.option.help:
        return
    settings = config.stash[SETTINGS_KEY] = resolve_settings(config)
    config.stash[RESULTS_KEY] = []
    config.stash[CEILING_KEY] = []
    if settings.fail_on:
        config.pluginmanager.register(GatePlugin(config, settings), GatePlugin.NAME)


def pytest_report_header(config: pytest.Config) -> List[str]:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return []
    rounds = settings.rounds or "the profile's"
    return [f"pyconcbench: profile {settings.profile}, {rounds} rounds, {settings.pinning_note}"]


# ---- cases ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EchoCase:
    """One echo benchmark.  ``plain``: the plain reference server of ``impl``
    (``pyconcbench.plain``) instead of the project's; ``count_alloc``: count the server's
    allocator syscalls in one untimed round after the measured ones (set where a run compares
    allocator states)."""

    impl: str
    connections: int
    size: int
    transport: str
    malloc: str = harness.MALLOC_DEFAULT
    plain: bool = False
    count_alloc: bool = field(default=False, compare=False)

    @property
    def scale(self) -> str:
        label = f"c{self.connections}-{size_label(self.size)}"
        return label if self.transport == "tcp" else label + "-unix"

    @property
    def id(self) -> str:
        """Baseline key: ``[plain_]impl-cN-SIZE[-unix][-malloc_STATE]``."""
        suffix = "" if self.malloc == harness.MALLOC_DEFAULT else f"-malloc_{self.malloc}"
        prefix = plain.PREFIX if self.plain else ""
        return f"{prefix}{self.impl}-{self.scale}{suffix}"

    @property
    def label(self) -> str:
        """The implementation as the summary table names it: ``impl[+plain][+STATE_malloc]``."""
        label = self.impl + ("+plain" if self.plain else "")
        return label if self.malloc == harness.MALLOC_DEFAULT else f"{label}+{self.malloc}_malloc"

    @property
    def counterpart(self) -> Optional["EchoCase"]:
        """The case this one is compared with: a plain server's project counterpart, a special
        allocator state's representative one; None for a representative project case."""
        if self.plain:
            return dataclasses.replace(self, plain=False)
        if self.malloc != harness.MALLOC_DEFAULT:
            return dataclasses.replace(self, malloc=harness.MALLOC_DEFAULT)
        return None

    @property
    def group(self) -> str:
        return f"echo-{self.scale}"


def echo_cases(settings: Settings) -> List[EchoCase]:
    """Every echo case of a run, in the order measured: per scale, each implementation in each
    allocator state, then (where --pcb-reference puts one) its plain reference server, so that a
    server and what it is compared with run back to back."""
    out: List[EchoCase] = []
    for conns, size, transport in settings.cases:
        reference = settings.reference == "all" or (settings.reference == "auto" and (conns, size, transport) == (100, 64, "tcp"))
        for impl in settings.impls:
            mallocs = list(settings.mallocs) + [v[4] for v in settings.variants
                                                if (v[0], v[1], v[2], v[3]) == (impl, conns, size, transport)]
            mallocs = list(dict.fromkeys(mallocs))
            for malloc in mallocs:
                out.append(EchoCase(impl, conns, size, transport, malloc))
            if reference and impl in plain.PLAIN:
                out += [EchoCase(impl, conns, size, transport, malloc, plain=True)
                        for malloc in mallocs if malloc != "tuned"]
    # Where a run compares allocator states of a server, count their allocator syscalls.
    states: Dict[Tuple[str, int, int, str], int] = {}
    for case in out:
        key = (case.impl, case.connections, case.size, case.transport)
        states[key] = states.get(key, 0) + (not case.plain)
    return [dataclasses.replace(c, count_alloc=states[(c.impl, c.connections, c.size, c.transport)] > 1)
            for c in out]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "echo_case" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash[SETTINGS_KEY]
    metafunc.parametrize("echo_case", [
        pytest.param(case, id=case.id, marks=pytest.mark.benchmark(group=case.group, timer=ROUND_CLOCK))
        for case in echo_cases(settings)])


# ---- the measured round -----------------------------------------------------------------

class RoundClock:
    """The timer pytest-benchmark reads around each round: ``perf_counter`` less the time
    spent probing the machine and measuring rounds that were rejected as noisy.  A round's
    duration is therefore the wall time of the one accepted load phase of N round trips."""

    __name__ = "round_clock"
    __module__ = "pyconcbench.plugin"

    def __init__(self) -> None:
        self.excluded = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.excluded


ROUND_CLOCK = RoundClock()

#: A round is noisy when the cache-line probe exceeds both of these ...
PROBE_NOISY_FACTOR = 2.0
PROBE_NOISY_MARGIN_NS = 150.0
#: ... or other processes used more than this share of one CPU during it.
OTHER_CPU_NOISY_SHARE = 0.25
#: Clock ticks of server CPU needed before its user/system split is reported.
MIN_TICKS_FOR_SPLIT = 20


def noise_reason(speed: Optional[machine.SpeedGauge], speed_probes: Tuple[Any, ...],
                 probe_baseline: Optional[float], probes: Tuple[Optional[float], ...],
                 other_cpu: Optional[float], elapsed: float) -> str:
    """Why a measured round (echo or ZeroMQ) is noisy, or '': a slow spell of either pinned CPU
    in the speed probes around it, the cache-line round trip far above the quiet machine's, or
    other processes busy during it."""
    if speed is not None:
        slow = speed.judge(*speed_probes)
        if slow:
            return slow
    worst = max((p for p in probes if p is not None), default=None)
    if probe_baseline and worst is not None:
        limit = max(probe_baseline * PROBE_NOISY_FACTOR, probe_baseline + PROBE_NOISY_MARGIN_NS)
        if worst > limit:
            return f"cache-line probe {worst:.0f} ns > {limit:.0f} ns"
    tick = 1.0 / machine.CLK_TCK
    if other_cpu is not None and elapsed > 0 and other_cpu - 2 * tick > OTHER_CPU_NOISY_SHARE * elapsed:
        return f"other processes used {other_cpu / elapsed:.0%} of a CPU"
    return ""


def retry_pause(attempt: int) -> None:
    """Before measuring a noisy round again: a slow spell of the host lasts seconds, so wait a
    little longer each time."""
    if attempt:
        time.sleep(min(2.0, 0.5 * attempt))


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
    speed_before: Optional[Dict[int, float]] = None  # cpu -> loop time / the best seen
    speed_after: Optional[Dict[int, float]] = None


class EchoRunner:
    """Runs the measured rounds of one echo case against a started server."""

    def __init__(self, settings: Settings, case: EchoCase, server: harness.ServerProcess,
                 probe_baseline: Optional[float], speed: Optional[machine.SpeedGauge] = None):
        self.settings = settings
        self.speed = speed
        self.case = case
        self.server = server
        self.probe_baseline = probe_baseline
        self.records: List[RoundRecord] = []
        self.rejected: List[RoundRecord] = []
        cpus = settings.cpus
        if settings.duration:
            messages, duration = 0, settings.duration
        else:
            messages = settings.messages or PROFILES[settings.profile]().messages_for(case.connections, case.size)
            duration = 0.0
        self.messages = messages
        profile = PROFILES[settings.profile]()
        self.rounds = settings.rounds or profile.rounds_for(case.connections)
        address = server.address
        common = dict(
            connections=case.connections, size=case.size, messages=messages, duration=duration,
            warmup_messages=max(2000, per_connection(case.connections) * case.connections // 5) if messages else 0,
            warmup_seconds=0.0 if messages else min(1.0, duration),
            cpu=cpus[1] if cpus else None, stall_timeout=settings.stall_timeout,
            connect_timeout=max(30.0, case.connections / 200.0),
            # a hard bound on each phase: slower than 100 round trips a second is a failure
            deadline=max(120.0, 10 * settings.stall_timeout, 2 * duration + 60, messages / 100.0),
        )
        if case.transport == "unix":
            self.spec = loadgen.LoadSpec(transport="unix", path=address, **common)
        else:
            self.spec = loadgen.LoadSpec(transport="tcp", host=address[0], port=address[1], **common)

    def _probe(self) -> Optional[float]:
        cpus = self.settings.cpus
        return machine.cacheline_rtt(cpus[0], cpus[1]) if cpus else None

    def _judge(self, rec: RoundRecord, speed_probes: Tuple[Any, ...] = ()) -> str:
        return noise_reason(self.speed, speed_probes, self.probe_baseline, (rec.probe_before, rec.probe_after),
                            rec.other_cpu, rec.result.elapsed)

    def one_round(self, session: loadgen.LoadSession) -> None:
        """The function pytest-benchmark times: measures until a round is clean (at most
        noise_retries extra tries); only the accepted phase's wall time counts."""
        entered = time.perf_counter()
        for attempt in range(self.settings.noise_retries + 1):
            retry_pause(attempt)
            speed_before = self.speed.probe() if self.speed is not None else None
            probe_before = self._probe()
            self.server.check_alive()
            before = machine.snapshot(self.server.measured_pid)
            started = time.perf_counter()
            result = session.round()
            finished = time.perf_counter()
            after = machine.snapshot(self.server.measured_pid)
            if before.server_runtime is None or after.server_runtime is None:
                self.server.check_alive()
                raise harness.ServerError(
                    f"cannot read server {self.case.impl!r}'s CPU time from "
                    f"/proc/{self.server.measured_pid}/task/*/schedstat: its CPU per message would be unknown")
            probe_after = self._probe()
            speed_after = self.speed.probe() if self.speed is not None else None
            rec = RoundRecord(
                result=result,
                server_cpu=after.server_runtime - before.server_runtime,
                server_user=after.server_user - before.server_user,
                server_sys=after.server_sys - before.server_sys,
                other_cpu=after.other_since(before),
                probe_before=probe_before, probe_after=probe_after, noisy="", attempt=attempt,
            )
            rec.noisy = self._judge(rec, (speed_before, speed_after))
            if self.speed is not None:
                rec.speed_before = self.speed.slowdown(speed_before)
                rec.speed_after = self.speed.slowdown(speed_after)
            if not rec.noisy or attempt == self.settings.noise_retries:
                self.records.append(rec)
                ROUND_CLOCK.excluded += (time.perf_counter() - entered) - (finished - started)
                return
            self.rejected.append(rec)

    def count_allocator(self, session: loadgen.LoadSession) -> Dict[str, Any]:
        """The server's allocator syscalls per round trip over one extra round after the
        measured ones (untimed: perf's tracepoints slow the calls they count), to show the
        state it ran in; ``alloc_syscalls_per_msg`` is None with the reason when it cannot count."""
        tool = _syscall_tool_cached()
        if tool is None:
            return {"alloc_syscalls_per_msg": None,
                    "alloc_syscalls_note": "not counted: needs perf (linux-perf) or strace on PATH"}
        counter = syscalls.SyscallCounter(self.server.measured_pid, tool, names=syscalls.ALLOCATOR).start()
        try:
            result = session.round()
        finally:
            counts = counter.stop()
        per = {name: round(counts.get(name, 0) / result.completed, 3) for name in syscalls.ALLOCATOR}
        per["total"] = round(counts.get("total", 0) / result.completed, 3)
        return {"alloc_syscalls_per_msg": per,
                "alloc_syscalls_note": f"counted with {tool} over one extra, untimed round of "
                                       f"{result.completed} round trips after the measured ones"}

    def run(self, benchmark: Any) -> "EchoOutcome":
        counts = None
        with loadgen.LoadSession(self.spec) as session:
            counter = None
            if self.settings.syscalls:
                counter = syscalls.SyscallCounter(self.server.measured_pid).start()
            try:
                benchmark.pedantic(self.one_round, args=(session,), rounds=self.rounds,
                                   iterations=1, warmup_rounds=0)
            finally:
                if counter is not None:
                    counts = counter.stop()
            alloc = self.count_allocator(session) if self.case.count_alloc else None
        outcome = EchoOutcome.from_records(self, session.connect_seconds)
        if alloc is not None:
            outcome.extra.update(alloc)
        if counts is not None:
            # every round trip in the counted window, rejected noisy rounds included
            messages = sum(r.result.completed for r in self.records + self.rejected)
            outcome.extra["syscalls_tool"] = counter.tool
            outcome.extra["syscalls_per_msg"] = syscalls.per_message(counts, messages)
            outcome.extra["syscalls_note"] = "counted with tracing on: rates are lower than without"
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
        recs = runner.records
        results = [r.result for r in recs]
        completed = sum(r.completed for r in results)
        elapsed = sum(r.elapsed for r in results)
        errors: Dict[str, int] = {}
        for r in results:
            for kind, n in r.errors.items():
                if n:
                    errors[kind] = errors.get(kind, 0) + n
        pct = loadgen.merge_percentiles([r.latency_buckets for r in results],
                                        maximum=max(r.latency["max"] for r in results))
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
        extra: Dict[str, Any] = {
            "impl": case.impl,
            "label": case.label,
            "malloc": case.malloc,
            "plain": case.plain,
            "malloc_probe_at_start": (server.ready or {}).get("malloc_probe"),
            "connections": case.connections,
            "size": case.size,
            "transport": case.transport,
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
            "fairness_jain": _sig(min(r.fairness.jain for r in results)),
            "fairness_min": min(r.fairness.min for r in results),
            "fairness_max": max(r.fairness.max for r in results),
            "starving_connections": max(r.fairness.starving for r in results),
            "errors": errors,
            "connect_seconds": round(connect_seconds, 4),
            "connect_rate": round(case.connections / connect_seconds, 1) if connect_seconds else 0.0,
            "loadgen_cpu_share": round(l_cpu / elapsed, 3) if elapsed else 0.0,
            "loadgen_bound": any(r.loadgen_bound for r in results),
            "server_cpu": round(s_cpu, 6),
            "server_cpu_user": None if s_user is None else round(s_user, 6),
            "server_cpu_sys": None if s_sys is None else round(s_sys, 6),
            "server_cpu_share": round(s_cpu / elapsed, 3) if elapsed else 0.0,
            "server_user_share": None if user_share is None else round(user_share, 3),
            "server_cpu_us_per_msg": round(s_cpu / completed * 1e6, 3) if completed else None,
            "loadgen_cpu_us_per_msg": round(l_cpu / completed * 1e6, 3) if completed else None,
            "server_rss_kib": machine.proc_status_kib(server.measured_pid, "VmRSS"),
            "server_rss_peak_kib": machine.proc_status_kib(server.measured_pid, "VmHWM"),
            "pinning": runner.settings.pinning_note,
            "probe_baseline_ns": runner.probe_baseline,
            "cpu_speed_best_ns": ({str(c): round(v) for c, v in runner.speed.best.items()}
                                  if runner.speed is not None else None),
            "noise_rule": (f"a round is noisy when a fixed loop ran > {machine.SPEED_NOISY_FACTOR}x slower than "
                           f"its best on either pinned CPU, or the cache-line probe exceeded the larger of "
                           f"{PROBE_NOISY_FACTOR}x its quiet value and the quiet value + "
                           f"{PROBE_NOISY_MARGIN_NS:.0f} ns, or other processes used > "
                           f"{OTHER_CPU_NOISY_SHARE:.0%} of a CPU beyond two clock ticks; it is measured again up to "
                           f"{runner.settings.noise_retries} times, waiting 0.5 s more each time"),
            # /proc/stat unreadable: the other-CPU part of the noise judge did not run; say so
            "other_cpu_check": ("unknown: /proc/stat was unreadable" if any(r.other_cpu is None for r in recs)
                                else "ran"),
            "noisy_rounds_rejected": len(runner.rejected),
            "noisy_rounds_kept": sum(1 for r in recs if r.noisy),
            "timer": "wall time of the accepted load phase (perf_counter less probes and rejected noisy rounds)",
            "rounds": [_round_dict(r) for r in recs],
            "rejected_rounds": [_round_dict(r) for r in runner.rejected],
        }
        slow = os.environ.get(servers.SLOWDOWN_ENV, "").strip()
        if slow and case.impl in servers.SLOWDOWN_IMPLS:
            extra["test_slowdown_ns"] = int(slow)  # the test-only knob was on: not a real result
        return cls(case, len(recs), runner.messages, completed, errors, extra)

    def fill(self, extra_info: Dict[str, Any]) -> None:
        # pytest-benchmark keeps a reference to this very dict: mutate it, never rebind it.
        extra_info.update(self.extra)


def _round_dict(rec: RoundRecord) -> Dict[str, Any]:
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
        "cpu_speed_before": _ratios(rec.speed_before),
        "cpu_speed_after": _ratios(rec.speed_after),
        "noisy": rec.noisy or None,
        "attempt": rec.attempt,
    }


def _ratios(speed: Optional[Dict[int, float]]) -> Optional[Dict[str, float]]:
    """{cpu: loop time / best} as JSON keeps it (string keys)."""
    return None if speed is None else {str(cpu): round(r, 3) for cpu, r in speed.items()}


# ---- fixtures ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def pcb_settings(pytestconfig: pytest.Config) -> Settings:
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def pcb_ceiling_results(pytestconfig: pytest.Config) -> List[Dict[str, Any]]:
    """Where the load-generator ceiling benchmark puts its extra_info, for the summary table."""
    return pytestconfig.stash[CEILING_KEY]


@pytest.fixture(scope="session")
def pcb_speed_gauge(pcb_settings: Settings) -> Optional[machine.SpeedGauge]:
    """Times a fixed loop on the two pinned CPUs around each round: a round measured in one of
    the host's slow spells is noisy (see machine.SpeedGauge)."""
    cpus = pcb_settings.cpus
    return machine.SpeedGauge(cpus).warm() if cpus else None


@pytest.fixture(scope="session")
def pcb_probe_baseline(pcb_settings: Settings) -> Optional[float]:
    """The quiet machine's cache-line round trip between the two pinned CPUs (the lowest of
    a few probes), the reference each round's probes are judged against."""
    cpus = pcb_settings.cpus
    if not cpus:
        return None
    return min(machine.cacheline_rtt(cpus[0], cpus[1], 50000) for _ in range(3))


SERVER_REPORTED_KEY = pytest.StashKey[bool]()
CALL_FAILED_KEY = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED_KEY] = True
    if report.when == "call":
        # the test's own gate thresholds travel with its results, for `pyconcbench compare`
        text = marker_fail_on(item)
        bench = getattr(item, "funcargs", {}).get("benchmark")
        if text and bench is not None:
            bench.extra_info["pcb_fail_on"] = text
    return report


def marker_fail_on(item: pytest.Item) -> Optional[str]:
    """The expression of the test's closest ``pcb_fail_on`` marker, or None."""
    marker = item.get_closest_marker("pcb_fail_on")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], str):
        raise pytest.UsageError(f"{item.nodeid}: pcb_fail_on takes one expression string, "
                                f"e.g. pcb_fail_on('latency_p99:+50%')")
    return marker.args[0]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        text = marker_fail_on(item)
        if text is None:
            continue
        try:
            gate.parse_fail_on(text)
        except gate.GateSpecError as exc:
            raise pytest.UsageError(f"{item.nodeid}: pcb_fail_on marker: {exc}") from None


# ---- the regression gate ------------------------------------------------------------------

class GatePlugin:
    """Registered when --pcb-fail-on is given: compares each benchmark, as its test finishes,
    with the same test in --benchmark-compare's baseline, and turns a regression into a
    failure of that test with one line per regressed metric."""

    NAME = "pyconcbench-gate"

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.rules = gate.parse_fail_on(settings.fail_on or "")
        self.settings = settings
        self.result = gate.GateResult(alpha=settings.fail_alpha)
        self.baseline: Dict[str, List[Dict[str, Any]]] = {}
        self.baseline_name = ""
        self.problem = ""
        self.facts_note = ""
        source = settings.sources.get("fail-on", "--pcb-fail-on")
        if not config.getoption("benchmark_compare", None):
            raise pytest.UsageError(f"{source}: the gate needs a baseline: add --benchmark-compare (the "
                                    "newest saved run) or --benchmark-compare=NUM")
        self.config = config
        self.source = source

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Reads the baseline pytest-benchmark loaded for --benchmark-compare (its
        pytest_configure has run by now)."""
        settings = self.settings
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is not None and (getattr(bs, "disabled", False) or getattr(bs, "skip", False)):
            # --benchmark-disable or --benchmark-skip, or pytest-xdist (which disables benchmarks)
            raise pytest.UsageError(f"{self.source}: the gate compares measured rounds, but benchmarks are "
                                    "disabled or skipped in this run (--benchmark-disable, "
                                    "--benchmark-skip, or pytest-xdist's -n)")
        mapping = getattr(bs, "compared_mapping", None) or {}
        if not mapping:
            where = getattr(bs, "storage", None) or "the benchmark storage"
            self.problem = (f"no baseline: --benchmark-compare found no saved run in {where}, so nothing "
                            "was gated (save one first: --benchmark-autosave)")
            return
        # --benchmark-compare=GLOB may match several saved runs: all of them are the baseline
        # (their rounds pooled, and a regression must be worse than every one of them).
        for path, benches in mapping.items():
            for fullname, bench in benches.items():
                self.baseline.setdefault(fullname, []).append(bench)
        names = [str(p) for p in mapping]
        self.baseline_name = names[0] if len(names) == 1 else f"{len(names)} runs ({names[0]} .. {names[-1]})"
        here = {"pyconcbench": machine.machine_facts()}
        for path in mapping:
            data = None
            for candidate in (Path(str(path)), Path(str(getattr(bs, "storage", ""))) / path):
                try:
                    data = json.loads(candidate.read_text(encoding="utf8"))
                    break
                except (OSError, ValueError):
                    continue
            if data is None:
                self.facts_note = (f"the machine facts of the baseline {path} could not be read: "
                                   "not checked against this machine")
                continue
            diffs = gate.fact_differences(data.get("machine_info", {}), here)
            if diffs and not settings.allow_machine_change:
                raise pytest.UsageError(
                    f"{self.source}: the baseline {path} was measured on a different machine or Python ("
                    + "; ".join(diffs) + "): its numbers are not comparable; pass --pcb-allow-machine-change "
                    "yes to gate anyway")
            if diffs:
                self.facts_note = "machine facts differ from the baseline's (gated anyway): " + "; ".join(diffs)

    @staticmethod
    def bench_dict(bench: Any) -> Optional[Dict[str, Any]]:
        meta = getattr(bench, "stats", None)
        st = getattr(meta, "stats", None)
        if st is None:
            return None
        return {"name": bench.name, "fullname": bench.fullname, "group": bench.group,
                "extra_info": bench.extra_info,
                "stats": {"median": st.median, "data": list(st.data)}}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.when != "call" or not report.passed or self.problem:
            return report
        new = self.bench_dict(getattr(item, "funcargs", {}).get("benchmark"))
        if new is None:
            return report
        text = marker_fail_on(item)
        marker_rules = gate.parse_fail_on(text) if text else []
        changes = gate.check_bench(self.baseline.get(new["fullname"]), new, self.rules, marker_rules,
                                   self.settings.fail_alpha)
        self.result.changes.extend(changes)
        failed = [c for c in changes if c.failed]
        if failed:
            report.outcome = "failed"
            report.longrepr = "\n".join(f"pyconcbench gate: {c.line()}" for c in failed)
        return report

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("-", "pyconcbench regression gate")
        if self.problem:
            tr.write_line(f"pyconcbench gate: {self.problem}")
            return
        res = self.result
        counts: Dict[str, int] = {}
        for c in res.changes:
            counts[c.status] = counts.get(c.status, 0) + 1
        tr.write_line(f"baseline {self.baseline_name}; fail-on {self.settings.fail_on}; alpha "
                      f"{self.settings.fail_alpha:g}; " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                                                          or "no gated metric in the tests that ran"))
        if self.facts_note:
            tr.write_line(self.facts_note)
        for c in res.changes:
            if c.status in ("regression", "within noise", "improved", "noisy", "untested"):
                tr.write_line(f"{c.status.upper():>12}  {c.test} {c.metric} {gate.fmt_change(c.change)} "
                              f"(p={'-' if c.p_value is None else format(c.p_value, '.3g')})")
        if self.settings.gate_markdown:
            context = [f"Baseline `{self.baseline_name}`; fail-on `{self.settings.fail_on}`."]
            if self.facts_note:
                context.append(self.facts_note)
            try:
                with open(self.settings.gate_markdown, "a", encoding="utf8") as fh:
                    fh.write(gate.markdown(res, context=context) + "\n")
                tr.write_line(f"gate summary appended to {self.settings.gate_markdown}")
            except OSError as exc:
                tr.write_line(f"pyconcbench gate: cannot write {self.settings.gate_markdown}: {exc.strerror}")
_TOOL_CACHE: Dict[str, Optional[str]] = {}


def _syscall_tool_cached() -> Optional[str]:
    """syscalls.available_tool(), probed once per process."""
    if "tool" not in _TOOL_CACHE:
        _TOOL_CACHE["tool"] = syscalls.available_tool()
    return _TOOL_CACHE["tool"]


def _syscall_tool(config: pytest.Config) -> Optional[str]:  # noqa: ARG001
    return _syscall_tool_cached()


@pytest.fixture
def echo_server(request: pytest.FixtureRequest, echo_case: EchoCase, pcb_settings: Settings):
    """The server process under test for this case, pinned to the server CPU."""
    try:
        loadgen.ensure_fd_limit(echo_case.connections)
    except loadgen.FdLimitError as exc:
        pytest.fail(str(exc), pytrace=False)
    cpus = pcb_settings.cpus
    # Thread-per-connection models take seconds to wind down 10k threads on one CPU.
    stop_timeout = max(10.0, echo_case.connections / 500.0)
    kind = harness.PlainServer if echo_case.plain else harness.ServerProcess
    server = kind(echo_case.impl, transport=echo_case.transport, cpu=cpus[0] if cpus else None,
                  malloc=echo_case.malloc, stop_timeout=stop_timeout)
    failure = None
    try:
        server.start()
    except harness.ServerUnavailable as exc:  # not installed, not on PATH, not on this Python
        pytest.skip(str(exc))
    except harness.ServerError as exc:  # ServerBroken (our own code) included: never a skip
        failure = str(exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # outside the except: no chained traceback
    try:
        yield server
    finally:
        failure = None
        try:
            server.stop()
        except harness.ServerError as exc:
            # once per test: not again when the test itself already failed on it
            if not (request.node.stash.get(SERVER_REPORTED_KEY, False)
                    or request.node.stash.get(CALL_FAILED_KEY, False)):
                failure = f"{echo_case.id}: {exc}"
        if failure is not None:
            pytest.fail(failure, pytrace=False)  # outside the except: no chained traceback


@pytest.fixture
def echo_bench(request: pytest.FixtureRequest, benchmark: Any, echo_case: EchoCase,
               echo_server: harness.ServerProcess, pcb_settings: Settings,
               pcb_probe_baseline: Optional[float],
               pcb_speed_gauge: Optional[machine.SpeedGauge]) -> Callable[[], EchoOutcome]:
    """Call it to run the measured rounds; returns the EchoOutcome (also in extra_info)."""

    def run() -> EchoOutcome:
        if pcb_settings.syscalls and _syscall_tool(request.config) is None:
            pytest.skip("--pcb-syscalls needs perf (linux-perf) or strace on PATH")
        runner = EchoRunner(pcb_settings, echo_case, echo_server, pcb_probe_baseline, pcb_speed_gauge)
        failure = None
        try:
            outcome = runner.run(benchmark)
        except loadgen.LoadError as exc:
            failure = f"{echo_case.id}: {exc}"
            try:
                echo_server.check_alive()
            except harness.ServerError as died:
                failure = f"{echo_case.id}: the server died during the load ({exc}): {died}"
                request.node.stash[SERVER_REPORTED_KEY] = True
        except harness.ServerError as exc:
            failure = f"{echo_case.id}: {exc}"
            request.node.stash[SERVER_REPORTED_KEY] = True
        if failure is not None:
            # Outside the except blocks: one line, no chained traceback.
            pytest.fail(failure, pytrace=False)
        request.config.stash[RESULTS_KEY].append(outcome.extra)
        return outcome

    return run


# ---- results ----------------------------------------------------------------------------

def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: Dict[str, Any]) -> None:
    machine_info["pyconcbench"] = machine.machine_facts()
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is not None:
        machine_info["pyconcbench"]["settings"] = {
            "profile": settings.profile, "rounds": settings.rounds or "by profile and scale",
            "cpus": list(settings.cpus) if settings.cpus else None,
            "pinning": settings.pinning_note, "noise_retries": settings.noise_retries,
        }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = config.stash.get(RESULTS_KEY, None)
    ceiling = config.stash.get(CEILING_KEY, None)
    if not rows and not ceiling:
        return
    terminalreporter.write_sep("-", "pyconcbench echo results")
    for line in echo_table(rows or []) + syscall_table(rows or []) + ceiling_table(ceiling or []):
        terminalreporter.write_line(line)
