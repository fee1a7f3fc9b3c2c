"""The echo comparison table printed at the end of a benchmark run.

One block per scale (connections x size x transport), implementations sorted by msgs/s.
A rate measured while the load generator was busy >= 90 % of a core is printed as a lower
bound (">="); the server's CPU per message does not depend on the load generator and is the
figure to compare there.  "overhead" is the server's CPU per round trip minus native_epoll's
at the same scale: the concurrency model's own cost.  "KiB/conn" is the server's resident memory
per open connection (after the rounds, less its memory before the load generator connected).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from pyconcbench import explain

BASELINE = "native_epoll"
WIDTH = 38  # implementation column: fits "asyncio_protocol+plain+pristine_malloc"
#: A project server whose rate is outside this band of its plain reference server's (same run,
#: same load) is flagged as a harness effect.
HARNESS_EFFECT_BAND = (0.9, 1.1)


def comparison_notes(row: Dict[str, Any], group: List[Dict[str, Any]]) -> List[str]:
    """What a row is compared with in its scale's group: a project server with its plain
    reference server (flagged outside HARNESS_EFFECT_BAND), a special allocator state with the
    representative one, a simulated network with the local loopback, and the allocator syscalls
    per round trip where they were counted."""
    notes: List[str] = []
    network = row.get("network", "local")

    workers = row.get("workers") or 1

    def find(**want: Any) -> Optional[Dict[str, Any]]:
        want.setdefault("network", (network, "local"))
        want.setdefault("workers", (workers, 1))
        return next((r for r in group if all(r.get(k, d) == v for k, (v, d) in want.items())), None)

    impl, malloc = row["impl"], row.get("malloc", "representative")
    if workers != 1:
        one = find(impl=(impl, None), plain=(False, False), malloc=(malloc, "representative"), workers=(1, 1))
        if one and one["msgs_per_s"]:
            notes.append(f"{row['msgs_per_s'] / one['msgs_per_s']:.2f}x 1 worker")
        if row.get("workers_note"):
            notes.append(row["workers_note"])
    if network != "local":
        notes += network_notes(row, find(impl=(impl, None), plain=(bool(row.get("plain")), False),
                                         malloc=(malloc, "representative"), network=("local", "local")))
    if not row.get("plain"):
        ref = find(impl=(impl, None), plain=(True, False), malloc=(malloc, "representative"))
        if ref and ref.get("msgs_per_s"):
            ratio = row["msgs_per_s"] / ref["msgs_per_s"]
            low, high = HARNESS_EFFECT_BAND
            if low <= ratio <= high:
                notes.append(f"{ratio:.2f}x its plain server")
            else:
                notes.append(f"⚠ harness effect: {ratio:.2f}x its plain server (outside {low}-{high})")
    if malloc != "representative":
        rep = find(impl=(impl, None), plain=(bool(row.get("plain")), False), malloc=("representative", "representative"))
        if rep and rep.get("msgs_per_s"):
            notes.append(f"{row['msgs_per_s'] / rep['msgs_per_s']:.2f}x representative")
    else:
        # the striking difference, on the row users read: a fresh process runs at a fraction of this
        fresh = find(impl=(impl, None), plain=(bool(row.get("plain")), False), malloc=("pristine", "representative"))
        if fresh and fresh.get("msgs_per_s") and row.get("msgs_per_s"):
            ratio = fresh["msgs_per_s"] / row["msgs_per_s"]
            fper = fresh.get("alloc_syscalls_per_msg") or {}
            calls = [f"{n} {fper[n]:.2f}" for n in ("mmap", "munmap", "mremap") if fper.get(n)]
            if ratio < 0.8 and calls:
                notes.append(f"a fresh process runs {ratio:.2f}x this: its allocator maps each receive buffer "
                             f"({', '.join(calls)} per round trip) until a client disconnects")
            elif ratio < 0.8:
                notes.append(f"a fresh process (pristine allocator) runs {ratio:.2f}x this")
    per = row.get("alloc_syscalls_per_msg")
    if per:
        calls = [f"{name} {per[name]:.2f}" for name in ("mmap", "munmap", "mremap", "brk") if per.get(name)]
        notes.append("allocator calls per round trip: " + (", ".join(calls) if calls else "none"))
    elif "alloc_syscalls_per_msg" in row:
        notes.append("allocator calls " + str(row.get("alloc_syscalls_note") or "not counted (no perf or strace)"))
    return notes


def network_notes(row: Dict[str, Any], local: Optional[Dict[str, Any]]) -> List[str]:
    """A row over a simulated network (--pcb-network netns...): what each round trip crossed,
    the probe's round trip there, and the rate and p50 against the same server's local row."""
    delay = row.get("network_delay_us") or 0
    parts = [f"netns: +{2 * delay:,} us per round trip by netem (2 x {delay:,} us)" if delay
             else "netns: the namespace alone (no qdisc)"]
    if row.get("network_rtt_us") is not None:
        parts.append(f"probe round trip {row['network_rtt_us']:,.0f} us")
    if local and local.get("msgs_per_s") and row.get("msgs_per_s"):
        parts.append(f"{row['msgs_per_s'] / local['msgs_per_s']:.2f}x local, "
                     f"p50 {row['latency_p50_us'] - local['latency_p50_us']:+,.0f} us")
    return ["; ".join(parts)]


def baseline(row: Dict[str, Any], group: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The native_epoll row a row's "x native" and "overhead" are against: over the same network,
    with as many workers."""
    network = row.get("network", "local")
    workers = row.get("workers") or 1
    return next((r for r in group if r["impl"] == BASELINE and not r.get("plain")
                 and r.get("malloc", "representative") == "representative"
                 and r.get("network", "local") == network and (r.get("workers") or 1) == workers), None)


