"""The regression gate: direction-aware thresholds on any metric, tested for significance over
the per-round samples.

A fail-on expression is a comma-separated list of ``[SCOPE@]METRIC:THRESHOLD``:

    msgs_per_s:-10%,latency_p99:+25%          every benchmark that has these metrics
    echo-c1000-*@latency_p99:+50%             only groups (or test names) matching the glob
    test_echo[threads-*]@latency_p99:off      not gated there at all

Each metric knows whether higher or lower is better; a threshold's sign, when given, must
point the worse way (``msgs_per_s:+10%`` is refused, as it would gate improvements).  For one
benchmark the last matching scoped item wins over the unscoped ones, and a
``@pytest.mark.pcb_fail_on("...")`` marker on the test wins over both.

A change is a **regression** when the median of the new rounds is worse than the median of
the baseline's rounds by more than the threshold **and** a one-sided Mann-Whitney U test over
the two sets of per-round samples gives p <= alpha (default 0.05).  Beyond the threshold but
not significant is reported as "within noise"; when the rounds are too few for the test ever
to reach alpha (2 against 2 cannot), as "untested" (run more rounds).  Neither fails.
"""
from __future__ import annotations

import fnmatch
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pyconcbench import stats
from pyconcbench.metrics import METRICS, Metric, fmt_value  # noqa: F401  (gate.METRICS: the gate's names)

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


def rules_for(bench: Dict[str, Any], rules: Sequence[Rule],
              marker_rules: Sequence[Rule] = ()) -> Dict[str, Optional[float]]:
    """metric -> threshold (None = off) for one benchmark: unscoped rules, then the scoped
    rules whose glob matches its group or test name (later wins), then the test's marker."""
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


def samples(bench: Dict[str, Any], metric: Metric) -> Tuple[Optional[float], List[float]]:
    """(summary value, per-round samples) of a metric in a saved benchmark, or (None, []).
    Rounds the plugin kept although they were noisy (retries exhausted) are left out."""
    info = bench.get("extra_info") or {}
    if metric.name == "time":
        # the clean rounds' own times (echo, ZeroMQ: seconds; switches: ns), else pytest-benchmark's
        st = bench.get("stats") or {}
        data: List[float] = []
        for key, field_, scale in (("rounds", "elapsed", 1.0), ("samples", "elapsed_ns", 1e-9)):
            rounds = info.get(key)
            if isinstance(rounds, list):
                data = [float(r[field_]) * scale for r in rounds
                        if isinstance(r, dict) and isinstance(r.get(field_), (int, float)) and not r.get("noisy")]
                break
        else:
            data = [float(v) for v in st.get("data") or []]
        median = st.get("median")
        if median is None and data:
            median = statistics.median(data)
        return (float(median) if median is not None else None), data
    for key, list_key, round_key in metric.sources:
        value = info.get(key)
        if value is None:
            continue
        rounds = info.get(list_key)
        data = []
        if isinstance(rounds, list):
            data = [float(r[round_key]) for r in rounds
                    if isinstance(r, dict) and isinstance(r.get(round_key), (int, float)) and not r.get("noisy")]
        return float(value), data
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

    @property
    def failed(self) -> bool:
        return self.status == "regression"

    def line(self) -> str:
        """The one line a failing test item shows."""
        m = METRICS[self.metric]
        bound = ("-" if m.higher_is_better else "+") + f"{(self.threshold or 0) * 100:g}%"
        p = ("p=%.3g" % self.p_value) if self.p_value is not None else "no significance test"
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
    new_value, new_samples = samples(new, metric)
    ch.n_new = len(new_samples)
    if new_value is None:
        ch.status = "no data"
        return ch
    ch.new = statistics.median(new_samples) if new_samples else new_value
    bases = []
    for b in _as_list(base):
        value, data = samples(b, metric)
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

    @property
    def regressions(self) -> List[Change]:
        return [c for c in self.changes if c.failed]


