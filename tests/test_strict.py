"""--pcb-strict and --pcb-require, through pytester: an implementation that cannot run here is
a skip in a lax run and a one-line failure in a strict one (every family: echo servers and
peers, ZeroMQ, switch); strict is on by default when CI is set; a required implementation that
was not selected, or skipped, fails the session in one line.

Every run here names its strictness (``--pcb-strict``) or sets/clears CI itself, so the file
passes whether or not the suite runs with CI set."""
import pathlib

import pytest
from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)

#: node_net's peer needs `node` on PATH: without it the server exits 3, "not available here".
NO_NODE = "import os\nos.environ['PATH'] = '/nonexistent-pcb-path'\n"
#: pyzmq_single made to need a package that is not installed.
NO_ZMQ_PACKAGE = ("import dataclasses\nimport pyconcbench.zmq as z\n"
                  "z.MODES['pyzmq_single'] = dataclasses.replace(z.MODES['pyzmq_single'], "
                  "requires=('pcb_no_such_package',))\n")
#: gevent reported as not installed to the switch microbenchmarks' check.
NO_GEVENT = ("import importlib.util\n_real = importlib.util.find_spec\n"
             "importlib.util.find_spec = lambda name, *a: None if name == 'gevent' else _real(name, *a)\n")
NODE_LINE = "pyconcbench.serve: implementation 'node_net' needs 'node' on PATH (not found)"


@pytest.fixture
def run(pytester, monkeypatch):
    """run(*args, ci=None, **env): pytest in a subprocess with CI unset (or set to ``ci``),
    PCB_STRICT and PCB_REQUIRE unset unless given in ``env``."""
    def go(*args, ci=None, **env):
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        for name in ("PCB_STRICT", "PCB_REQUIRE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-ra", "--benchmark-disable", *args)
    return go


@pytest.fixture
def echo_without_node(pytester):
    pytester.makeconftest(NO_NODE)
    pytester.makepyfile(test_echo="""
        def test_echo(echo_case, echo_server):
            pass
    """)
    return ["--pcb-impl", "node_net", "--pcb-conns", "10"]


def test_help_documents_strict_and_require(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--pcb-strict=yes|no*"])
    result.stdout.fnmatch_lines(["*--pcb-require=IMPLS*"])
    text = " ".join(result.stdout.str().split())
    assert "(default: yes when the environment variable CI is set, no otherwise)" in text
    assert "fails with its one line instead of skipping" in text


def test_a_missing_echo_server_is_a_skip_in_a_lax_run(run, echo_without_node):
    result = run(*echo_without_node, "--pcb-strict", "no")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED * {NODE_LINE}"])
    assert result.ret == 0


def test_a_missing_echo_server_fails_a_strict_run_with_its_one_line(run, echo_without_node):
    result = run(*echo_without_node, "--pcb-strict", "yes")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_echo[[]node_net-c10-64B] _*",
        f"{NODE_LINE} [[]not skipped: strict run, --pcb-strict; --pcb-strict no allows the skip]",
        "=*"], consecutive=True)
    assert result.ret == 1
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("ci, args, strict", [
    ("true", (), True), ("1", (), True), ("true", ("--pcb-strict", "no"), False),
    ("", (), False), ("false", (), False), ("0", (), False),
])
def test_strict_by_default_when_ci_is_set(run, echo_without_node, ci, args, strict):
    result = run(*echo_without_node, *args, ci=ci)
    if strict:
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines([f"pyconcbench: strict (CI is set (CI={ci!r})): an implementation that "
                                     "cannot run here fails instead of skipping",
                                     f"{NODE_LINE} [[]not skipped: strict run, CI is set (CI={ci!r})*"])
    else:
        result.assert_outcomes(skipped=1)


def test_strict_from_the_environment_variable_names_it(run, echo_without_node):
    result = run(*echo_without_node, PCB_STRICT="yes")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"{NODE_LINE} [[]not skipped: strict run, PCB_STRICT (environment)*"])
    result = run(*echo_without_node, ci="true", PCB_STRICT="no")  # the variable wins over CI
    result.assert_outcomes(skipped=1)


def test_strict_applies_to_zeromq_and_switch(run, pytester):
    pytester.makeconftest(NO_ZMQ_PACKAGE + NO_GEVENT)
    pytester.makepyfile(test_zmq=(BENCH_DIR / "test_zmq.py").read_text(),
                        test_switch=(BENCH_DIR / "test_switch.py").read_text())
    select = ("-k", "pyzmq_single-200B-if1] or python-gevent_sleep0")
    lax = run(*select, "--pcb-strict", "no")
    lax.assert_outcomes(skipped=2)
    strict = run(*select, "--pcb-strict", "yes")
    strict.assert_outcomes(failed=2)
    strict.stdout.fnmatch_lines([
        "*pyzmq_single needs pcb_no_such_package (pip install pcb_no_such_package*): not installed "
        "[[]not skipped: strict run, --pcb-strict; --pcb-strict no allows the skip]"])
    strict.stdout.fnmatch_lines([
        "python-gevent_sleep0 needs gevent (not installed); install pyconcbench[[]gevent] "
        "[[]not skipped: strict run, --pcb-strict; --pcb-strict no allows the skip]"])
    assert "Traceback" not in strict.stdout.str()


# ---- --pcb-require ---------------------------------------------------------------------------

@pytest.fixture
def echo_ids(pytester):
    """A test parametrized over the echo cases that starts nothing."""
    pytester.makepyfile(test_ids="""
        def test_echo(echo_case):
            pass
    """)


def test_a_required_implementation_not_selected_fails_the_session(run, echo_ids):
    result = run("--pcb-impl", "selectors", "--pcb-conns", "10", "--pcb-require", "selectors,go_net",
                 "--pcb-strict", "no")
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["pyconcbench: --pcb-require: go_net was not measured: no test of it was "
                                 "selected in this run"])
    assert "selectors was not measured" not in result.stdout.str()


def test_required_implementations_all_measured_pass(run, echo_ids):
    result = run("--pcb-impl", "selectors,native_epoll", "--pcb-conns", "10",
                 "--pcb-require", "selectors,native_epoll", "--pcb-strict", "no")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["pyconcbench: required: selectors, native_epoll"])


def test_a_required_implementation_that_skipped_fails_the_session(run, echo_without_node):
    result = run(*echo_without_node, "--pcb-require", "node_net", "--pcb-strict", "no")
    result.assert_outcomes(skipped=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"pyconcbench: --pcb-require: node_net was not measured: "
                                 f"test_echo.py::test_echo[[]node_net-c10-64B] skipped ({NODE_LINE})"])


def test_require_from_the_environment_names_its_source(run, echo_ids):
    result = run("--pcb-impl", "selectors", "--pcb-conns", "10", "--pcb-strict", "no", PCB_REQUIRE="go-goroutine")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["pyconcbench: PCB_REQUIRE (environment): go-goroutine was not measured: "
                                 "no test of it was selected in this run"])


def test_an_unknown_required_name_is_a_usage_error(run, echo_ids):
    result = run("--collect-only", "--pcb-require", "selectors,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --pcb-require: unknown implementation 'nope' (an echo server, a ZeroMQ "
                                 "mode, a switch microbenchmark or family*"])
    assert "Traceback" not in result.stderr.str()


def test_collect_only_does_not_fail_on_requirements(run, echo_ids):
    result = run("--collect-only", "-q", "--pcb-impl", "selectors", "--pcb-require", "go_net")
    assert result.ret == 0
