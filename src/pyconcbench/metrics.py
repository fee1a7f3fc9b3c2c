"""The result schema: which family a saved benchmark belongs to, and every metric the gate and
the reports read from it (its key in extra_info, where its per-round samples are, its unit,
which way is better, how it is printed).

Every benchmark the suite saves is stamped ``pcb_family`` (``echo``, ``ceiling``, ``switch``,
``zmq``, ``openloop``: an echo server at a fixed offered rate, ``pyconcbench.openloop``; ``ab``: an
interleaved A/B case of the echo, switch or ZeroMQ family, named by its ``ab_family``; see
``pyconcbench.ab``) and ``pcb_schema`` (``SCHEMA_VERSION``) in its
extra_info.  (The switch family's own ``family`` key is the language -- python, native, go --
hence the prefix.)  Runs saved before the stamp existed (schema 0) are recognised by the keys
they hold.  A schema newer than this
code is refused: ``SchemaError``, one line.  ``check_run`` checks a whole saved run against the
fields the report and the gate read (``RUN_FIELDS``, ``BENCHMARK_FIELDS``, ``FAMILY_FIELDS``); ``md_text``/``md_code``
escape saved text for Markdown.  No pytest, no workload here: the report and the
gate read saved JSON through this module only.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

SCHEMA_VERSION = 1
FAMILY_KEY = "pcb_family"
SCHEMA_KEY = "pcb_schema"

ECHO, CEILING, SWITCH, ZMQ, AB, OPENLOOP = "echo", "ceiling", "switch", "zmq", "ab", "openloop"
FAMILIES = (ECHO, CEILING, SWITCH, ZMQ, AB, OPENLOOP)
OTHER = "other"


class SchemaError(ValueError):
    """A saved benchmark this code cannot read: the message says which and why."""



def bench_key(bench: Dict[str, Any]) -> str:
    """The key a benchmark is matched by across runs: its node id without the folders of its
    file (``test_echo.py::test_echo[asyncio_protocol-c100-64B]``), so a run of the suite from the
    package (``pyconcbench run``) matches one saved when it lived in the repo's ``tests/bench``."""
    name = bench.get("fullname") or bench.get("name") or "?"
    path, sep, rest = name.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest if sep else name

