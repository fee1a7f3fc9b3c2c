"""The studies' plots from saved runs, drawn with matplotlib's Agg backend (no display needed).

    echo-msgs-vs-connections-<transport>-<size>.png   msgs/s against connections, log x
    echo-p95-vs-connections-<transport>-<size>.png    p95 latency against connections, log-log
    echo-kib-per-conn-vs-connections-<transport>-<size>.png
                                                      the server's resident KiB per connection
                                                      against connections, log x
    echo-msgs-vs-size-<transport>-c<N>.png            msgs/s against message size, log x
    switch-depth.png                                  ns per switch against delegation depth
    switch-costs.png                                  bar chart of every switch cost, log scale

A plot is drawn only when the run has the sweep it needs (two or more connection counts, two
or more sizes, ...); ``plot_all`` says which it skipped and why.
"""
from __future__ import annotations

import io
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pyconcbench.report.results import Families
from pyconcbench.report.echo_tables import BASELINE, size_label


class PlotsUnavailable(Exception):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable("--png and --html need matplotlib: pip install 'pyconcbench[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(label: str) -> Dict[str, Any]:
    """Native and peer baselines dashed, so the Python models stand out."""
    if label.startswith("native") or label in ("go_net", "node_net"):
        return {"linestyle": "--", "linewidth": 1.6}
    return {"linestyle": "-", "linewidth": 1.4}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


MARKERS = "osD^vP*Xhp<>"


def _look(plt, label: str) -> Dict[str, Any]:
    """One colour and marker per implementation, the same in every plot: by its place in the
    registry (a variant such as ``+tuned_malloc`` gets its own)."""
    from pyconcbench.servers import IMPLS

    palette = list(plt.get_cmap("tab20").colors)[0::2] + list(plt.get_cmap("tab20b").colors)[0::4] \
        + list(plt.get_cmap("tab20").colors)[1::2]
    known = list(IMPLS)
    base, _, variant = label.partition("+")
    n = known.index(base) if base in known else len(known) + sum(map(ord, base)) % 17
    if variant:
        n += len(known)
    look = {"color": palette[n % len(palette)], "marker": MARKERS[n % len(MARKERS)]}
    look.update(_style(label))
    return look


def _lines(plt, series: Dict[str, List[Tuple[float, float]]], title: str, xlabel: str, ylabel: str,
           logx: bool, logy: bool, xticks: Sequence[Tuple[float, str]] = (), yformat: Optional[str] = ",.0f"):
    fig, ax = plt.subplots(figsize=(9, 5.5))
    # legend order: highest value at the largest x first, as the lines end
    order = sorted(series, key=lambda k: -sorted(series[k])[-1][1])
    for label in order:
        pts = sorted(series[label])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], markersize=4, label=label, **_look(plt, label))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if xticks:
        ax.set_xticks([t[0] for t in xticks])
        ax.set_xticklabels([t[1] for t in xticks])
        ax.minorticks_off() if not logy else None
    ax.set_title(_plain(title))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    if not logy:
        if yformat is not None:
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: format(v, yformat)))
        # from 0, or below it when a value is (memory a server gave back): never cut off
        ax.set_ylim(bottom=min([0.0] + [y for pts in series.values() for _, y in pts]))
    data = _png(fig)
    plt.close(fig)
    return data


def _label(info: Dict[str, Any]) -> str:
    return _plain(info.get("label") or info.get("impl") or "?")


def _plain(text: str) -> str:
    """A saved name as matplotlib text: a '$' would start mathtext (and bad TeX fails the plot)."""
    return str(text).replace("$", r"\$")


def plot_all(fams: Families) -> Tuple[List[Tuple[str, bytes]], List[str]]:
    """-> ([(file name, PNG bytes)], [what was skipped and why])."""
    with warnings.catch_warnings():
        # matplotlib releases that still support Python 3.9 call pyparsing's deprecated names
        # (when it first lays out text): not the user's business.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _plot_all(fams)