def size_label(size: int) -> str:
    """64 -> '64B', 1024 -> '1KiB', 1048576 -> '1MiB' (as in test ids and group names)."""
    for unit, n in (("MiB", 1 << 20), ("KiB", 1024)):
        if size % n == 0:
            return f"{size // n}{unit}"
    return f"{size}B"


def _scale_key(row: Dict[str, Any]) -> Tuple[str, int, int, int]:
    return (row["transport"], row["size"], row["connections"], row.get("pipeline") or 1)


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def echo_table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    groups: Dict[Tuple[str, int, int, int], List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_scale_key(row), []).append(row)
    header = (f"{'implementation':<{WIDTH}} {'msgs/s':>11} {'x native':>8} {'p50 us':>8} {'p99 us':>8} "
              f"{'srv us/msg':>10} {'overhead':>8} {'user%':>5} {'srv cpu':>7} {'lg cpu':>6} {'KiB/conn':>8}  notes")
    lines: List[str] = []
    for (transport, size, conns, pipeline), group in sorted(groups.items()):
        group.sort(key=lambda r: -r["msgs_per_s"])
        lines.append("")
        lines.append(f"echo {conns} connections x {size_label(size)} over {transport}"
                     + (f", {pipeline} in flight per connection" if pipeline != 1 else ""))
        lines.append(header)
        for r in group:
            notes = []
            bound = r.get("loadgen_bound")
            if bound:
                notes.append("load-generator-bound: rate is a lower bound")
            if r.get("starving_connections"):
                notes.append(f"{r['starving_connections']} starving connections")
            if r.get("noisy_rounds_kept"):
                notes.append(f"figures from {r['figures_from']}" if r.get("figures_from")
                             else f"{r['noisy_rounds_kept']} noisy rounds kept")
            if str(r.get("other_cpu_check", "ran")).startswith("unknown"):
                notes.append("other processes' CPU unknown (/proc/stat unreadable)")
            notes += comparison_notes(r, group) + explain_notes(r)
            base = baseline(r, group)
            ratio = r["msgs_per_s"] / base["msgs_per_s"] if base and base["msgs_per_s"] else None
            overhead = None
            if base and base.get("server_cpu_us_per_msg") is not None and r.get("server_cpu_us_per_msg") is not None:
                overhead = r["server_cpu_us_per_msg"] - base["server_cpu_us_per_msg"]
            user = r.get("server_user_share")
            rate = ("≥" if bound else "") + f"{r['msgs_per_s']:,.0f}"
            lines.append(
                f"{r.get('label', r['impl']):<{WIDTH}} {rate:>11} {_fmt(ratio, '.2f'):>8} {r['latency_p50_us']:>8.1f} "
                f"{r['latency_p99_us']:>8.1f} {_fmt(r.get('server_cpu_us_per_msg'), '.2f'):>10} "
                f"{_fmt(overhead, '+.2f'):>8} {_fmt(None if user is None else user * 100, '.0f'):>5} "
                f"{r['server_cpu_share'] * 100:>6.0f}% {r['loadgen_cpu_share'] * 100:>5.0f}% "
                f"{_fmt(r.get('rss_per_conn_kib'), '.1f'):>8}  "
                + "; ".join(notes)
            )
    return lines