def stamp(family: str) -> Dict[str, Any]:
    """The keys every saved benchmark of ``family`` carries first."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    return {FAMILY_KEY: family, SCHEMA_KEY: SCHEMA_VERSION}


def family_of(info: Any, name: str = "?") -> str:
    """The family of a saved benchmark's extra_info: its stamp, or for a run saved before the
    stamp (schema 0) the keys it holds; ``OTHER`` for a benchmark of none of ours."""
    if not isinstance(info, dict):
        return OTHER
    schema = info.get(SCHEMA_KEY)
    if schema is not None:
        if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
            raise SchemaError(f"{name}: {SCHEMA_KEY} {schema!r} is not a schema version")
        if schema > SCHEMA_VERSION:
            raise SchemaError(f"{name}: saved with result schema {schema}, newer than this pyconcbench "
                              f"reads ({SCHEMA_VERSION}): upgrade pyconcbench to read it")
        family = info.get(FAMILY_KEY)
        if family not in FAMILIES:
            raise SchemaError(f"{name}: {FAMILY_KEY} {family!r} is not one of {', '.join(FAMILIES)}")
        return family
    # schema 0: before the stamp
    if "micro" in info and "ns_per_op" in info:
        return SWITCH
    if "requests_per_s" in info and "mode" in info:
        return ZMQ
    if info.get("impl") == "loadgen_ceiling":
        return CEILING
    if "impl" in info and "msgs_per_s" in info and "connections" in info:
        return ECHO
    return OTHER


@dataclass(frozen=True)
class Metric:
    """A gateable metric.  ``sources``: (summary key in extra_info, list of per-round dicts in
    extra_info, key in each round); the first that a benchmark holds is used."""

    name: str
    higher_is_better: bool
    unit: str
    sources: Tuple[Tuple[str, str, str], ...]
    what: str
    families: Tuple[str, ...] = FAMILIES
    #: a baseline below this is not judged: a relative change of it means nothing (memory per
    #: connection near 0 is page granularity, and below 0 the ratio flips its sign)
    floor: float = 0.0

    @property
    def better(self) -> str:
        return "higher" if self.higher_is_better else "lower"


METRICS: Dict[str, Metric] = {m.name: m for m in (
    Metric("msgs_per_s", True, "msgs/s", (("msgs_per_s", "rounds", "msgs_per_s"),),
           "echo round trips per second", (ECHO, CEILING)),
    Metric("requests_per_s", True, "req/s", (("requests_per_s", "rounds", "requests_per_s"),),
           "ZeroMQ requests per second", (ZMQ,)),
    Metric("latency_p50", False, "us", (("latency_p50_us", "rounds", "latency_p50_us"),),
           "median round-trip latency (open loop: from each message's intended send time)", (ECHO, ZMQ, OPENLOOP)),
    Metric("latency_p90", False, "us", (("latency_p90_us", "rounds", "latency_p90_us"),),
           "90th percentile latency", (ECHO, ZMQ, OPENLOOP)),
    Metric("latency_p95", False, "us", (("latency_p95_us", "rounds", "latency_p95_us"),),
           "95th percentile latency", (ECHO, ZMQ, OPENLOOP)),
    Metric("latency_p99", False, "us", (("latency_p99_us", "rounds", "latency_p99_us"),),
           "99th percentile latency", (ECHO, ZMQ, OPENLOOP)),
    Metric("server_cpu_us_per_msg", False, "us", (("server_cpu_us_per_msg", "rounds", "server_cpu_us_per_msg"),),
           "the echo server's CPU per round trip", (ECHO, OPENLOOP)),
    Metric("rss_per_conn_kib", False, "KiB", (("rss_per_conn_kib", "rounds", "rss_per_conn_kib"),),
           "the echo server's resident memory per open connection (its RSS after each round less its "
           "RSS before the load generator connected, over the connections)", (ECHO,), floor=1.0),
    Metric("cpu_us_per_req", False, "us", (("cpu_us_per_req", "rounds", "cpu_us_per_req"),),
           "the ZeroMQ client's CPU per request", (ZMQ,)),
    Metric("ns_per_op", False, "ns", (("ns_per_op", "samples", "ns_per_op"),),
           "a switch microbenchmark's cost per operation", (SWITCH,)),
    Metric("time", False, "s", (("", "", ""),),
           "pytest-benchmark's round time (median)"),
)}


#: The families an interleaved A/B case can measure; its record (family ``ab``) names one
#: under ``AB_FAMILY_KEY`` (a record saved before the key existed is an echo case).
AB_FAMILIES = (ECHO, SWITCH, ZMQ)
AB_FAMILY_KEY = "ab_family"


def _pair_keys(family: str) -> Dict[str, str]:
    return {m.name: m.sources[0][2] for m in METRICS.values() if family in m.families and m.sources[0][0]}


#: The gate's metrics an interleaved A/B case compares pair by pair, per family: metric name ->
#: the key of each side's per-round figure (and of its summary).  Saved per pair as B/A,
#: summarised as an interval under ``intervals``.  Derived from METRICS: a metric gated for a
#: family is compared in its A/B runs too (echo: msgs_per_s, the latencies, the server's CPU;
#: zmq: requests_per_s, the latencies, the client's CPU; switch: ns_per_op).  Echo's memory per
#: connection is among them: each pair's B/A of the two servers' per-connection RSS after their
#: rounds (readings of the same two processes, so its interval shows their drift over the run,
#: not what a restart would move; a round with no growth, as native_epoll's at 10 connections
#: can be, gives no ratio).
AB_PAIR_KEYS: Dict[str, Dict[str, str]] = {f: _pair_keys(f) for f in AB_FAMILIES}
#: Per family, the list of a side's per-round figures in its saved summary.
AB_ROUNDS_KEY: Dict[str, str] = {f: next(m.sources[0][1] for m in METRICS.values() if f in m.families)
                                 for f in AB_FAMILIES}


def ab_family(info: Dict[str, Any]) -> str:
    """The family an A/B record measured: its ``ab_family``, echo when it has none."""
    return info.get(AB_FAMILY_KEY) or ECHO


#: How the noise judges' reasons for the host's state begin (the CPU-speed gauge, the cache-line
#: probe: a slow spell or a placement of the host, read on probes around the round, never on the
#: round's own figures).  Other processes' CPU is not among them: its threshold scales with the
#: round's length, so a faster server's shorter round is more easily flagged than a slower one's.
SPELL_REASONS = ("CPU ", "cache-line probe ")


def is_spell(reason: Any) -> bool:
    """Whether a saved noisy round's reason is the host's state (``SPELL_REASONS``)."""
    return isinstance(reason, str) and reason.startswith(SPELL_REASONS)


def fmt_value(value: Optional[float], metric: Metric) -> str:
    """A metric's value with its unit, as the gate prints it."""
    if value is None:
        return "-"
    if metric.unit in ("msgs/s", "req/s"):
        return f"{value:,.0f} {metric.unit}"
    if metric.unit == "s":
        return f"{value * 1e3:.3f} ms"
    return f"{value:,.2f} {metric.unit}"