def _plot_all(fams: Families) -> Tuple[List[Tuple[str, bytes]], List[str]]:
    plt = _pyplot()
    images: List[Tuple[str, bytes]] = []
    skipped: List[str] = []
    # ping-pong only: pipelined rows (--pcb-pipeline) are another measurement
    infos = [b["extra_info"] for b in fams.echo if (b["extra_info"].get("pipeline") or 1) == 1]

    by_scale: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for i in infos:
        by_scale.setdefault((i["transport"], i["size"]), []).append(i)
    drew_conns = drew_memory = False
    for (transport, size), group in sorted(by_scale.items()):
        conns = sorted({i["connections"] for i in group})
        if len(conns) < 2:
            continue
        drew_conns = True
        ticks = [(c, f"{c:,}") for c in conns]
        rate: Dict[str, List[Tuple[float, float]]] = {}
        p95: Dict[str, List[Tuple[float, float]]] = {}
        for i in group:
            rate.setdefault(_label(i), []).append((i["connections"], i["msgs_per_s"]))
            if i.get("latency_p95_us"):
                p95.setdefault(_label(i), []).append((i["connections"], i["latency_p95_us"]))
        where = f"{size_label(size)} messages over {transport}"
        images.append((f"echo-msgs-vs-connections-{transport}-{size_label(size)}.png",
                       _lines(plt, rate, f"Echo throughput vs connections ({where})", "connections (log)",
                              "round trips per second", True, False, ticks)))
        images.append((f"echo-p95-vs-connections-{transport}-{size_label(size)}.png",
                       _lines(plt, p95, f"Echo p95 latency vs connections ({where})", "connections (log)",
                              "p95 round-trip latency, µs (log)", True, True, ticks)))
        # memory per connection: runs saved before the server's memory was measured have none
        memory: Dict[str, List[Tuple[float, float]]] = {}
        for i in group:
            if isinstance(i.get("rss_per_conn_kib"), (int, float)):
                memory.setdefault(_label(i), []).append((i["connections"], i["rss_per_conn_kib"]))
        if len({c for pts in memory.values() for c, _ in pts}) >= 2:
            drew_memory = True
            images.append((f"echo-kib-per-conn-vs-connections-{transport}-{size_label(size)}.png",
                           _lines(plt, memory, f"Server memory per connection vs connections ({where})",
                                  "connections (log)", "resident KiB per connection", True, False, ticks,
                                  yformat=None)))
    if not drew_conns:
        skipped.append("msgs/s and p95 vs connections: no implementation was run at two or more connection counts")
    elif not drew_memory:
        skipped.append("KiB per connection vs connections: no server's memory at two or more connection counts "
                       "(runs saved before it was measured have none)")

    by_conns: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for i in infos:
        by_conns.setdefault((i["transport"], i["connections"]), []).append(i)
    drew_sizes = False
    for (transport, conns), group in sorted(by_conns.items()):
        sizes = sorted({i["size"] for i in group})
        if len(sizes) < 2:
            continue
        drew_sizes = True
        rate = {}
        for i in group:
            rate.setdefault(_label(i), []).append((i["size"], i["msgs_per_s"]))
        images.append((f"echo-msgs-vs-size-{transport}-c{conns}.png",
                       _lines(plt, rate, f"Echo throughput vs message size ({conns:,} connections over {transport})",
                              "message size (log)", "round trips per second", True, False,
                              [(s, size_label(s)) for s in sizes])))
    if not drew_sizes:
        skipped.append("msgs/s vs message size: no size sweep in these runs (the full profile, or "
                       "--pcb-size 64,1KiB,10KiB,100KiB, has one)")

    # msgs/s by worker processes (--pcb-workers), per scale: one line per implementation
    by_case: Dict[Tuple[str, int, int], Dict[str, List[Tuple[float, float]]]] = {}
    crowded = False
    for i in infos:
        if i.get("plain") or i.get("malloc", "representative") != "representative":
            continue
        series = by_case.setdefault((i["transport"], i["size"], i["connections"]), {})
        series.setdefault(_plain(i["impl"]), []).append((i.get("workers") or 1, i["msgs_per_s"]))
        crowded = crowded or bool(i.get("workers_note"))
    drew_workers = False
    for (transport, size, conns), series in sorted(by_case.items()):
        series = {k: v for k, v in series.items() if len({w for w, _ in v}) >= 2}
        if not series:
            continue
        drew_workers = True
        counts = sorted({w for pts in series.values() for w, _ in pts})
        title = f"Echo throughput by worker processes ({conns:,} connections x {size_label(size)} over {transport})"
        if crowded:
            title += ": workers outnumber the server's CPUs, a functional check"
        images.append((f"echo-msgs-vs-workers-{transport}-{size_label(size)}-c{conns}.png",
                       _lines(plt, series, title, "worker processes", "round trips per second", False, False,
                              [(w, str(w)) for w in counts])))
    if not drew_workers:
        skipped.append("msgs/s vs worker processes: no server run at two or more worker counts (--pcb-workers 1,2,4)")

    images += _openloop_plots(plt, [b["extra_info"] for b in fams.openloop], skipped)

    switch = [b["extra_info"] for b in fams.switch]
    depth: Dict[str, List[Tuple[float, float]]] = {}
    for i in switch:
        if i.get("depth") is not None:
            depth.setdefault(i["case"].rsplit("-d", 1)[0], []).append((i["depth"], i["ns_per_op"]))
    depth = {k: v for k, v in depth.items() if len(v) >= 2}
    if depth:
        depths = sorted({d for pts in depth.values() for d, _ in pts})
        images.append(("switch-depth.png",
                       _depth_plot(plt, depth, depths)))
    else:
        skipped.append("ns/switch vs depth: no depth sweep in these runs")
    flat = [i for i in switch if i.get("depth") is None and i.get("ns_per_op") is not None]
    if flat:
        images.append(("switch-costs.png", _bars(plt, flat)))
    else:
        skipped.append("switch cost bars: no switch microbenchmarks in these runs")
    return images, skipped


