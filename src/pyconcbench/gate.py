"""The regression gate: direction-aware thresholds on any metric, tested for significance over
the per-round samples.

A fail-on expression is a comma-separated list of ``[SCOPE@]METRIC:THRESHOLD``:

    msgs_per_s:-10%,latency_p99:+25%          every benchmark that has these metrics
    echo-c1000-*@latency_p99:+50%             only groups (or test names) matching the glob
    test_echo[threads-*]@latency_p99:off      not gated there at all

Each metric knows whether higher or lower is better; a threshold's sign, when given, must
point the worse way (``msgs_per_s:+10%`` is refused, as it would gate improvements).  For one
benchmark the last matching scoped item wins over the unscoped ones, and a test's
``@pytest.mark.pcb_fail_on("...")`` marker is weighed as below.

The run under test cannot loosen its own gate, offline (``compare_runs``, markers read from the
saved runs) or in pytest (the test's own marker is part of the change under test): the marker
saved in the **baseline** (``trusted_marker``: the newest baseline run that has the test) wins
over both kinds of rule, while the marker of the **new** run may only tighten -- a
threshold of its that is smaller than the one in force, or a metric that is not gated otherwise,
is applied; its ``off`` and its wider thresholds are ignored (the change's note says so).

A change is a **regression** when the median of the new rounds is worse than the median of
the baseline's rounds by more than the threshold **and** a one-sided Mann-Whitney U test over
the two sets of per-round samples gives p <= alpha (default 0.05).  Beyond the threshold but
not significant is reported as "within noise"; when the rounds are too few for the test ever
to reach alpha (2 against 2 cannot), as "untested" (run more rounds).  Neither fails.

Over a whole run the tests are corrected for their number (``correct``: Holm by default, or
Benjamini-Hochberg, or none): at 1 % false alarms per check, a suite of 300 checks would fail
nearly every unchanged run.  An interleaved A/B case (``pyconcbench ab``) is judged on its own:
a regression is B/A's whole interval beyond the threshold (``check_ab``).
"""
from __future__ import annotations

import fnmatch
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pyconcbench import stats
from pyconcbench.metrics import AB, AB_PAIR_KEYS, bench_key, METRICS, Metric, ab_family, fmt_value, md_code, md_text  # noqa: F401 (gate.METRICS)

DEFAULT_ALPHA = 0.05


class GateSpecError(ValueError):
    """A fail-on expression that cannot be understood; the message quotes the bad part."""


@dataclass(frozen=True)
class Rule:
    metric: str
    threshold: Optional[float]  # fraction, > 0; None = "off"
    scope: Optional[str] = None  # glob on group or test name

    def text(self) -> str:
        if self.threshold is None:
            t = "off"
        else:
            sign = "-" if METRICS[self.metric].higher_is_better else "+"
            t = f"{sign}{self.threshold * 100:g}%"
        return (f"{self.scope}@" if self.scope else "") + f"{self.metric}:{t}"


_ITEM = re.compile(r"^(?:(?P<scope>.+)@)?(?P<metric>[a-z0-9_]+):(?P<thr>.+)$")
_THR = re.compile(r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)%$")


def parse_fail_on(text: str) -> List[Rule]:
    """``"msgs_per_s:-10%,latency_p99:+25%"`` -> rules; GateSpecError quoting the bad item."""
    rules: List[Rule] = []
    items = [part.strip() for part in text.split(",")]
    if not any(items):
        raise GateSpecError(f"{text!r}: expected METRIC:THRESHOLD items such as msgs_per_s:-10%")
    for item in items:
        if not item:
            continue
        m = _ITEM.match(item)
        if not m:
            raise GateSpecError(f"{item!r}: expected [SCOPE@]METRIC:THRESHOLD, e.g. msgs_per_s:-10%")
        name = m.group("metric")
        metric = METRICS.get(name)
        if metric is None:
            raise GateSpecError(f"{item!r}: unknown metric {name!r}; known: {', '.join(sorted(METRICS))}")
        thr = m.group("thr").strip()
        scope = m.group("scope")
        if thr == "off":
            rules.append(Rule(name, None, scope))
            continue
        t = _THR.match(thr)
        if not t:
            raise GateSpecError(f"{item!r}: threshold {thr!r} is not a percentage like -10% or 25% (or 'off')")
        value = float(t.group("num")) / 100.0
        if value <= 0:
            raise GateSpecError(f"{item!r}: the threshold must be above 0%")
        sign = t.group("sign")
        worse = "-" if metric.higher_is_better else "+"
        if sign and sign != worse:
            raise GateSpecError(
                f"{item!r}: {name} is better {metric.better}, so its regression is a "
                f"{'drop' if metric.higher_is_better else 'rise'}: write {name}:{worse}{t.group('num')}%")
        rules.append(Rule(name, value, scope))
    return rules


