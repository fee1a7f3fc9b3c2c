"""The --pcb-fail-on gate inside a pytest run, through pytester: benchmarks whose per-round
figures the test controls (FAKE_SCALE), so every verdict is known in advance."""
import json

import pytest

FAKE = """
import os

import pytest

RATES = (1.0, 1.01, 0.99, 1.005, 0.995)


def _bench(benchmark, base):
    scale = float(os.environ.get("FAKE_SCALE", "1"))
    rates = [base * scale * f for f in RATES]
    benchmark.pedantic(lambda: None, rounds=5, iterations=1)
    benchmark.extra_info.update(msgs_per_s=sum(rates) / 5, rounds=[{"msgs_per_s": r} for r in rates])


def test_plain(benchmark):
    _bench(benchmark, 100000.0)


@pytest.mark.pcb_fail_on("msgs_per_s:-50%")
def test_lenient(benchmark):
    if os.environ.get("FAKE_SKIP"):
        pytest.skip("lenient cannot run here")
    _bench(benchmark, 50000.0)
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_fake=FAKE)
    storage = f"--benchmark-storage=file://{pytester.path / 'store'}"

    def run(*args, scale="1", **env):
        pytester._monkeypatch.setenv("FAKE_SCALE", scale)
        pytester._monkeypatch.delenv("FAKE_SKIP", raising=False)
        if "CI" not in env and "--pcb-strict" not in args:
            pytester._monkeypatch.delenv("CI", raising=False)  # lax unless the test says otherwise
        for k, v in env.items():
            pytester._monkeypatch.setenv(k, v)
        return pytester.runpytest_subprocess(storage, "-p", "no:cacheprovider", *args)

    return run


def test_same_code_passes_and_a_slowdown_fails_its_item_with_one_line(suite, pytester):
    """Without the family-wise correction, each benchmark is judged as its test finishes."""
    suite("--benchmark-autosave").assert_outcomes(passed=2)
    same = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", "--pcb-fail-correction", "none")
    same.assert_outcomes(passed=2)
    same.stdout.fnmatch_lines(["*pyconcbench regression gate*", "baseline *0001_*; fail-on msgs_per_s:-10%; alpha 0.05; 2 unchanged",
                               "*each of the 2 tests on its own (no family-wise correction)"])

    md = pytester.path / "summary.md"
    slow = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", f"--pcb-gate-markdown={md}",
                 "--pcb-fail-correction", "none", scale="0.7")
    slow.assert_outcomes(passed=1, failed=1)  # test_lenient's marker allows -50 %
    assert slow.ret == 1
    slow.stdout.fnmatch_lines([
        "pyconcbench gate: test_plain: msgs_per_s regressed 100,000 msgs/s -> 70,000 msgs/s (-30.0%, threshold -10%), "
        "one-sided Mann-Whitney U p=0.00397 over 5 vs 5 rounds",
        "*REGRESSION  test_plain msgs_per_s -30.0% (p=0.00397)",
        "FAILED test_fake.py::test_plain*",  # pytest 9 adds " - pyconcbench gate: ..."
    ])
    assert "Traceback" not in slow.stdout.str()
    text = md.read_text()
    assert "**1 regression**" in text and "| `test_lenient` | msgs_per_s | -50% |" in text


def test_with_the_correction_a_regression_fails_the_session_once_every_test_ran(suite, pytester):
    """Holm (the default) needs every p-value of the run: the items pass, the session fails,
    one line per regression; with 2 tests Holm doubles the smallest p (0.00397 -> 0.00794)."""
    suite("--benchmark-autosave").assert_outcomes(passed=2)
    same = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%")
    same.assert_outcomes(passed=2)
    assert same.ret == 0
    slow = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", scale="0.7")
    slow.assert_outcomes(passed=2)
    assert slow.ret == 1
    slow.stdout.fnmatch_lines([
        "*after Holm's correction over the run's 2 tests",
        "*REGRESSION  test_plain msgs_per_s -30.0% (p=0.00397, corrected 0.00794)",
        "pyconcbench gate: test_plain: msgs_per_s regressed 100,000 msgs/s -> 70,000 msgs/s (-30.0%, threshold -10%), "
        "one-sided Mann-Whitney U p=0.00397 (Holm 0.00794) over 5 vs 5 rounds",
    ])
    bh = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", "--pcb-fail-correction", "bh", scale="0.7")
    assert bh.ret == 1
    bh.stdout.fnmatch_lines(["*after Benjamini-Hochberg's correction over the run's 2 tests"])


def test_the_marker_travels_in_the_saved_results(suite, pytester):
    suite("--benchmark-autosave").assert_outcomes(passed=2)
    (saved,) = (pytester.path / "store").rglob("*.json")
    data = json.loads(saved.read_text())
    lenient = next(b for b in data["benchmarks"] if b["name"] == "test_lenient")
    assert lenient["extra_info"]["pcb_fail_on"] == "msgs_per_s:-50%"


def test_no_saved_baseline_is_a_clear_message_not_a_crash(suite):
    res = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["pyconcbench gate: no baseline: --benchmark-compare found no saved run in *store*, "
                              "so nothing was gated (save one first: --benchmark-autosave)"])


@pytest.mark.parametrize("args, message", [
    (("--pcb-fail-on", "msgs_per_s:-10%"),
     "ERROR: --pcb-fail-on: the gate needs a baseline: add --benchmark-compare (the newest saved run) or --benchmark-compare=NUM"),
    (("--pcb-fail-on", "msgs_per_s:-10%", "--benchmark-compare", "--benchmark-disable"),
     "ERROR: --pcb-fail-on: the gate compares measured rounds, but benchmarks are disabled or skipped in this "
     "run (--benchmark-disable, --benchmark-skip, or pytest-xdist's -n)"),
    (("--pcb-fail-on", "msgs_per_s:-10%", "--benchmark-compare", "--benchmark-skip"),
     "ERROR: --pcb-fail-on: the gate compares measured rounds, but benchmarks are disabled or skipped*"),
    (("--pcb-fail-on", "msgs_per_s:+10%", "--benchmark-compare"),
     "ERROR: --pcb-fail-on: 'msgs_per_s:+10%': msgs_per_s is better higher, so its regression is a drop: write msgs_per_s:-10%"),
    (("--pcb-fail-alpha", "2", "--benchmark-compare"),
     "ERROR: --pcb-fail-alpha: the significance level must be between 0 and 1, got '2'"),
])
def test_usage_errors(suite, args, message):
    res = suite(*args)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([message])


def test_environment_and_bad_marker(suite, pytester):
    res = suite("--benchmark-compare", PCB_FAIL_ON="latency_p99:-5%")
    res.stderr.fnmatch_lines(["ERROR: PCB_FAIL_ON (environment): 'latency_p99:-5%': latency_p99 is better lower*"])
    pytester._monkeypatch.delenv("PCB_FAIL_ON")
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.pcb_fail_on("msgs_per_s")
        def test_x(benchmark):
            benchmark(lambda: None)
    """)
    res = pytester.runpytest_subprocess("test_bad.py", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: test_bad.py::test_x: pcb_fail_on marker: 'msgs_per_s': expected ?SCOPE@?METRIC:THRESHOLD*"])


def test_a_baseline_from_another_machine_is_refused_unless_allowed(suite, pytester):
    suite("--benchmark-autosave").assert_outcomes(passed=2)
    (saved,) = (pytester.path / "store").rglob("*.json")
    data = json.loads(saved.read_text())
    data["machine_info"]["pyconcbench"]["kernel"] = "1.0.0-elsewhere"
    saved.write_text(json.dumps(data))
    res = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: --pcb-fail-on: the baseline *0001_* was measured on a different machine or "
                              "Python (kernel: 1.0.0-elsewhere -> *): its numbers are not comparable; pass "
                              "--pcb-allow-machine-change yes to gate anyway"])
    res = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", "--pcb-allow-machine-change", "yes")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["Machine facts differ (compared anyway): kernel: 1.0.0-elsewhere -> *"])


