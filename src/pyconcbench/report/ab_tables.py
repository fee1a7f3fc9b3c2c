"""The A/B tables: one row per interleaved A/B case (family ``ab``, see pyconcbench.ab), one table
per family it measured (echo, switch, zmq: the record's ``ab_family``), for the terminal at the
end of a run and for ``pyconcbench report``.  Reads saved extra_info only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from pyconcbench import metrics
from pyconcbench.report.echo_tables import size_label

#: Per family: the metric A, B and the verdict are given for, its unit, and the other metrics
#: shown as B/A (column label, metric).
COLUMNS: Dict[str, Tuple[str, str, Tuple[Tuple[str, str], ...]]] = {
    metrics.ECHO: ("msgs_per_s", "msgs/s", (("p99", "latency_p99"), ("server CPU/msg", "server_cpu_us_per_msg"),
                                            ("KiB/conn", "rss_per_conn_kib"))),
    metrics.SWITCH: ("ns_per_op", "ns/op", ()),
    metrics.ZMQ: ("requests_per_s", "req/s", (("p99", "latency_p99"), ("client CPU/req", "cpu_us_per_req"))),
}

#: What ran on each side, per family.
_RAN = {metrics.ECHO: "A's and B's servers, by the same load generator",
        metrics.SWITCH: "the microbenchmark in a worker process of A's and one of B's",
        metrics.ZMQ: "the ZeroMQ loop in a worker process of A's and one of B's"}


def head(family: str) -> List[str]:
    primary, unit, others = COLUMNS[family]
    return (["case", f"A {unit}", f"B {unit}", f"B/A {unit} [interval]"]
            + [f"B/A {label} [interval]" for label, _ in others] + ["pairs", "verdict"])


def note(family: str) -> str:
    primary, unit, _ = COLUMNS[family]
    better = "higher" if metrics.METRICS[primary].higher_is_better else "lower"
    return (f"Each case ran {_RAN[family]} in one run, their rounds alternated in ABBA order on the same "
            "CPUs; each pair of adjacent rounds gives B/A. The ratio is the Hodges-Lehmann estimate over the "
            "pairs (those outside the host's slow spells when at least 6 are), the interval the exact Wilcoxon "
            "signed-rank interval "
            "(its coverage in %; fewer than 6 "
            f"pairs cannot reach 95 %). Verdict on {unit} ({better} is better): B slower or faster when the "
            "whole interval is on one side of 1, else no difference shown; the gate (--fail-on) fails only "
            "where the whole interval is beyond its threshold."
            + (" KiB/conn: each server's resident memory per connection after its rounds; the readings are "
               "of the same two processes, so its interval shows their drift over the run, not what a "
               "restart would change." if family == metrics.ECHO else ""))


def _ratio(iv: Dict[str, Any]) -> str:
    if not iv:
        return "-"
    return f"{iv['ratio']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}] {iv['confidence'] * 100:.0f}%"


def verdict(iv: Dict[str, Any], higher_is_better: bool = True) -> str:
    """'B slower by 4.1 %' when the whole interval says B is worse (below 1 where higher is
    better, above 1 where lower is), 'B faster by ...' when it says better, else no difference."""
    if not iv:
        return "-"
    below, above = iv["high"] < 1.0, iv["low"] > 1.0
    if below or above:
        word = "slower" if below == higher_is_better else "faster"
        return f"B {word} by {abs(iv['ratio'] - 1) * 100:.1f} %"
    return "no difference shown"


def case_label(info: Dict[str, Any]) -> str:
    family = metrics.ab_family(info)
    if family != metrics.ECHO:
        return f"{family} {info.get('case', '?')}"
    scale = f"c{info.get('connections', '?')}-{size_label(int(info.get('size') or 0))}"
    if info.get("transport") == "unix":
        scale += "-unix"
    return f"{info.get('label') or info.get('impl', '?')} {scale}"


def families(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """The families the records measured, in the tables' order."""
    found = {metrics.ab_family(i) for i in infos}
    return [f for f in COLUMNS if f in found]


def environments(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """'A: /path/python (Python 3.12.1, uvloop 0.21)' lines, once per distinct environment."""
    out: List[str] = []
    for info in infos:
        for side in ("a", "b"):
            env = (info.get(side) or {}).get("environment") or {}
            libs = env.get("libraries") or {}
            text = (f"{side.upper()}: {env.get('given', '?')} = {env.get('executable') or env.get('python', '?')} "
                    f"(Python {metrics.python_label(env.get('python', '?'), env.get('python_build'), env.get('gil_enabled'))}, pyconcbench {env.get('pyconcbench', '?')}"
                    + "".join(f", {k} {v}" for k, v in sorted(libs.items()) if k in ("uvloop", "rloop", "gevent", "greenlet",
                                                                                      "tornado", "trio", "anyio",
                                                                                      "pyzmq", "aiozmq"))
                    + ")" + "".join(f" {k}={v}" for k, v in sorted((env.get("env") or {}).items())))
            if text not in out:
                out.append(text)
    return out


def _pairs(info: Dict[str, Any]) -> str:
    """'12', or '12 (3 in spells)' when some pairs had a round in a slow spell of the host (the
    interval is then over the others, if there are 6: see pyconcbench.ab.interval_pairs)."""
    pairs = info.get("pairs") or []
    spells = sum(1 for p in pairs if isinstance(p, dict) and p.get("spell"))
    return str(len(pairs)) + (f" ({spells} in spells)" if spells else "")


def _value(value: Any, metric: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{value:,.0f}" if metrics.METRICS[metric].unit.endswith("/s") else f"{value:,.2f}"


def rows(infos: Sequence[Dict[str, Any]], family: str = metrics.ECHO) -> List[List[str]]:
    """One row per record of ``family``."""
    primary, _, others = COLUMNS[family]
    key = metrics.AB_PAIR_KEYS[family][primary]
    higher = metrics.METRICS[primary].higher_is_better
    out = []
    mine = [i for i in infos if metrics.ab_family(i) == family]
    for info in sorted(mine, key=lambda i: (i.get("transport") or "", i.get("size") or 0, i.get("connections") or 0,
                                            i.get("label") or "", i.get("case") or "")):
        ivs = info.get("intervals") or {}
        a, b = info.get("a") or {}, info.get("b") or {}
        out.append([case_label(info), _value(a.get(key), primary), _value(b.get(key), primary),
                    _ratio(ivs.get(primary, {}))] + [_ratio(ivs.get(m, {})) for _, m in others]
                   + [_pairs(info), verdict(ivs.get(primary, {}), higher)])
    return out


def table_lines(infos: Sequence[Dict[str, Any]]) -> List[str]:
    """The terminal's fixed-width A/B tables (one per family), with the environments above them."""
    if not infos:
        return []
    lines = environments(infos)
    for family in families(infos):
        titles, body = head(family), rows(infos, family)
        widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(titles)]
        fmt = tuple(f"{{:<{w}}}" if i == 0 or i == len(titles) - 1 else f"{{:>{w}}}" for i, w in enumerate(widths))
        lines.append("")
        lines.append("  ".join(f.format(h) for f, h in zip(fmt, titles)))
        lines += ["  ".join(f.format(c) for f, c in zip(fmt, r)) for r in body]
    return lines
