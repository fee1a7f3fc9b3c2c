"""Live progress (pyconcbench.progress): one line per finished benchmark with done/total and the
time left, a header with the whole run's estimate, quiet under -q; pytest-benchmark's own table
off unless asked for; the seconds each benchmark took saved for the next run's estimate."""
import json
import pathlib

import pytest

from pyconcbench import progress
from pyconcbench import suite as pcb_suite

ECHO = (pathlib.Path(pcb_suite.SUITE_DIR) / "test_echo.py").read_text()
ARGS = ("--pcb-impl", "native_epoll", "--pcb-conns", "10", "--pcb-rounds", "1", "--pcb-messages", "2000",
        "--pcb-reference", "none", "-p", "no:cacheprovider")


@pytest.fixture
def echo(pytester):
    pytester.makepyfile(test_echo=ECHO)
    return pytester


def test_a_run_prints_a_line_per_benchmark_and_saves_its_seconds(echo):
    result = echo.runpytest_subprocess(*ARGS, "--benchmark-autosave", "--pcb-conns", "10,100")
    assert result.ret == 0
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "pyconcbench: 2 benchmarks, about 0:0* (a rough guess: a saved run here makes it better)",
        "[[]1/2] echo native_epoll c10 64B * msgs/s  p99 * us*~0:0* left",
        "[[]2/2] echo native_epoll c100 64B * msgs/s  p99 * us*",
    ])
    assert "Name (time in" not in out  # pytest-benchmark's own table is off
    assert "test_echo.py ." not in out  # no dots: the lines are the progress
    saved = json.loads(next(echo.path.glob(".benchmarks/*/*.json")).read_text())
    seconds = [b["extra_info"]["case_seconds"] for b in saved["benchmarks"]]
    assert len(seconds) == 2 and all(0 < s < 120 for s in seconds)
    # the next run estimates from the saved one
    again = echo.runpytest_subprocess(*ARGS)
    again.stdout.fnmatch_lines(["pyconcbench: 1 benchmarks, about 0:0* (1 of them as long as in the newest "
                                "saved runs here)"])


def test_quiet_runs_print_no_progress_and_the_table_comes_back_when_asked(echo):
    quiet = echo.runpytest_subprocess(*ARGS, "-q")
    assert quiet.ret == 0 and "[1/1]" not in quiet.stdout.str() and "benchmarks, about" not in quiet.stdout.str()
    table = echo.runpytest_subprocess(*ARGS, "--pcb-benchmark-table", "yes")
    assert table.ret == 0
    table.stdout.fnmatch_lines(["[[]1/1] echo native_epoll c10 64B *", "*Name (time in *"])


def test_a_failed_benchmark_says_so_on_its_line(echo):
    result = echo.runpytest_subprocess(*ARGS[:1], "nosuch_pcb_mod:serve", *ARGS[2:])
    assert result.ret == 1
    result.stdout.fnmatch_lines(["[[]1/1] echo nosuch_pcb_mod:serve-c10-64B: ERROR in setup: server "
                                 "'nosuch_pcb_mod:serve' cannot run as asked (exit code 2): *"])


def test_a_test_run_of_the_suite_keeps_pytests_dots(echo):
    result = echo.runpytest_subprocess(*ARGS, "--benchmark-disable")
    assert result.ret == 0 and "[1/1]" not in result.stdout.str()


def test_time_left_scales_the_estimates_by_how_the_finished_ones_went():
    p = progress.Progress.__new__(progress.Progress)
    p.estimate = {"a": 1.0, "b": 2.0, "c": 3.0}
    p.seconds = {"a": 2.0}
    p.finished = []
    assert p.time_left() is None
    p.finished = ["a"]
    p.info = {"a": {}}
    # the first took twice its estimate: the scale moves towards 2 as more seconds have run
    prior = progress.PRIOR_SECONDS
    assert p.time_left() == pytest.approx((2 + 3) * (2.0 + prior) / (1.0 + prior))
    p.estimate, p.seconds, p.finished = {"a": 100.0, "b": 50.0}, {"a": 200.0}, ["a"]
    p.info = {"a": {}}
    assert p.time_left() == pytest.approx(50 * (200 + prior) / (100 + prior))


def test_clock_and_saved_seconds(tmp_path):
    assert [progress.clock(s) for s in (0, 59.6, 61, 3725)] == ["0:00", "1:00", "1:01", "1:02:05"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "0001.json").write_text(json.dumps({"benchmarks": [
        {"fullname": "tests/bench/test_echo.py::test_echo[x]", "extra_info": {"case_seconds": 2.5}},
        {"fullname": "test_echo.py::test_echo[y]", "extra_info": {"case_seconds": "2"}},
        {"fullname": "test_echo.py::test_echo[z]", "extra_info": {"case_seconds": float("nan")}},
        "garbage"]}))
    (tmp_path / "m" / "0002.json").write_text("{not json")
    assert progress.saved_seconds(f"file://{tmp_path}") == {"test_echo.py::test_echo[x]": 2.5}
    assert progress.saved_seconds(str(tmp_path / "none")) == {}


def test_skips_do_not_scale_the_time_left_down():
    p = progress.Progress.__new__(progress.Progress)
    p.estimate = {"a": 10.0, "s1": 10.0, "s2": 10.0, "b": 10.0}
    p.seconds = {"a": 10.0, "s1": 0.01, "s2": 0.01}
    p.finished = ["a", "s1", "s2"]
    p.info = {"a": {}}  # the skips never reached their call
    assert p.time_left() == pytest.approx(10.0)