# ---- the saved run's shape ------------------------------------------------------------------
#
# What a saved run must hold for the report and the gate to read it: each field they read, with
# its kind.  ``check_run`` walks a run against it and names the first field that is wrong, so a
# hostile or damaged file is refused in one line (pyconcbench.report.results) instead of
# failing somewhere inside a table.  A field not listed is not read and not checked, except that
# no number anywhere in a benchmark may be NaN or infinite.  An optional field may be absent or
# null; a required one (``REQUIRED``) must hold a value.
# Written here rather than with jsonschema: a JSON Schema cannot refuse NaN and infinities
# anywhere (Python's json reads them), and this keeps the report free of a dependency for ~120 lines.

#: A measured figure beyond this magnitude is not a measurement (and would overflow the sums).
MAX_MAGNITUDE = 1e18

TEXT, COUNT, INTEGER, NUMBER, NONNEG, FLAG, SCALAR = "text", "count", "integer", "number", "nonneg", "flag", "scalar"


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class REQUIRED:
    kind: Any


_WHAT = {TEXT: "a string", COUNT: "a whole number >= 0", INTEGER: "a whole number", NUMBER: "a finite number",
         NONNEG: "a finite number >= 0", FLAG: "true or false", SCALAR: "a string, number or true/false"}

_ECHO_ROUND = {"msgs_per_s": NONNEG, "latency_p50_us": NONNEG, "latency_p90_us": NONNEG,
               "latency_p95_us": NONNEG, "latency_p99_us": NONNEG, "server_cpu_us_per_msg": NUMBER,
               "elapsed": NONNEG, "noisy": SCALAR, "rss_kib": COUNT, "rss_per_conn_kib": NUMBER}
_LATENCIES = {k: NONNEG for k in ("latency_p50_us", "latency_p90_us", "latency_p95_us", "latency_p99_us")}
_INTERVAL = {"ratio": REQUIRED(NUMBER), "low": REQUIRED(NUMBER), "high": REQUIRED(NUMBER),
             "confidence": REQUIRED(NUMBER), "pairs": COUNT}
_ENVIRONMENT = {"given": TEXT, "executable": TEXT, "python": TEXT, "pyconcbench": TEXT, "python_build": TEXT,
                "gil_enabled": FLAG,
                "libraries": MapOf(SCALAR), "env": MapOf(SCALAR)}
