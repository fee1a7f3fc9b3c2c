"""The pytest plugin, through pytester: options, ids and groups, a real small benchmark run
saved to JSON and compared against."""
import json
import statistics
import pathlib

import pytest
from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_echo=(BENCH_DIR / "test_echo.py").read_text())
    return pytester


def test_help_lists_every_option(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines([
        "pyconcbench (echo benchmarks):",
        "*--pcb-profile=NAME*",
        "*--pcb-impl=IDS*",
        "*--pcb-conns=COUNTS*",
        "*--pcb-size=SIZES*",
        "*--pcb-transport=LIST*",
        "*--pcb-messages=N*",
        "*--pcb-duration=SECONDS*",
        "*--pcb-rounds=N*",
        "*--pcb-cpus=A,B*",
        "*--pcb-noise-retries=N*",
        "*--pcb-stall-timeout=SECONDS*",
    ])
    assert result.ret == 0


@pytest.mark.parametrize("args, env, message", [
    (["--pcb-conns", "10,x"], {}, "--pcb-conns: 'x' is not a connection count (e.g. 10, 1k, max)"),
    (["--pcb-size", "64,3Q"], {}, "--pcb-size: '3Q' is not a size*"),
    ([], {"PCB_SIZE": "2MiB"}, "PCB_SIZE (environment): '2MiB' is outside 1 B .. 1 MiB"),
    (["--pcb-impl", "nope"], {}, "--pcb-impl: unknown implementation 'nope'; known: native_epoll*"),
    (["--pcb-profile", "huge"], {}, "--pcb-profile: 'huge' is not a profile (quick, full)"),
    (["--pcb-cpus", "0,0"], {}, "--pcb-cpus: server and load generator on the same CPU 0*"),
    (["--pcb-cpus", "0,999"], {}, "--pcb-cpus: CPU 999 is not available to this process*"),
    (["--pcb-rounds", "0"], {}, "--pcb-rounds: '0' is not a whole number >= 1"),
    (["--pcb-duration", "-1"], {}, "--pcb-duration: '-1' must be > 0 seconds"),
    (["--pcb-messages", "10", "--pcb-duration", "1"], {}, "*exclude each other*"),
    (["--pcb-conns", "100000"], {}, "--pcb-conns: 100000 connections do not fit: one server process holds at most * sockets here*"),
    (["--pcb-transport", "udp"], {}, "--pcb-transport: 'udp' is not a transport (tcp, unix)"),
    (["--pcb-malloc", "default"], {}, "--pcb-malloc: 'default' is gone: the default state is now 'representative'*"),
    (["--pcb-reference", "some"], {}, "--pcb-reference: 'some' is not one of auto, all, none"),
])
def test_bad_settings_are_usage_errors(suite, monkeypatch, args, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = suite.runpytest_subprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: " + message])
    assert "Traceback" not in result.stderr.str()


def collected_ids(result):
    return [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]


def test_ids_and_profile_matrix(suite):
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "native_epoll,selectors")
    assert collected_ids(result) == [
        "test_echo[native_epoll-c10-64B]", "test_echo[selectors-c10-64B]",
        # the plain reference server right after its counterpart, at 100 connections over TCP
        "test_echo[native_epoll-c100-64B]", "test_echo[selectors-c100-64B]", "test_echo[plain_selectors-c100-64B]",
        "test_echo[native_epoll-c1000-64B]", "test_echo[selectors-c1000-64B]",
        "test_echo[native_epoll-c100-64B-unix]", "test_echo[selectors-c100-64B-unix]",
    ]


def test_allocator_variants_and_references_in_the_matrix(suite):
    """The profile's pristine variant of asyncio_protocol and both states of its plain server run
    right after it; --pcb-reference none and an explicit --pcb-malloc leave them out."""
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "asyncio_protocol",
                                        "--pcb-conns", "100")
    assert collected_ids(result) == [
        "test_echo[asyncio_protocol-c100-64B]", "test_echo[asyncio_protocol-c100-64B-malloc_pristine]",
        "test_echo[plain_asyncio_protocol-c100-64B]", "test_echo[plain_asyncio_protocol-c100-64B-malloc_pristine]",
    ]
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "asyncio_protocol",
                                        "--pcb-conns", "100", "--pcb-reference", "none", "--pcb-malloc", "tuned")
    assert collected_ids(result) == ["test_echo[asyncio_protocol-c100-64B-malloc_tuned]"]
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "selectors,native_epoll",
                                        "--pcb-conns", "10", "--pcb-reference", "all")
    assert collected_ids(result) == [
        "test_echo[selectors-c10-64B]", "test_echo[plain_selectors-c10-64B]", "test_echo[native_epoll-c10-64B]"]


def test_dimensions_not_given_are_64B_over_tcp(suite):
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "selectors",
                                        "--pcb-profile", "full", "--pcb-conns", "10k")
    assert collected_ids(result) == ["test_echo[selectors-c10000-64B]"]
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "selectors",
                                        "--pcb-size", "1KiB")
    assert collected_ids(result) == ["test_echo[selectors-c10-1KiB]", "test_echo[selectors-c100-1KiB]",
                                     "test_echo[selectors-c1000-1KiB]"]


