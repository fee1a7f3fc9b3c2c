"""pyconcbench's pytest plugin (the ``pytest11`` entry point): hooks and fixtures only.

It turns the option table (``pyconcbench.options``) into ``--pcb-*`` options and settings,
parametrizes the benchmark tests from the workloads' cases (echo_case, ceiling_connections,
zmq_case, switch_case), registers the fixtures that run them (``pyconcbench.fixtures``), saves
the machine facts and prints the tables at the end, so the suite's files (``pyconcbench/suite``) only state and assert.  The regression gate's plugin is
``pyconcbench.gate_plugin``, registered here when ``--pcb-fail-on`` is given.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest

from . import echo, fixtures, gate_plugin, machine, micro, netsim, openloop, options, procs, progress, rounds
from . import zmq as pcbzmq
from .fixtures import (AB_KEY, CALL_FAILED_KEY, CEILING_KEY, OPENLOOP_KEY, RESULTS_KEY, SETTINGS_KEY,
                       SWITCH_KEY)
from .options import Settings
from .report.ab_tables import families as ab_families, table_lines as ab_table
from .report.echo_tables import ceiling_table, echo_table, explain_table, syscall_table, workers_table
from .report.openloop_tables import table as openloop_table
from .report.switch_tables import table as switch_table



# ---- options and settings ----------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pyconcbench", "pyconcbench (echo benchmarks)")
    for name, (_, default, help_text, metavar) in options.OPTIONS.items():
        dest = "pcb_" + name.replace("-", "_")
        group.addoption(f"--pcb-{name}", dest=dest, metavar=metavar, default=None,
                        help=f"{help_text}; env {options.env_name(name)}, ini {dest}. Default: {default!r}")
        parser.addini(dest, help="pyconcbench: " + help_text.replace("%%", "%"), default=None)


def _raw_setting(config: pytest.Config, name: str) -> Tuple[Optional[str], str]:
    """An option's text and where it came from: command line, environment, ini, default."""
    dest = "pcb_" + name.replace("-", "_")
    value = config.getoption(dest, default=None)
    if value is not None:
        return str(value), f"--pcb-{name}"
    raw, source = options.from_environment(name)
    if raw is not None:
        return raw, source
    ini = config.getini(dest)
    if ini:
        return str(ini), f"{dest} (ini)"
    return None, "default"


def resolve_settings(config: pytest.Config) -> Settings:
    try:
        return options.resolve(lambda name: _raw_setting(config, name))
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pcb_fail_on(expr): this test's own regression-gate thresholds, e.g. "
                   "pcb_fail_on('latency_p99:+50%'); wins over --pcb-fail-on")
    if config.option.help:
        return
    settings = config.stash[SETTINGS_KEY] = resolve_settings(config)
    config.stash[RESULTS_KEY] = []
    config.stash[CEILING_KEY] = []
    config.stash[SWITCH_KEY] = []
    config.stash[AB_KEY] = []
    config.stash[OPENLOOP_KEY] = []
    config.pluginmanager.register(fixtures, "pyconcbench-fixtures")
    config.pluginmanager.register(gate_plugin, "pyconcbench-gate-markers")  # the pcb_fail_on marker's hooks
    if settings.fail_on:
        config.pluginmanager.register(gate_plugin.GatePlugin(config, settings), gate_plugin.GatePlugin.NAME)
    if settings.require:
        config.pluginmanager.register(RequirePlugin(settings), RequirePlugin.NAME)
    procs.sweep_stale_tmpdirs()  # left behind by a run that was killed (SIGKILL) before its clean-up
    if any(not n.local for n in settings.networks):
        netsim.sweep_stale()  # the same for network namespaces (--pcb-network netns...)
    rounds.BUDGET.reset()  # the session's noise budget starts now
    if (config.option.verbose >= 0 and not config.option.collectonly
            and not config.getoption("benchmark_disable", False)):
        config.pluginmanager.register(progress.Progress(config), progress.Progress.NAME)