def rules_for(bench: Dict[str, Any], rules: Sequence[Rule], marker_rules: Sequence[Rule] = (),
              tighten_only: Sequence[Rule] = (), ignored: Optional[List[Rule]] = None) -> Dict[str, Optional[float]]:
    """metric -> threshold (None = off) for one benchmark: unscoped rules, then the scoped
    rules whose glob matches its group or test name (later wins), then the test's marker; then
    ``tighten_only`` (a marker saved in the run under test), each applied only where it is
    stricter than what is in force -- the others are appended to ``ignored``."""
    group = bench.get("group") or ""
    names = (group, bench.get("name") or "", bench.get("fullname") or "")
    out: Dict[str, Optional[float]] = {}
    for rule in rules:
        if rule.scope is None:
            out[rule.metric] = rule.threshold
    for rule in rules:
        if rule.scope is not None and any(fnmatch.fnmatchcase(n, rule.scope) for n in names if n):
            out[rule.metric] = rule.threshold
    for rule in marker_rules:
        out[rule.metric] = rule.threshold
    for rule in tighten_only:
        now = out.get(rule.metric)
        if rule.threshold is not None and (now is None or rule.threshold < now):
            out[rule.metric] = rule.threshold
        elif ignored is not None and (rule.threshold is None or rule.threshold > now):
            ignored.append(rule)
    return out


#: Fewer clean rounds than this on either side, when some were noisy: the change is not judged.
MIN_CLEAN_ROUNDS = 3


def noisy_rounds(bench: Dict[str, Any]) -> int:
    """How many of the benchmark's kept rounds were measured while the machine was noisy."""
    info = bench.get("extra_info") or {}
    for key in ("rounds", "samples"):
        rounds = info.get(key)
        if isinstance(rounds, list):
            return sum(1 for r in rounds if isinstance(r, dict) and r.get("noisy"))
    return 0


class BadValue(ValueError):
    """A metric's value that is not a finite number (NaN, an infinity, a string ...)."""


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(f"{value!r} is not a number")
    try:
        out = float(value)
    except OverflowError:
        raise BadValue("a number beyond any float") from None
    if not math.isfinite(out):
        raise BadValue(f"{value!r} is not a finite number")
    return out


def samples(bench: Dict[str, Any], metric: Metric) -> Tuple[Optional[float], List[float]]:
    """(summary value, per-round samples) of a metric in a saved benchmark, or (None, []).
    Rounds the plugin kept although they were noisy (retries exhausted) are left out.
    BadValue when the summary or a round's value is not a finite number."""
    info = bench.get("extra_info")
    info = info if isinstance(info, dict) else {}
    if metric.name == "time":
        # the clean rounds' own times (echo, ZeroMQ: seconds; switches: ns), else pytest-benchmark's
        st = bench.get("stats")
        st = st if isinstance(st, dict) else {}
        data: List[float] = []
        for key, field_, scale in (("rounds", "elapsed", 1.0), ("samples", "elapsed_ns", 1e-9)):
            rounds = info.get(key)
            if isinstance(rounds, list):
                data = [_finite(r[field_]) * scale for r in rounds
                        if isinstance(r, dict) and r.get(field_) is not None and not r.get("noisy")]
                break
        else:
            raw = st.get("data")
            data = [_finite(v) for v in raw] if isinstance(raw, list) else []
        median = st.get("median")
        if median is None and data:
            median = statistics.median(data)
        return (_finite(median) if median is not None else None), data
    for key, list_key, round_key in metric.sources:
        value = info.get(key)
        if value is None:
            continue
        rounds = info.get(list_key)
        data = []
        if isinstance(rounds, list):
            data = [_finite(r[round_key]) for r in rounds
                    if isinstance(r, dict) and r.get(round_key) is not None and not r.get("noisy")]
        return _finite(value), data
    return None, []


