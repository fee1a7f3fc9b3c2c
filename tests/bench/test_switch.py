"""Context-switch microbenchmarks: Python switch costs beside native C and Go baselines.

The cases are ``pyconcbench.micro.cases()``; each test runs one through
``benchmark.pedantic(rounds=R, iterations=1)``.  A round times N operations inside the
workload and subtracts an empty loop of the same length; the median ns/op, the per-round
samples, what one op is, the pinning and the study's figure go into ``extra_info``.
pytest-benchmark's own round time is the wall time of the whole round.

    test_switch[python-generator_next]   groups switch-python, switch-native, switch-go
    test_create[native-fork_waitpid]     group create
    test_handoff[python-condition-2cpu]  group handoff
    test_depth[yield_from-d8]            group depth-sweep: each also carries the slope
                                         (ns per extra level) and intercept fitted over
                                         every depth measured so far

``pytest tests/bench -k switch`` runs them all; a table is printed at the end.  Cases whose
module (greenlet, gevent, uvloop) or toolchain (go) is missing are skipped with the reason;
Go baselines that do not build (``go`` on PATH) fail, in one line.
"""
from typing import Any, Dict, List

import pytest

from pyconcbench import micro
from pyconcbench.micro.summary import depth_fits, table

SUMMARY_PLUGIN = "pyconcbench-switch-summary"


def _params(test: str):
    return [pytest.param(c, id=c.id, marks=pytest.mark.benchmark(group=c.group))
            for c in micro.cases() if c.test == test]


class SwitchSummary:
    """Registered once per session by the ``switch_rows`` fixture: prints the table of every
    switch microbenchmark that ran, at the end of the terminal report."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self.depth_infos: Dict[str, List[Dict[str, Any]]] = {}

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        terminalreporter.write_sep("-", "pyconcbench switch microbenchmarks")
        for line in table(self.rows):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def switch_rows(pytestconfig) -> SwitchSummary:
    plugin = pytestconfig.pluginmanager.get_plugin(SUMMARY_PLUGIN)
    if plugin is None:
        plugin = SwitchSummary()
        pytestconfig.pluginmanager.register(plugin, SUMMARY_PLUGIN)
    return plugin


@pytest.fixture(scope="module", autouse=True)
def libuv_reserve_fds():
    """libuv opens a pipe (its signal lock) at the first loop a process creates and never
    closes it: create one before the per-test fd leak check looks."""
    try:
        import uvloop
    except ImportError:
        yield
        return
    loop = uvloop.new_event_loop()
    loop.close()
    yield


def _run(case: micro.Case, benchmark, pcb_settings, summary: SwitchSummary) -> Dict[str, Any]:
    runner = micro.Runner(case, pcb_settings.cpus)
    skipped = failure = None
    try:
        runner.check_available()
    except micro.Unavailable as exc:  # not installed, not on PATH, one CPU
        skipped = str(exc)
    except micro.Broken as exc:  # our own code (the Go baselines) does not build
        failure = f"{case.id}: {exc}"
    if skipped is not None:
        pytest.skip(skipped)
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # one line, no chained traceback
    try:
        extra = runner.run(benchmark.pedantic)
    except (micro.WorkloadError, OSError, RuntimeError) as exc:
        failure = f"{case.id}: {type(exc).__name__}: {exc}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # one line, no chained traceback
    # pytest-benchmark keeps a reference to this very dict: mutate it, never rebind it.
    benchmark.extra_info.update(extra)
    summary.rows.append(benchmark.extra_info)
    assert extra["rounds"] >= 1
    assert all(s["ops"] >= 1 and s["elapsed_ns"] > 0 for s in extra["samples"])
    return benchmark.extra_info


@pytest.mark.parametrize("case", _params("switch"))
def test_switch(case, benchmark, pcb_settings, switch_rows):
    _run(case, benchmark, pcb_settings, switch_rows)


@pytest.mark.parametrize("case", _params("create"))
def test_create(case, benchmark, pcb_settings, switch_rows):
    _run(case, benchmark, pcb_settings, switch_rows)


@pytest.mark.parametrize("case", _params("handoff"))
def test_handoff(case, benchmark, pcb_settings, switch_rows):
    _run(case, benchmark, pcb_settings, switch_rows)


@pytest.mark.parametrize("case", _params("depth"))
def test_depth(case, benchmark, pcb_settings, switch_rows):
    info = _run(case, benchmark, pcb_settings, switch_rows)
    kind = case.name.rsplit("-d", 1)[0]
    infos = switch_rows.depth_infos.setdefault(kind, [])
    infos.append(info)
    fit = depth_fits(infos).get(kind)
    if fit is None:
        return
    slope, intercept, r2, depths = fit
    # Every depth test of this kind carries the fit over all depths measured so far, so the
    # last one to run completes it in each of them.
    for d in infos:
        d.update(fit_slope_ns_per_level=round(slope, 3), fit_intercept_ns=round(intercept, 3),
                 fit_r2=round(r2, 4), fit_depths=depths)