def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-benchmark's own table of round times stays off unless asked for (--pcb-benchmark-table
    yes, its --benchmark-verbose or --benchmark-cprofile): its OPS column is rounds per second."""
    config = session.config
    settings = config.stash.get(SETTINGS_KEY, None)
    bs = getattr(config, "_benchmarksession", None)
    if settings is None or bs is None or settings.benchmark_table:
        return
    if not getattr(bs, "verbose", False) and not getattr(bs, "cprofile_sort_by", None):
        bs.quiet = True  # the table and the cProfile listing only; its log messages stay


def pytest_report_header(config: pytest.Config) -> List[str]:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return []
    rounds_ = settings.rounds or "the profile's"
    lines = [f"pyconcbench: profile {settings.profile}, {rounds_} rounds, {settings.pinning_note}"]
    lines.append("pyconcbench: loops and libraries: " + machine.libraries_line())
    if settings.strict:
        lines.append(f"pyconcbench: strict ({fixtures.strict_reason(settings)}): an implementation that cannot "
                     "run here fails instead of skipping")
    if settings.require:
        lines.append(f"pyconcbench: required: {', '.join(settings.require)}")
    if settings.ab is not None:
        lines += [f"pyconcbench A/B: {env.label}" for env in settings.ab.values()]
    return lines


# ---- parametrization -----------------------------------------------------------------------

def _bench_param(case: Any, group: str) -> Any:
    """Every family's rounds are measured by pyconcbench.rounds and handed to pytest-benchmark
    through ROUND_CLOCK (rounds.replay)."""
    marks = pytest.mark.benchmark(group=group, timer=rounds.ROUND_CLOCK)
    return pytest.param(case, id=case if isinstance(case, str) else case.id, marks=marks)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """echo_case: the run's echo cases; ceiling_connections: the ceiling's counts; zmq_case:
    the profile's ZeroMQ cases; switch_case: the switch microbenchmarks whose kind is the test
    function's name without ``test_`` (test_switch, test_create, test_handoff, test_depth)."""
    names = metafunc.fixturenames
    settings = metafunc.config.stash[SETTINGS_KEY]
    if "openloop_case" in names:
        # the open loop runs on the echo fixtures' server: each case names its echo case too
        metafunc.parametrize(("openloop_case", "echo_case"), [
            pytest.param(c, c.echo, id=c.id, marks=pytest.mark.benchmark(group=c.group, timer=rounds.ROUND_CLOCK))
            for c in openloop.openloop_cases(settings)])
    elif "echo_case" in names:
        metafunc.parametrize("echo_case", [_bench_param(c, c.group) for c in echo.echo_cases(settings)])
    if "ceiling_connections" in names:
        metafunc.parametrize("ceiling_connections", [
            pytest.param(c, id=f"c{c}-64B", marks=pytest.mark.benchmark(group=echo.ceiling_group(c),
                                                                        timer=rounds.ROUND_CLOCK))
            for c in echo.CEILING_COUNTS])
    if "zmq_case" in names:
        metafunc.parametrize("zmq_case", [_bench_param(c, c.group) for c in pcbzmq.cases(settings.profile)])
    if "switch_case" in names:
        kind = metafunc.function.__name__[len("test_"):]
        found = [c for c in micro.cases() if c.test == kind]
        if not found:
            raise pytest.UsageError(f"{metafunc.function.__name__}: no switch microbenchmark of kind {kind!r}")
        metafunc.parametrize("switch_case", [_bench_param(c, c.group) for c in found])


# ---- required implementations ------------------------------------------------------------------

