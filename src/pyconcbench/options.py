"""The one table of options, and the settings a run resolves from them.

Used by the pytest plugin (``--pcb-NAME``) and by the ``pyconcbench`` command (``--NAME``), with
the same names and meanings: a value comes from the command line, else the environment
(``PCB_NAME``), else (pytest only) the ini file (``pcb_NAME``), else the option's default or
the profile's.  A bad value is an ``OptionError`` naming where it came from.  Also the
benchmark matrices (profiles).  No pytest here.
"""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import gate

# The workload-side modules (loadgen, servers, harness) are imported where a parser needs them,
# so that the `pyconcbench` command (report, compare) reads its options without loading them.


class OptionError(ValueError):
    """A bad option value or combination, in one line that names its source."""


SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20,
              "mib": 1 << 20}


def parse_sizes(text: str) -> Tuple[int, ...]:
    """'64,1KiB,100k' -> (64, 1024, 102400); each 1 B .. 1 MiB."""
    from . import loadgen
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
    from . import loadgen
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
    """'all' (the built-in implementations, then those registered in the pyconcbench.servers
    entry-point group), ids, or servers of one's own: ``MODULE:FUNCTION``, ``PATH.py:FUNCTION``."""
    from . import servers
    out = []
    try:
        known = servers.known_impls()
        for part in _items(text):
            if part == "all":
                out.extend(known)
            elif part in known:
                out.append(part)
            elif ":" in part:
                servers.check_user_spec(part)  # its code runs in the server process, not here
                out.append(part)
            else:
                raise ValueError(f"unknown implementation {part!r}; known: {', '.join(known)} (or a server of "
                                 "your own: MODULE:FUNCTION, PATH.py:FUNCTION)")
    except servers.UserServerError as exc:
        raise ValueError(str(exc)) from None
    return tuple(dict.fromkeys(out))


def parse_transports(text: str) -> Tuple[str, ...]:
    out = _items(text)
    for part in out:
        if part not in ("tcp", "unix"):
            raise ValueError(f"{part!r} is not a transport (tcp, unix)")
    return tuple(dict.fromkeys(out))


def parse_cpus(text: str) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """'0,1' -> ((0,), (1,)); '0-3,4-7' -> ((0, 1, 2, 3), (4, 5, 6, 7)): the server's CPUs (its
    workers spread over them, one per CPU) and the load generator's (it runs on the first);
    'none' turns pinning off."""
    if text.strip().lower() in ("none", "off"):
        return None
    parts = _items(text)
    sets = [_cpu_range(p) for p in parts] if len(parts) == 2 else []
    if len(sets) != 2 or not all(sets):
        raise ValueError(f"{text!r} is not SERVER_CPUS,LOADGEN_CPUS (e.g. 0,1 or 0-3,4-7) or 'none'")
    server, load = sets
    allowed = sorted(os.sched_getaffinity(0))
    for cpu in server + load:
        if cpu not in allowed:
            raise ValueError(f"CPU {cpu} is not available to this process (allowed: {allowed})")
    shared = sorted(set(server) & set(load))
    if shared:
        raise ValueError(f"server and load generator on the same CPU {shared[0]}: give two CPUs or 'none'")
    return server, load


def _cpu_range(text: str) -> Tuple[int, ...]:
    """'3' -> (3,); '0-3' -> (0, 1, 2, 3); () when it is neither (procs.cpu_set of one part)."""
    from . import procs  # here: the report reads options without loading the process helpers
    if "," in text:
        return ()
    try:
        return procs.cpu_set(text)
    except ValueError:
        return ()


def parse_workers(text: str) -> Tuple[int, ...]:
    """'1,2,4' -> worker process counts of each server (pyconcbench.serve --workers)."""
    from . import harness
    out = []
    for part in _items(text):
        if not part.isdigit() or not 1 <= int(part) <= harness.MAX_WORKERS:
            raise ValueError(f"{part!r} is not a number of worker processes (1 .. {harness.MAX_WORKERS})")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


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
    from . import harness
    out = _items(text)
    for part in out:
        if part == "default":
            raise ValueError("'default' is gone: the default state is now 'representative' (a server that has "
                             "seen clients disconnect); the old default is 'pristine'")
        if part not in harness.MALLOC_STATES:
            raise ValueError(f"{part!r} is not an allocator state ({', '.join(harness.MALLOC_STATES)})")
    return tuple(dict.fromkeys(out))


