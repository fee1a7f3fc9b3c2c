"""The switch microbenchmarks' tables (terminal and report): ns per operation by group, the
spread of the rounds, the study's figure and the ratio (saved with each result), and the
depth-sweep line fits.  Reads extra_info dicts only."""
from __future__ import annotations

import statistics
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..stats import fit_line

GROUP_ORDER = ("switch-python", "switch-native", "switch-go", "create", "handoff", "depth-sweep")


def fmt_ns(ns: Optional[float]) -> str:
    if ns is None:
        return "-"
    if abs(ns) < 10:
        return f"{ns:.2f}"
    if abs(ns) < 1000:
        return f"{ns:.1f}"
    return f"{ns:,.0f}"


def depth_fits(rows: Iterable[Dict[str, Any]]) -> Dict[str, Tuple[float, float, float, List[int]]]:
    """kind ('yield_from', 'await') -> (slope ns/level, intercept ns, r squared, depths)."""
    points: Dict[str, Dict[int, float]] = {}
    for r in rows:
        if r.get("depth") is None:
            continue
        kind = r["case"].rsplit("-d", 1)[0]
        points.setdefault(kind, {})[r["depth"]] = r["ns_per_op"]
    out = {}
    for kind, pts in points.items():
        if len(pts) >= 2:
            ds = sorted(pts)
            slope, intercept, r2 = fit_line(ds, [pts[d] for d in ds])
            out[kind] = (slope, intercept, r2, ds)
    return out


def table(rows: Iterable[Dict[str, Any]]) -> List[str]:
    """One block per group: operation, ns/op (median of rounds), spread of the rounds, the
    study's figure and the ratio; then the depth-sweep fits."""
    rows = list(rows)
    by_group: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    lines: List[str] = []
    header = f"{'operation':<34} {'ns/op':>11} {'spread':>7} {'study':>9} {'x study':>8}  pinning"
    for group in sorted(by_group, key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else 99, g)):
        lines.append("")
        lines.append(f"{group} (ns per operation, median of rounds; empty loop subtracted)")
        lines.append(header)
        for r in by_group[group]:
            spread = r.get("spread_pct")
            study = r.get("study_ns")
            ratio = r.get("ratio_to_study")
            notes = [r.get("pinning", "")]
            if r.get("parent_rss_kib"):
                notes.append(f"forking process {r['parent_rss_kib'] / 1024:,.1f} MiB resident")
            if study is None and r.get("study_note"):
                notes.append("no study ratio: not like for like")
            if r.get("noisy_rounds_kept"):
                notes.append(f"{r['noisy_rounds_kept']} noisy rounds kept")
            lines.append(f"{r['micro']:<34} {fmt_ns(r['ns_per_op']):>11} "
                         f"{'-' if spread is None else format(spread, '.1f') + '%':>7} "
                         f"{fmt_ns(study):>9} {'-' if ratio is None else format(ratio, '.2f'):>8}  "
                         f"{'; '.join(n for n in notes if n)}")
    fits = depth_fits(rows)
    if fits:
        lines.append("")
        lines.append("depth sweep: ns per op = slope x depth + intercept (least squares)")
        for kind, (slope, intercept, r2, ds) in sorted(fits.items()):
            lines.append(f"  {kind:<12} slope {slope:7.2f} ns/level  intercept {intercept:7.1f} ns"
                         f"  r2 {r2:.3f}  depths {','.join(map(str, ds))}")
    return lines


def spread_between(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    """Run-to-run spread per figure of two runs: |a - b| / mean, in percent."""
    out = {}
    for key in a:
        if key in b and (a[key] + b[key]):
            out[key] = 100.0 * abs(a[key] - b[key]) / statistics.mean((a[key], b[key]))
    return out