#: The echo server's memory (absent in runs saved before it was measured): resident KiB idle
#: (before the load generator connects), with the connections open after the warm-up, the median
#: after the rounds; and per connection (can be below 0 when the server gave memory back).
_ECHO_MEMORY = {"server_rss_idle_kib": COUNT, "server_rss_connected_kib": COUNT, "server_rss_loaded_kib": NONNEG,
                "rss_per_conn_kib": NUMBER}
_AB_SIDE = {"environment": _ENVIRONMENT, "msgs_per_s": NONNEG, **_LATENCIES, "server_cpu_us_per_msg": NUMBER,
            **_ECHO_MEMORY, "rounds": ListOf(_ECHO_ROUND)}
_ALL_PAIR_METRICS = {m: NUMBER for keys in AB_PAIR_KEYS.values() for m in keys}

#: extra_info of each family: key -> kind (a kind, a nested dict, ListOf, MapOf, REQUIRED(kind)).
FAMILY_FIELDS: Dict[str, Dict[str, Any]] = {
    ECHO: {"impl": REQUIRED(TEXT), "label": TEXT, "connections": REQUIRED(COUNT), "size": REQUIRED(COUNT),
           "transport": REQUIRED(TEXT), "msgs_per_s": REQUIRED(NONNEG), "mib_per_s": NONNEG, **_LATENCIES,
           "server_cpu_us_per_msg": NUMBER, "server_user_share": NUMBER, "server_cpu_share": NUMBER,
           "loadgen_cpu_share": NUMBER, "loadgen_bound": FLAG, "noisy_rounds_kept": COUNT,
           "fairness_jain": NUMBER, "fairness_min": NUMBER, "fairness_max": NUMBER,
           "starving_connections": COUNT, "plain": FLAG, "malloc": TEXT, "workers": COUNT, "workers_note": TEXT,
           "network": TEXT, "network_delay_us": COUNT, "network_rate_bit": COUNT, "network_rtt_us": NUMBER,
           "alloc_syscalls_per_msg": MapOf(NUMBER), **_ECHO_MEMORY, "rounds": ListOf(_ECHO_ROUND)},
    CEILING: {"impl": TEXT, "connections": REQUIRED(COUNT), "size": COUNT, "transport": TEXT,
              "msgs_per_s": REQUIRED(NONNEG), "engine_msgs_per_s": NONNEG, "engine_to_ceiling": NUMBER,
              "engine_to_ceiling_paired_median": NUMBER, "loadgen_cpu_share": NUMBER,
              "rounds": ListOf(_ECHO_ROUND)},
    SWITCH: {"micro": REQUIRED(TEXT), "case": REQUIRED(TEXT), "ns_per_op": REQUIRED(NUMBER), "group": TEXT,
             "op": TEXT, "family": TEXT, "ns_per_op_min": NUMBER, "ns_per_op_max": NUMBER, "study_ns": NUMBER,
             "spread_pct": NUMBER, "ratio_to_study": NUMBER, "depth": COUNT, "noisy_rounds_kept": COUNT,
             "pinning": TEXT, "parent_rss_kib": NUMBER,
             "samples": ListOf({"ns_per_op": NUMBER, "elapsed_ns": NONNEG, "noisy": SCALAR})},
    ZMQ: {"mode": REQUIRED(TEXT), "requests_per_s": REQUIRED(NONNEG), "size": COUNT, "inflight": COUNT,
          "transport": TEXT, "placement": TEXT, "pinning": TEXT, **_LATENCIES, "cpu_us_per_req": NUMBER,
          "study_requests_per_s": NONNEG,
          "rounds": ListOf({"requests_per_s": NONNEG, **_LATENCIES, "cpu_us_per_req": NUMBER,
                            "elapsed": NONNEG, "noisy": SCALAR})},
    AB: {AB_FAMILY_KEY: TEXT, "case": TEXT, "impl": TEXT, "label": TEXT, "connections": COUNT, "size": COUNT,
         "transport": TEXT, "malloc": TEXT, "plain": FLAG,
         "pairs": ListOf({"order": TEXT, "noisy": SCALAR, "spell": SCALAR, **_ALL_PAIR_METRICS}),
         "intervals": MapOf(_INTERVAL), "intervals_all": MapOf(_INTERVAL)},
    OTHER: {},
}
#: An open-loop case (pyconcbench.openloop): the echo record's fields, its latencies from each
#: message's intended send time, and the open loop's own: the rate asked and achieved, the
#: latencies from the actual send (uncorrected), and both whole spectra ([percentile, us], ...).
FAMILY_FIELDS[OPENLOOP] = {
    **FAMILY_FIELDS[ECHO], "arrival": TEXT, "rate_label": TEXT, "rate_fraction": NONNEG,
    "rate_asked": REQUIRED(NONNEG), "rate_achieved_share": NONNEG, "rate_held": FLAG,
    "closed_loop_max_msgs_per_s": NONNEG, "latency_uncorrected_p50_us": NONNEG,
    "latency_uncorrected_p99_us": NONNEG, "latency_uncorrected_p99_9_us": NONNEG, "latency_p99_9_us": NONNEG,
    "latency_max_us": NONNEG, "send_lag_mean_us": NUMBER, "send_lag_max_us": NUMBER,
    "latency_spectrum": ListOf(ListOf(NONNEG)), "latency_uncorrected_spectrum": ListOf(ListOf(NONNEG)),
}
for _fields in FAMILY_FIELDS.values():
    _fields["pcb_fail_on"] = TEXT  # a test's pcb_fail_on marker, as the plugin saved it

