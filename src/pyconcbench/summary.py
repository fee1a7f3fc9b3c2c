"""The echo comparison table printed at the end of a benchmark run.

One block per scale (connections x size x transport), implementations sorted by msgs/s.
A rate measured while the load generator was busy >= 90 % of a core is printed as a lower
bound (">="); the server's CPU per message does not depend on the load generator and is the
figure to compare there.  "overhead" is the server's CPU per round trip minus native_epoll's
at the same scale: the concurrency model's own cost.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

BASELINE = "native_epoll"


def size_label(size: int) -> str:
    """64 -> '64B', 1024 -> '1KiB', 1048576 -> '1MiB' (as in test ids and group names)."""
    for unit, n in (("MiB", 1 << 20), ("KiB", 1024)):
        if size % n == 0:
            return f"{size // n}{unit}"
    return f"{size}B"


def _scale_key(row: Dict[str, Any]) -> Tuple[str, int, int]:
    return (row["transport"], row["size"], row["connections"])


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def echo_table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    groups: Dict[Tuple[str, int, int], List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_scale_key(row), []).append(row)
    header = (f"{'implementation':<18} {'msgs/s':>11} {'x native':>8} {'p50 us':>8} {'p99 us':>8} "
              f"{'srv us/msg':>10} {'overhead':>8} {'user%':>5} {'srv cpu':>7} {'lg cpu':>6}  notes")
    lines: List[str] = []
    for (transport, size, conns), group in sorted(groups.items()):
        group.sort(key=lambda r: -r["msgs_per_s"])
        base = next((r for r in group if r["impl"] == BASELINE), None)
        lines.append("")
        lines.append(f"echo {conns} connections x {size_label(size)} over {transport}")
        lines.append(header)
        for r in group:
            notes = []
            bound = r.get("loadgen_bound")
            if bound:
                notes.append("load-generator-bound: rate is a lower bound")
            if r.get("starving_connections"):
                notes.append(f"{r['starving_connections']} starving connections")
            if r.get("noisy_rounds_kept"):
                notes.append(f"{r['noisy_rounds_kept']} noisy rounds kept")
            ratio = r["msgs_per_s"] / base["msgs_per_s"] if base and base["msgs_per_s"] else None
            overhead = None
            if base and base.get("server_cpu_us_per_msg") is not None and r.get("server_cpu_us_per_msg") is not None:
                overhead = r["server_cpu_us_per_msg"] - base["server_cpu_us_per_msg"]
            user = r.get("server_user_share")
            rate = ("≥" if bound else "") + f"{r['msgs_per_s']:,.0f}"
            lines.append(
                f"{r['impl']:<18} {rate:>11} {_fmt(ratio, '.2f'):>8} {r['latency_p50_us']:>8.1f} "
                f"{r['latency_p99_us']:>8.1f} {_fmt(r.get('server_cpu_us_per_msg'), '.2f'):>10} "
                f"{_fmt(overhead, '+.2f'):>8} {_fmt(None if user is None else user * 100, '.0f'):>5} "
                f"{r['server_cpu_share'] * 100:>6.0f}% {r['loadgen_cpu_share'] * 100:>5.0f}%  "
                + "; ".join(notes)
            )
    return lines