def test_explicit_dimensions_make_a_product(suite):
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-impl", "selectors",
                                        "--pcb-conns", "1k", "--pcb-size", "1KiB,100",
                                        "--pcb-transport", "unix")
    # in the order given
    assert collected_ids(result) == ["test_echo[selectors-c1000-1KiB-unix]",
                                     "test_echo[selectors-c1000-100B-unix]"]


def test_command_line_beats_environment_beats_ini(suite, monkeypatch):
    suite.makeini("[pytest]\npcb_impl = selectors\npcb_conns = 7\n")
    result = suite.runpytest_subprocess("--collect-only", "-q")
    assert collected_ids(result) == ["test_echo[selectors-c7-64B]"]
    monkeypatch.setenv("PCB_CONNS", "8")
    result = suite.runpytest_subprocess("--collect-only", "-q")
    assert collected_ids(result) == ["test_echo[selectors-c8-64B]"]
    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-conns", "9")
    assert collected_ids(result) == ["test_echo[selectors-c9-64B]"]


def test_full_profile_reaches_the_fd_limit(suite):
    from pyconcbench import loadgen

    result = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-profile", "full",
                                        "--pcb-impl", "native_epoll")
    ids = collected_ids(result)
    top = loadgen.max_connections()
    assert f"test_echo[native_epoll-c{top}-64B]" in ids
    assert "test_echo[native_epoll-c10-100KiB]" in ids
    assert "test_echo[native_epoll-c100-64B-unix]" in ids


def test_small_benchmark_run_saves_and_compares(suite):
    args = ["-p", "no:cacheprovider", "--pcb-impl", "native_epoll,selectors", "--pcb-conns", "10",
            "--pcb-messages", "300", "--pcb-rounds", "2", "--benchmark-autosave",
            "--benchmark-storage", "file://./store"]
    first = suite.runpytest_subprocess(*args, "--benchmark-json", "out.json")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines([
        "[[]1/2] echo native_epoll c10 64B * msgs/s*",
        "*pyconcbench echo results*",
        "echo 10 connections x 64B over tcp",
        "implementation*msgs/s*x native*",
    ])
    data = json.loads((suite.path / "out.json").read_text())
    facts = data["machine_info"]["pyconcbench"]
    assert facts["fd_limit"]["hard"] > 0 and facts["kernel"]
    assert facts["settings"]["rounds"] == 2
    by_name = {b["name"]: b for b in data["benchmarks"]}
    bench = by_name["test_echo[native_epoll-c10-64B]"]
    assert bench["group"] == "echo-c10-64B"
    assert bench["stats"]["rounds"] == 2
    extra = bench["extra_info"]
    rounds = extra["rounds"]
    assert (extra["pcb_family"], extra["pcb_schema"]) == ("echo", 1)  # the result schema's stamp
    assert extra["errors"] == {}
    assert [r["completed"] for r in rounds] == [300, 300]
    # Values, not just keys: each figure follows from the saved rounds or is plausible for a
    # server that did the work (a /proc read that failed must not show up as a 0.0 here).
    assert extra["msgs_per_s"] == pytest.approx(600 / sum(r["elapsed"] for r in rounds), rel=1e-3)
    # pytest-benchmark's timer covers the accepted load phase and nothing of the probes around
    # it: at least the engine's own phase time, at most a scheduler slice or so more.
    engine_median = statistics.median(r["elapsed"] for r in rounds)
    assert engine_median <= bench["stats"]["median"] <= engine_median + 0.025
    assert 0 < extra["latency_p50_us"] <= extra["latency_p99_us"] <= extra["latency_p99_9_us"] <= extra["latency_max_us"]
    assert 0 < extra["fairness_jain"] <= 1
    assert extra["connect_rate"] > 0 and 0 < extra["loadgen_cpu_share"] < 1.5
    assert isinstance(extra["loadgen_bound"], bool)
    assert extra["server_cpu_us_per_msg"] > 0 and all(r["server_cpu"] > 0 for r in rounds)
    assert extra["server_cpu_us_per_msg"] == pytest.approx(
        sum(r["server_cpu"] for r in rounds) / 600 * 1e6, rel=0.01, abs=0.01)
    assert extra["server_user_share"] is None or 0 <= extra["server_user_share"] <= 1
    assert extra["other_cpu_check"] == "ran" and all(r["other_cpu_share"] is not None for r in rounds)
    assert extra["server_rss_peak_kib"] > 1000  # a Python or C process, not a defaulted 0
    if facts["settings"]["cpus"]:
        assert extra["probe_baseline_ns"] > 0

    second = suite.runpytest_subprocess(*args, "--pcb-benchmark-table", "yes", "--benchmark-compare")
    second.assert_outcomes(passed=2)
    second.stderr.fnmatch_lines(["*Comparing against benchmarks from*0001_*"])
    # rows are sorted by time, so either may come first
    second.stdout.fnmatch_lines(["*test_echo[[]native_epoll-c10-64B[]] (0001_*"])
    second.stdout.fnmatch_lines(["*test_echo[[]native_epoll-c10-64B[]] (NOW)*"])



