"""The open-loop family's tables (pyconcbench.openloop): per scale, each implementation's rows by
rate asked, with the latency from each message's intended send time (corrected) beside the
latency from its actual send (uncorrected), and whether the rate was held.  Plain lists of
strings: the terminal table at the end of a run, and the report's rows (``rows``).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from pyconcbench.report.echo_tables import size_label

WIDTH = 24

HEAD = ["implementation", "asked", "of max", "achieved", "held", "p50 us", "p99 us", "p99.9 us", "max us",
        "unc. p99 us", "late %", "srv us/msg"]

NOTE = ("Open loop: every message has an intended send time (each connection on its own schedule at "
        "rate / connections), whatever the server does; a message due while its connection waits for an echo "
        "queues, and its wait counts. Latencies (p50 … max) are from the intended send time, corrected for "
        "coordinated omission; 'unc. p99' is from the actual send, what a closed-loop tool would report. "
        "'of max': the asked rate as a share of the implementation's closed-loop maximum, measured first in "
        "the same run; 'held': achieved ≥ 95 % of asked (a rate not held is never lowered: its latencies "
        "grow with the queue); 'late %': messages sent more than 1 ms after their intended time.")


def scale_of(info: Dict[str, Any]) -> Tuple[str, int, int, int]:
    return (info["transport"], info["size"], info["connections"], info.get("pipeline") or 1)


def scale_title(key: Tuple[str, int, int, int], arrival: str = "uniform") -> str:
    transport, size, conns, pipeline = key
    text = f"open loop, {conns} connections x {size_label(size)} over {transport}"
    if pipeline != 1:
        text += f", up to {pipeline} in flight per connection"
    return text + ("" if arrival == "uniform" else f", {arrival} arrivals")


def _f(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row_cells(i: Dict[str, Any]) -> List[str]:
    frac = i.get("rate_fraction")
    sent = i.get("sent") or 0
    return [
        str(i.get("label") or i.get("impl")),
        _f(i.get("rate_asked"), ",.0f"),
        "-" if frac is None else f"{frac * 100:g}%",
        _f(i.get("msgs_per_s"), ",.0f"),
        "yes" if i.get("rate_held") else "NO",
        _f(i.get("latency_p50_us"), ",.1f"),
        _f(i.get("latency_p99_us"), ",.1f"),
        _f(i.get("latency_p99_9_us"), ",.1f"),
        _f(i.get("latency_max_us"), ",.1f"),
        _f(i.get("latency_uncorrected_p99_us"), ",.1f"),
        _f(100.0 * (i.get("sent_late") or 0) / sent if sent else None, ".2f"),
        _f(i.get("server_cpu_us_per_msg"), ".2f"),
    ]


def grouped(infos: Iterable[Dict[str, Any]]) -> Dict[Tuple[Tuple[str, int, int, int], str], List[Dict[str, Any]]]:
    """Rows by (scale, arrival), each group by implementation (in order of first appearance),
    then by rate asked."""
    groups: Dict[Tuple[Tuple[str, int, int, int], str], List[Dict[str, Any]]] = {}
    for i in infos:
        groups.setdefault((scale_of(i), i.get("arrival") or "uniform"), []).append(i)
    for rows in groups.values():
        order: Dict[str, int] = {}
        for r in rows:
            order.setdefault(str(r.get("label") or r.get("impl")), len(order))
        rows.sort(key=lambda r: (order[str(r.get("label") or r.get("impl"))], r.get("rate_asked") or 0))
    return groups


def table(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """The terminal table: one block per scale."""
    lines: List[str] = []
    widths = [WIDTH, 10, 6, 10, 4, 9, 9, 9, 9, 11, 6, 10]
    for (key, arrival), rows in sorted(grouped(infos).items()):
        lines += ["", scale_title(key, arrival)]
        lines.append(" ".join(h.ljust(w) if n == 0 else h.rjust(w) for n, (h, w) in enumerate(zip(HEAD, widths))))
        for r in rows:
            cells = row_cells(r)
            line = " ".join(c.ljust(w) if n == 0 else c.rjust(w) for n, (c, w) in enumerate(zip(cells, widths)))
            notes = []
            if r.get("closed_loop_max_loadgen_bound"):
                near = (r.get("rate_asked") or 0) <= (r.get("closed_loop_max_msgs_per_s") or 0)
                notes.append("max load-generator-bound: a lower bound"
                             + ("; not held at the load generator's own limit, likely"
                                if not r.get("rate_held") and near else ""))
            if r.get("engine_wait", "").startswith("unpinned"):
                notes.append("engine unpinned: its timer wake-ups count in the latency")
            if r.get("messages_cut"):
                notes.append("far beyond the maximum: rounds cut to twice its worth")
            if r.get("noisy_rounds_kept"):
                notes.append(f"{r['noisy_rounds_kept']} noisy rounds kept")
            lines.append(line + ("  " + "; ".join(notes) if notes else ""))
    if lines:
        lines += ["", NOTE]
    return lines