#: The open loop's percentiles drawn against the achieved rate: (key, line style).
OPEN_PERCENTILES = (("latency_p50_us", "p50", ":"), ("latency_p99_us", "p99", "-"), ("latency_p99_9_us", "p99.9", "--"))


def _openloop_plots(plt, infos: List[Dict[str, Any]], skipped: List[str]) -> List[Tuple[str, bytes]]:
    """Per scale: latency (p50, p99, p99.9 from the intended send time) against the achieved rate,
    one colour per implementation; and the whole latency distribution (percentile spectrum,
    corrected solid, uncorrected dotted) at each rate asked."""
    from pyconcbench.report import openloop_tables

    out: List[Tuple[str, bytes]] = []
    if not infos:
        skipped.append("open-loop curves: no open-loop cases in these runs (pyconcbench run --family openloop)")
        return out
    for (key, arrival), rows in sorted(openloop_tables.grouped(infos).items()):
        name = "-".join(str(k) for k in key) + ("" if arrival == "uniform" else f"-{arrival}")
        title = openloop_tables.scale_title(key, arrival)
        fig, ax = plt.subplots(figsize=(9, 5.5))
        by_impl: Dict[str, List[Dict[str, Any]]] = {}
        for r in rows:
            by_impl.setdefault(_label(r), []).append(r)
        for label, group in by_impl.items():
            look = _look(plt, label)
            for field_, pname, style in OPEN_PERCENTILES:
                pts = sorted((g["msgs_per_s"], g[field_]) for g in group if g.get(field_))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=style, color=look["color"],
                            marker=look["marker"], markersize=4, label=f"{label} {pname}")
        ax.set_yscale("log")
        out.append((f"openloop-latency-vs-rate-{name}.png",
                    _finish(plt, fig, ax, f"Latency vs achieved rate ({title})", "achieved round trips per second",
                            "latency from the intended send, µs (log)")))
        by_rate: Dict[str, List[Dict[str, Any]]] = {}
        for r in rows:
            by_rate.setdefault(str(r.get("rate_label") or r.get("rate_asked")), []).append(r)
        for rate, group in sorted(by_rate.items()):
            fig, ax = plt.subplots(figsize=(9, 5.5))
            for r in group:
                look = _look(plt, _label(r))
                for field_, style, what in (("latency_spectrum", "-", ""), ("latency_uncorrected_spectrum", ":",
                                                                                " (uncorrected)")):
                    pts = [(p, v) for p, v in (r.get(field_) or []) if p < 100.0 and v > 0]
                    if pts:
                        ax.plot([1.0 / (1.0 - p / 100.0) for p, _ in pts], [v for _, v in pts], linestyle=style,
                                color=look["color"], label=_label(r) + what)
            ticks = [(1, "0%"), (10, "90%"), (100, "99%"), (1000, "99.9%"), (10000, "99.99%")]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks([t[0] for t in ticks])
            ax.set_xticklabels([t[1] for t in ticks])
            said = rate.replace("pct", " % of each one's maximum") if rate.endswith("pct") else f"{rate} round trips/s"
            out.append((f"openloop-distribution-{name}-{rate}.png",
                        _finish(plt, fig, ax, f"Latency distribution at {said} ({title})", "percentile",
                                "latency, µs (log)")))
    return out