@dataclass
class Change:
    """One metric of one benchmark, baseline against new."""

    test: str
    group: str
    metric: str
    threshold: Optional[float]
    base: Optional[float] = None
    new: Optional[float] = None
    change: Optional[float] = None  # new / base - 1, medians of the rounds
    p_value: Optional[float] = None
    n_base: int = 0
    n_new: int = 0
    status: str = ""  # see STATUS_ORDER; "no data" when the benchmark does not have the metric
    note: str = ""
    p_adjusted: Optional[float] = None  # after the family-wise correction over the whole run
    #: an interleaved A/B case: B/A's interval and its coverage (then base = A, new = B)
    low: Optional[float] = None
    high: Optional[float] = None
    confidence: Optional[float] = None

    correction_name: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("regression", "invalid")

    def line(self) -> str:
        """The one line a failing test item shows."""
        m = METRICS[self.metric]
        if self.status == "invalid":
            return f"{self.test}: {self.metric} cannot be judged: {self.note}"
        bound = ("-" if m.higher_is_better else "+") + f"{(self.threshold or 0) * 100:g}%"
        if self.low is not None:
            return (f"{self.test}: {self.metric} B/A {self.change + 1:.3f} [{self.low:.3f}, {self.high:.3f}] "
                    f"({(self.confidence or 0) * 100:.1f} % interval over {self.n_new} interleaved pairs; "
                    f"A {fmt_value(self.base, m)}, B {fmt_value(self.new, m)}): the whole interval is beyond "
                    f"the threshold {bound}" + (f"; {self.note}" if self.note else ""))
        p = ("p=%.3g" % self.p_value) if self.p_value is not None else "no significance test"
        if self.p_adjusted is not None:
            p += f" ({self.correction_name} {self.p_adjusted:.3g})"
        return (f"{self.test}: {self.metric} regressed {fmt_value(self.base, m)} -> {fmt_value(self.new, m)} "
                f"({fmt_change(self.change)}, threshold {bound}), one-sided Mann-Whitney U {p} "
                f"over {self.n_base} vs {self.n_new} rounds" + (f"; {self.note}" if self.note else ""))


def fmt_change(change: Optional[float]) -> str:
    return "-" if change is None else f"{change * 100:+.1f}%"


Bases = Union[None, Dict[str, Any], Sequence[Dict[str, Any]]]


def _as_list(base: Bases) -> List[Dict[str, Any]]:
    if base is None:
        return []
    if isinstance(base, dict):
        return [base]
    return [b for b in base if b is not None]


def _unreadable(ch: Change, whose: str, exc: Exception) -> Change:
    """NaN or a string where a run's figure should be: never "unchanged" (nor a failure where
    the metric is not gated)."""
    ch.status = "not gated" if ch.threshold is None else "invalid"
    ch.note = f"{whose} {ch.metric}: {exc}"
    return ch


