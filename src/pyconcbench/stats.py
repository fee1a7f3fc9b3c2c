"""Small statistics over per-round samples: the 95 % interval the reports print, the
one-sided Mann-Whitney U test the regression gate uses, the paired interval of an A/B run
(Hodges-Lehmann with the exact Wilcoxon signed-rank interval) and the family-wise corrections
(Holm, Benjamini-Hochberg).  No SciPy: the sample sizes are the rounds of one benchmark (3 to a
few dozen), where exact enumeration is cheap.
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

#: Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

#: A connection that completed fewer round trips than this share of the mean is starving.
STARVING_SHARE = 0.10

#: Above this many ways to split the pooled samples, the test uses the normal approximation.
EXACT_LIMIT = 20000


def t975(df: int) -> float:
    """Student's t quantile for a two-sided 95 % interval with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("t975: need at least 1 degree of freedom")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def ci95_halfwidth(samples: Sequence[float]) -> Optional[float]:
    """Half-width of the 95 % confidence interval of the mean (Student t), or None for fewer
    than two samples."""
    if len(samples) < 2:
        return None
    return t975(len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))


def _u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """Mann-Whitney U of ``x``: pairs where x > y, ties counting one half."""
    u = 0.0
    for a in x:
        for b in y:
            if a > b:
                u += 1.0
            elif a == b:
                u += 0.5
    return u


def min_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided p-value the exact test can give for these sample sizes."""
    return 1.0 / math.comb(n1 + n2, n1)


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided Mann-Whitney U test: the p-value of samples ``x`` tending to be *smaller*
    than samples ``y`` by chance alone.

    Exact (every split of the pooled samples, ties kept as they are) when there are at most
    ``EXACT_LIMIT`` splits; otherwise the normal approximation with tie and continuity
    corrections."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_less: both samples must be non-empty")
    observed = _u_statistic(x, y)
    if math.comb(n1 + n2, n1) <= EXACT_LIMIT:
        pooled = list(x) + list(y)
        index = range(n1 + n2)
        hits = total = 0
        for chosen in itertools.combinations(index, n1):
            picked = set(chosen)
            xs = [pooled[i] for i in chosen]
            ys = [pooled[i] for i in index if i not in picked]
            total += 1
            if _u_statistic(xs, ys) <= observed + 1e-9:
                hits += 1
        return hits / total
    # Normal approximation: mean n1 n2 / 2, variance with the tie correction.
    pooled = sorted(list(x) + list(y))
    n = n1 + n2
    ties = 0.0
    for _, group in itertools.groupby(pooled):
        t = len(list(group))
        ties += t ** 3 - t
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (observed - n1 * n2 / 2.0 + 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def signed_rank_cdf(n: int) -> List[float]:
    """P(T+ <= t) for t = 0 .. n(n+1)/2: the exact null distribution of the Wilcoxon
    signed-rank statistic over ``n`` pairs without ties (each rank's sign a fair coin)."""
    if n < 1:
        raise ValueError("signed_rank_cdf: need at least one pair")
    top = n * (n + 1) // 2
    ways = [1] + [0] * top  # ways[t]: subsets of ranks 1..k summing to t
    for k in range(1, n + 1):
        for t in range(top, k - 1, -1):
            ways[t] += ways[t - k]
    total = float(2 ** n)
    out, seen = [], 0
    for w in ways:
        seen += w
        out.append(seen / total)
    return out


@dataclass(frozen=True)
class PairedInterval:
    """The Hodges-Lehmann estimate of the pseudo-median of paired differences, and the
    distribution-free interval around it (exact Wilcoxon signed rank).  ``confidence`` is the
    interval's exact coverage: at least the one asked for when the pairs allow it; with few
    pairs the widest interval there is ([min, max]) and its coverage, which is lower."""

    estimate: float
    low: float
    high: float
    confidence: float
    pairs: int


def paired_interval(differences: Sequence[float], confidence: float = 0.95) -> PairedInterval:
    """``differences``: one value per pair (here the log of B's round over A's adjacent one).
    The estimate is the median of the Walsh averages (x_i + x_j) / 2, i <= j; the interval runs
    from the d-th smallest to the d-th largest of them, d the largest with
    P(T+ <= d - 1) <= (1 - confidence) / 2 (Hollander & Wolfe, ch. 3)."""
    xs = [float(x) for x in differences]
    n = len(xs)
    if n < 1:
        raise ValueError("paired_interval: need at least one pair")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError("paired_interval: the differences must be finite numbers")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"paired_interval: confidence must be within (0, 1), got {confidence!r}")
    walsh = sorted((xs[i] + xs[j]) / 2.0 for i in range(n) for j in range(i, n))
    m = len(walsh)
    cdf = signed_rank_cdf(n)
    tail = (1.0 - confidence) / 2.0
    d = 1
    while d < m and cdf[d] <= tail + 1e-12:  # cdf[d] = P(T+ <= d)
        d += 1
    # d is the largest with P(T+ <= d - 1) <= tail, or 1 when even that is not reached
    coverage = max(0.0, 1.0 - 2.0 * cdf[d - 1])
    return PairedInterval(estimate=statistics.median(walsh), low=walsh[d - 1], high=walsh[m - d],
                          confidence=coverage, pairs=n)


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where adjusted <= alpha
    and the family-wise error rate is at most alpha, whatever the dependence between tests."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> List[float]:
    """Benjamini-Hochberg adjusted p-values (same order): reject where adjusted <= q and the
    expected share of false alarms among the alarms is at most q (independent or positively
    dependent tests)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    out = [1.0] * m
    running = 1.0
    for k, i in enumerate(order):
        rank = m - k  # 1-based rank in ascending order
        running = min(running, p_values[i] * m / rank)
        out[i] = min(1.0, running)
    return out


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float, float]:
    """Least squares y = slope * x + intercept; returns (slope, intercept, r squared)."""
    n = len(xs)
    if n < 2 or n != len(ys):
        raise ValueError("fit_line: need at least two (x, y) pairs")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line: all x are equal")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 - ss_res / ss_tot if ss_tot else 1.0
    return slope, intercept, r2
