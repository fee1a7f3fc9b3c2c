"""Saved runs in pytest-benchmark's JSON format, built from given per-round figures, for the
report and gate tests.  The shapes are those the plugin and the bench suite write (see
``pyconcbench.echo.EchoOutcome``, ``micro.Runner.summary``, ``zmq.summarize``)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

FACTS = {"cpu_model": "Test CPU", "cpus_online": 2, "kernel": "6.18.0", "python": "3.11.7",
         "python_implementation": "CPython", "fd_limit": {"soft": 20000, "hard": 20000},
         "libraries": {"pytest-benchmark": "5.3.1"},
         "settings": {"profile": "quick", "pinning": "server on CPU 0, load generator on CPU 1"}}


def echo(impl: str, conns: int, rates: Sequence[float], size: int = 64, transport: str = "tcp",
         p99: Optional[Sequence[float]] = None, cpu_us: float = 5.0, rss: Optional[Sequence[int]] = None,
         rss_idle: int = 10240, **extra: Any) -> Dict[str, Any]:
    """One echo benchmark with these per-round msgs/s (and p99 µs per round); ``rss``: the
    server's resident KiB after each round (then its memory keys, from ``rss_idle``, as the
    plugin saves them), None: a run saved before the server's memory was measured."""
    p99 = list(p99) if p99 is not None else [100.0 + 1000.0 * conns / r for r in rates]
    rounds = [{"msgs_per_s": r, "completed": 10000, "elapsed": 10000 / r, "latency_p50_us": p / 3,
               "latency_p95_us": p * 0.8, "latency_p99_us": p, "server_cpu_us_per_msg": cpu_us}
              for r, p in zip(rates, p99)]
    memory: Dict[str, Any] = {}
    if rss is not None:
        for r, kib in zip(rounds, rss):
            r.update(rss_kib=kib, rss_per_conn_kib=round((kib - rss_idle) / conns, 3))
        memory = {"server_rss_idle_kib": rss_idle, "server_rss_connected_kib": rss[0],
                  "server_rss_loaded_kib": float(statistics.median(rss)),
                  "rss_per_conn_kib": round(statistics.median(r["rss_per_conn_kib"] for r in rounds), 3)}
    scale = f"c{conns}-{size}B" + ("-unix" if transport == "unix" else "")
    info = {"impl": impl, "label": impl, "connections": conns, "size": size, "transport": transport,
            "msgs_per_s": round(len(rates) * 10000 / sum(10000 / r for r in rates), 1),
            "mib_per_s": 1.0, "latency_p50_us": statistics.median(p99) / 3,
            "latency_p95_us": statistics.median(p99) * 0.8, "latency_p99_us": statistics.median(p99),
            "fairness_jain": 0.999, "fairness_min": 90, "fairness_max": 110, "starving_connections": 0,
            "loadgen_cpu_share": 0.5, "loadgen_bound": False, "server_cpu_share": 0.99,
            "server_user_share": 0.3, "server_cpu_us_per_msg": cpu_us, **memory, "rounds": rounds}
    info.update(extra)
    times = [r["elapsed"] for r in rounds]
    return {"group": f"echo-{scale}", "name": f"test_echo[{impl}-{scale}]",
            "fullname": f"tests/bench/test_echo.py::test_echo[{impl}-{scale}]",
            "params": {}, "param": f"{impl}-{scale}", "extra_info": info, "options": {},
            "stats": {"min": min(times), "max": max(times), "mean": statistics.mean(times),
                      "stddev": statistics.stdev(times) if len(times) > 1 else 0,
                      "rounds": len(times), "median": statistics.median(times), "iqr": 0, "q1": min(times),
                      "q3": max(times), "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
                      "ld15iqr": min(times), "hd15iqr": max(times), "ops": 1 / statistics.mean(times),
                      "total": sum(times), "iterations": 1}}