#: Each side of an A/B record, per family: its environment and that family's figures -- echo's
#: as the first A/B records saved them; a switch or ZeroMQ side is what a normal run saves.
AB_SIDE_FIELDS: Dict[str, Dict[str, Any]] = {
    ECHO: _AB_SIDE,
    **{f: {"environment": _ENVIRONMENT, **FAMILY_FIELDS[f]} for f in (SWITCH, ZMQ)},
}


def _check_ab(info: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """An A/B record's own checks beyond FAMILY_FIELDS: a family it can measure, both sides as
    that family's, every interval an interval."""
    fam = ab_family(info)
    if fam not in AB_SIDE_FIELDS:
        return f"extra_info.{AB_FAMILY_KEY}", f"expected one of {', '.join(AB_FAMILIES)}, got {_short(fam)}"
    for side in ("a", "b"):
        if info.get(side) is not None:
            found = check_fields(info[side], AB_SIDE_FIELDS[fam], f"extra_info.{side}")
            if found:
                return found
    for metric, iv in (info.get("intervals") or {}).items():
        if isinstance(iv, dict) and not 0 < iv["low"] <= iv["ratio"] <= iv["high"]:
            return f"extra_info.intervals.{metric}", "not an interval: needs 0 < low <= ratio <= high"
    return None

#: Each benchmark, around its extra_info.
BENCHMARK_FIELDS: Dict[str, Any] = {
    "name": TEXT, "fullname": TEXT, "group": TEXT,
    "stats": {"median": NUMBER, "data": ListOf(NUMBER)},
}

#: The run, around its benchmarks.
RUN_FIELDS: Dict[str, Any] = {
    "datetime": TEXT,
    "commit_info": {"id": TEXT, "dirty": FLAG},
    "machine_info": {
        "python_version": TEXT, "python_implementation": TEXT, "python_compiler": TEXT, "release": TEXT,
        "cpu": {"brand_raw": TEXT},
        "pyconcbench": {"python": TEXT, "python_implementation": TEXT, "python_build": TEXT, "gil_enabled": FLAG,
                        "cpu_model": TEXT, "kernel": TEXT,
                        "cpus_online": COUNT, "fd_limit": {"soft": SCALAR, "hard": SCALAR},
                        "libraries": MapOf(SCALAR), "settings": {"profile": TEXT, "pinning": TEXT}},
    },
}


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    except OverflowError:  # an int beyond any float
        return False


def _kind_problem(value: Any, kind: str) -> Optional[str]:
    if kind == TEXT:
        return None if isinstance(value, str) else "expected " + _WHAT[kind]
    if kind == FLAG:
        return None if isinstance(value, bool) else "expected " + _WHAT[kind]
    if kind == SCALAR:
        ok = isinstance(value, (str, bool)) or (isinstance(value, (int, float)) and _finite(value))
        return None if ok else "expected " + _WHAT[kind]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected " + _WHAT[kind]
    if not _finite(value):
        return f"not a finite number within ±{MAX_MAGNITUDE:g}"
    if kind in (COUNT, INTEGER) and not isinstance(value, int):
        return "expected " + _WHAT[kind]
    if kind in (COUNT, NONNEG) and value < 0:
        return "expected " + _WHAT[kind]
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_fields(value: Any, spec: Any, where: str) -> Optional[Tuple[str, str]]:
    """The first field of ``value`` that does not match ``spec``: (its path, what is wrong), or
    None.  ``where`` is the path of ``value`` itself."""
    if isinstance(spec, REQUIRED):
        spec = spec.kind
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return where, f"expected an object, got {_short(value)}"
        for key, sub in spec.items():
            item = value.get(key)
            path = f"{where}.{key}" if where else key
            if item is None:
                if isinstance(sub, REQUIRED):
                    return path, "missing" if key not in value else "null"
                continue
            found = check_fields(item, sub, path)
            if found:
                return found
        return None
    if isinstance(spec, ListOf):
        if not isinstance(value, list):
            return where, f"expected a list, got {_short(value)}"
        for n, item in enumerate(value):
            found = check_fields(item, spec.item, f"{where}[{n}]") if item is not None else None
            if found:
                return found
        return None
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            return where, f"expected an object, got {_short(value)}"
        for key, item in value.items():
            found = check_fields(item, spec.value, f"{where}.{key}") if item is not None else None
            if found:
                return found
        return None
    problem = _kind_problem(value, spec)
    return (where, f"{problem}, got {_short(value)}") if problem else None


def non_finite(value: Any, where: str) -> Optional[str]:
    """The path of the first NaN, infinite or float-overflowing number anywhere in ``value``."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}") for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{n}]") for n, v in reversed(list(enumerate(item))))
        elif isinstance(item, float) and not math.isfinite(item):
            return path
        elif isinstance(item, int) and not isinstance(item, bool):
            try:
                float(item)
            except OverflowError:
                return path
    return None


def check_benchmark(bench: Any) -> Optional[Tuple[str, str]]:
    """The first problem of one saved benchmark as (field, what is wrong), or None: its own
    fields, its family's stamp and extra_info (FAMILY_FIELDS), and no NaN or infinity anywhere."""
    if not isinstance(bench, dict):
        return "", f"expected an object, got {_short(bench)}"
    found = check_fields(bench, BENCHMARK_FIELDS, "")
    if found:
        return found
    info = bench.get("extra_info")
    if info is not None and not isinstance(info, dict):
        return "extra_info", f"expected an object, got {_short(info)}"
    try:
        fam = family_of(info or {})
    except SchemaError as exc:
        return "extra_info", str(exc).split(": ", 1)[-1]
    found = check_fields(info or {}, FAMILY_FIELDS[fam], "extra_info")
    if found:
        return found
    if fam == AB:
        found = _check_ab(info)
        if found:
            return found
    path = non_finite(bench, "")
    if path is not None:
        return path.lstrip("."), "not a finite number"
    return None


def check_run(data: Any) -> Optional[Tuple[str, str, str]]:
    """The first problem of a saved run as (benchmark, field, what is wrong); benchmark is ''
    for a field of the run itself.  None when the report and the gate can read all of it."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        return "", "benchmarks", "not a pytest-benchmark run (no 'benchmarks' list)"
    found = check_fields(data, RUN_FIELDS, "")
    if found:
        return ("",) + found
    for n, bench in enumerate(data["benchmarks"]):
        found = check_benchmark(bench)
        if found:
            name = bench.get("fullname") or bench.get("name") if isinstance(bench, dict) else None
            label = name if isinstance(name, str) and name else f"#{n}"
            return (label,) + found
    return None


# ---- saved text in Markdown -------------------------------------------------------------------

_MD = str.maketrans({"\\": "\\\\", "|": "\\|", "\n": " ", "\r": " ", "\t": " ", "\x0b": " ", "\x0c": " ",
                     "\x85": " ", "\u2028": " ", "\u2029": " "})
#: What could begin HTML in Markdown: '<' before a tag name, '/', '!' or '?' (a tag, comment,
#: declaration or autolink) and '&' before a name or '#' (an entity).  '<=', '< 5', '->' stay.
_MD_HTML = re.compile(r"<(?=[A-Za-z/!?])|&(?=[A-Za-z0-9#])")
#: What closes a link or image's text: ']' before '(' or '[' ('[90-110]' stays as it is).
_MD_LINK = re.compile(r"\](?=[(\[])")


def md_text(text: Any) -> str:
    """``text`` for a Markdown line or table cell of ours: every '<' that could open a tag and
    every '&' that could start an entity as entities (no HTML of a saved run reaches
    $GITHUB_STEP_SUMMARY), a ``]`` before ``(`` or ``[`` escaped (no link or image), ``|`` escaped (no extra
    cell), line breaks as spaces (no extra line: no heading, list or table row of its own), a
    backslash doubled (it cannot escape our '|').  Emphasis (``*``, ``_``) is left alone: it
    cannot reach outside the cell, and escaping it would mangle every test name."""
    text = str(text).translate(_MD)
    text = "".join(ch if ch.isprintable() or ch == " " else " " for ch in text)
    text = _MD_LINK.sub(r"\\]", text)
    return _MD_HTML.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", text)


def md_code(text: Any, in_table: bool = True) -> str:
    """``text`` as a Markdown code span when that is safe (nothing in it can end the span or
    open a tag: no backtick, ``<`` or line break), else as ``md_text``.  In a table a ``|``
    is escaped (GFM reads ``\\|`` inside a code span there as the character)."""
    text = str(text)
    if any(ch in text for ch in "`<\\") or not text.isprintable():
        return md_text(text)
    return "`" + (text.replace("|", "\\|") if in_table else text) + "`"


#: The version the machine facts record for a library or tool that is not there.
NOT_INSTALLED = "not installed"


def libraries_text(libs: Dict[str, Any], leave_out: Tuple[str, ...] = ()) -> str:
    """'uvloop 0.21.0, rloop 0.5.0 (not installed: curio)': the saved ``libraries`` facts in
    their order, those recorded as NOT_INSTALLED named last."""
    libs = {k: v for k, v in libs.items() if k not in leave_out}
    have = ", ".join(f"{k} {v}" for k, v in libs.items() if v != NOT_INSTALLED)
    missing = ", ".join(k for k, v in libs.items() if v == NOT_INSTALLED)
    if not missing:
        return have or "none recorded"
    return f"{have} (not installed: {missing})" if have else f"none installed (not installed: {missing})"


def python_label(version: str, build: Any = None, gil: Any = None) -> str:
    """'3.13.15' for the default build, '3.13.15t (no GIL)' / '3.13.15t (GIL on)' for a
    free-threaded one: how tables name a Python."""
    if build != "free-threaded":
        return version
    return f"{version}t ({'GIL on' if gil else 'no GIL'})"
