"""The studies' tables from saved runs: Markdown for the terminal and CI summaries, HTML with
the plots inline, and the cross-Python table.

Every table is a ``Table`` (title, column heads, rows of strings, a note saying exactly what
the cells are), rendered to Markdown or HTML from the same values.

Size: one renderer per family (echo, ceiling, switch, ZeroMQ, by-Python) over the one ``Table``
type, kept together so every table is rendered the same way; the data it reads comes from
``report.results`` and ``metrics``, the plots from ``report.plots``.
"""
from __future__ import annotations

import base64
import html
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pyconcbench import explain, metrics, stats
from pyconcbench.metrics import md_text
from pyconcbench.report import ab_tables, echo_tables as summary, openloop_tables
from pyconcbench.stats import STARVING_SHARE
from pyconcbench.report.switch_tables import fmt_ns
from pyconcbench.report.results import Families, Run, split
from pyconcbench.report.echo_tables import BASELINE, size_label

SPREAD_NOTE = ("± is the half-width of the 95 % confidence interval (Student t) of the mean of the "
               "per-round msgs/s, as a share of the rate; the rate itself is all verified round trips "
               "of the accepted rounds over their total time; '(n noisy)': n rounds were kept although "
               "the machine was noisy (slow spell, busy CPUs) after the retries ran out")
LG_BOUND_NOTE = ("≥: the load generator was ≥ 90 % busy in some round, so the rate is a lower bound "
                 "for the server (compare its CPU per round trip instead)")


@dataclass
class Table:
    title: str
    head: List[str]
    rows: List[List[str]]
    note: str = ""
    #: per column: True = right-aligned (numbers)
    right: Optional[List[bool]] = None

    def markdown(self) -> List[str]:
        """The table in GitHub Markdown; every text escaped (``metrics.md_text``): names and
        labels come from the saved runs."""
        right = self.right or [False] + [True] * (len(self.head) - 1)
        out = [f"### {md_text(self.title)}", ""]
        if self.note:
            out += [md_text(self.note), ""]
        out.append("| " + " | ".join(md_text(h) for h in self.head) + " |")
        out.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
        for row in self.rows:
            out.append("| " + " | ".join(md_text(cell) for cell in row) + " |")
        out.append("")
        return out

    def html(self) -> str:
        right = self.right or [False] + [True] * (len(self.head) - 1)
        parts = [f"<h3>{html.escape(self.title)}</h3>"]
        if self.note:
            parts.append(f"<p class='note'>{html.escape(self.note)}</p>")
        parts.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in self.head)
                     + "</tr></thead><tbody>")
        for row in self.rows:
            parts.append("<tr>" + "".join(
                f"<td class='{'num' if r else 'txt'}'>{html.escape(c)}</td>" for c, r in zip(row, right))
                + "</tr>")
        parts.append("</tbody></table>")
        return "\n".join(parts)


@dataclass
class Section:
    title: str
    tables: List[Table] = field(default_factory=list)
    text: List[str] = field(default_factory=list)


# ---- formatting -------------------------------------------------------------------------

def _or(value: Any, default: Any) -> Any:
    """``value``, or ``default`` when it is absent (None): unlike ``or``, 0 stays 0."""
    return default if value is None else value