def test_a_glob_baseline_pools_several_saved_runs(suite):
    suite("--benchmark-save=main").assert_outcomes(passed=2)
    suite("--benchmark-save=main", scale="0.95").assert_outcomes(passed=2)
    suite("--benchmark-save=other", scale="0.5").assert_outcomes(passed=2)
    res = suite("--benchmark-compare=*_main", "--pcb-fail-on", "msgs_per_s:-10%", "--pcb-fail-correction", "none",
                scale="0.7")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines([
        "pyconcbench gate: test_plain: msgs_per_s regressed * -> 70,000 msgs/s (-*%, threshold -10%), "
        "one-sided Mann-Whitney U p=* over 10 vs 5 rounds; worse than all 2 baseline runs",
        "baseline 2 runs (*0001_main.json .. *0002_main.json); *",
    ])


def test_pytest_benchmarks_own_compare_fail_still_works(pytester):
    pytester.makepyfile(test_sleepy="""
        import os
        import time

        def test_sleepy(benchmark):
            delay = 0.004 * float(os.environ.get("FAKE_SCALE", "1"))
            benchmark.pedantic(time.sleep, args=(delay,), rounds=5, iterations=1)
    """)
    storage = f"--benchmark-storage=file://{pytester.path / 'store'}"
    pytester.runpytest_subprocess(storage, "--benchmark-autosave", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester._monkeypatch.setenv("FAKE_SCALE", "3")
    res = pytester.runpytest_subprocess(storage, "--benchmark-compare", "--benchmark-compare-fail=median:10%",
                                        "-p", "no:cacheprovider")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*Performance has regressed*"])


MISSING = "test_fake.py::test_lenient (skipped: lenient cannot run here)"


def test_a_baseline_benchmark_missing_from_the_run_is_listed_and_fails_a_strict_run(suite):
    """As `pyconcbench compare` does: a benchmark of the baseline that the run did not measure
    (skipped here) fails a strict run, one line naming it and why; a lax run lists it."""
    suite("--benchmark-autosave").assert_outcomes(passed=2)
    gate = ("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%")
    lax = suite(*gate, "--pcb-strict", "no", FAKE_SKIP="1")
    lax.assert_outcomes(passed=1, skipped=1)
    assert lax.ret == 0
    lax.stdout.fnmatch_lines([f"not in this run (1 benchmark(s) of the baseline; a strict run fails on them): {MISSING}"])
    strict = suite(*gate, "--pcb-strict", "yes", FAKE_SKIP="1")
    strict.assert_outcomes(passed=1, skipped=1)
    assert strict.ret == 1
    strict.stdout.fnmatch_lines([f"pyconcbench gate: 1 benchmark(s) of the baseline missing from this run (strict: "
                                 f"--pcb-strict no accepts that): {MISSING}"])
    assert suite(*gate, FAKE_SKIP="1", CI="true").ret == 1  # strict by default under CI
    deselected = suite(*gate, "--pcb-strict", "yes", "-k", "plain")
    assert deselected.ret == 1
    deselected.stdout.fnmatch_lines(["pyconcbench gate: 1 benchmark(s) of the baseline missing from this run *: "
                                     "test_fake.py::test_lenient (not selected in this run)"])
    whole = suite(*gate, "--pcb-strict", "yes")
    whole.assert_outcomes(passed=2)
    assert whole.ret == 0 and "of the baseline" not in whole.stdout.str()


def test_a_marker_added_by_the_change_under_test_cannot_loosen_its_gate(suite, pytester):
    """The test's marker is part of the code under test: the marker saved with the baseline
    holds (as in `pyconcbench compare`); the test's own may tighten it, never switch it off or
    widen it."""
    suite("--benchmark-autosave").assert_outcomes(passed=2)  # test_lenient saved with -50 %
    pytester.makepyfile(test_fake=FAKE.replace('pcb_fail_on("msgs_per_s:-50%")', 'pcb_fail_on("msgs_per_s:-5%")')
                        .replace("def test_plain(", '@pytest.mark.pcb_fail_on("msgs_per_s:off")\ndef test_plain('))
    slow = suite("--benchmark-compare", "--pcb-fail-on", "msgs_per_s:-10%", "--pcb-fail-correction", "none",
                 scale="0.7")
    slow.assert_outcomes(failed=2)
    out = slow.stdout.str()
    assert "test_plain: msgs_per_s regressed" in out and "threshold -10%" in out   # 'off' not applied
    assert "test_lenient: msgs_per_s regressed" in out and "threshold -5%" in out  # tighter than -50 %: applied
