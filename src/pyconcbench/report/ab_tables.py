"""The A/B table: one row per interleaved A/B echo case (family ``ab``, see pyconcbench.ab), for
the terminal at the end of a run and for ``pyconcbench report``.  Reads saved extra_info only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from pyconcbench import metrics
from pyconcbench.report.echo_tables import size_label

HEAD = ["case", "A msgs/s", "B msgs/s", "B/A msgs/s [interval]", "B/A p99 [interval]",
        "B/A server CPU/msg [interval]", "pairs", "verdict"]

NOTE = ("Each case ran A's and B's servers in one run, their rounds alternated in ABBA order on the same "
        "CPUs with the same load generator; each pair of adjacent rounds gives B/A. The ratio is the "
        "Hodges-Lehmann estimate over the pairs, the interval the exact Wilcoxon signed-rank interval "
        "(its coverage in %; fewer than 6 pairs cannot reach 95 %). Verdict on msgs/s: the interval "
        "below 1 = B slower, above 1 = B faster, across 1 = no difference shown; the gate "
        "(--fail-on) fails only where the whole interval is beyond its threshold.")


def _ratio(iv: Dict[str, Any]) -> str:
    if not iv:
        return "-"
    return f"{iv['ratio']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}] {iv['confidence'] * 100:.0f}%"


def _verdict(iv: Dict[str, Any]) -> str:
    if not iv:
        return "-"
    if iv["high"] < 1.0:
        return f"B slower by {(1 - iv['ratio']) * 100:.1f} %"
    if iv["low"] > 1.0:
        return f"B faster by {(iv['ratio'] - 1) * 100:.1f} %"
    return "no difference shown"


def case_label(info: Dict[str, Any]) -> str:
    scale = f"c{info.get('connections', '?')}-{size_label(int(info.get('size') or 0))}"
    if info.get("transport") == "unix":
        scale += "-unix"
    return f"{info.get('label') or info.get('impl', '?')} {scale}"


def environments(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """'A: /path/python (Python 3.12.1, uvloop 0.21)' lines, once per distinct environment."""
    out: List[str] = []
    for info in infos:
        for side in ("a", "b"):
            env = (info.get(side) or {}).get("environment") or {}
            libs = env.get("libraries") or {}
            text = (f"{side.upper()}: {env.get('given', '?')} = {env.get('executable') or env.get('python', '?')} "
                    f"(Python {metrics.python_label(env.get('python', '?'), env.get('python_build'), env.get('gil_enabled'))}, pyconcbench {env.get('pyconcbench', '?')}"
                    + "".join(f", {k} {v}" for k, v in sorted(libs.items()) if k in ("uvloop", "gevent", "greenlet",
                                                                                      "tornado", "trio", "anyio"))
                    + ")" + "".join(f" {k}={v}" for k, v in sorted((env.get("env") or {}).items())))
            if text not in out:
                out.append(text)
    return out


def rows(infos: Sequence[Dict[str, Any]]) -> List[List[str]]:
    out = []
    for info in sorted(infos, key=lambda i: (i.get("transport") or "", i.get("size") or 0, i.get("connections") or 0,
                                             i.get("label") or "")):
        ivs = info.get("intervals") or {}
        a, b = info.get("a") or {}, info.get("b") or {}
        out.append([case_label(info), f"{a.get('msgs_per_s') or 0:,.0f}", f"{b.get('msgs_per_s') or 0:,.0f}",
                    _ratio(ivs.get("msgs_per_s", {})), _ratio(ivs.get("latency_p99", {})),
                    _ratio(ivs.get("server_cpu_us_per_msg", {})), str(len(info.get("pairs") or [])),
                    _verdict(ivs.get("msgs_per_s", {}))])
    return out


def table_lines(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """The terminal's fixed-width A/B table, with the environments above it."""
    if not infos:
        return []
    body = rows(infos)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(HEAD)]
    fmt: Tuple[str, ...] = tuple(f"{{:<{w}}}" if i == 0 or i == len(HEAD) - 1 else f"{{:>{w}}}"
                                 for i, w in enumerate(widths))
    lines = environments(infos) + [""]
    lines.append("  ".join(f.format(h) for f, h in zip(fmt, HEAD)))
    for r in body:
        lines.append("  ".join(f.format(c) for f, c in zip(fmt, r)))
    return lines
