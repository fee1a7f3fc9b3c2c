"""The gate proved on the real thing: the echo benchmark against a real asyncio_protocol server,
saved as a baseline, run again on unchanged code (no regression), then with the test-only
slowdown knob (servers.SLOWDOWN_ENV: CPU busy-wait per received chunk) and caught.

The threshold here is wider than a CI gate would use (-25 %), so a noisy shared machine does
not make this test flaky, and 7 rounds leave enough clean ones when the host has a slow spell
(noisy rounds are retried, and left out by the gate); tools/gate_trials.py measures the
false-alarm rate and the smallest slowdown caught at the usual -10 %."""
import json
import sys
from pathlib import Path

import pytest

from pyconcbench import servers
from pyconcbench import suite as pcb_suite

ECHO_TEST = (Path(pcb_suite.SUITE_DIR) / "test_echo.py").read_text()
CASE = ["--pcb-impl", "asyncio_protocol", "--pcb-conns", "10", "--pcb-messages", "10000", "--pcb-rounds", "7",
        "-p", "no:cacheprovider"]


@pytest.fixture
def run(pytester):
    pytester.makepyfile(test_echo=ECHO_TEST)
    storage = f"--benchmark-storage=file://{pytester.path / 'store'}"

    def run(*args, slowdown_ns=0):
        """Runs the echo case in pytester's directory (``run.path``)."""
        if slowdown_ns:
            pytester._monkeypatch.setenv(servers.SLOWDOWN_ENV, str(slowdown_ns))
        else:
            pytester._monkeypatch.delenv(servers.SLOWDOWN_ENV, raising=False)
        return pytester.runpytest_subprocess(storage, *CASE, *args)

    run.path = pytester.path
    return run


def test_gate_passes_unchanged_code_and_catches_a_slowed_server(run):
    run("--benchmark-autosave").assert_outcomes(passed=1)

    same = run("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-25%")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["baseline *; fail-on msgs_per_s:-25%; alpha 0.05; 1 *"])

    # 50 us of CPU per message on a server that costs ~30 us per round trip: about 2.5x slower
    slow = run("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-25%", "--benchmark-json", "slow.json",
               slowdown_ns=50000)
    # Measured either way: the server's CPU per round trip (which what else runs on the machine
    # hardly moves) went up by the knob's 50 us, far beyond any noise.
    base = json.loads(next((run.path / "store").rglob("0001_*.json")).read_text())["benchmarks"][0]
    new = json.loads((run.path / "slow.json").read_text())["benchmarks"][0]
    assert new["extra_info"]["test_slowdown_ns"] == 50000
    assert new["extra_info"]["server_cpu_us_per_msg"] > base["extra_info"]["server_cpu_us_per_msg"] + 25
    if "       NOISY  " in slow.stdout.str():
        # Too few clean rounds on one side (another process was busy): the gate refuses to
        # judge, says so and why, and does not pass the change as unchanged.  Not a skip: this
        # is the gate's specified answer on a busy machine (issue 13 makes it judge anyway).
        slow.stdout.fnmatch_lines(["baseline *; fail-on msgs_per_s:-25%; alpha 0.05; 1 noisy",
                                   "       NOISY  test_echo?asyncio_protocol-c10-64B? msgs_per_s - (p=-)"])
        return
    # decided once every test ran (Holm over the run's tests): the item passed, the session fails
    slow.assert_outcomes(passed=1)
    assert slow.ret == 1
    slow.stdout.fnmatch_lines([
        "pyconcbench gate: test_echo?asyncio_protocol-c10-64B?: msgs_per_s regressed * msgs/s -> * msgs/s "
        "(-*%, threshold -25%), one-sided Mann-Whitney U p=* (Holm *) over * vs * rounds",
    ])


AB = ["--pcb-ab-a", sys.executable, "--pcb-ab-b", sys.executable, "--pcb-rounds", "6"]


def test_an_interleaved_ab_run_passes_a_against_itself_and_catches_a_slowed_b(run):
    """A/B in one run: no baseline, no separate runs for the machine to drift between.  A
    against itself (A/A) is not a regression; B with the knob on is, on B/A's interval."""
    same = run(*AB, "--pcb-fail-on", "msgs_per_s:-25%")
    same.assert_outcomes(passed=1)
    assert same.ret == 0
    same.stdout.fnmatch_lines(["*pyconcbench interleaved A/B (echo)*",
                               "asyncio_protocol c10-64B * 6*"])  # pairs: "6", or "6 (2 in spells)"
    slow = run(*AB, "--pcb-ab-b-env", f"{servers.SLOWDOWN_ENV}=50000", "--pcb-fail-on", "msgs_per_s:-25%",
               "--benchmark-json", "ab.json")
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines([
        "pyconcbench gate: test_echo?asyncio_protocol-c10-64B?: msgs_per_s B/A * ?*, *? (* % interval over 6 "
        "interleaved pairs; A * msgs/s, B * msgs/s): the whole interval is beyond the threshold -25%",
    ])
    info = json.loads((run.path / "ab.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["pcb_family"] == "ab" and info["order"] == "ABBAABBAABBA"
    assert info["b"]["environment"]["env"] == {servers.SLOWDOWN_ENV: "50000"}
    # the knob's 50 us of CPU per message shows in B's server CPU per round trip, pair by pair
    assert info["intervals"]["server_cpu_us_per_msg"]["low"] > 1.5


def test_the_knob_is_refused_by_servers_that_do_not_implement_it(run):
    # A knob set for a server that does not implement it is a mistake in the run, not a missing
    # tool: an error in one line, never a skip.
    res = run("--pcb-impl", "selectors", "--benchmark-disable", slowdown_ns=1000)
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines(["server 'selectors' cannot run as asked (exit code 2): pyconcbench.serve: "
                              "PCB_TEST_SLOWDOWN_NS (test-only) is set, but only asyncio_protocol, uvloop_protocol "
                              "implement it, not selectors"])
    assert "Traceback" not in res.stdout.str()
