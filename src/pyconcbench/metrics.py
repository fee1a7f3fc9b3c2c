"""The result schema: which family a saved benchmark belongs to, and every metric the gate and
the reports read from it (its key in extra_info, where its per-round samples are, its unit,
which way is better, how it is printed).

Every benchmark the suite saves is stamped ``pcb_family`` (``echo``, ``ceiling``, ``switch``,
``zmq``, ``ab``: an interleaved A/B echo case, see ``pyconcbench.ab``) and ``pcb_schema`` (``SCHEMA_VERSION``) in its extra_info.  (The switch family's own
``family`` key is the language -- python, native, go -- hence the prefix.)  Runs saved before
the stamp existed (schema 0) are recognised by the keys they hold.  A schema newer than this
code is refused: ``SchemaError``, one line.  No pytest, no workload here: the report and the
gate read saved JSON through this module only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

SCHEMA_VERSION = 1
FAMILY_KEY = "pcb_family"
SCHEMA_KEY = "pcb_schema"

ECHO, CEILING, SWITCH, ZMQ, AB = "echo", "ceiling", "switch", "zmq", "ab"
FAMILIES = (ECHO, CEILING, SWITCH, ZMQ, AB)
OTHER = "other"


class SchemaError(ValueError):
    """A saved benchmark this code cannot read: the message says which and why."""


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

    @property
    def better(self) -> str:
        return "higher" if self.higher_is_better else "lower"


METRICS: Dict[str, Metric] = {m.name: m for m in (
    Metric("msgs_per_s", True, "msgs/s", (("msgs_per_s", "rounds", "msgs_per_s"),),
           "echo round trips per second", (ECHO, CEILING)),
    Metric("requests_per_s", True, "req/s", (("requests_per_s", "rounds", "requests_per_s"),),
           "ZeroMQ requests per second", (ZMQ,)),
    Metric("latency_p50", False, "us", (("latency_p50_us", "rounds", "latency_p50_us"),),
           "median round-trip latency", (ECHO, ZMQ)),
    Metric("latency_p90", False, "us", (("latency_p90_us", "rounds", "latency_p90_us"),),
           "90th percentile latency", (ECHO, ZMQ)),
    Metric("latency_p95", False, "us", (("latency_p95_us", "rounds", "latency_p95_us"),),
           "95th percentile latency", (ECHO, ZMQ)),
    Metric("latency_p99", False, "us", (("latency_p99_us", "rounds", "latency_p99_us"),),
           "99th percentile latency", (ECHO, ZMQ)),
    Metric("server_cpu_us_per_msg", False, "us", (("server_cpu_us_per_msg", "rounds", "server_cpu_us_per_msg"),),
           "the echo server's CPU per round trip", (ECHO,)),
    Metric("cpu_us_per_req", False, "us", (("cpu_us_per_req", "rounds", "cpu_us_per_req"),),
           "the ZeroMQ client's CPU per request", (ZMQ,)),
    Metric("ns_per_op", False, "ns", (("ns_per_op", "samples", "ns_per_op"),),
           "a switch microbenchmark's cost per operation", (SWITCH,)),
    Metric("time", False, "s", (("", "", ""),),
           "pytest-benchmark's round time (median)"),
)}


#: The gate's metrics an interleaved A/B case (family ``ab``) compares pair by pair: metric
#: name -> the key of each side's per-round figure.  Saved per pair as B/A, summarised as an
#: interval under ``intervals``.
AB_PAIR_KEYS: Dict[str, str] = {
    "msgs_per_s": "msgs_per_s",
    "latency_p50": "latency_p50_us",
    "latency_p90": "latency_p90_us",
    "latency_p95": "latency_p95_us",
    "latency_p99": "latency_p99_us",
    "server_cpu_us_per_msg": "server_cpu_us_per_msg",
}


def fmt_value(value: Optional[float], metric: Metric) -> str:
    """A metric's value with its unit, as the gate prints it."""
    if value is None:
        return "-"
    if metric.unit in ("msgs/s", "req/s"):
        return f"{value:,.0f} {metric.unit}"
    if metric.unit == "s":
        return f"{value * 1e3:.3f} ms"
    return f"{value:,.2f} {metric.unit}"