def marker_rules_of(bench: Dict[str, Any]) -> List[Rule]:
    """The rules of a test's ``pcb_fail_on`` marker, as the plugin saved them in extra_info."""
    text = (bench.get("extra_info") or {}).get("pcb_fail_on")
    return parse_fail_on(text) if text else []


def check_bench(base: Bases, new: Dict[str, Any], rules: Sequence[Rule],
                marker_rules: Sequence[Rule] = (), alpha: float = DEFAULT_ALPHA) -> List[Change]:
    """Every gated metric of one benchmark that has it."""
    out = []
    for metric, threshold in rules_for(new, rules, marker_rules).items():
        ch = compare_one(base, new, metric, threshold, alpha)
        if ch.status != "no data":
            out.append(ch)
    return out


def _key(bench: Dict[str, Any]) -> str:
    return bench.get("fullname") or bench.get("name") or "?"


def compare_runs(base: Sequence[Any], new: Sequence[Dict[str, Any]], rules: Sequence[Rule],
                 alpha: float = DEFAULT_ALPHA) -> GateResult:
    """Baseline benchmarks against new ones, matched by full test name.  ``base`` is one run's
    benchmarks, or a list of several runs' benchmark lists (pooled as compare_one says)."""
    runs = [list(r) for r in base] if base and not isinstance(base[0], dict) else [list(base)]
    by_name: Dict[str, List[Dict[str, Any]]] = {}
    for run in runs:
        for b in run:
            by_name.setdefault(_key(b), []).append(b)
    result = GateResult(alpha=alpha, baseline_runs=len(runs))
    seen = set()
    for bench in new:
        key = _key(bench)
        seen.add(key)
        result.changes.extend(check_bench(by_name.get(key), bench, rules, marker_rules_of(bench), alpha))
    result.missing = sorted(k for k in by_name if k not in seen)
    return result


# ---- machine facts ----------------------------------------------------------------------

#: Facts that must match for two runs' numbers to be comparable.
FACTS = ("cpu_model", "cpus_online", "kernel", "python", "python_implementation")


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
    """The lines above the gate's Markdown table: what was compared with what, under which rules."""
    lines = [f"Baseline {baseline}; fail-on `{expr}`."]
    if diffs:
        lines.append("Machine facts differ (compared anyway): " + "; ".join(diffs))
    return lines + [n for n in notes if n]


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

STATUS_ORDER = ("regression", "untested", "noisy", "within noise", "improved", "unchanged", "not gated",
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
                 + f" (regression = beyond the threshold and one-sided Mann-Whitney U p <= {result.alpha:g} "
                   "over the per-round samples)")
    lines.append("")
    if regs:
        for c in regs:
            lines.append(f"- :x: `{c.line()}`")
        lines.append("")
    if result.changes:
        lines.append("| test | metric | threshold | baseline | new | change | p | rounds | status |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
        order = {s: i for i, s in enumerate(STATUS_ORDER)}
        for c in sorted(result.changes, key=lambda c: (order.get(c.status, 99), c.group, c.test, c.metric)):
            m = METRICS[c.metric]
            thr = "off" if c.threshold is None else ("-" if m.higher_is_better else "+") + f"{c.threshold * 100:g}%"
            p = "-" if c.p_value is None else f"{c.p_value:.3g}"
            status = c.status + (f" ({c.note})" if c.note else "")
            lines.append(f"| `{c.test}` | {c.metric} | {thr} | {fmt_value(c.base, m)} | {fmt_value(c.new, m)} "
                         f"| {fmt_change(c.change)} | {p} | {c.n_base}/{c.n_new} | {status} |")
        lines.append("")
    if result.missing:
        lines.append(f"Not in the new run ({len(result.missing)}): "
                     + ", ".join(f"`{m}`" for m in result.missing[:20])
                     + (" …" if len(result.missing) > 20 else ""))
        lines.append("")
    return "\n".join(lines)