def fmt_int(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_f(v: Optional[float], spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def fmt_pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def transport_label(transport: str) -> str:
    return {"tcp": "TCP", "unix": "UNIX sockets"}.get(transport, transport)


def conns_label(n: int) -> str:
    return f"{n:,} conns"


# ---- echo -------------------------------------------------------------------------------

def label_of(info: Dict[str, Any]) -> str:
    return info.get("label") or info.get("impl") or "?"


def spread(info: Dict[str, Any], key: str) -> str:
    """' ± 2.1%': the 95 % interval's half-width of the mean of the rounds' ``key``, relative."""
    per_round = [r[key] for r in info.get("rounds") or [] if isinstance(r, dict) and r.get(key)]
    half = stats.ci95_halfwidth(per_round)
    mean = statistics.mean(per_round) if per_round else None
    return f" ± {half / mean * 100:.1f}%" if half is not None and mean else ""


def rate_cell(info: Dict[str, Any]) -> str:
    rate = info.get("msgs_per_s")
    if rate is None:
        return "-"
    kept = info.get("noisy_rounds_kept")
    return (("≥" if info.get("loadgen_bound") else "") + f"{rate:,.0f}" + spread(info, "msgs_per_s")
            + (f" ({kept} noisy)" if kept else ""))


def _grid(infos: Sequence[Dict[str, Any]], col_key: str) -> Tuple[List[Any], List[str], Dict[Tuple[str, Any], Dict[str, Any]]]:
    cols = sorted({i[col_key] for i in infos})
    cells: Dict[Tuple[str, Any], Dict[str, Any]] = {}
    for i in infos:
        cells[(label_of(i), i[col_key])] = i

    def score(label: str) -> float:
        rates = [cells[(label, c)]["msgs_per_s"] for c in cols if (label, c) in cells and cells[(label, c)].get("msgs_per_s")]
        return -math.exp(statistics.mean(math.log(r) for r in rates)) if rates else 0.0

    labels = sorted({label_of(i) for i in infos}, key=lambda lab: (score(lab), lab))
    return cols, labels, cells


def _table(title: str, note: str, cols: List[Any], col_head: Callable[[Any], str], labels: List[str],
           cells: Dict[Tuple[str, Any], Dict[str, Any]], cell: Callable[[Dict[str, Any], Any], str]) -> Table:
    rows = []
    for lab in labels:
        row = [lab]
        for c in cols:
            info = cells.get((lab, c))
            row.append(cell(info, c) if info is not None else "")
        rows.append(row)
    return Table(title, ["implementation"] + [col_head(c) for c in cols], rows, note)


def echo_scale_tables(infos: Sequence[Dict[str, Any]], transport: str, size: int) -> List[Table]:
    """The connection sweep at one transport and message size."""
    cols, labels, cells = _grid(infos, "connections")
    where = f"{transport_label(transport)}, {size_label(size)} messages"
    head = conns_label
    tables = []
    any_bound = any(i.get("loadgen_bound") for i in infos)
    tables.append(_table(f"Echo throughput (msgs/s) — {where}",
                         SPREAD_NOTE + (". " + LG_BOUND_NOTE if any_bound else ""),
                         cols, head, labels, cells, lambda i, c: rate_cell(i)))

    slowest = {c: min((i["msgs_per_s"] for (lab, cc), i in cells.items() if cc == c and i.get("msgs_per_s")),
                      default=None) for c in cols}
    tables.append(_table(f"Relative speed — {where}",
                         "msgs/s divided by the slowest implementation's at the same connections (slowest = 1), "
                         "as the study prints it",
                         cols, head, labels, cells,
                         lambda i, c: fmt_f(i["msgs_per_s"] / slowest[c], ".1f") if slowest[c] else "-"))

    base = {c: cells.get((BASELINE, c)) for c in cols}
    if any(base.values()):
        tables.append(_table(f"Ratio to {BASELINE} — {where}",
                             f"msgs/s divided by {BASELINE}'s at the same connections (C, one thread, epoll)",
                             cols, head, labels, cells,
                             lambda i, c: fmt_f(i["msgs_per_s"] / base[c]["msgs_per_s"], ".2f")
                             if base[c] and base[c].get("msgs_per_s") else "-"))
    for p, key in (("p50", "latency_p50_us"), ("p95", "latency_p95_us"), ("p99", "latency_p99_us")):
        tables.append(_table(f"Latency {p} (µs) — {where}",
                             f"round-trip latency {p}, first byte sent to the echo's last byte received, "
                             "over every round trip of the accepted rounds (log-linear histogram, ≤ 1 % error)",
                             cols, head, labels, cells, lambda i, c, key=key: fmt_f(i.get(key), ",.1f")))

    def cpu_cell(i: Dict[str, Any], c: Any) -> str:
        own = i.get("server_cpu_us_per_msg")
        b = base.get(c)
        if own is None:
            return "-"
        if b and b.get("server_cpu_us_per_msg") is not None:
            return f"{own:.2f} ({own - b['server_cpu_us_per_msg']:+.2f})"
        return f"{own:.2f}"

    tables.append(_table(f"Server CPU per round trip (µs) and excess over {BASELINE} — {where}",
                         "the server process's user+system CPU per verified round trip; in brackets, minus "
                         f"{BASELINE}'s at the same connections: the concurrency model's own cost, which a "
                         "load-generator-bound rate cannot hide",
                         cols, head, labels, cells, cpu_cell))

    def busy_cell(i: Dict[str, Any], c: Any) -> str:
        user = i.get("server_user_share")
        return (f"{fmt_pct(i.get('server_cpu_share'))} / {fmt_pct(i.get('loadgen_cpu_share'))}"
                + (f" · user {fmt_pct(user)}" if user is not None else "")
                + (" · lg-bound" if i.get("loadgen_bound") else ""))

    tables.append(_table(f"CPU busy: server / load generator, and the server's user share — {where}",
                         "share of one core during the measured rounds; user = the server's user-mode share "
                         "of its CPU (from clock ticks: '-' when too few to split); lg-bound = the load "
                         "generator was ≥ 90 % busy",
                         cols, head, labels, cells, busy_cell))

    def fair_cell(i: Dict[str, Any], c: Any) -> str:
        jain = i.get("fairness_jain")
        text = (f"{jain:.3f} [{fmt_int(i.get('fairness_min'))}–{fmt_int(i.get('fairness_max'))}]"
                if jain is not None else "-")
        starving = i.get("starving_connections")
        return text + (f" ⚠ {starving} starving" if starving else "")

    memory = memory_table(infos, where, cols, labels, cells)
    if memory is not None:
        tables.append(memory)
    tables.append(_table(f"Fairness — {where}",
                         "Jain's index of the per-connection round-trip counts (1 = perfectly even; the worst "
                         "round), with the fewest and most round trips one connection made in a round; "
                         f"⚠ n starving: in one round, n connections made fewer than {STARVING_SHARE:.0%} of "
                         "the mean round trips per connection (the most of any round)",
                         cols, head, labels, cells, fair_cell))
    return tables


MEMORY_NOTE = ("the server's resident memory (RSS): idle, after its start and pre-flight connections, before the "
               "load generator connects → with the connections open (the median of the readings after the "
               "rounds), in MiB · per connection: (open − idle) / connections, the median of the rounds', "
               "in KiB (the gate's rss_per_conn_kib; below 0 when the server gave memory back). Runs saved "
               "before the server's memory was measured show nothing")


def memory_cell(i: Dict[str, Any]) -> str:
    """'12.3 → 45.6 MiB · 3.4 KiB/conn'; '' when the run did not measure the server's memory."""
    idle, loaded, per = i.get("server_rss_idle_kib"), i.get("server_rss_loaded_kib"), i.get("rss_per_conn_kib")
    if idle is None and loaded is None and per is None:
        return ""
    return (f"{fmt_f(None if idle is None else idle / 1024, ',.1f')} → "
            f"{fmt_f(None if loaded is None else loaded / 1024, ',.1f')} MiB · {fmt_f(per, ',.1f')} KiB/conn")


def memory_table(infos: Sequence[Dict[str, Any]], where: str, cols: List[Any], labels: List[str],
                 cells: Dict[Tuple[str, Any], Dict[str, Any]]) -> Optional[Table]:
    """The server's memory at each connection count: idle and loaded RSS, KiB per connection;
    None when no benchmark of the sweep measured it (a run saved before it was)."""
    if not any(memory_cell(i) for i in infos):
        return None
    return _table(f"Server memory: idle → with the connections open (MiB) · per connection (KiB) — {where}",
                  MEMORY_NOTE, cols, conns_label, labels, cells, lambda i, c: memory_cell(i))


def echo_size_table(infos: Sequence[Dict[str, Any]], transport: str, connections: int) -> Table:
    cols, labels, cells = _grid(infos, "size")
    return _table(f"Echo by message size — {transport_label(transport)}, {connections:,} connections",
                  "msgs/s (verified round trips per second) · MiB/s (payload one way)",
                  cols, size_label, labels, cells,
                  lambda i, c: ("≥" if i.get("loadgen_bound") else "") + f"{i['msgs_per_s']:,.0f} · "
                  f"{_or(i.get('mib_per_s'), i['msgs_per_s'] * c / (1 << 20)):,.1f} MiB/s")


ALLOCATOR_NOTE = (
    "representative (the default): the server has seen a few clients connect and disconnect before the "
    "measurement, as any server in use has; pristine: it has not. glibc maps a block above its mmap threshold "
    "(128 KiB at start) on its own and raises the threshold only when such a block is freed; an asyncio "
    "transport receives into a new 256 KiB buffer per read and shrinks it (mremap), so a pristine server makes "
    "an mmap, an mremap and a munmap per read, until a read that finds end-of-file frees a whole buffer. "
    "tuned: glibc's thresholds fixed by MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_. "
    "plain: a reference server of the same model written as a user would (pyconcbench.plain), no project code "
    "in its process, measured right after the project's; ⚠ marks a ratio outside "
    f"{summary.HARNESS_EFFECT_BAND[0]}–{summary.HARNESS_EFFECT_BAND[1]} (the harness, not the model, measured). "
    "Allocator calls are counted over one extra, untimed round.")


def harness_check_table(infos: Sequence[Dict[str, Any]]) -> Optional[Table]:
    """Each project server measured beside its plain reference server or in another allocator
    state: rate, its ratio to the plain server and to the representative state, and the allocator
    calls per round trip where they were counted.  None when the run compared nothing."""
    def key(i: Dict[str, Any]) -> Tuple[Any, ...]:
        return (i.get("impl"), i.get("transport"), i.get("size"), i.get("connections"))

    by_key: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for i in infos:
        by_key.setdefault(key(i), []).append(i)
    rows = []
    for k in sorted(by_key, key=lambda k: tuple(str(x) for x in k)):
        group = by_key[k]
        if len(group) < 2:
            continue

        def find(plain: bool, malloc: str) -> Optional[Dict[str, Any]]:
            return next((i for i in group if bool(i.get("plain")) == plain
                         and (i.get("malloc") or "representative") == malloc), None)

        for i in sorted(group, key=lambda i: (bool(i.get("plain")), i.get("malloc") or "")):
            malloc = i.get("malloc") or "representative"
            plain_ref = None if i.get("plain") else find(True, malloc)
            rep = find(bool(i.get("plain")), "representative") if malloc != "representative" else None
            ratio = i["msgs_per_s"] / plain_ref["msgs_per_s"] if plain_ref and plain_ref.get("msgs_per_s") else None
            low, high = summary.HARNESS_EFFECT_BAND
            flag = " ⚠" if ratio is not None and not low <= ratio <= high else ""
            per = i.get("alloc_syscalls_per_msg")
            calls = ("-" if not per else
                     " + ".join(f"{per.get(n, 0):.2f}" for n in ("mmap", "mremap", "munmap")))
            scale = f"{conns_label(i['connections'])} × {size_label(i['size'])} {transport_label(i['transport'])}"
            rows.append([i["impl"] + (" (plain)" if i.get("plain") else ""), scale, malloc, rate_cell(i),
                         fmt_f(ratio, ".2f") + flag if ratio is not None else "",
                         fmt_f(i["msgs_per_s"] / rep["msgs_per_s"], ".2f") if rep and rep.get("msgs_per_s") else "",
                         calls])
    if not rows:
        return None
    return Table("Harness checks: plain reference servers and allocator states",
                 ["implementation", "scale", "allocator state", "msgs/s", "÷ plain server", "÷ representative",
                  "mmap + mremap + munmap per round trip"], rows, ALLOCATOR_NOTE)


def explain_report_table(infos: Sequence[Dict[str, Any]]) -> Optional[Table]:
    """Per implementation, what its traced round counted per round trip and what that explains
    (``extra_info.explain``, --pcb-explain).  None when no row was traced."""
    rows = []
    for i in sorted((i for i in infos if isinstance(i.get("explain"), dict)), key=lambda i: str(i.get("impl"))):
        ex = i["explain"]
        per = {k: v for k, v in (ex.get("per_msg") if isinstance(ex.get("per_msg"), dict) else {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        texts = [f.get("text", "") for f in ex.get("findings") or [] if isinstance(f, dict) and f.get("key") != "syscalls"]
        named = explain.top_calls(per, 4)
        scale = f"{conns_label(i['connections'])} × {size_label(i['size'])} {transport_label(i['transport'])}"
        rows.append([label_of(i), scale, fmt_f(per.get("total"), ".1f") if per else "-",
                     ", ".join(named) or "-",
                     fmt_f(per.get("context_switches"), ".2f") if "context_switches" in per else "-",
                     "; ".join(texts) or (ex.get("note") if not per else "") or ""])
    if not rows:
        return None
    return Table("What each implementation does per round trip",
                 ["implementation", "scale", "syscalls", "most frequent", "context switches", "what it explains"],
                 rows, "one extra, untimed round per implementation, traced after the measured ones (perf's syscall "
                       "tracepoints, else strace): counts per round trip; the measured rounds are never traced",
                 [False, False, True, False, True, False])


def echo_section(echo: Sequence[Dict[str, Any]], ceiling: Sequence[Dict[str, Any]] = ()) -> Optional[Section]:
    if not echo and not ceiling:
        return None
    sec = Section("Echo servers")
    infos = [b["extra_info"] for b in echo]
    scales: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for i in infos:
        scales.setdefault((i["transport"], i["size"]), []).append(i)
    for (transport, size) in sorted(scales, key=lambda k: (k[0] != "tcp", k[0], k[1])):
        sec.tables += echo_scale_tables(scales[(transport, size)], transport, size)
    sweeps: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for i in infos:
        sweeps.setdefault((i["transport"], i["connections"]), []).append(i)
    for (transport, conns), group in sorted(sweeps.items()):
        if len({i["size"] for i in group}) > 1:
            sec.tables.append(echo_size_table(group, transport, conns))
    checks = harness_check_table(infos)
    if checks is not None:
        sec.tables.append(checks)
    explained = explain_report_table(infos)
    if explained is not None:
        sec.tables.append(explained)
    if ceiling:
        rows = []
        for b in sorted(ceiling, key=lambda b: b["extra_info"]["connections"]):
            i = b["extra_info"]
            judged = i.get("engine_to_ceiling_paired_median", i.get("engine_to_ceiling"))
            flag = (f" ⚠ below {summary.ENGINE_CEILING_FLOOR:.2f}"
                    if isinstance(judged, (int, float)) and judged < summary.ENGINE_CEILING_FLOOR else "")
            rows.append([f"{i['connections']:,} conns × {size_label(_or(i.get('size'), 64))}",
                         fmt_int(i.get("msgs_per_s")), fmt_int(i.get("engine_msgs_per_s")),
                         fmt_f(i.get("engine_to_ceiling"), ".2f") + flag, fmt_pct(i.get("loadgen_cpu_share"))])
        sec.tables.append(Table("Load generator ceiling",
                                ["scale", "minimal client msgs/s", "engine msgs/s", "engine / minimal",
                                 "load generator CPU"], rows,
                                "the engine against the native server beside a minimal epoll client that "
                                "verifies nothing: how close the full engine (histogram, payload checks) "
                                "comes to the most this machine's loopback allows; below "
                                f"{summary.ENGINE_CEILING_FLOOR:.2f} (the paired median) the fastest servers' "
                                "rates are the engine's limit"))
    return sec


# ---- switches -----------------------------------------------------------------------------

def switch_section(switch: Sequence[Dict[str, Any]]) -> Optional[Section]:
    if not switch:
        return None
    from pyconcbench.report.switch_tables import GROUP_ORDER, depth_fits

    sec = Section("Context switches and hand-offs")
    infos = [b["extra_info"] for b in switch]
    order = {g: n for n, g in enumerate(GROUP_ORDER)}
    rows = []
    for i in sorted(infos, key=lambda i: (order.get(i.get("group"), 99), i.get("depth") or 0, i["ns_per_op"])):
        study = i.get("study_ns")
        rows.append([i["micro"], i.get("group") or "", i.get("op") or "", fmt_ns(i.get("ns_per_op")),
                     f"{fmt_ns(i.get('ns_per_op_min'))}–{fmt_ns(i.get('ns_per_op_max'))}",
                     fmt_ns(study) if study is not None else ""])
    sec.tables.append(Table("Switch costs (ns per operation)",
                            ["case", "group", "one operation is", "ns/op", "range over rounds", "study"],
                            rows,
                            "median over the rounds of the time per operation, the empty loop's cost "
                            "subtracted where the case says so; 'study' is the 2014 study's figure for "
                            "the same operation where it gives one",
                            right=[False, False, False, True, True, True]))
    fits = depth_fits(infos)
    if fits:
        frows = []
        for kind, (slope, intercept, r2, depths) in sorted(fits.items()):
            frows.append([kind, f"{slope:.2f}", f"{intercept:.1f}", f"{r2:.4f}",
                          ", ".join(str(d) for d in depths)])
        sec.tables.append(Table("Depth sweep: cost per extra level",
                                ["chain", "slope (ns per level)", "intercept (ns)", "r²", "depths"], frows,
                                "least-squares line of ns/op against the depth of the delegation chain "
                                "(each level one more `yield from` or `await`)"))
    return sec


# ---- open loop ----------------------------------------------------------------------------

def openloop_section(openloop: Sequence[Dict[str, Any]]) -> Optional[Section]:
    """Latency at a fixed offered rate: one table per scale, each implementation's rates in a row
    (the figures of the latency-against-throughput plot)."""
    if not openloop:
        return None
    sec = Section("Open loop: latency at a fixed offered rate")
    for (key, arrival), rows in sorted(openloop_tables.grouped(b["extra_info"] for b in openloop).items()):
        title = openloop_tables.scale_title(key, arrival)
        sec.tables.append(Table(title[:1].upper() + title[1:], list(openloop_tables.HEAD),
                                [openloop_tables.row_cells(r) for r in rows], openloop_tables.NOTE,
                                right=[False] + [True] * (len(openloop_tables.HEAD) - 1)))
    return sec


# ---- zmq ----------------------------------------------------------------------------------

def zmq_section(zmq: Sequence[Dict[str, Any]]) -> Optional[Section]:
    if not zmq:
        return None
    sec = Section("ZeroMQ request/response loops")
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for b in zmq:
        groups.setdefault(b.get("group") or "", []).append(b["extra_info"])
    by_mode: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for infos in groups.values():
        for i in infos:
            by_mode[(i.get("mode"), i.get("size"), i.get("inflight"), i.get("transport"), i.get("placement"))] = i
    for group in sorted(groups):
        infos = sorted(groups[group], key=lambda i: -i["requests_per_s"])
        fastest = infos[0].get("requests_per_s") or 0
        first = infos[0]
        placement = first.get("placement")
        two = [by_mode.get((i.get("mode"), i.get("size"), i.get("inflight"), i.get("transport"), "2cpu"))
               for i in infos] if placement == "1cpu" else []
        show_two = any(two)
        rows = []
        for n, i in enumerate(infos):
            row = [i["mode"], f"{i['requests_per_s']:,.0f}{spread(i, 'requests_per_s')}",
                   fmt_f(i["requests_per_s"] / fastest, ".2f") if fastest else "-",
                   fmt_f(i.get("latency_p50_us"), ",.1f"), fmt_f(i.get("latency_p99_us"), ",.1f"),
                   fmt_f(i.get("cpu_us_per_req"), ".2f"), fmt_int(i.get("study_requests_per_s"))]
            if show_two:
                other = two[n]
                row += [fmt_int(other.get("requests_per_s")) if other else "",
                        fmt_f(i["requests_per_s"] / other["requests_per_s"], ".2f")
                        if other and other.get("requests_per_s") else ""]
            rows.append(row)
        where = (f"{size_label(first.get('size') or 0)} requests, {_or(first.get('inflight'), '?')} in flight, "
                 f"{first.get('transport') or '?'}")
        place = {"1cpu": "1cpu: every thread on one CPU", "2cpu": "2cpu: client thread on one CPU, the rest on "
                 "the other", "off": "pinning off", None: "client thread only pinned (before placement)"}
        head = ["mode", "requests/s", "x fastest", "p50 µs", "p99 µs", "client CPU µs/req", "study req/s"]
        if show_two:
            head += ["2cpu req/s", "1cpu ÷ 2cpu"]
        sec.tables.append(Table(f"{group}: {where} — {place.get(placement, placement)}", head, rows,
                                "requests/s over all rounds, ± the 95 % interval of the per-round mean; "
                                "latency from request sent to verified reply received; study: the aiozmq "
                                "study's figure (2014, asyncio's default loop). Placement: "
                                + (first.get("pinning") or "not recorded")))
    return sec


# ---- A/B ----------------------------------------------------------------------------------

def ab_section(benches: Sequence[Dict[str, Any]]) -> Optional[Section]:
    """Interleaved A/B cases: B/A per case with its interval, a table per family they measured
    (report.ab_tables)."""
    if not benches:
        return None
    infos = [b["extra_info"] for b in benches]
    fams = ab_tables.families(infos)
    sec = Section(f"Interleaved A/B ({', '.join(fams)})")
    sec.text = [f"- {line}" for line in ab_tables.environments(infos)]
    for fam in fams:
        head = ab_tables.head(fam)
        title = "B against A, per case" + ("" if fams == [metrics.ECHO] else f" ({fam})")
        sec.tables.append(Table(title, head, ab_tables.rows(infos, fam), ab_tables.note(fam),
                                right=[False] + [True] * (len(head) - 2) + [False]))
    return sec


# ---- header -------------------------------------------------------------------------------

def header_lines(runs: Sequence[Run]) -> List[str]:
    out = []
    for run in runs:
        f = run.facts
        m = run.machine
        libs = f.get("libraries") or {}
        settings = f.get("settings") or {}
        fd = f.get("fd_limit") or {}
        out.append(f"- **{run.label}** — {run.data.get('datetime', '?')}, commit {run.commit}, "
                   f"{len(run.benchmarks)} benchmarks")
        out.append(f"  - machine: {f.get('cpu_model') or (m.get('cpu') or {}).get('brand_raw') or '?'}, "
                   f"{f.get('cpus_online', '?')} CPUs online, Linux {f.get('kernel') or m.get('release', '?')}, "
                   f"fd limit {fd.get('soft', '?')}/{fd.get('hard', '?')}")
        out.append(f"  - Python {run.python_label} ({m.get('python_compiler', '?')}); profile "
                   f"{settings.get('profile', '?')}; pinning: {settings.get('pinning') or 'not recorded'}")
        if libs:
            out.append("  - libraries: " + metrics.libraries_text(libs))
    return out


# ---- whole reports ------------------------------------------------------------------------

def sections(fams: Families) -> List[Section]:
    out = [s for s in (ab_section(fams.ab), echo_section(fams.echo, fams.ceiling), openloop_section(fams.openloop),
                       switch_section(fams.switch), zmq_section(fams.zmq)) if s is not None]
    return out


def to_markdown(head: List[str], secs: Sequence[Section], title: str = "pyconcbench report") -> str:
    """The report in GitHub Markdown.  ``head`` and each section's ``text`` are plain lines (a
    leading '- ' is a list item, '**' bold): their text is escaped here (``metrics.md_text``),
    as every table's is, since run names, machine facts and labels come from the saved runs."""
    lines = [f"# {md_text(title)}", ""] + [md_text(line) for line in head] + [""]
    if not secs:
        lines += ["No pyconcbench benchmarks in these runs.", ""]
    for sec in secs:
        lines += [f"## {md_text(sec.title)}", ""]
        lines += [md_text(line) for line in sec.text]
        for t in sec.tables:
            lines += t.markdown()
    return "\n".join(lines)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:78em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.9em}
th,td{border:1px solid #ccc;padding:0.25em 0.6em}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
p.note{color:#555;font-size:0.85em;max-width:70em}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
"""


def to_html(head: List[str], secs: Sequence[Section], images: Sequence[Tuple[str, bytes]] = (),
            title: str = "pyconcbench report") -> str:
    """One self-contained page: the tables, and the PNGs inline as data: URIs (no CDN)."""
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", "<ul>"]
    for line in head:
        text = line.strip()
        if text.startswith("- "):
            text = text[2:]
        parts.append(f"<li>{html.escape(text.replace('**', ''))}</li>")
    parts.append("</ul>")
    if images:
        parts.append("<h2>Plots</h2>")
        for name, data in images:
            b64 = base64.b64encode(data).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{html.escape(name)}</figcaption></figure>")
    for sec in secs:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.text:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line.strip().removeprefix('- '))}</li>"
                                          for line in sec.text) + "</ul>")
        for t in sec.tables:
            parts.append(t.html())
    parts.append("</body></html>")
    return "\n".join(parts)


# ---- by Python version ----------------------------------------------------------------------

def by_python(runs: Sequence[Run]) -> Tuple[List[str], List[Section], List[str]]:
    """Runs of several Python versions side by side: (header, sections, notes).  When two runs
    have the same Python, the later one given is used and a note says so."""
    versions: Dict[str, Run] = {}
    notes = []
    for run in runs:
        if run.python_label in versions:
            notes.append(f"two runs of Python {run.python_label}: using {run.name}, not "
                         f"{versions[run.python_label].name}")
        versions[run.python_label] = run
    order = sorted(versions, key=_version_key)
    head = header_lines([versions[v] for v in order])
    fams = {v: split(versions[v].benchmarks) for v in order}

    def cross(title: str, note: str, rows_of: Callable[[Families], Dict[str, str]], row_head: str) -> Optional[Table]:
        cells = {v: rows_of(fams[v]) for v in order}
        keys = sorted({k for c in cells.values() for k in c}, key=natural_key)
        if not keys:
            return None
        rows = [[k] + [cells[v].get(k, "") for v in order] for k in keys]
        return Table(title, [row_head] + [f"Python {v}" for v in order], rows, note)

    secs: List[Section] = []
    echo = Section("Echo servers by Python version")
    scales = sorted({(b["extra_info"]["transport"], b["extra_info"]["size"], b["extra_info"]["connections"])
                     for f in fams.values() for b in f.echo}, key=lambda k: (k[0] != "tcp", k[1], k[2]))
    for transport, size, conns in scales:
        def pick(f: Families, t=transport, s=size, c=conns) -> Dict[str, Dict[str, Any]]:
            return {label_of(b["extra_info"]): b["extra_info"] for b in f.echo
                    if (b["extra_info"]["transport"], b["extra_info"]["size"], b["extra_info"]["connections"]) == (t, s, c)}
        where = f"{conns:,} connections × {size_label(size)} over {transport_label(transport)}"
        t1 = cross(f"Echo msgs/s — {where}", SPREAD_NOTE, lambda f, pick=pick: {k: rate_cell(i) for k, i in pick(f).items()},
                   "implementation")
        t2 = cross(f"Server CPU per round trip (µs) — {where}",
                   "the server's user+system CPU per verified round trip: independent of how fast the load "
                   "generator is", lambda f, pick=pick: {k: fmt_f(i.get("server_cpu_us_per_msg"), ".2f")
                                                         for k, i in pick(f).items()}, "implementation")
        echo.tables += [t for t in (t1, t2) if t is not None]
    if echo.tables:
        secs.append(echo)
    sw = cross("Switch costs (ns per operation)", "median over the rounds",
               lambda f: {b["extra_info"].get("micro", "?"): fmt_ns(b["extra_info"].get("ns_per_op")) for b in f.switch},
               "case")
    if sw is not None:
        from pyconcbench.report.switch_tables import depth_fits

        sec = Section("Context switches by Python version", [sw])
        slopes = cross("Depth sweep: ns per extra level of delegation", "least-squares slope of ns/op against depth",
                       lambda f: {kind: f"{fit[0]:.1f}" for kind, fit in
                                  depth_fits([b["extra_info"] for b in f.switch]).items()}, "chain")
        if slopes is not None:
            sec.tables.append(slopes)
        secs.append(sec)
    zq = cross("ZeroMQ requests/s", "requests per second over all rounds",
               lambda f: {(b.get("name") or "?").replace("test_zmq", "").strip("[]"): fmt_int(b["extra_info"].get("requests_per_s"))
                          for b in f.zmq}, "case")
    if zq is not None:
        secs.append(Section("ZeroMQ by Python version", [zq]))
    return head, secs, notes


def natural_key(text: str) -> Tuple:
    """'await-d2' before 'await-d16': digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _version_key(label: str) -> Tuple:
    nums = []
    for part in label.split()[-1].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        nums.append(int(digits) if digits else 0)
    return (label.split()[0] if " " in label else "", tuple(nums))