def _finish(plt, fig, ax, title: str, xlabel: str, ylabel: str) -> bytes:
    """The open loop's plots' titles, grid and legend, as PNG bytes; the figure closed."""
    ax.set_title(_plain(title), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    data = _png(fig)
    plt.close(fig)
    return data


def _depth_plot(plt, depth: Dict[str, List[Tuple[float, float]]], depths: List[int]) -> bytes:
    from pyconcbench.stats import fit_line

    fig, ax = plt.subplots(figsize=(8, 5))
    for n, (kind, pts) in enumerate(sorted(depth.items())):
        pts.sort()
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        color = plt.get_cmap("tab10")(n)
        ax.plot(xs, ys, "o", color=color, label=_plain(f"{kind} (measured)"))
        slope, intercept, r2 = fit_line(xs, ys)
        ax.plot([0, max(xs)], [intercept, intercept + slope * max(xs)], "-", color=color, alpha=0.6,
                label=_plain(kind) + f": {slope:.1f} ns/level + {intercept:.0f} ns (r²={r2:.3f})")
    ax.set_title("Cost of one switch through a delegation chain, by depth")
    ax.set_xlabel("depth (levels of yield from / await)")
    ax.set_ylabel("ns per switch")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    data = _png(fig)
    plt.close(fig)
    return data


FAMILY_COLOURS = {"python": "#3572A5", "native": "#555555", "go": "#00ADD8"}


def _bars(plt, rows: List[Dict[str, Any]]) -> bytes:
    rows = sorted(rows, key=lambda i: i["ns_per_op"])
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.28 * len(rows) + 1)))
    ys = range(len(rows))
    values = [max(i["ns_per_op"], 0.01) for i in rows]
    ax.barh(list(ys), values, color=[FAMILY_COLOURS.get(i.get("family"), "#999999") for i in rows])
    ax.set_yticks(list(ys))
    ax.set_yticklabels([_plain(i.get("micro") or "?") for i in rows], fontsize=7.5)
    ax.set_xscale("log")
    for y, v in zip(ys, values):
        ax.text(v * 1.08, y, f"{v:,.1f}" if v < 1000 else f"{v:,.0f}", va="center", fontsize=6.5)
    ax.set_xlabel("ns per operation (log)")
    ax.set_title("Switch, creation and hand-off costs (blue Python, grey C, cyan Go)")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.set_xlim(right=max(values) * 6)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    data = _png(fig)
    plt.close(fig)
    return data


__all__ = ["plot_all", "PlotsUnavailable", "BASELINE"]