def compare_one(base: Bases, new: Dict[str, Any], metric_name: str,
                threshold: Optional[float], alpha: float = DEFAULT_ALPHA) -> Change:
    """One metric of one benchmark: ``base`` is the same test in one baseline run, or in
    several (a list, oldest first).  With several, their rounds are pooled for the test, and
    a regression must also fall outside the range of the baseline runs' own medians: runs of
    unchanged code differ by more than their rounds do (the machine has slow spells), and
    only several baseline runs show by how much."""
    metric = METRICS[metric_name]
    test = new.get("name") or new.get("fullname") or "?"
    ch = Change(test=test, group=new.get("group") or "", metric=metric_name, threshold=threshold)
    try:
        new_value, new_samples = samples(new, metric)
    except BadValue as exc:
        return _unreadable(ch, "the new run's", exc)
    ch.n_new = len(new_samples)
    if new_value is None:
        ch.status = "no data"
        return ch
    ch.new = statistics.median(new_samples) if new_samples else new_value
    bases = []
    for b in _as_list(base):
        try:
            value, data = samples(b, metric)
        except BadValue as exc:
            return _unreadable(ch, "the baseline's", exc)
        if value is not None:
            bases.append((value, data))
    if not bases:
        ch.status = "no baseline"
        if base:
            ch.note = f"the baseline has no {metric_name}"
        return ch
    noisy_new = noisy_rounds(new)
    noisy_base = sum(noisy_rounds(b) for b in _as_list(base))
    base_samples = [x for _, data in bases for x in data]
    if (noisy_new and ch.n_new < MIN_CLEAN_ROUNDS) or (noisy_base and len(base_samples) < MIN_CLEAN_ROUNDS):
        ch.status = "noisy"
        ch.note = (f"too few rounds measured on a quiet machine to judge (new: {noisy_new} noisy, "
                   f"{ch.n_new} clean; baseline: {noisy_base} noisy, {len(base_samples)} clean): rerun")
        ch.n_base = len(base_samples)
        return ch
    run_medians = [statistics.median(data) if data else value for value, data in bases]
    ch.n_base = len(base_samples)
    ch.base = statistics.median(base_samples) if base_samples else statistics.median(run_medians)
    if not ch.base:
        ch.status = "no baseline"
        ch.note = "the baseline's value is 0"
        return ch
    if ch.base < metric.floor:
        ch.status = "no baseline"
        ch.note = (f"the baseline's value {fmt_value(ch.base, metric)} is below {fmt_value(metric.floor, metric)}, "
                   "where a relative change means nothing: not judged")
        return ch
    ch.change = ch.new / ch.base - 1.0
    worse = -ch.change if metric.higher_is_better else ch.change  # > 0: worse
    testable = ch.n_base >= 1 and ch.n_new >= 1 and stats.min_p_value(ch.n_base, ch.n_new) <= alpha
    p_better = 1.0
    if testable:
        if metric.higher_is_better:
            ch.p_value = stats.mann_whitney_less(new_samples, base_samples)  # new smaller = worse
            p_better = stats.mann_whitney_less(base_samples, new_samples)
        else:
            ch.p_value = stats.mann_whitney_less(base_samples, new_samples)  # new larger = worse
            p_better = stats.mann_whitney_less(new_samples, base_samples)
    worst_run = min(run_medians) if metric.higher_is_better else max(run_medians)
    inside_range = len(run_medians) >= 2 and (ch.new >= worst_run if metric.higher_is_better else ch.new <= worst_run)
    if threshold is None:
        ch.status = "not gated"
    elif worse > threshold:
        if inside_range:
            ch.status = "within noise"
            ch.note = (f"inside the range of the {len(run_medians)} baseline runs' medians "
                       f"({fmt_value(min(run_medians), metric)} .. {fmt_value(max(run_medians), metric)})")
        elif not testable:
            # beyond the threshold, but no test over these rounds could be significant
            ch.status = "untested"
            ch.note = (f"{ch.n_base} vs {ch.n_new} rounds cannot reach p <= {alpha:g} "
                       f"(the smallest possible is {stats.min_p_value(max(ch.n_base, 1), max(ch.n_new, 1)):.3g}): "
                       "run more rounds (--pcb-rounds) to judge")
        elif ch.p_value is not None and ch.p_value <= alpha:
            ch.status = "regression"
        else:
            ch.status = "within noise"
    elif -worse > threshold and testable and p_better <= alpha:
        ch.status = "improved"
    else:
        ch.status = "unchanged"
    if len(run_medians) >= 2 and ch.status == "regression":
        ch.note = (ch.note + "; " if ch.note else "") + f"worse than all {len(run_medians)} baseline runs"
    return ch