def item_impls(item: pytest.Item) -> Tuple[str, ...]:
    """The names --pcb-require matches for a benchmark test: an echo case's server (not its
    plain reference counterpart), a ZeroMQ case's mode, a switch case's id and family."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    out: List[str] = []
    case = params.get("echo_case")
    if case is not None and not case.plain:
        out.append(case.impl)
    if "openloop_case" in params:
        out.append("openloop")
    case = params.get("zmq_case")
    if case is not None:
        out.append(case.mode)
    case = params.get("switch_case")
    if case is not None:
        out += [case.id, case.family]
    return tuple(out)


class RequirePlugin:
    """Registered when --pcb-require is given: a required implementation with no test selected
    in the run, or with a test that skipped, fails the session with one line."""

    NAME = "pyconcbench-require"

    def __init__(self, settings: Settings) -> None:
        self.required = settings.require
        self.source = settings.sources.get("require", "--pcb-require")
        self.items: Dict[str, List[str]] = {name: [] for name in self.required}
        self.skipped: Dict[str, str] = {}  # nodeid -> the skip's reason
        self.failures: List[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:  # what is left after -k, -m and deselection
            for name in item_impls(item):
                if name in self.items:
                    self.items[name].append(item.nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and report.nodeid not in self.skipped:
            self.skipped[report.nodeid] = gate_plugin.skip_reason(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.config.option.collectonly:
            return
        for name in self.required:
            nodeids = self.items[name]
            skipped = [n for n in nodeids if n in self.skipped]
            if not nodeids:
                self.failures.append(f"pyconcbench: {self.source}: {name} was not measured: no test of it "
                                     "was selected in this run")
            elif skipped:
                self.failures.append(f"pyconcbench: {self.source}: {name} was not measured: {skipped[0]} "
                                     f"skipped ({self.skipped[skipped[0]]})"
                                     + (f", and {len(skipped) - 1} more of its tests" if len(skipped) > 1 else ""))
        if self.failures and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.failures:
            terminalreporter.write_sep("-", "pyconcbench required implementations")
            for line in self.failures:
                terminalreporter.write_line(line)


# ---- reports -----------------------------------------------------------------------------------

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED_KEY] = True
    return report


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: Dict[str, Any]) -> None:
    machine_info["pyconcbench"] = machine.machine_facts()
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is not None:
        machine_info["pyconcbench"]["settings"] = {
            "profile": settings.profile, "rounds": settings.rounds or "by profile and scale",
            "cpus": list(settings.cpus) if settings.cpus else None,
            "pinning": settings.pinning_note, "noise_retries": settings.noise_retries,
            "workers": list(settings.workers), "server_cpus": list(settings.server_cpus) or None,
            "networks": [n.spec for n in settings.networks] or ["local"],
        }
        if settings.ab is not None:
            machine_info["pyconcbench"]["ab"] = {s: env.as_dict() for s, env in settings.ab.items()}


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = config.stash.get(RESULTS_KEY, None)
    ceiling = config.stash.get(CEILING_KEY, None)
    if rows or ceiling:
        terminalreporter.write_sep("-", "pyconcbench echo results")
        for line in (echo_table(rows or []) + workers_table(rows or []) + explain_table(rows or [])
                     + syscall_table(rows or [])
                     + ceiling_table(ceiling or [])):
            terminalreporter.write_line(line)
    open_rows = config.stash.get(OPENLOOP_KEY, None)
    if open_rows:
        terminalreporter.write_sep("-", "pyconcbench open loop (latency at a fixed offered rate)")
        for line in openloop_table(open_rows):
            terminalreporter.write_line(line)
    ab_rows = config.stash.get(AB_KEY, None)
    if ab_rows:
        terminalreporter.write_sep("-", f"pyconcbench interleaved A/B ({', '.join(ab_families(ab_rows))})")
        for line in ab_table(ab_rows):
            terminalreporter.write_line(line)
    switch = config.stash.get(SWITCH_KEY, None)
    if switch:
        terminalreporter.write_sep("-", "pyconcbench switch microbenchmarks")
        for line in switch_table(switch):
            terminalreporter.write_line(line)