def parse_server_cmd(text: str) -> str:
    """A server command line with exactly one of {port}, {unix}, {fd} (harness.parse_command)."""
    from . import harness
    harness.parse_command(text)
    return text


def parse_server_name(text: str) -> str:
    from . import harness
    return harness.check_name(text.strip())


def parse_rate(text: str) -> float:
    """'100' or '100/s' -> connections per second (loadgen's range)."""
    from . import loadgen
    raw = text.strip()
    raw = raw[:-2] if raw.endswith("/s") else raw
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a rate (connections per second, e.g. 100 or 100/s)") from None
    if not loadgen.MIN_CONNECT_RATE <= value <= loadgen.MAX_CONNECT_RATE:
        raise ValueError(f"{text!r} is outside {loadgen.MIN_CONNECT_RATE:g} .. {loadgen.MAX_CONNECT_RATE:g} "
                         "connections per second")
    return value


def parse_open_rates(text: str) -> Tuple[Tuple[float, bool], ...]:
    """'25%,50%,90%' (shares of the implementation's closed-loop maximum, measured in the same
    run) or '20000,50k' (round trips per second, all connections) -> ((value, relative), ...)."""
    from . import loadgen
    out = []
    for part in _items(text):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|k|K|/s)?", part)
        if not m:
            raise ValueError(f"{part!r} is not a rate: a share of the closed-loop maximum (50%) or round "
                             "trips per second (20000, 20k)")
        value, unit = float(m.group(1)), m.group(2) or ""
        if unit == "%":
            if not 0 < value <= 1000:
                raise ValueError(f"{part!r}: a share must be above 0% and at most 1000%")
            out.append((round(value / 100.0, 6), True))
            continue
        value *= 1000 if unit in ("k", "K") else 1
        if not loadgen.MIN_OPEN_RATE <= value <= loadgen.MAX_OPEN_RATE:
            raise ValueError(f"{part!r} is outside {loadgen.MIN_OPEN_RATE:g} .. {loadgen.MAX_OPEN_RATE:g} "
                             "round trips per second")
        out.append((value, False))
    return tuple(dict.fromkeys(out))


def parse_arrival(text: str) -> str:
    from . import loadgen
    value = text.strip().lower()
    if value not in loadgen.ARRIVALS:
        raise ValueError(f"{text!r} is not one of {', '.join(loadgen.ARRIVALS)}")
    return value


def parse_pipeline(text: str) -> int:
    from . import loadgen
    value = parse_positive_int(text)
    if value > loadgen.MAX_PIPELINE:
        raise ValueError(f"{text!r}: at most {loadgen.MAX_PIPELINE} messages in flight per connection")
    return value


def parse_networks(text: str) -> Tuple[Any, ...]:
    """'local,netns:delay=200us' -> netsim.Network values (see pyconcbench.netsim)."""
    from . import netsim
    return netsim.parse_networks(text)


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


