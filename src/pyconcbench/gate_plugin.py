"""The regression gate inside pytest: ``GatePlugin``, registered by the plugin when
``--pcb-fail-on`` is given, compares each benchmark as its test finishes with the same test in
``--benchmark-compare``'s baseline (or, in an interleaved A/B run, B with A in the same case).
With the family-wise correction (``--pcb-fail-correction holm``, the default, or ``bh``) the
verdicts wait for every test of the session, and a regression fails the session with one line
per regressed metric; with ``none``, and for A/B intervals, it fails the test's item at once;
benchmarks of the baseline this run did not measure are listed, and fail the session in a
strict run (``--pcb-strict``, on when CI is set), as ``pyconcbench compare`` fails on them;
and the hooks of the ``pcb_fail_on`` marker (checked at collection, its
expression saved with the results so ``pyconcbench compare`` honours it too).  The machine-fact
check, the context lines and the Markdown are ``gate``'s, shared with ``pyconcbench compare``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from . import gate, machine


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave, without pytest's 'Skipped: ' prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def marker_fail_on(item: pytest.Item) -> Optional[str]:
    """The expression of the test's closest ``pcb_fail_on`` marker, or None."""
    marker = item.get_closest_marker("pcb_fail_on")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], str):
        raise pytest.UsageError(f"{item.nodeid}: pcb_fail_on takes one expression string, "
                                f"e.g. pcb_fail_on('latency_p99:+50%')")
    return marker.args[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "call":
        # the test's own gate thresholds travel with its results, for `pyconcbench compare`
        text = marker_fail_on(item)
        bench = getattr(item, "funcargs", {}).get("benchmark")
        if text and bench is not None:
            bench.extra_info["pcb_fail_on"] = text
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        text = marker_fail_on(item)
        if text is None:
            continue
        try:
            gate.parse_fail_on(text)
        except gate.GateSpecError as exc:
            raise pytest.UsageError(f"{item.nodeid}: pcb_fail_on marker: {exc}") from None


class GatePlugin:
    """Registered when --pcb-fail-on is given: compares each benchmark, as its test finishes,
    with the same test in --benchmark-compare's baseline, and turns a regression into a
    failure of that test with one line per regressed metric."""

    NAME = "pyconcbench-gate"

    def __init__(self, config: pytest.Config, settings: Any) -> None:
        self.rules = gate.parse_fail_on(settings.fail_on or "")
        self.settings = settings
        self.result = gate.GateResult(alpha=settings.fail_alpha)
        self.baseline: Dict[str, List[Dict[str, Any]]] = {}
        self.baseline_name = ""
        self.problem = ""
        self.notes: List[str] = []  # said above the gate's table
        self.diffs: List[str] = []  # machine facts that differ from the baseline's (gated anyway)
        source = settings.sources.get("fail-on", "--pcb-fail-on")
        self.ab = settings.ab is not None
        self.failures: List[str] = []  # decided at the end of the session (corrected tests)
        self.measured: List[str] = []  # full names of the benchmarks this run measured
        self.outcomes: Dict[str, str] = {}  # nodeid -> "skipped: REASON" / "failed" (no measurement)
        self.missing: List[str] = []  # baseline benchmarks this run did not measure, with why
        if not self.ab and not config.getoption("benchmark_compare", None):
            raise pytest.UsageError(f"{source}: the gate needs a baseline: add --benchmark-compare (the "
                                    "newest saved run) or --benchmark-compare=NUM")
        self.config = config
        self.source = source

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Reads the baseline pytest-benchmark loaded for --benchmark-compare (its
        pytest_configure has run by now)."""
        settings = self.settings
        if self.ab:
            self.baseline_name = "none (interleaved A/B: B against A in this run)"
            return
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is not None and (getattr(bs, "disabled", False) or getattr(bs, "skip", False)):
            # --benchmark-disable or --benchmark-skip, or pytest-xdist (which disables benchmarks)
            raise pytest.UsageError(f"{self.source}: the gate compares measured rounds, but benchmarks are "
                                    "disabled or skipped in this run (--benchmark-disable, "
                                    "--benchmark-skip, or pytest-xdist's -n)")
        mapping = getattr(bs, "compared_mapping", None) or {}
        if not mapping:
            where = getattr(bs, "storage", None) or "the benchmark storage"
            self.problem = (f"no baseline: --benchmark-compare found no saved run in {where}, so nothing "
                            "was gated (save one first: --benchmark-autosave)")
            return
        # --benchmark-compare=GLOB may match several saved runs: all of them are the baseline
        # (their rounds pooled, and a regression must be worse than every one of them).
        for path, benches in mapping.items():
            for fullname, bench in benches.items():
                self.baseline.setdefault(gate.match_key({"fullname": fullname}), []).append(bench)
        names = [str(p) for p in mapping]
        self.baseline_name = names[0] if len(names) == 1 else f"{len(names)} runs ({names[0]} .. {names[-1]})"
        here = {"pyconcbench": machine.machine_facts()}
        facts = []
        for path in mapping:
            data = None
            for candidate in (Path(str(path)), Path(str(getattr(bs, "storage", ""))) / path):
                try:
                    data = json.loads(candidate.read_text(encoding="utf8"))
                    break
                except (OSError, ValueError):
                    continue
            if data is None:
                self.notes.append(f"the machine facts of the baseline {path} could not be read: "
                                  "not checked against this machine")
                continue
            facts.append((f"the baseline {path}", data.get("machine_info", {})))
        try:
            self.diffs = gate.check_facts(facts, here, settings.allow_machine_change,
                                          "pass --pcb-allow-machine-change yes to gate anyway")
        except gate.MachineChanged as exc:
            raise pytest.UsageError(f"{self.source}: {exc}") from None

    @staticmethod
    def bench_dict(bench: Any) -> Optional[Dict[str, Any]]:
        meta = getattr(bench, "stats", None)
        st = getattr(meta, "stats", None)
        if st is None:
            return None
        return {"name": bench.name, "fullname": bench.fullname, "group": bench.group,
                "extra_info": bench.extra_info,
                "stats": {"median": st.median, "data": list(st.data)}}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Why a test left no measurement: for the baseline benchmarks missing from the run."""
        key = gate.match_key({"fullname": report.nodeid})
        if key in self.outcomes:
            return
        if report.skipped:
            self.outcomes[key] = "skipped: " + skip_reason(report)
        elif report.failed:
            self.outcomes[key] = "failed" if report.when == "call" else f"error in {report.when}"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.when != "call" or self.problem:
            return report
        new = self.bench_dict(getattr(item, "funcargs", {}).get("benchmark"))
        if new is not None:
            self.measured.append(gate.match_key(new))
        if new is None or not report.passed:
            return report
        text = marker_fail_on(item)
        marker_rules = gate.parse_fail_on(text) if text else []
        ab_case = gate.is_ab(new)
        if self.ab and not ab_case:
            return report  # another family in an A/B run: not measured there
        bases = self.baseline.get(gate.match_key(new))
        if ab_case:
            # the code under test is in the A/B environments, not in this suite: its marker holds
            trusted, own = marker_rules, []
        else:
            # the test's marker is part of the change under test: as in `pyconcbench compare`, the
            # marker saved with the baseline (the reviewed code) holds, this one may only tighten it
            try:
                trusted = gate.trusted_marker(bases)
            except gate.GateSpecError as exc:  # refused, as `pyconcbench compare` refuses the run
                report.outcome = "failed"
                report.longrepr = f"pyconcbench gate: the baseline: {exc}"
                return report
            own = marker_rules
        changes = gate.check_bench(bases, new, self.rules, trusted, self.settings.fail_alpha, own_rules=own)
        self.result.changes.extend(changes)
        failed = [c for c in changes if c.failed]
        if failed and self.settings.fail_correction != "none" and not ab_case:
            return report  # corrected over the whole run: decided in pytest_sessionfinish
        if failed:
            report.outcome = "failed"
            report.longrepr = "\n".join(f"pyconcbench gate: {c.line()}" for c in failed)
        return report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The family-wise correction over every test of the run; a regression it leaves fails
        the session (as pytest-benchmark's own --benchmark-compare-fail does), one line each."""
        if self.problem:
            return
        self.missing = self.missing_benchmarks()
        if self.missing and self.settings.strict and not session.config.option.collectonly:
            self.failures += [f"pyconcbench gate: {len(self.missing)} benchmark(s) of the baseline missing from "
                              "this run (strict: --pcb-strict no accepts that): " + "; ".join(self.missing[:5])
                              + (" …" if len(self.missing) > 5 else "")]
        gate.correct(self.result, self.settings.fail_correction)
        if self.settings.fail_correction != "none":
            self.failures += [f"pyconcbench gate: {c.line()}" for c in self.result.regressions if c.low is None]
        if self.failures and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def missing_benchmarks(self) -> List[str]:
        """The baseline's benchmarks this run did not measure (``gate.compare_runs``' rule, as
        ``pyconcbench compare`` applies it), each with why: skipped (its reason), failed, or not
        selected in this run.  Empty in an A/B run (no baseline)."""
        if self.ab or not self.baseline:
            return []
        base = [{"fullname": name} for name in self.baseline]
        new = [{"fullname": name} for name in self.measured]
        missing = gate.compare_runs(base, new, []).missing
        return [f"{name} ({self.outcomes.get(name, 'not selected in this run')})" for name in missing]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("-", "pyconcbench regression gate")
        if self.problem:
            tr.write_line(f"pyconcbench gate: {self.problem}")
            return
        res = self.result
        counts: Dict[str, int] = {}
        for c in res.changes:
            counts[c.status] = counts.get(c.status, 0) + 1
        tr.write_line(f"baseline {self.baseline_name}; fail-on {self.settings.fail_on}; alpha "
                      f"{self.settings.fail_alpha:g}; " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                                                          or "no gated metric in the tests that ran"))
        tr.write_line(gate.rule_text(res))
        context = gate.context_lines(f"`{self.baseline_name}`", self.settings.fail_on, self.diffs, self.notes)
        for line in context[1:]:
            tr.write_line(line)
        for c in res.changes:
            if c.status in ("regression", "within noise", "improved", "noisy", "untested"):
                if c.low is not None:
                    detail = f"B/A [{c.low:.3f}, {c.high:.3f}]"
                else:
                    detail = f"p={'-' if c.p_value is None else format(c.p_value, '.3g')}"
                    if c.p_adjusted is not None:
                        detail += f", corrected {c.p_adjusted:.3g}"
                tr.write_line(f"{c.status.upper():>12}  {c.test} {c.metric} {gate.fmt_change(c.change)} ({detail})")
        if self.missing and not self.settings.strict:
            tr.write_line(f"not in this run ({len(self.missing)} benchmark(s) of the baseline; a strict run fails "
                          "on them): " + "; ".join(self.missing[:5]) + (" …" if len(self.missing) > 5 else ""))
        for line in self.failures:
            tr.write_line(line)
        if self.settings.gate_markdown:
            problem = gate.append_markdown(self.settings.gate_markdown, gate.markdown(res, context=context))
            tr.write_line(f"pyconcbench gate: cannot write {self.settings.gate_markdown}: {problem}" if problem
                          else f"gate summary appended to {self.settings.gate_markdown}")