@dataclass
class GateResult:
    changes: List[Change] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)  # in the baseline, not in the new run
    alpha: float = DEFAULT_ALPHA
    baseline_runs: int = 1
    correction: str = "none"  # see CORRECTIONS; set by correct()
    checks: int = 0           # significance tests the correction was made over

    @property
    def regressions(self) -> List[Change]:
        return [c for c in self.changes if c.failed]


# ---- the family-wise correction --------------------------------------------------------------

#: How the significance tests of one gated run are corrected for their number: ``holm``
#: (Holm-Bonferroni: the chance of any false alarm in the whole run stays <= alpha, whatever the
#: dependence between checks; the default), ``bh`` (Benjamini-Hochberg: the expected share of
#: false alarms among the alarms stays <= alpha; more alarms pass when many metrics really
#: moved), ``none`` (each check at alpha on its own: with hundreds of checks, some unchanged
#: benchmark fails most runs).
CORRECTIONS = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "none"}


def correct(result: GateResult, method: str) -> GateResult:
    """Applies the family-wise correction over every tested check of the run (a gated metric
    with a p-value; the interval verdicts of A/B cases are not p-values and stay as they are).
    A regression whose corrected p-value is above alpha becomes "within noise" -- or "untested"
    when no result of its rounds could pass the corrected level: the note says how many rounds,
    or an A/B run, it would take."""
    if method not in CORRECTIONS:
        raise ValueError(f"unknown correction {method!r}; known: {', '.join(CORRECTIONS)}")
    tested = [c for c in result.changes if c.threshold is not None and c.p_value is not None and c.low is None]
    result.correction = method
    result.checks = len(tested)
    if method == "none" or not tested:
        return result
    adjust = stats.holm if method == "holm" else stats.benjamini_hochberg
    m = len(tested)
    level = result.alpha / m  # what the smallest p of the run must reach, under either method
    for c, adjusted in zip(tested, adjust([c.p_value for c in tested])):
        c.p_adjusted = adjusted
        c.correction_name = CORRECTIONS[method]
        if c.status != "regression" or adjusted <= result.alpha:
            continue
        best = stats.min_p_value(c.n_base, c.n_new)
        if best > level:
            need = _rounds_needed(level)
            c.status = "untested"
            c.note = (f"{m} checks in this run: under {CORRECTIONS[method]} a regression needs p <= {level:.2g}, "
                      f"which {c.n_base} vs {c.n_new} rounds cannot reach (at best {best:.2g}): run {need}+ rounds "
                      "a side (--pcb-rounds), gate fewer metrics, or compare A and B interleaved in one run "
                      "(pyconcbench ab)")
        else:
            c.status = "within noise"
            c.note = f"p={c.p_value:.3g}, {adjusted:.3g} after {CORRECTIONS[method]} over {m} checks"
    return result


def _rounds_needed(level: float) -> int:
    """The fewest rounds per side with which the exact test can reach ``level``."""
    n = 2
    while stats.min_p_value(n, n) > level and n < 1000:
        n += 1
    return n


# ---- interleaved A/B cases ------------------------------------------------------------------

def ab_verdict(higher_is_better: bool, low: float, high: float, threshold: Optional[float]) -> str:
    """An A/B interval of B/A against a threshold: "regression" when the whole interval is worse
    than the threshold, "improved" when the whole interval is better by more than it, else
    "unchanged" (the note says when the interval excludes 1 all the same); "not gated" when the
    threshold is off."""
    if threshold is None:
        return "not gated"
    worse_low, worse_high = (1 - high, 1 - low) if higher_is_better else (low - 1, high - 1)  # > 0: worse
    if worse_low > threshold:
        return "regression"
    if worse_high < -threshold:
        return "improved"
    return "unchanged"


