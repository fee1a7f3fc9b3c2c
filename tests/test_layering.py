"""The import rules of docs/architecture.md, checked in a fresh interpreter each: workloads,
engines and the harness never import pytest (the plugin is the only bridge), and the report
reads saved JSON only (it never imports a workload, the harness or the engine)."""
import json
import pkgutil
import subprocess
import sys

import pytest

import pyconcbench

#: The pytest-free side: everything but the plugin, the gate's plugin and the report.
WORKLOADS = ("pyconcbench.options", "pyconcbench.loopback", "pyconcbench.ab", "pyconcbench.rounds", "pyconcbench.instruments", "pyconcbench.machine",
             "pyconcbench.echo", "pyconcbench.loadgen", "pyconcbench.harness", "pyconcbench.serve",
             "pyconcbench.plain", "pyconcbench.syscalls", "pyconcbench.gate", "pyconcbench.stats",
             "pyconcbench.metrics", "pyconcbench.micro", "pyconcbench.zmq", "pyconcbench.zmq.runner",
             "pyconcbench.cli", "pyconcbench.gobuild", "pyconcbench.broken", "pyconcbench.procs",
             "pyconcbench.worker", "pyconcbench.suite", "pyconcbench.examples", "pyconcbench.examples.echo_server",
             "pyconcbench.conformance", "pyconcbench.explain", "pyconcbench.openloop", "pyconcbench.netsim", "pyconcbench.engines")


def _loaded_after(module: str):
    """The pyconcbench modules and pytest loaded by importing ``module`` alone."""
    code = ("import json, sys, importlib; importlib.import_module(%r); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pyconcbench', 'pytest', "
            "'_pytest')))))" % module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"importing {module} failed: {out.stderr.strip().splitlines()[-1:]}"
    return set(json.loads(out.stdout))


def _servers():
    import pyconcbench.servers as servers

    return ["pyconcbench.servers"] + [f"pyconcbench.servers.{m.name}" for m in pkgutil.iter_modules(servers.__path__)]


@pytest.mark.parametrize("module", WORKLOADS + tuple(_servers()))
def test_workloads_and_engines_never_import_pytest(module):
    loaded = _loaded_after(module)
    assert not {m for m in loaded if m in ("pytest", "_pytest") or m.startswith("_pytest.")}, \
        f"{module} imports pytest"
    assert "pyconcbench.plugin" not in loaded, f"{module} imports the plugin"


REPORT = ("pyconcbench.report", "pyconcbench.report.results", "pyconcbench.report.plots",
          "pyconcbench.report.echo_tables", "pyconcbench.report.switch_tables", "pyconcbench.report.ab_tables",
          "pyconcbench.report.openloop_tables",
          "pyconcbench.cli")
#: What the report may never load: it reads saved JSON (through metrics) on any machine.
NOT_IN_REPORT = ("pyconcbench.micro", "pyconcbench.servers", "pyconcbench.zmq", "pyconcbench.harness",
                 "pyconcbench.loadgen", "pyconcbench.plugin", "pyconcbench._native", "pyconcbench.echo",
                 "pyconcbench.serve", "pyconcbench.procs", "pytest")


@pytest.mark.parametrize("module", REPORT)
def test_the_report_reads_saved_json_only(module):
    loaded = _loaded_after(module)
    bad = sorted(m for m in loaded if m in NOT_IN_REPORT or m.startswith(tuple(n + "." for n in NOT_IN_REPORT)))
    assert bad == [], f"{module} loads {bad}"
    assert "pyconcbench.metrics" in loaded or module == "pyconcbench.report.plots"


def test_the_rule_can_fail():
    # the checker itself sees pytest when a module does import it
    assert "pytest" in _loaded_after("pyconcbench.plugin")


def test_every_module_is_covered():
    """A new top-level module must be placed on one side of the rules (here or in the report's)."""
    known = set(WORKLOADS) | set(REPORT) | {"pyconcbench.plugin", "pyconcbench.gate_plugin", "pyconcbench.fixtures", "pyconcbench.progress",
                              "pyconcbench.servers",
                              "pyconcbench.net", "pyconcbench._native", "pyconcbench.__main__"}
    found = {f"pyconcbench.{m.name}" for m in pkgutil.iter_modules(pyconcbench.__path__)}
    assert found - known == set(), f"modules not placed in tests/test_layering.py: {sorted(found - known)}"