def switch(case: str, ns: Sequence[float], group: str = "switch-python", depth: Optional[int] = None) -> Dict[str, Any]:
    family, name = case.split("-", 1) if depth is None else ("python", case)
    test = "test_depth" if depth is not None else "test_switch"
    info = {"micro": case, "group": group, "family": family, "case": name, "op": "one switch",
            "ns_per_op": statistics.median(ns), "ns_per_op_min": min(ns), "ns_per_op_max": max(ns),
            "samples": [{"ns_per_op": v, "ops": 1000, "elapsed_ns": v * 1000} for v in ns]}
    if depth is not None:
        info["depth"] = depth
    b = echo("x", 1, [1.0])
    b.update(group=group, name=f"{test}[{case}]", fullname=f"tests/bench/test_switch.py::{test}[{case}]",
             extra_info=info)
    return b


def zmq(mode: str, rates: Sequence[float], group: str = "zmq-200B-if1") -> Dict[str, Any]:
    info = {"mode": mode, "size": 200, "inflight": 1, "transport": "tcp",
            "requests_per_s": statistics.mean(rates), "latency_p50_us": 50.0, "latency_p99_us": 90.0,
            "cpu_us_per_req": 20.0,
            "rounds": [{"requests_per_s": r, "latency_p50_us": 50.0, "latency_p99_us": 90.0} for r in rates]}
    b = echo("x", 1, [1.0])
    b.update(group=group, name=f"test_zmq[{mode}-200B-if1]", fullname=f"tests/bench/test_zmq.py::test_zmq[{mode}-200B-if1]",
             extra_info=info)
    return b


def run(benchmarks: List[Dict[str, Any]], python: str = "3.11.7", when: str = "2026-11-22T10:00:00",
        **facts: Any) -> Dict[str, Any]:
    f = dict(FACTS, python=python, **facts)
    return {"machine_info": {"python_version": python, "python_implementation": "CPython",
                             "python_compiler": "GCC", "release": f["kernel"], "pyconcbench": f},
            "commit_info": {"id": "0123456789abcdef", "dirty": False},
            "benchmarks": benchmarks, "datetime": when, "version": "5.3.1"}


def save(folder: Path, name: str, data: Dict[str, Any], machine_id: str = "Linux-CPython-3.11-64bit") -> Path:
    path = folder / machine_id / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf8")
    return path


def openloop(impl: str, fraction: float, maximum: float, achieved: float, p99: Sequence[float],
             unc_p99: float = 80.0, conns: int = 100) -> Dict[str, Any]:
    """One open-loop benchmark (pyconcbench.openloop): ``fraction`` of the closed-loop
    ``maximum`` asked, ``achieved`` msgs/s, the corrected p99 µs of each round."""
    asked = fraction * maximum
    label = f"{fraction * 100:g}pct"
    b = echo(impl, conns, [achieved] * len(p99), p99=p99)
    spectrum = [[0.0, 20.0], [50.0, 40.0], [99.0, statistics.median(p99)], [100.0, max(p99) * 1.2]]
    b["extra_info"].update(pcb_family="openloop", pcb_schema=1, pipeline=1, arrival="uniform", rate_label=label,
                           rate_fraction=fraction, rate_asked=asked, rate_achieved_share=achieved / asked,
                           rate_held=achieved >= 0.95 * asked, closed_loop_max_msgs_per_s=maximum,
                           latency_p99_9_us=max(p99) * 1.1, latency_max_us=max(p99) * 1.2,
                           latency_uncorrected_p99_us=unc_p99, sent=30000, sent_late=30,
                           latency_spectrum=spectrum,
                           latency_uncorrected_spectrum=[[p, min(v, unc_p99)] for p, v in spectrum])
    scale = f"c{conns}-64B"
    b.update(group=f"openloop-{scale}-{label}", name=f"test_openloop[{impl}-{scale}-{label}]",
             fullname=f"test_openloop.py::test_openloop[{impl}-{scale}-{label}]")
    return b
