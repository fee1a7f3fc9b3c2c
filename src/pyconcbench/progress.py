"""Live progress of a run: one line per finished benchmark through pytest's terminal reporter,
with done/total and an estimate of the time left, and a header estimating the whole run.

    [ 12/233] echo asyncio_protocol c100 64B tcp   125,936 msgs/s  p99 812 us  1 retry     ~4:31 left

Registered by the plugin unless the run is quiet (``-q``), collects only, or runs with
``--benchmark-disable`` (a test run of the suite, where pytest's own dots say enough).  A
passed benchmark's letter (the dot) is left out: its line is its progress.

The estimates: each benchmark's seconds in the newest saved run of this storage that has it
(``case_seconds``, saved by this plugin into extra_info), else a rough figure per family;
scaled, as the run goes, by how long the finished benchmarks took against their estimates.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from . import metrics

#: Rough seconds per benchmark when no saved run has it (the quick profile on a 2-vCPU VM:
#: echo 188 s for 104 cases, switch 60 s for 84, ZeroMQ 52 s for 43, the ceiling 12 s for 2).
DEFAULT_SECONDS = {"echo": 1.6, "switch": 0.7, "zmq": 1.2, "ceiling": 6.0, "openloop": 4.5}
#: How many seconds of estimates the scale of the time left leans on before the measured ones.
PRIOR_SECONDS = 30.0
#: Saved runs read for the estimate (the newest first): enough to find the last full run.
RUNS_READ = 5

# (the open loop's cases carry an echo_case too: its own parameter is looked at first)
FAMILY_PARAMS = {"openloop_case": "openloop", "echo_case": "echo", "zmq_case": "zmq", "switch_case": "switch",
                 "ceiling_connections": "ceiling"}


def item_family(item: pytest.Item) -> Optional[str]:
    """The family of a benchmark item of the suite, None for any other test."""
    callspec = getattr(item, "callspec", None)
    for param, family in FAMILY_PARAMS.items():
        if callspec is not None and param in callspec.params:
            return family
    return None


def default_seconds(item: pytest.Item, family: str) -> float:
    case = item.callspec.params.get("echo_case")
    if family == "openloop":
        return DEFAULT_SECONDS["openloop"] + case.connections / 2000
    if case is not None:  # more connections: longer to connect, and fewer, longer rounds
        return DEFAULT_SECONDS["echo"] + case.connections / 2000
    return DEFAULT_SECONDS[family]


def saved_seconds(storage: Optional[str]) -> Dict[str, float]:
    """bench key -> seconds, from the newest saved runs in ``storage`` (a folder, or
    pytest-benchmark's ``file://`` URL); empty when there are none or they cannot be read."""
    if not storage:
        return {}
    folder = Path(storage[len("file://"):] if storage.startswith("file://") else storage)
    try:
        files = sorted(folder.glob("*/*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:RUNS_READ]
    except OSError:
        return {}
    out: Dict[str, float] = {}
    for path in files:
        try:
            benches = json.loads(path.read_text(encoding="utf8")).get("benchmarks") or []
        except (OSError, ValueError, AttributeError):
            continue
        for bench in benches:
            info = bench.get("extra_info") if isinstance(bench, dict) else None
            seconds = info.get("case_seconds") if isinstance(info, dict) else None
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 < seconds < 1e6:
                out.setdefault(metrics.bench_key(bench), float(seconds))
    return out


def clock(seconds: float) -> str:
    """'4:31', '1:02:05'."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rate(info: Dict[str, Any], key: str, unit: str) -> str:
    """'  125,936 msgs/s  p99 812 us' from a record's rate and p99 (either may be missing)."""
    rate, p99 = _num(info.get(key)), _num(info.get("latency_p99_us"))
    body = f"{rate:>12,.0f} {unit}" if rate is not None else ""
    return body + (f"  p99 {p99:,.0f} us" if p99 is not None else "")


def summary(family: str, item: pytest.Item, info: Dict[str, Any]) -> str:
    """What a finished benchmark measured, in one short line."""
    params = item.callspec.params
    retries = len(info.get("rejected_rounds") or info.get("rejected_samples") or [])
    tail = f"  {retries} retr{'y' if retries == 1 else 'ies'}" if retries else ""
    if family == "echo":
        case = params["echo_case"]
        head = f"echo {case.label} {case.scale.replace('-', ' ')}"
        if info.get(metrics.FAMILY_KEY) == metrics.AB:
            iv = (info.get("intervals") or {}).get("msgs_per_s") or {}
            ratio, low, high = _num(iv.get("ratio")), _num(iv.get("low")), _num(iv.get("high"))
            if ratio is None:
                return head
            return f"{head:<52} B/A msgs/s {ratio:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low and high else "")
        return f"{head:<52}{_rate(info, 'msgs_per_s', 'msgs/s')}{tail}"
    if family == "openloop":
        case = params["openloop_case"]
        head = f"open {case.echo.label} {case.echo.scale.replace('-', ' ')} at {case.rate_label}"
        held = "" if info.get("rate_held", True) else "  rate not held"
        return f"{head:<52}{_rate(info, 'msgs_per_s', 'msgs/s')}{held}{tail}"
    if family == "zmq":
        return f"{'zmq ' + params['zmq_case'].id:<52}{_rate(info, 'requests_per_s', 'req/s')}{tail}"
    if family == "switch":
        ns = _num(info.get("ns_per_op"))
        head = f"switch {params['switch_case'].id}"
        return f"{head:<52}" + (f"{ns:>12,.1f} ns/op" if ns is not None else "") + tail
    rate = _num(info.get("msgs_per_s"))
    head = f"ceiling c{params['ceiling_connections']}"
    return f"{head:<52}" + (f"{rate:>12,.0f} msgs/s" if rate is not None else "")


class Progress:
    """The plugin object (see the module's docstring)."""

    NAME = "pyconcbench-progress"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.estimate: Dict[str, float] = {}  # nodeid -> estimated seconds, benchmark items only
        self.family: Dict[str, str] = {}
        self.items: Dict[str, pytest.Item] = {}
        self.info: Dict[str, Dict[str, Any]] = {}  # nodeid -> the benchmark's extra_info
        self.seconds: Dict[str, float] = {}  # nodeid -> setup + call + teardown so far
        self.finished: List[str] = []
        self.from_saved = 0

    @property
    def reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        saved = saved_seconds(self.config.getoption("benchmark_storage", None))
        for item in session.items:
            family = item_family(item)
            if family is None:
                continue
            key = metrics.bench_key({"fullname": item.nodeid})
            self.family[item.nodeid] = family
            self.items[item.nodeid] = item
            if key in saved:
                self.estimate[item.nodeid] = saved[key]
                self.from_saved += 1
            else:
                self.estimate[item.nodeid] = default_seconds(item, family)
        reporter = self.reporter
        if self.estimate and reporter is not None:
            # the lines are the progress: no file name before each (write_line ends the line
            # pytest would go on), no percentages filling the last one
            reporter.showfspath = False
            if hasattr(reporter, "_show_progress_info"):
                reporter._show_progress_info = False
            total = sum(self.estimate.values())
            source = (f"{self.from_saved} of them as long as in the newest saved runs here"
                      if self.from_saved else "a rough guess: a saved run here makes it better")
            self.reporter.write_line(f"pyconcbench: {len(self.estimate)} benchmarks, about {clock(total)} "
                                     f"({source})")

    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        """No letter for what gets a progress line (the line is its mark); the category and
        word stay pytest's, so its summary counts are unchanged."""
        if report.nodeid not in self.estimate or hasattr(report, "wasxfail"):
            return None
        if report.when == "call":
            category = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        elif report.when == "setup" and not report.passed:
            category = "skipped" if report.skipped else "error"
        else:
            return None
        return category, "", category.upper()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.when == "call" and item.nodeid in self.estimate:
            bench = getattr(item, "funcargs", {}).get("benchmark")
            info = getattr(bench, "extra_info", None)
            if isinstance(info, dict):
                self.info[item.nodeid] = info
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if nodeid not in self.estimate:
            return
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + (report.duration or 0.0)
        if report.when == "teardown":
            info = self.info.get(nodeid)
            if info is not None:  # saved with the run: the next run's estimate
                info["case_seconds"] = round(self.seconds[nodeid], 2)
            return
        done_now = (report.when == "call") or (report.when == "setup" and not report.passed)
        if not done_now or nodeid in self.finished:
            return
        self.finished.append(nodeid)
        self._line(nodeid, report)

    def time_left(self) -> Optional[float]:
        """Seconds left: the remaining benchmarks' estimates, scaled by how the finished ones
        compared with theirs."""
        # only what ran: a skip or a setup error takes no time, and would scale the rest down
        ran = [n for n in self.finished if n in self.info]
        took = sum(self.seconds.get(n, 0.0) for n in ran)
        guessed = sum(self.estimate[n] for n in ran)
        left = sum(s for n, s in self.estimate.items() if n not in self.finished)
        if guessed <= 0 or took <= 0:
            return None
        # the first benchmarks alone would swing it (one fast case halved the estimate): the
        # scale leans on the estimates until PRIOR_SECONDS of benchmarks have run
        return left * (took + PRIOR_SECONDS) / (guessed + PRIOR_SECONDS)

    def _line(self, nodeid: str, report: pytest.TestReport) -> None:
        if self.reporter is None:
            return
        item, family = self.items[nodeid], self.family[nodeid]
        width = len(str(len(self.estimate)))
        head = f"[{len(self.finished):>{width}}/{len(self.estimate)}] "
        if report.passed:
            body = summary(family, item, self.info.get(nodeid) or {})
        else:
            what = "skipped" if report.skipped else ("FAILED" if report.when == "call" else f"ERROR in {report.when}")
            body = f"{family} {item.callspec.id}: {what}"
            if report.skipped and isinstance(report.longrepr, tuple):
                body += f" ({str(report.longrepr[2]).removeprefix('Skipped: ')})"
            elif report.failed:  # its last line (the whole of ours): the full report comes at the end
                lines = str(report.longrepr or "").strip().splitlines()
                if lines:
                    body += ": " + (lines[-1] if len(lines[-1]) <= 120 else lines[-1][:119] + "…")
        left = self.time_left()
        if left is not None and len(self.finished) < len(self.estimate):
            body = f"{body:<96} ~{clock(left)} left"
        self.reporter.write_line(head + body)