def parse_share(text: str) -> float:
    """'3%', '0.03' or '0' -> a share in [0, 0.5]."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"expected a share such as 3% or 0.03, got {text!r}") from None
    if not 0.0 <= value <= 0.5:
        raise ValueError(f"the share must be between 0 and 50%, got {text!r}")
    return value


def parse_alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a significance level such as 0.05, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise ValueError(f"the significance level must be between 0 and 1, got {text!r}")
    return value


def parse_ab_env(text: str) -> Dict[str, str]:
    from . import ab
    return ab.parse_env(text)


def parse_correction(text: str) -> str:
    value = text.strip().lower()
    if value not in gate.CORRECTIONS:
        raise ValueError(f"{text!r} is not a correction ({', '.join(gate.CORRECTIONS)})")
    return value


def parse_require(text: str) -> Tuple[str, ...]:
    """'go_net,pyzmq_single' -> the implementations a run must measure: an echo server
    (``--pcb-impl``'s ids), a ZeroMQ mode, a switch microbenchmark's id (``go-goroutine``) or a
    switch family (``go``, ``native``, ``python``)."""
    known = require_names()
    out = []
    for part in _items(text):
        if part not in known and ":" not in part:  # MODULE:FUNCTION: a server of one's own
            raise ValueError(f"unknown implementation {part!r} (an echo server, a ZeroMQ mode, a switch "
                             f"microbenchmark or family; e.g. {', '.join(sorted(known)[:4])}, ...)")
        out.append(part)
    return tuple(dict.fromkeys(out))


def require_names() -> Dict[str, str]:
    """Every name --pcb-require accepts, and the family it belongs to."""
    from . import micro, servers
    from . import zmq as pcbzmq
    try:
        echo_names = servers.known_impls()
    except servers.UserServerError as exc:
        raise ValueError(str(exc)) from None
    names = {name: "echo" for name in echo_names}
    names.update((name, "zmq") for name in pcbzmq.MODES)
    for case in micro.cases():
        names[case.id] = names[case.family] = "switch"
    return names


#: The environment variable that turns --pcb-strict on by default (set by every CI service).
CI_ENV = "CI"


def ci_strict_default() -> bool:
    """--pcb-strict's default: on when ``CI`` is set to anything but empty, 0, false, no or off."""
    return os.environ.get(CI_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


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
    least: int = 3        #: rounds every case measures before it may stop early
    agree: float = 0.0    #: ... once its clean rounds agree within this share (0: never early)
    #: the open-loop family (test_openloop.py): its scales, implementations (when --pcb-impl is
    #: not given), rates (shares of each implementation's closed-loop maximum), rounds, and
    #: seconds per round at the asked rate
    openloop_cases: Tuple[Tuple[int, int, str], ...] = ((100, 64, "tcp"),)
    openloop_impls: Tuple[str, ...] = ()
    openloop_rates: Tuple[Tuple[float, bool], ...] = ((0.25, True), (0.5, True), (0.9, True))
    openloop_rounds: int = 3
    openloop_seconds: float = 1.0

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
    # A case stops after 3 rounds when they agree within 3 % (rounds.Plan): most quiet cases do.
    return Profile(cases=cases, rounds=5, min_messages=20_000, variants=PRISTINE_VARIANTS, agree=0.03,
                   openloop_impls=OPENLOOP_IMPLS)


def _profile_full() -> Profile:
    from . import loadgen
    counts = [10, 32, 100, 316, 1000, 3000, 10000]
    top = loadgen.max_connections()
    counts = [c for c in counts if c <= top]
    if top > counts[-1]:
        counts.append(top)
    cases = [(c, 64, "tcp") for c in counts]
    cases += [(10, s, "tcp") for s in (1024, 10 * 1024, 100 * 1024)]
    cases += [(c, 64, "unix") for c in (10, 100)]
    return Profile(cases=tuple(cases), rounds=7, min_messages=50_000, variants=PRISTINE_VARIANTS,
                   openloop_cases=tuple((c, 64, "tcp") for c in (10, 100, 1000) if c <= top),
                   openloop_impls=OPENLOOP_IMPLS,
                   openloop_rates=tuple((f, True) for f in (0.1, 0.25, 0.5, 0.75, 0.9)),
                   openloop_rounds=5, openloop_seconds=2.0)


#: The allocator-sensitive implementations, shown also in the pristine state at 100 connections,
#: 64 B over TCP: those that receive into a fresh 256 KiB buffer per read (asyncio's selector
#: transport) make an mmap, an mremap and a munmap per round trip when pristine.  Measured for
#: every implementation (docs/representative.md); the others make none in either state.
PRISTINE_VARIANTS = tuple((impl, 100, 64, "tcp", "pristine")
                          for impl in ("asyncio_protocol", "asyncio_streams", "anyio"))


#: The open-loop family's implementations when --pcb-impl is not given: the native baseline and
#: one of each kind of model (event loop in C, asyncio's own, greenlets, a thread per connection).
OPENLOOP_IMPLS = ("native_epoll", "uvloop_protocol", "asyncio_protocol", "gevent", "threads")

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
    "cpus": (parse_cpus, None, "SERVER_CPU,LOADGEN_CPU to pin to, or 'none'; either may be a range, "
             "e.g. 0-3,4-7: the server's workers spread over its CPUs, one per CPU, the load generator runs "
             "on its first (default: 0,1, or the first two CPUs this process may use; pinning off with only "
             "one)", "A,B"),
    "workers": (parse_workers, "1", "worker processes per echo server, comma-separated to compare, e.g. "
                "1,2,4: each runs the implementation on a SO_REUSEPORT socket of its own on one port (TCP) or "
                "on one shared socket (UNIX); other than 1 adds -wN to the test id; the peers (go_net, "
                "node_net), plain reference servers and --pcb-server-cmd programs run at 1 only", "N"),
    "malloc": (parse_mallocs, None, "allocator states to measure each server in: representative (it has "
               "seen clients disconnect, as any server in use has), pristine (never: glibc then maps and "
               "unmaps asyncio's 256 KiB receive buffer per read), tuned (representative with glibc's "
               "thresholds fixed by MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_); other than "
               "representative adds -malloc_STATE to the test id (default: representative, plus the "
               "profile's pristine variants)", "LIST"),
    "reference": (parse_reference, "auto", "where the plain reference servers (pyconcbench.plain) run beside "
                  "their project counterparts: auto (100 connections, 64 B, TCP), all (every case), none", "WHERE"),
    "network": (parse_networks, "local", "where each echo server and the load generator talk, comma-separated to "
                "compare: local (this machine's loopback), netns:delay=200us[,rate=1gbit] (a simulated remote server: "
                "both in a network namespace of their own whose loopback delays every packet with netem, so a round "
                "trip gains about 2x the delay; delay in us or ms, rate in kbit, mbit or gbit; needs root), netns (the "
                "namespace alone); TCP cases only", "LIST"),
    "syscalls": (parse_bool, "no", "count the server's syscalls and context switches per round trip "
                 "(perf, else strace; slows the server)", "yes|no"),
    "agree": (parse_share, None, "stop a case after 3 rounds, before the profile's number, once its clean "
              "rounds agree within this share of their median, e.g. 3%% (default: the profile's: quick 3%%, "
              "full 0 = always every round; --pcb-rounds fixes the number)", "PCT"),
    "noise-retries": (parse_positive_int, "3", "how often a noisy round is measured again", "N"),
    "stall-timeout": (parse_seconds, "10", "fail a round when no round trip completes for this long", "SECONDS"),
    "fail-on": (parse_fail_on, None, "regression gate against --benchmark-compare's baseline: comma-separated "
                "[SCOPE@]METRIC:THRESHOLD, e.g. 'msgs_per_s:-10%%,latency_p99:+25%%' (see pyconcbench.gate); "
                "a regression fails its test item", "EXPR"),
    "fail-alpha": (parse_alpha, "0.05", "significance level of the gate's one-sided Mann-Whitney U test "
                   "over the per-round samples", "P"),
    "fail-correction": (parse_correction, "holm", "how the gate's significance tests are corrected for their "
                        "number over the run: holm (no false alarm anywhere in the run with probability >= "
                        "1 - alpha), bh (Benjamini-Hochberg: false alarms <= alpha of the alarms), none (each "
                        "test alone); with holm or bh, regressions are decided once every test has run and "
                        "fail the session, not their items", "holm|bh|none"),
    "gate-markdown": (str, None, "append the gate's Markdown summary to this file (e.g. $GITHUB_STEP_SUMMARY)",
                      "FILE"),
    "ab-a": (str, None, "interleaved A/B run: side A's echo servers, or its switch and ZeroMQ workers, run "
             "with this Python executable or venv directory (the one it compares against); needs --pcb-ab-b",
             "PYTHON_OR_VENV"),
    "ab-b": (str, None, "interleaved A/B run: side B's Python executable or venv directory (the one under "
             "test); each echo, switch and ZeroMQ case alternates A's and B's rounds (ABBA) and saves B/A "
             "with its interval",
             "PYTHON_OR_VENV"),
    "ab-a-env": (parse_ab_env, None, "environment variables added for side A's servers and workers: "
                 "NAME=VALUE,...", "VARS"),
    "ab-b-env": (parse_ab_env, None, "environment variables added for side B's servers and workers: "
                 "NAME=VALUE,...", "VARS"),
    "strict": (parse_bool, None, "an implementation that cannot run here (a package or tool missing: an echo "
               "server, a peer, a ZeroMQ mode, a switch microbenchmark) fails with its one line instead of "
               "skipping, and the regression gate fails on benchmarks of the baseline missing from the run "
               "(default: yes when the environment variable CI is set, no otherwise)", "yes|no"),
    "require": (parse_require, None, "implementations this run must measure, comma-separated (echo servers, "
                "ZeroMQ modes, switch microbenchmarks or families such as go): one that is not selected, "
                "or skipped, fails the session", "IMPLS"),
    "explain": (parse_bool, "yes", "trace one extra, untimed round per implementation (syscalls by name, "
                "context switches per round trip; perf, else strace) and show what the counts explain in the "
                "table and report", "yes|no"),
    "benchmark-table": (parse_bool, "no", "also print pytest-benchmark's own table of round times (its OPS "
                        "column is rounds per second, not round trips: pyconcbench's tables have the figures)",
                        "yes|no"),
    "server-cmd": (parse_server_cmd, None, "benchmark any program as an echo server: a command line (split like "
                   "a shell's, none run) with exactly one of {port} (a free loopback TCP port it listens on), "
                   "{unix} (a UNIX socket path it listens on) or {fd} (the number of an inherited socket already "
                   "listening, TCP or UNIX by the case); its cases run beside --pcb-impl's when that is given, "
                   "alone otherwise", "COMMAND"),
    "server-name": (parse_server_name, None, "the --pcb-server-cmd server's name in test ids (letters, digits, _ . -; "
                    "default: cmd_ and its program's name)", "NAME"),
    "server-ready-timeout": (parse_seconds, "15", "how long a --pcb-server-cmd program may take to listen",
                             "SECONDS"),
    "connect-rate": (parse_rate, None, "open the connections at this many a second (default: unpaced, up to "
                     "512 connects in flight): for servers with a small listen backlog", "PER_SECOND"),
    "engines": (parse_positive_int, None, "load engine processes, the connections split over them (each binds "
                "its own source address in 127.0.0.0/8; their rounds start together and are merged exactly) "
                "(default: as many as the connections need: one holds one process's sockets)", "N"),
    "pipeline": (parse_pipeline, "1", "messages in flight per connection: 1 is ping-pong; more pipelines them "
                 "(each echo still verified, in order); other than 1 adds -pK to the test id", "K"),
    "rate": (parse_open_rates, None, "the open-loop family's rates (test_openloop.py): shares of each "
             "implementation's closed-loop maximum, measured first in the same run (25%%,50%%,90%%), or round "
             "trips per second over all connections (20000, 20k) (default: the profile's: quick "
             "25%%,50%%,90%%, full 10%%,25%%,50%%,75%%,90%%)", "RATES"),
    "arrival": (parse_arrival, "uniform", "how the open loop spreads each connection's sends: uniform "
                "(evenly spaced, staggered over the connections) or poisson (exponential gaps)", "NAME"),
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
    networks: Tuple[Any, ...] = ()  # netsim.Network values; () is local only
    syscalls: bool = False
    fail_on: Optional[str] = None
    fail_alpha: float = 0.05
    fail_correction: str = "holm"
    gate_markdown: Optional[str] = None
    allow_machine_change: bool = False
    strict: bool = False  # a missing implementation fails; the gate fails on missing baseline benchmarks
    require: Tuple[str, ...] = ()  # implementations the run must measure
    ab: Optional[Dict[str, Any]] = None  # "a"/"b" -> ab.Environment in an interleaved A/B run
    pinning_note: str = ""
    #: worker processes per echo server (--pcb-workers), and the server's CPU set when a range
    #: was given (--pcb-cpus 0-3,4-7; ``cpus`` then holds its first CPU and the load generator's)
    workers: Tuple[int, ...] = (1,)
    server_cpus: Tuple[int, ...] = ()
    sources: Dict[str, str] = field(default_factory=dict)
    agree: Optional[float] = None  # None: the profile's
    benchmark_table: bool = False  # pytest-benchmark's own table at the end
    explain: bool = False  # one traced, untimed round per implementation (pyconcbench.explain)
    server_cmd: Optional[str] = None  # --pcb-server-cmd: a program the user brings
    server_name: str = ""  # its name in test ids
    server_ready_timeout: float = 15.0
    connect_rate: float = 0.0  # connects per second, 0: unpaced
    pipeline: int = 1  # messages in flight per connection
    engines: Optional[int] = None  # load engine processes; None: as many as the connections need
    #: the open-loop family: its scales, implementations and rates ((value, relative), ...)
    openloop_cases: Tuple[Tuple[int, int, str], ...] = ()
    openloop_impls: Tuple[str, ...] = ()
    rates: Tuple[Tuple[float, bool], ...] = ()
    arrival: str = "uniform"

    def plan(self, most: int, profile: Optional[Profile] = None) -> Any:
        """How many rounds a case whose profile measures ``most`` runs (rounds.Plan): exactly
        --pcb-rounds when given, else from the profile's least up to ``most``, stopping once
        the clean rounds agree within --pcb-agree (the profile's by default)."""
        from . import rounds
        if self.rounds:
            return rounds.Plan.fixed(self.rounds)
        profile = profile or PROFILES[self.profile]()
        agree = profile.agree if self.agree is None else self.agree
        return rounds.Plan(min(profile.least, most), most, agree)

    def plan_for(self, connections: int) -> Any:
        """The echo plan at ``connections`` (fewer rounds from 3,000 connections on)."""
        profile = PROFILES[self.profile]()
        return self.plan(profile.rounds_for(connections), profile)


def env_name(name: str) -> str:
    return "PCB_" + name.replace("-", "_").upper()


def from_environment(name: str) -> Tuple[Optional[str], str]:
    """The option's raw value from ``PCB_NAME``, or (None, "default")."""
    env = env_name(name)
    if os.environ.get(env, "") != "":
        return os.environ[env], f"{env} (environment)"
    return None, "default"


def parse_option(name: str, raw: Optional[str], source: str) -> Any:
    """One option's value from its raw text (None: its default), OptionError naming the source."""
    parser, default, _, _ = OPTIONS[name]
    if raw is None:
        raw = default
    if raw is None:
        return None
    try:
        return parser(raw)
    except ValueError as exc:
        raise OptionError(f"{source}: {exc}") from None


def resolve(raw: Callable[[str], Tuple[Optional[str], str]]) -> Settings:
    """The run's settings; ``raw(name)`` gives each option's text and where it came from
    ((None, "default") when not given)."""
    from . import harness, loadgen
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for name in OPTIONS:
        text, source = raw(name)
        sources[name] = source
        values[name] = parse_option(name, text, source)
    if values["messages"] is not None and values["duration"] is not None:
        raise OptionError("--pcb-messages and --pcb-duration exclude each other: give one")
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
    # the load generator takes any number (several engines: pyconcbench.engines); a server
    # process holds at most `top`, so more need as many workers (--pcb-workers)
    most = top * max(values["workers"])
    too_many = [c for c, _, _ in cases if c > most]
    if too_many:
        need = -(-too_many[0] // top)
        raise OptionError(
            f"{sources['conns']}: {too_many[0]} connections do not fit: one server process holds at most "
            f"{top} sockets here (ulimit -n hard limit {loadgen.fd_limit()[1]}): give --pcb-workers {need} "
            "or more (each worker holds its share), or use 'max'")
    impls, server_name = values["impl"], ""
    if values["server-cmd"] is not None:
        server_name = _command_server(values, sources, cases)
        if sources["impl"] == "default":
            impls = ()  # the command alone, unless --pcb-impl says which to compare it with
    elif values["server-name"] is not None:
        raise OptionError(f"{sources['server-name']}: names the --pcb-server-cmd server, and none is given")
    ab_envs = None
    if values["ab-a"] is not None or values["ab-b"] is not None:
        if values["server-cmd"] is not None:
            raise OptionError(f"{sources['server-cmd']}: an A/B run compares two environments' servers, and a "
                              "--pcb-server-cmd program is the same on both sides: give it in neither, or compare "
                              "two builds as two runs")
        ab_envs = _ab_environments(values, sources)
    cpus, server_cpus = values["cpus"], ()
    if cpus is None:
        note = f"pinning off ({sources['cpus']})"
    else:
        server_set, load_set = cpus
        cpus = (server_set[0], load_set[0])
        server_cpus = server_set if len(server_set) > 1 else ()
        note = "server on CPU%s %s, load generator on CPU %d" % (
            "s" if server_cpus else "", _cpu_text(server_set), cpus[1])
    if sources["cpus"] == "default":
        # The default 0,1 adapts to the CPUs this process may use; an explicit value does not.
        plan = harness.pinning_plan()
        cpus = None if plan.server_cpu is None else (plan.server_cpu, plan.load_cpu)
        note = plan.note
    workers = values["workers"]
    crowded = harness.workers_note(max(workers), len(server_cpus) or (1 if cpus else len(harness.cpus_available())))
    if crowded:
        note += "; " + crowded
    return Settings(
        profile=values["profile"],
        impls=impls,
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
            v for v in profile.variants if v[0] in impls and v[1:4] in cases),
        reference=values["reference"],
        networks=_networks(values, sources, cases, ab_envs is not None),
        syscalls=values["syscalls"],
        fail_on=values["fail-on"],
        fail_alpha=values["fail-alpha"],
        fail_correction=values["fail-correction"],
        gate_markdown=values["gate-markdown"],
        allow_machine_change=values["allow-machine-change"],
        strict=ci_strict_default() if values["strict"] is None else values["strict"],
        require=values["require"] or (),
        ab=ab_envs,
        pinning_note=note,
        workers=workers,
        server_cpus=server_cpus,
        sources=sources,
        agree=values["agree"],
        benchmark_table=values["benchmark-table"],
        explain=values["explain"],
        server_cmd=values["server-cmd"],
        server_name=server_name,
        server_ready_timeout=values["server-ready-timeout"],
        connect_rate=values["connect-rate"] or 0.0,
        pipeline=values["pipeline"],
        engines=values["engines"],
        # the open loop runs at the given scales, else the profile's (fewer than the echo family's)
        openloop_cases=tuple(dict.fromkeys(cases)) if (conns or sizes or transports) else tuple(
            c for c in profile.openloop_cases if c[0] <= top),
        openloop_impls=impls if sources["impl"] != "default" or values["server-cmd"] is not None else tuple(
            i for i in profile.openloop_impls if i in impls),
        rates=values["rate"] or profile.openloop_rates,
        arrival=values["arrival"],
    )


def _cpu_text(cpus: Tuple[int, ...]) -> str:
    """(0, 1, 2, 3) -> '0-3'; (2,) -> '2'."""
    if len(cpus) > 1 and cpus == tuple(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}"
    return ",".join(map(str, cpus))


def _networks(values: Dict[str, Any], sources: Dict[str, str], cases: List[Tuple[int, int, str]],
              ab_run: bool) -> Tuple[Any, ...]:
    """--pcb-network's networks; OptionError (one line) for a simulated one in an A/B run, or
    with no TCP case to put through it (a UNIX socket does not cross the network)."""
    networks = values["network"]
    remote = [n for n in networks if not n.local]
    if remote and ab_run:
        raise OptionError(f"{sources['network']}: {remote[0].spec} is not available in an A/B run: "
                          "compare networks in a normal run")
    if remote and not any(t == "tcp" for _, _, t in cases):
        raise OptionError(f"{sources['network']}: {remote[0].spec} needs a TCP case (a UNIX socket does not cross "
                          "the network): add --pcb-transport tcp")
    return networks


def _command_server(values: Dict[str, Any], sources: Dict[str, str], cases: List[Tuple[int, int, str]]) -> str:
    """The --pcb-server-cmd server's name; OptionError when no case of the run has a transport
    its placeholder serves and the transports were asked for explicitly ({port} with
    --pcb-transport unix).  Otherwise the cases it cannot serve (the profile's UNIX case for a
    {port} command) are simply not generated for it."""
    from . import harness
    argv, placeholder = harness.parse_command(values["server-cmd"])
    serves = harness.COMMAND_PLACEHOLDERS[placeholder]
    if not any(t in serves for _, _, t in cases):
        where = sources["transport"] if sources["transport"] != "default" else "--pcb-transport not given"
        have = " and ".join(dict.fromkeys(t for _, _, t in cases))
        raise OptionError(
            f"{sources['server-cmd']}: its {placeholder} serves {' and '.join(serves)} only, and the run's "
            f"cases are over {have} only ({where}): give --pcb-transport {serves[0]}, or use {{fd}} (either)")
    return values["server-name"] if values["server-name"] is not None else harness.command_name(argv)


def _ab_environments(values: Dict[str, Any], sources: Dict[str, str]) -> Dict[str, Any]:
    """Both sides of an A/B run, resolved and asked to describe themselves; OptionError (one
    line, naming the option) when one is missing or cannot run the servers."""
    from . import ab
    missing = [f"--pcb-ab-{s}" for s in ab.SIDES if values[f"ab-{s}"] is None]
    if missing:
        given = [s for s in ab.SIDES if values[f"ab-{s}"] is not None][0]
        raise OptionError(f"{sources['ab-' + given]}: an A/B run needs both sides: add {missing[0]} "
                          "(a Python executable or venv directory; the same one for an A/A run)")
    out = {}
    for side in ab.SIDES:
        try:
            out[side] = ab.environment(side, values[f"ab-{side}"], values[f"ab-{side}-env"])
        except ab.ABError as exc:
            raise OptionError(f"{sources['ab-' + side]}: {exc}") from None
    return out