def workers_table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    """Round trips per second by worker processes (--pcb-workers), per scale and implementation
    (representative allocator, local loopback, project servers), with each count's speed-up over
    1 worker; [] when every row ran with 1 worker."""
    rows = [r for r in rows if not r.get("plain") and r.get("malloc", "representative") == "representative"
            and r.get("network", "local") == "local"]
    counts = sorted({r.get("workers") or 1 for r in rows})
    if counts == [1] or not counts:
        return []
    table: Dict[Tuple[Tuple[str, int, int, int], str], Dict[int, Dict[str, Any]]] = {}
    for r in rows:
        table.setdefault((_scale_key(r), r["impl"]), {})[r.get("workers") or 1] = r
    lines = ["", "msgs/s by worker processes (x: against 1 worker)",
             f"{'scale':<24} {'implementation':<{WIDTH - 14}}" + "".join(f" {'w' + str(n):>16}" for n in counts)]
    notes = sorted({r["workers_note"].split(":")[0] for r in rows if r.get("workers_note")})
    for ((transport, size, conns, pipeline), impl), by in sorted(table.items()):
        scale = f"c{conns}-{size_label(size)}" + (f"-p{pipeline}" if pipeline != 1 else "") + f" {transport}"
        one = by.get(1)
        cells = []
        for n in counts:
            r = by.get(n)
            if r is None:
                cells.append(f" {'-':>16}")
                continue
            x = f" ({r['msgs_per_s'] / one['msgs_per_s']:.2f}x)" if one and one["msgs_per_s"] and n != 1 else ""
            cells.append(f" {format(r['msgs_per_s'], ',.0f') + x:>16}")
        lines.append(f"{scale:<24} {impl:<{WIDTH - 14}}" + "".join(cells))
    if notes:
        lines.append("⚠ " + "; ".join(notes) + ": a functional check, not a scaling figure")
    return lines


#: The measuring engine should reach this share of the load generator's minimal loop (the
#: ceiling): below it, the engine's own per-message work limits the fastest servers' rows.
ENGINE_CEILING_FLOOR = 0.95


def ceiling_table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    """The load generator's ceiling against native_epoll and the share of it the measuring
    engine reaches, flagged below ENGINE_CEILING_FLOOR (a flag, not a failure: the figure is
    timed, so it moves with the machine)."""
    rows = sorted(rows, key=lambda r: r.get("connections", 0))
    if not rows:
        return []
    lines = ["", "load generator ceiling against native_epoll (64B over tcp): minimal loop vs measuring engine",
             f"{'connections':>11} {'ceiling msgs/s':>14} {'engine msgs/s':>13} {'engine/ceiling':>14} "
             f"{'paired median':>13}  notes"]
    for r in rows:
        ratio = r.get("engine_to_ceiling")
        paired = r.get("engine_to_ceiling_paired_median")
        notes = []
        judged = paired if paired is not None else ratio
        if judged is None:
            notes.append("engine_to_ceiling missing")
        elif judged < ENGINE_CEILING_FLOOR:
            notes.append(f"⚠ engine below {ENGINE_CEILING_FLOOR:.0%} of the ceiling: the fastest servers' "
                         f"rates here are the engine's limit")
        lines.append(f"{r.get('connections', 0):>11} {_fmt(r.get('msgs_per_s'), ',.0f'):>14} "
                     f"{_fmt(r.get('engine_msgs_per_s'), ',.0f'):>13} {_fmt(ratio, '.3f'):>14} "
                     f"{_fmt(paired, '.3f'):>13}  " + "; ".join(notes))
    return lines


def explain_notes(row: Dict[str, Any]) -> List[str]:
    """The short notes of the row's traced round (pyconcbench.explain): what explains a rate."""
    explained = row.get("explain")
    if not isinstance(explained, dict):
        return []
    return [f["note"] for f in explained.get("findings") or [] if isinstance(f, dict) and f.get("note")]


def explain_table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    """What each implementation does per round trip, from its one traced round (--pcb-explain)."""
    lines: List[str] = []
    for row in sorted((r for r in rows if isinstance(r.get("explain"), dict)), key=lambda r: r["impl"]):
        explained = row["explain"]
        if not lines:
            lines += ["", "what each implementation does per round trip (one extra, untimed round traced after "
                          "the measured ones: --pcb-explain)"]
        texts = [f["text"] for f in explained.get("findings") or [] if isinstance(f, dict) and f.get("text")]
        scale = f"c{row['connections']}-{size_label(row['size'])}" + ("-unix" if row["transport"] == "unix" else "")
        lines.append(f"{row.get('label', row['impl']):<{WIDTH}} {scale:<12} "
                     + ("; ".join(texts) if texts else explained.get("note") or "nothing counted"))
    return lines


def syscall_table(rows: Iterable[Dict[str, Any]], top: int = 6) -> List[str]:
    """Syscalls per round trip for the rows that counted them (``--pcb-syscalls``)."""
    lines: List[str] = []
    for row in rows:
        per = row.get("syscalls_per_msg")
        if not per:
            continue
        if not lines:
            lines += ["", "syscalls per round trip (counted with tracing on; rates then are lower)"]
        calls = ", ".join(explain.top_calls(per, top))
        extra = []
        if per.get("other"):
            extra.append(f"other {per['other']:.2f}")
        if "context_switches" in per:
            extra.append(f"context switches {per['context_switches']:.3f}")
        scale = f"c{row['connections']}-{size_label(row['size'])}" + ("-unix" if row["transport"] == "unix" else "")
        lines.append(f"{row.get('label', row['impl']):<{WIDTH}} {scale:<16} total {per.get('total', 0):6.2f}: "
                     + calls + ("; " + "; ".join(extra) if extra else ""))
    return lines