def check_ab(bench: Dict[str, Any], rules: Sequence[Rule], marker_rules: Sequence[Rule] = (),
             own_rules: Sequence[Rule] = ()) -> List[Change]:
    """Every gated metric of one interleaved A/B case (family ``ab``): B/A's interval against
    the threshold, in the metric's direction (ns_per_op: B/A above 1 is worse); no baseline run
    is involved.  ``own_rules``: the marker saved in the run itself, applied only where it
    tightens (``rules_for``).  Only the metrics the case's family compares pair by pair
    (``metrics.AB_PAIR_KEYS``) are judged."""
    info = bench.get("extra_info") or {}
    keys = AB_PAIR_KEYS.get(ab_family(info)) or {}
    ivs = info.get("intervals") or {}
    sides = {s: info.get(s) or {} for s in ("a", "b")}
    test = bench.get("name") or bench.get("fullname") or "?"
    out = []
    ignored: List[Rule] = []
    for metric, threshold in rules_for(bench, rules, marker_rules, own_rules, ignored).items():
        iv = ivs.get(metric)
        key = keys.get(metric)
        if not isinstance(iv, dict) or key is None:
            continue
        try:
            ratio, low, high = float(iv["ratio"]), float(iv["low"]), float(iv["high"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{test}: the A/B interval of {metric} is malformed: {iv!r}") from None
        if not (0 < low <= ratio <= high) or not all(map(math.isfinite, (ratio, low, high))):
            raise ValueError(f"{test}: the A/B interval of {metric} is not an interval: {iv!r}")
        m = METRICS[metric]
        ch = Change(test=test, group=bench.get("group") or "", metric=metric, threshold=threshold,
                    base=_num(sides["a"].get(key)), new=_num(sides["b"].get(key)), change=ratio - 1.0,
                    n_base=int(iv.get("pairs") or 0), n_new=int(iv.get("pairs") or 0),
                    low=low, high=high, confidence=_num(iv.get("confidence")))
        ch.status = ab_verdict(m.higher_is_better, low, high, threshold)
        if ch.status == "unchanged" and (low > 1.0 or high < 1.0):
            ch.note = f"B differs from A ({(ratio - 1) * 100:+.1f} %) but not beyond the threshold"
        if ch.confidence is not None and ch.confidence < 0.95 and ch.status in ("regression", "improved"):
            ch.note = (ch.note + "; " if ch.note else "") + f"only {ch.confidence * 100:.1f} % coverage: more pairs"
        out.append(ch)
    return _note_ignored(out, ignored)


def _note_ignored(changes: List[Change], ignored: Sequence[Rule]) -> List[Change]:
    """Says on each change which loosening of the new run's own marker was not applied."""
    for ch in changes:
        mine = [r.text() for r in ignored if r.metric == ch.metric]
        if mine:
            ch.note = ((ch.note + "; ") if ch.note else "") + (
                f"the new run's own pcb_fail_on {', '.join(mine)} not applied: a run cannot loosen its own gate")
    return changes


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def marker_rules_of(bench: Optional[Dict[str, Any]]) -> List[Rule]:
    """The rules of a test's ``pcb_fail_on`` marker, as the plugin saved them in extra_info;
    GateSpecError naming the test when the saved expression is not one."""
    info = (bench or {}).get("extra_info")
    text = info.get("pcb_fail_on") if isinstance(info, dict) else None
    if not text:
        return []
    try:
        return parse_fail_on(str(text))
    except GateSpecError as exc:
        raise GateSpecError(f"{_key(bench or {})}: the pcb_fail_on marker saved in the run: {exc}") from None


def check_bench(base: Bases, new: Dict[str, Any], rules: Sequence[Rule],
                marker_rules: Sequence[Rule] = (), alpha: float = DEFAULT_ALPHA,
                own_rules: Sequence[Rule] = ()) -> List[Change]:
    """Every gated metric of one benchmark that has it: against ``base``, or for an interleaved
    A/B case against its own A side (``check_ab``; ``base`` is not used).  ``marker_rules`` win
    over ``rules``; ``own_rules`` (a marker saved in the new run) only ever tighten them."""
    if is_ab(new):
        return check_ab(new, rules, marker_rules, own_rules)
    out = []
    ignored: List[Rule] = []
    for metric, threshold in rules_for(new, rules, marker_rules, own_rules, ignored).items():
        ch = compare_one(base, new, metric, threshold, alpha)
        if ch.status != "no data":
            out.append(ch)
    return _note_ignored(out, ignored)


def trusted_marker(bases: Optional[Sequence[Dict[str, Any]]]) -> List[Rule]:
    """The ``pcb_fail_on`` rules saved with the baseline (the newest run of ``bases`` that has
    one): the reviewed code's marker, which holds as the command line does.  GateSpecError
    naming the test when the saved expression is not one."""
    return next((r for r in (marker_rules_of(b) for b in reversed(list(bases or []))) if r), [])


def is_ab(bench: Dict[str, Any]) -> bool:
    """An interleaved A/B case: gated on its own interval, not against a baseline."""
    info = bench.get("extra_info")
    return isinstance(info, dict) and info.get("pcb_family") == AB


def _key(bench: Dict[str, Any]) -> str:
    return bench.get("fullname") or bench.get("name") or "?"


def match_key(bench: Dict[str, Any]) -> str:
    """What a baseline benchmark and a new one are matched by (metrics.bench_key: the node id
    without its file's folders, so the suite's move from tests/bench into the package keeps
    old baselines)."""
    return bench_key(bench)


def compare_runs(base: Sequence[Any], new: Sequence[Dict[str, Any]], rules: Sequence[Rule],
                 alpha: float = DEFAULT_ALPHA) -> GateResult:
    """Baseline benchmarks against new ones, matched by full test name.  ``base`` is one run's
    benchmarks, or a list of several runs' benchmark lists (pooled as compare_one says)."""
    runs = [list(r) for r in base] if base and not isinstance(base[0], dict) else [list(base)]
    by_name: Dict[str, List[Dict[str, Any]]] = {}
    for run in runs:
        for b in run:
            by_name.setdefault(match_key(b), []).append(b)
    result = GateResult(alpha=alpha, baseline_runs=len(runs))
    seen = set()
    for bench in new:
        key = match_key(bench)
        seen.add(key)
        bases = by_name.get(key) or []
        # the marker of the reviewed code wins as on the command line; the new run's own
        # marker may only tighten it
        trusted = trusted_marker(bases)
        result.changes.extend(check_bench(bases or None, bench, rules, trusted, alpha,
                                          own_rules=marker_rules_of(bench)))
    result.missing = sorted(_key(by_name[k][0]) for k in by_name if k not in seen)
    return result


# ---- machine facts ----------------------------------------------------------------------

#: Facts that must match for two runs' numbers to be comparable.
FACTS = ("cpu_model", "cpus_online", "kernel", "python", "python_implementation", "python_build", "gil_enabled")


def fact_differences(base_machine: Dict[str, Any], new_machine: Dict[str, Any]) -> List[str]:
    """'kernel: 6.1 -> 6.18' for each comparable fact that differs between two runs."""
    a = base_machine.get("pyconcbench") or {}
    b = new_machine.get("pyconcbench") or {}
    out = []
    for key in FACTS:
        if key in a and key in b and a[key] != b[key]:
            out.append(f"{key}: {a[key]} -> {b[key]}")
    return out


class MachineChanged(ValueError):
    """A baseline measured on another machine or Python: its numbers are not comparable."""


def check_facts(bases: Sequence[Tuple[str, Dict[str, Any]]], new_machine: Dict[str, Any], allow: bool,
                allow_hint: str) -> List[str]:
    """The machine facts that differ between the baselines (name, machine_info) and the new
    run's machine_info, each once; MachineChanged (one line, ending with ``allow_hint``) when
    any differ and ``allow`` is false.  Used by `pyconcbench compare` and the pytest gate alike."""
    diffs: List[str] = []
    for name, machine in bases:
        found = fact_differences(machine, new_machine)
        if found and not allow:
            raise MachineChanged(f"{name} was measured on a different machine or Python ("
                                 + "; ".join(found) + f"): its numbers are not comparable; {allow_hint}")
        diffs += [d for d in found if d not in diffs]
    return diffs


def context_lines(baseline: str, expr: str, diffs: Sequence[str], notes: Sequence[str] = ()) -> List[str]:
    """The lines above the gate's Markdown table: what was compared with what, under which rules
    (every text escaped for Markdown: file names and machine facts come from the saved runs)."""
    lines = [f"Baseline {md_text(baseline)}; fail-on {md_code(expr, in_table=False)}."]
    if diffs:
        lines.append("Machine facts differ (compared anyway): " + md_text("; ".join(diffs)))
    return lines + [md_text(n) for n in notes if n]


def append_markdown(path: str, text: str) -> Optional[str]:
    """Appends the gate's Markdown to ``path`` (e.g. $GITHUB_STEP_SUMMARY); why it cannot, in a
    few words, else None."""
    try:
        with open(path, "a", encoding="utf8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


# ---- the summary ------------------------------------------------------------------------

def rule_text(result: GateResult) -> str:
    """What "regression" meant in this run, in one sentence."""
    text = (f"regression = beyond the threshold and one-sided Mann-Whitney U p <= {result.alpha:g} over the "
            "per-round samples")
    if result.correction != "none" and result.checks:
        text += f" after {CORRECTIONS[result.correction]}'s correction over the run's {result.checks} tests"
    elif result.checks:
        text += f", each of the {result.checks} tests on its own (no family-wise correction)"
    if any(c.low is not None for c in result.changes):
        text += "; for an interleaved A/B case, B/A's whole interval beyond the threshold"
    return text

STATUS_ORDER = ("regression", "invalid", "untested", "noisy", "within noise", "improved", "unchanged", "not gated",
                "no baseline")


def markdown(result: GateResult, title: str = "pyconcbench regression gate",
             context: Sequence[str] = ()) -> str:
    """A Markdown summary of every gated change, regressions first: ready for a CI job summary."""
    regs = result.regressions
    lines = [f"## {title}", ""]
    lines += list(context)
    if context:
        lines.append("")
    counts = {s: sum(1 for c in result.changes if c.status == s) for s in STATUS_ORDER}
    verdict = (f"**{len(regs)} regression{'s' if len(regs) != 1 else ''}**" if regs
               else "**no regression**")
    lines.append(verdict + " — " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
                 + f" ({rule_text(result)})")
    lines.append("")
    if regs:
        for c in regs:
            lines.append(f"- :x: {md_code(c.line(), in_table=False)}")
        lines.append("")
    if result.changes:
        lines.append("| test | metric | threshold | baseline | new | change | p | rounds | status |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
        order = {s: i for i, s in enumerate(STATUS_ORDER)}
        for c in sorted(result.changes, key=lambda c: (order.get(c.status, 99), c.group, c.test, c.metric)):
            m = METRICS[c.metric]
            thr = "off" if c.threshold is None else ("-" if m.higher_is_better else "+") + f"{c.threshold * 100:g}%"
            p = "-" if c.p_value is None else f"{c.p_value:.3g}"
            if c.p_adjusted is not None:
                p += f" ({c.p_adjusted:.3g})"
            if c.low is not None:
                p = f"B/A [{c.low:.3f}, {c.high:.3f}]"
            status = c.status + (f" ({c.note})" if c.note else "")
            lines.append(f"| {md_code(c.test)} | {c.metric} | {thr} | {fmt_value(c.base, m)} | {fmt_value(c.new, m)} "
                         f"| {fmt_change(c.change)} | {p} | {c.n_base}/{c.n_new} | {md_text(status)} |")
        lines.append("")
    if result.missing:
        lines.append(f"Not in the new run ({len(result.missing)}): "
                     + ", ".join(md_code(m, in_table=False) for m in result.missing[:20])
                     + (" …" if len(result.missing) > 20 else ""))
        lines.append("")
    return "\n".join(lines)