def test_a_server_that_dies_mid_load_is_one_clear_failure(pytester):
    pytester.makepyfile(test_die="""
        import os, signal, threading

        def test_echo(echo_case, echo_server, echo_bench):
            threading.Timer(0.5, os.kill, (echo_server.pid, signal.SIGKILL)).start()
            echo_bench()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pcb-impl", "selectors",
                                           "--pcb-conns", "10", "--pcb-messages", "100000000",
                                           "--pcb-stall-timeout", "5", "--benchmark-disable")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*selectors-c10-64B: the server died during the load (load *): server 'selectors' (pid *) exited with code -9*",
    ])
    assert "Traceback" not in result.stdout.str()
    assert "During handling" not in result.stdout.str()
    assert "errors" not in result.parseoutcomes()  # no second report from the teardown


def test_pytest_timeout_interrupts_a_stalled_load(pytester):
    pytester.makepyfile(brokenservers=(pathlib.Path(__file__).parent / "brokenservers.py").read_text())
    pytester.makepyfile(test_hang="""
        import time
        from brokenservers import BrokenServer
        from pyconcbench import loadgen

        def test_hang():
            with BrokenServer("stop_reading") as server:
                host, port = server.address
                loadgen.run(loadgen.LoadSpec(host=host, port=port, connections=2, warmup_messages=0,
                                             stall_timeout=120, deadline=120))
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Failed: Timeout (>1.0s) from pytest-timeout*"])
    assert result.duration < 30


def test_a_run_removes_the_temporary_directories_a_killed_run_left_behind(pytester, monkeypatch, tmp_path):
    """pyconcbench's temporary directories carry their maker's pid (procs.make_tmpdir): the next
    run removes those whose maker is gone (a pytest killed before its clean-up), and only those."""
    import os
    import subprocess
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, timeout=60).stdout.strip()
    stale = [tmp / f"pcb-zmq-{dead}-ab12cd", tmp / f"pcb-sock-{dead}-x_y"]
    for path in stale:
        path.mkdir()
        (path / "left.sock").write_text("")
    alive = tmp / f"pcb-sock-{os.getpid()}-mine"
    alive.mkdir()
    old = time.time() - 3600  # left behind an hour ago
    for path in stale + [alive]:
        os.utime(path, (old, old))
    monkeypatch.setenv("TMPDIR", str(tmp))
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not any(path.exists() for path in stale)
    assert alive.exists()


def test_a_run_past_one_process_on_both_sides(suite):
    """Several load engines (--pcb-engines) against a server of several workers (--pcb-workers):
    every connection served and verified, the figures merged over the engines, the engines'
    CPU the load generator's (not another process's: the rounds are not all noisy for it)."""
    args = ["-p", "no:cacheprovider", "--pcb-impl", "native_epoll,asyncio_protocol", "--pcb-conns", "600",
            "--pcb-messages", "6000", "--pcb-rounds", "2", "--pcb-engines", "3", "--pcb-workers", "2",
            "--pcb-explain", "no", "--benchmark-json", "out.json"]
    result = suite.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2)
    data = json.loads((suite.path / "out.json").read_text())
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        assert info["load_engines"] == 3 and info["workers"] == 2 and info["connections"] == 600
        assert all(r["completed"] == 6000 for r in info["rounds"])
        assert info["fairness_min"] >= 1 and not info["errors"]
        # (counted as others', the engines' CPU made every try noisy; another job on the machine may
        # still make one so)
        tries = info["rounds"] + info["rejected_rounds"]
        assert sum("other processes" in (r["noisy"] or "") for r in tries) < len(tries), tries


def test_what_cannot_hold_60000_connections_says_why_in_one_line(suite):
    # nothing is started: a thread per connection needs more tasks than the kernel numbers, a
    # peer runs as one process, one worker holds about 20,000 sockets here
    from pyconcbench import fixtures, loadgen
    if not 0 < fixtures._pid_max() < 60000 + fixtures.PID_MARGIN or loadgen.max_connections() * 3 >= 60000:
        pytest.skip("this machine's kernel.pid_max or fd limit would let the 60,000-connection cases run")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--pcb-impl", "threads,go_net,native_epoll",
                                        "--pcb-conns", "60k", "--pcb-workers", "1,4", "--pcb-explain", "no",
                                        "--benchmark-disable", "-rs", "-k", "threads or go_net or w1 or not w4")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines_random([
        "*threads-c60000-64B: 60000 connections do not fit in 1 server process (one holds at most * sockets "
        "here): needs --pcb-workers 4 or more*",
        "*threads-c60000-64B-w4: a thread per connection needs 60000 threads, and this kernel numbers at most "
        "* tasks in all (kernel.pid_max)*",
        "*go_net-c60000-64B: 60000 connections do not fit in 1 server process (*): it runs as one process only*",
        "*native_epoll-c60000-64B: 60000 connections do not fit in 1 server process (*): needs --pcb-workers 4*",
    ])
