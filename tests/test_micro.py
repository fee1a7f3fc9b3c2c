"""pyconcbench.micro: the catalogue, the native loops (not optimised away, every case counted
by the other side, bounded, interruptible, leaving no thread or child behind), the Python
workloads, the Go driver, the Runner (pinning restored, skips with reasons, extra_info), the
least-squares fit, fork from a small helper process (smallproc: bounded, never orphaned, one-line
failures, its size recorded), and the benchmark module through pytester."""
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyconcbench import _native, gobuild, micro
from pyconcbench.rounds import ROUND_CLOCK as round_clock
from pyconcbench.micro import (Case, Runner, Sample, Unavailable, fit_line, golang, native,
                               smallproc, workloads)
from pyconcbench.report.switch_tables import depth_fits, spread_between, table
from pyconcbench import suite as pcb_suite

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = sorted(os.sched_getaffinity(0))
CPU_A = ALLOWED[0]
CPU_B = ALLOWED[-1]


def _tasks():
    """The ids of this process's threads (a thread of an earlier test may end meanwhile, so
    callers check that no new one is left, not that the count is equal)."""
    return set(os.listdir("/proc/self/task"))


@pytest.fixture(scope="module", autouse=True)
def libuv_reserve_fds():
    """libuv keeps a pipe open from its first loop on: open it before the leak check looks."""
    try:
        import uvloop
    except ImportError:
        yield
        return
    uvloop.new_event_loop().close()
    yield


# ---- the catalogue --------------------------------------------------------------------------

def test_catalogue_ids_groups_and_targets():
    cases = micro.cases()
    keys = [(c.test, c.id) for c in cases]
    assert len(keys) == len(set(keys))
    assert {c.group for c in cases} == {"switch-python", "switch-native", "switch-go", "create",
                                         "handoff", "depth-sweep"}
    ids = {c.id for c in cases}
    for expected in ("python-generator_next", "native-swapcontext", "yield_from-d8", "await-d32",
                     "native-futex-1cpu", "native-futex-2cpu", "python-condition-2cpu",
                     "native-sched_yield-t1024", "go-gosched-g16384", "go-chan_pingpong"):
        assert expected in ids
    native_targets = set(native.cases())
    for c in cases:
        assert re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)*", c.id), c.id
        assert c.loops % c.step == 0 and c.warm_loops() % c.step == 0
        if c.family == "python":
            assert callable(getattr(workloads, c.target))
        elif c.family == "native":
            assert c.target in native_targets
    assert sorted(c.depth for c in cases if c.name.startswith("yield_from")) == list(micro.DEPTHS)
    assert sorted(c.depth for c in cases if c.name.startswith("await")) == list(micro.DEPTHS)
    threads = [c.kwargs["threads"] for c in cases if c.name.startswith("sched_yield")]
    assert threads[0] == 1 and threads[-1] == 1024 and all(t in threads for t in (2, 4, 512))


def test_k_switch_selects_every_case(pytester):
    """`pyconcbench run -k switch` selects every case (through the module's name), with
    the readable ids."""
    pytester.makepyfile(test_switch=(Path(pcb_suite.SUITE_DIR) / "test_switch.py").read_text())
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-k", "switch",
                                           "-p", "no:cacheprovider")
    collected = [line for line in result.outlines if line.startswith("test_switch.py::")]
    assert len(collected) == len(micro.cases())
    for line in ("test_switch.py::test_switch[python-generator_next]",
                 "test_switch.py::test_switch[native-swapcontext]",
                 "test_switch.py::test_handoff[native-futex-2cpu]",
                 "test_switch.py::test_create[go-goroutine]",
                 "test_switch.py::test_depth[yield_from-d8]"):
        assert line in collected


def test_fit_line_exact():
    slope, intercept, r2 = fit_line([1, 2, 4, 8], [12.0, 14.0, 18.0, 26.0])
    assert slope == pytest.approx(2.0)
    assert intercept == pytest.approx(10.0)
    assert r2 == pytest.approx(1.0)
    with pytest.raises(ValueError):
        fit_line([1], [1.0])
    with pytest.raises(ValueError):
        fit_line([2, 2], [1.0, 3.0])


def test_sample_subtracts_the_empty_loop():
    s = Sample(elapsed_ns=1_000, empty_ns=200, ops=40, check=40)
    assert s.ns_per_op == pytest.approx(20.0)
    assert s.as_dict() == {"ns_per_op": 20.0, "elapsed_ns": 1000, "empty_ns": 200, "ops": 40,
                           "check": 40}


def test_summary_table_and_fits():
    rows = [{"micro": f"yield_from-d{d}", "case": f"yield_from-d{d}", "group": "depth-sweep",
             "depth": d, "ns_per_op": 10.0 + 5.0 * d, "spread_pct": 1.0, "pinning": "p"}
            for d in (1, 2, 4)]
    rows.append({"micro": "native-call", "case": "call", "group": "switch-native", "ns_per_op": 1.2,
                 "spread_pct": 0.5, "study_ns": 2.34, "ratio_to_study": 0.51, "pinning": "p"})
    fits = depth_fits(rows)
    assert fits["yield_from"][0] == pytest.approx(5.0)
    assert fits["yield_from"][1] == pytest.approx(10.0)
    text = "\n".join(table(rows))
    assert text.index("switch-native") < text.index("depth-sweep")
    assert "slope    5.00 ns/level" in text and "2.34" in text and "0.51" in text
    assert spread_between({"a": 100.0, "b": 1.0}, {"a": 102.0}) == {"a": pytest.approx(1.9802, 1e-3)}


# ---- native: not optimised away ------------------------------------------------------------

def _best(case, n, **kw):
    """The fastest of five runs: (net ns, result) — the least disturbed by other load."""
    runs = [native.run(case, n, cpu_a=CPU_A, cpu_b=CPU_A, **kw) for _ in range(5)]
    best = min(runs, key=lambda d: d["elapsed_ns"] - d["empty_ns"])
    return best["elapsed_ns"] - best["empty_ns"], best


@pytest.mark.parametrize("case,n", [("call", 10_000_000), ("setjmp_longjmp", 250_000),
                                    ("swapcontext", 20_000), ("coroutine", 10_000_000)])
def test_native_loop_runs_every_iteration(case, n):
    """The callee / the coroutine counts each call or resume: the count equals the loop
    count, and the time grows with it (8x the work takes 3x..24x the time, wide enough for a
    shared machine; a folded loop would take the same time), so the loop is neither folded
    nor hoisted by the compiler."""
    small, r1 = _best(case, n)
    large, r8 = _best(case, 8 * n)
    assert r1["check"] == n and r1["ops"] == n
    assert r8["check"] == 8 * n and r8["ops"] == 8 * n
    assert small > 0 and large > 0
    assert 3.0 <= large / small <= 24.0, (small, large)
    # A call or a switch costs at least a few cycles: never 0.1 ns.
    assert large / (8 * n) > 0.1


def test_native_call_is_a_real_call_in_the_disassembly():
    """The call loop holds a `call` of micro_callee (no inlining), and the empty loop does
    not: the difference between the two loops is the call."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump not found (binutils)")
    so = _native.__file__

    def disassemble(symbol):
        out = subprocess.run([objdump, "-d", "--no-show-raw-insn", f"--disassemble={symbol}", so],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        text = out.stdout.decode()
        if f"<{symbol}>:" not in text:
            pytest.skip(f"{symbol} not in the symbol table of {so} (stripped build?)")
        return text

    loop = disassemble("micro_call_loop")
    assert re.search(r"\bcall\s+[0-9a-f]+ <micro_callee(\.[a-z0-9.]+)?>", loop), loop
    empty = disassemble("micro_empty_loop")
    assert "micro_callee" not in empty


def test_native_syscall_is_made_every_time():
    ns, r = _best("syscall_getpid", 20_000)
    assert r["check"] == 20_000  # every getpid returned this pid
    # A lower bound: a loaded machine only makes it slower, so noise cannot fail it; a getpid
    # answered from a cache (1-2 ns) would.
    assert ns / 20_000 > 20  # a kernel entry costs tens of ns at least


# ---- native: every case, small ---------------------------------------------------------------

SMALL = {"call": 1000, "syscall_getpid": 1000, "setjmp_longjmp": 1000, "swapcontext": 1000,
         "coroutine": 1000, "mutex_uncontended": 1000, "mutex_contended": 1000, "sched_yield": 400,
         "usleep0": 20, "pthread_create_join": 20, "fork_waitpid": 5, "futex_handoff": 200,
         "pipe_threads": 200, "pipe_processes": 200}


def test_small_table_covers_every_native_case():
    assert set(SMALL) == set(native.cases())


NATIVE_INFO = native.cases()


@pytest.mark.parametrize("case,cpu_b", [(c, "same") for c in sorted(SMALL)]
                         + [(c, "other") for c in sorted(SMALL) if NATIVE_INFO[c]["two_party"]])
def test_native_case_counts_every_op(case, cpu_b):
    info = NATIVE_INFO[case]
    threads = 4 if info["threaded"] else 1
    tasks = _tasks()
    d = native.run(case, SMALL[case], threads=threads, cpu_a=CPU_A,
                   cpu_b=CPU_B if cpu_b == "other" else CPU_A)
    assert d["elapsed_ns"] > 0 and d["empty_ns"] >= 0
    round_trips = case in ("futex_handoff", "pipe_threads", "pipe_processes")
    if round_trips:
        assert d["ops"] == 2 * SMALL[case] and d["check"] == SMALL[case]
    else:
        assert d["ops"] >= SMALL[case] - threads and d["check"] == d["ops"]
    assert not _tasks() - tasks  # every thread it started joined (children: the conftest leak check)


def test_native_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="unknown native case 'nope'"):
        native.run("nope", 1)
    with pytest.raises(ValueError, match="n: must be"):
        native.run("call", 0)
    with pytest.raises(ValueError, match="n: must be"):
        native.run("call", -1)
    with pytest.raises(ValueError, match="threads"):
        native.run("call", 10, threads=2)
    with pytest.raises(ValueError, match="threads"):
        native.run("sched_yield", 10, threads=5000)
    with pytest.raises(ValueError, match="not a CPU"):
        native.run("call", 10, cpu_a=max(ALLOWED) + 1)
    with pytest.raises(ValueError, match="timeout"):
        native.run("call", 10, timeout=0.0)


@pytest.mark.parametrize("case", ["futex_handoff", "pipe_threads", "pipe_processes",
                                  "sched_yield", "mutex_contended", "call"])
def test_native_run_is_bounded_by_its_timeout(case):
    """A run that would take minutes stops at its timeout with TimeoutError, its threads
    joined and its child reaped (the conftest checks children and fds)."""
    tasks = _tasks()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not finished within 0.3 s"):
        native.run(case, 4_000_000_000 if case == "call" else 200_000_000,
                   threads=2 if case == "sched_yield" else 1, cpu_a=CPU_A, cpu_b=CPU_B,
                   timeout=0.3)
    assert time.monotonic() - t0 < 15.0  # stopped by itself: the run alone would take minutes
    assert not _tasks() - tasks


def test_native_run_is_interruptible():
    """A signal handler's exception stops a long run within about 100 ms."""

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Stop):
            native.run("futex_handoff", 200_000_000, cpu_a=CPU_A, cpu_b=CPU_A, timeout=60)
        assert time.monotonic() - t0 < 30.0  # the signal ended it, not the 60 s timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- Python workloads ------------------------------------------------------------------------

def test_yield_from_and_await_chains_are_as_deep_as_asked():
    for d in (1, 4, 32):
        top = workloads.yield_from_chain(d)  # held: dropping it would close the chain
        next(top)
        g, levels = top, 0
        while g.gi_yieldfrom is not None:
            g, levels = g.gi_yieldfrom, levels + 1
        assert levels == d and g.gi_code.co_name == "_leaf"
        top = workloads.await_chain(d)
        top.send(None)
        c, levels = top, 0
        while getattr(c, "cr_await", None) is not None:
            c, levels = c.cr_await, levels + 1
        assert levels == d and c.gi_code.co_name == "__await__"  # d coroutines, then the leaf


PY_SMALL = [case for case in micro.cases() if case.family == "python" and not case.helper]


@pytest.mark.parametrize("case", PY_SMALL, ids=[f"{c.test}-{c.id}" for c in PY_SMALL])
def test_python_workload_runs(case):
    for need in case.needs:
        pytest.importorskip(need)
    kwargs = case.kwargs
    if kwargs.pop("peer", False):
        kwargs["peer_cpu"] = CPU_B if case.cpus == 2 else CPU_A
    loops = case.step * max(1, 200 // case.step) if case.loops >= 200 else 3
    tasks = threading.active_count()
    elapsed = getattr(workloads, case.target)(loops, **kwargs)
    assert isinstance(elapsed, int) and elapsed > 0
    assert threading.active_count() == tasks


def test_two_threads_reports_a_peer_that_times_out(monkeypatch):
    monkeypatch.setattr(workloads, "TIMEOUT", 0.05)
    with pytest.raises(workloads.WorkloadError, match="peer thread timed out"):
        workloads._two_threads(5, None, "fake", lambda: False, lambda: True)
    with pytest.raises(workloads.WorkloadError, match="did not answer"):
        workloads._two_threads(5, None, "fake", lambda: True, lambda: False)


def test_call_soon_needs_whole_batches():
    with pytest.raises(ValueError, match="multiple of 100"):
        workloads.asyncio_call_soon(150)


# ---- Go ---------------------------------------------------------------------------------------

def _go_or_skip():
    broken = None
    try:
        return golang.build()
    except golang.GoUnavailable as exc:  # 'go' not on PATH: the one skip reason
        pytest.skip(str(exc))
    except micro.Broken as exc:  # switch.go does not build: a failure
        broken = str(exc)
    pytest.fail(broken, pytrace=False)  # outside the except: no chained traceback


@pytest.mark.parametrize("case,n,g", [("goroutine", 2000, 1), ("chan_pingpong", 2000, 1),
                                      ("mutex_handoff", 2000, 1), ("gosched", 2000, 16)])
def test_go_cases_count_every_op(case, n, g):
    _go_or_skip()
    d = golang.run(case, n, goroutines=g, cpu=CPU_A)
    assert d["gomaxprocs"] == 1 and d["elapsed_ns"] > 0
    if case in ("chan_pingpong", "mutex_handoff"):
        assert d["ops"] == 2 * n and d["check"] == n
    else:
        assert d["check"] == d["ops"] == n


def test_go_program_rejects_bad_arguments():
    _go_or_skip()
    with pytest.raises(RuntimeError, match="unknown case"):
        golang.run("nope", 10)


def test_go_missing_is_a_skip_reason(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    case = micro.find("go-chan_pingpong")
    with pytest.raises(Unavailable, match="need 'go' on PATH"):
        Runner(case).check_available()


#: Where the Go builds are cached (read before pytester gives a test a HOME of its own).
GO_CACHE_HOME = os.path.dirname(gobuild.cache_root())


def _broken_switch_go(directory):
    """A copy of switch.go in ``directory`` with a call to an undefined function planted as
    main()'s first statement; (its path, the planted line's number)."""
    lines = Path(golang.SOURCE).read_text().splitlines(keepends=True)
    at = lines.index("func main() {\n") + 1
    lines.insert(at, "\tpcbPlantedBug()\n")
    path = directory / "switch.go"
    path.write_text("".join(lines))
    return path, at + 1


def test_go_baselines_that_do_not_compile_fail_not_skip(tmp_path, monkeypatch):
    """go on PATH and switch.go does not compile: Broken (a failure, one line), never
    Unavailable -- from the Runner's check, from golang.run, and from the tests' own helper."""
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    source, line = _broken_switch_go(tmp_path)
    monkeypatch.setattr(golang, "SOURCE", str(source))
    with pytest.raises(Exception) as info:
        Runner(micro.find("go-chan_pingpong")).check_available()
    assert not isinstance(info.value, Unavailable)
    assert isinstance(info.value, micro.Broken)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot build the Go baselines: go build exited with code 1: "
                              "# command-line-arguments; ")
    assert message.endswith("switch.go:%d:2: undefined: pcbPlantedBug" % line)
    with pytest.raises(micro.Broken, match="^" + re.escape(message) + "$"):
        golang.run("chan_pingpong", 10)
    with pytest.raises(pytest.fail.Exception, match="^" + re.escape(message) + "$"):
        _go_or_skip()


def test_go_baselines_that_do_not_compile_fail_the_benchmark(pytester, tmp_path):
    """Through the benchmark module: one failure in one line (before: a skip)."""
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    source, line = _broken_switch_go(tmp_path)
    pytester.makepyfile(test_switch=(Path(pcb_suite.SUITE_DIR) / "test_switch.py").read_text())
    pytester.makeconftest(  # pytester's HOME is new: keep the usual (warm) Go build cache
        "import os\nos.environ['XDG_CACHE_HOME'] = %r\n"
        "from pyconcbench.micro import golang\ngolang.SOURCE = %r\n" % (GO_CACHE_HOME, str(source)))
    result = pytester.runpytest_subprocess("-k", "go-chan_pingpong", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([  # the failure's whole report: one line
        "*_ test_handoff[[]go-chan_pingpong] _*",
        "go-chan_pingpong: cannot build the Go baselines: go build exited with code 1: "
        "# command-line-arguments; *switch.go:%d:2: undefined: pcbPlantedBug" % line,
        "=*"], consecutive=True)


def test_a_module_installed_but_not_importing_is_a_stated_skip(tmp_path, monkeypatch):
    """A third-party release that does not import on this Python stays a skip, saying so."""
    (tmp_path / "pcb_broken_dep.py").write_text("raise AttributeError('module asyncio has no attribute coroutine')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = Case("switch", "python", "fake", "call", "op", 10, needs=("pcb_broken_dep",))
    with pytest.raises(Unavailable, match=r"^python-fake: pcb_broken_dep does not import on Python "
                                          r"3\.\d+\.\d+: AttributeError: module asyncio has no "
                                          r"attribute coroutine$"):
        Runner(fake).check_available()


# ---- the Runner --------------------------------------------------------------------------------

def test_runner_skips_with_reasons():
    fake = Case("switch", "python", "fake", "call", "op", 10, needs=("no_such_module_pcb",))
    with pytest.raises(Unavailable, match="needs no_such_module_pcb"):
        Runner(fake).check_available()
    two = micro.find("native-futex-2cpu")
    with pytest.raises(Unavailable, match="needs 2 CPUs"):
        Runner(two, cpus=[CPU_A]).check_available()


def test_runner_pins_restores_and_reports(monkeypatch):
    case = Case("switch", "python", "generator_next", "generator_next", "op", 20_000, rounds=3)
    before = os.sched_getaffinity(0)
    seen = []
    real = workloads.generator_next

    def spy(loops):
        seen.append(os.sched_getaffinity(0))
        return real(loops)

    monkeypatch.setattr(workloads, "generator_next", spy)
    monkeypatch.setattr(micro, "NOISY_WAIT_SHARE", 2.0)  # no retries on a busy machine
    timed = []

    def pedantic(fn, rounds, iterations, warmup_rounds):  # pytest-benchmark's, its timer ROUND_CLOCK
        assert iterations == 1 and warmup_rounds == 0
        for _ in range(rounds):
            started = round_clock()
            fn()
            timed.append(round_clock() - started)

    extra = Runner(case, cpus=[CPU_B, CPU_A]).run(pedantic)
    assert os.sched_getaffinity(0) == before
    assert len(seen) == 4 and all(s == {CPU_B} for s in seen)  # warm-up + 3 rounds, pinned
    assert len(timed) == 3
    assert extra["rounds"] == 3 and len(extra["samples"]) == 3
    assert extra["group"] == "switch-python" and extra["cpus"] == [CPU_B]
    assert extra["ops_per_round"] == 20_000
    assert extra["ns_per_op_min"] <= extra["ns_per_op"] <= extra["ns_per_op_max"]
    assert extra["study_ns"] == 25.1 and extra["ratio_to_study"] > 0
    json.dumps(extra)


def test_runner_measures_a_noisy_round_again(monkeypatch):
    """A solo round whose thread waited for its CPU is measured again; after NOISE_RETRIES
    noisy tries the last one is kept and counted."""
    case = micro.find("python-generator_next")
    runner = Runner(case)
    waits = iter([50, 0] + [50] * (micro.NOISE_RETRIES + 1))  # % of the round spent waiting

    def fake_measure(loops):
        return Sample(1000, 100, 10, waited_ns=10 * next(waits))

    monkeypatch.setattr(runner, "measure", fake_measure)
    runner.one_round()  # noisy, then clean
    runner.one_round()  # noisy every time: the last try kept
    assert [s.waited_ns for s in runner.samples] == [0, 500]
    assert runner.noisy[0] == "" and "waited 50.0% of the round" in runner.noisy[1]
    assert len(runner.rejected) == 1 + micro.NOISE_RETRIES
    extra = runner.summary()
    assert extra["noisy_rounds_rejected"] == 1 + micro.NOISE_RETRIES
    assert extra["noisy_rounds_kept"] == 1
    assert "noisy rounds kept" in "\n".join(table([extra]))
    # Not solo (two threads): waiting for the CPU is part of the hand-off, never noisy.
    assert not micro.find("python-condition-1cpu").solo
    assert not micro.find("native-sched_yield-t4").solo
    assert micro.find("native-swapcontext").solo and micro.find("await-d8").solo


def test_runner_rejects_a_count_that_does_not_add_up(monkeypatch):
    case = micro.find("native-futex-1cpu")
    monkeypatch.setattr(native, "run", lambda *a, **k: {"elapsed_ns": 10, "empty_ns": 1,
                                                        "ops": 20, "check": 9})
    with pytest.raises(micro.WorkloadError, match="counted 9 operations, expected 10"):
        Runner(case).measure(10)


# ---- the benchmark module through pytester ---------------------------------------------------

def test_bench_module_runs_records_and_prints(pytester):
    pytester.makepyfile(test_switch=(Path(pcb_suite.SUITE_DIR) / "test_switch.py").read_text())
    out_json = pytester.path / "bench.json"
    result = pytester.runpytest_subprocess(
        "-k", "python-call or native-call or yield_from-d2 or yield_from-d4", "-p",
        "no:cacheprovider", f"--benchmark-json={out_json}", "--benchmark-columns=median,rounds")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "*pyconcbench switch microbenchmarks*",
        "switch-python (ns per operation*",
        "python-call *",
        "depth sweep: ns per op = slope x depth + intercept*",
        "  yield_from   slope *",
    ])
    data = json.loads(out_json.read_text())
    by_name = {b["name"]: b for b in data["benchmarks"]}
    assert set(by_name) == {"test_switch[python-call]", "test_switch[native-call]",
                            "test_depth[yield_from-d2]", "test_depth[yield_from-d4]"}
    assert by_name["test_switch[native-call]"]["group"] == "switch-native"
    assert {(b["extra_info"]["pcb_family"], b["extra_info"]["pcb_schema"]) for b in by_name.values()} == {("switch", 1)}
    for name in ("test_depth[yield_from-d2]", "test_depth[yield_from-d4]"):
        extra = by_name[name]["extra_info"]
        assert by_name[name]["group"] == "depth-sweep"
        assert extra["fit_depths"] == [2, 4] and "fit_slope_ns_per_level" in extra
    call = by_name["test_switch[native-call]"]["extra_info"]
    # the quick profile's plan: 3 to the case's 7 rounds, stopping once they agree within 3 %
    assert call["study_ns"] == 2.34 and len(call["samples"]) == call["rounds"] and 3 <= call["rounds"] <= 7
    assert call["round_plan"].startswith("3 to 7 rounds") and by_name["test_switch[native-call]"]["stats"]["rounds"] == call["rounds"]


# ---- fork from a small helper process --------------------------------------------------------

SMALL_FORK = ["native-fork_waitpid-small_c", "native-fork_waitpid-small_py",
              "python-fork_waitpid-small_py"]
HERE_FORK = ["native-fork_waitpid", "python-fork_waitpid"]


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(key)


def _alive(pid):
    """Whether pid is a live process (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append((int(entry), cmd))
    return out


def test_fork_rows_from_a_small_process_and_from_this_one():
    """Each fork case exists twice, clearly apart: from a small helper (compared with the
    study's s_fork) and from the measuring process (no study ratio, a note saying why)."""
    from pyconcbench.micro.study import not_compared_note, study_figure

    for cid in SMALL_FORK:
        c = micro.find(cid, "create")
        assert c.helper in smallproc.KINDS and c.target == "fork_waitpid"
        assert study_figure(c)[0] == 50980.0 and not_compared_note(c) is None
        assert "fresh" in c.op and "MiB resident" in c.op
    assert micro.find("native-fork_waitpid-small_c").helper == "c"
    for cid in HERE_FORK:
        c = micro.find(cid, "create")
        assert not c.helper and "measuring process itself" in c.op
        assert study_figure(c) is None and "not compared" in not_compared_note(c)


def test_small_helpers_report_their_loop_and_their_size():
    pytest_rss = _status_kib("VmRSS")
    for kind, family in (("c", "native"), ("python", "native"), ("python", "python")):
        d = smallproc.run(kind, family, 20, cpu=CPU_A, timeout=60)
        assert d["ops"] == d["check"] == 20 and d["elapsed_ns"] > 0 and d["empty_ns"] >= 0
        assert d["rss_kib"] > 0 and d["pte_kib"] > 0 and d["maps"] > 0
        # far below this (pytest) process: the point of the helper
        assert d["rss_kib"] < pytest_rss / (8 if kind == "c" else 2), (kind, family, d)
    with pytest.raises(ValueError, match="native cases only"):
        smallproc.command("c", "python", 10)


@pytest.mark.parametrize("cid", SMALL_FORK)
def test_small_fork_case_runs_and_records_the_forking_process(cid):
    case = dataclasses.replace(micro.find(cid, "create"), loops=20, rounds=2)
    before = os.sched_getaffinity(0)
    extra = Runner(case).run()
    assert os.sched_getaffinity(0) == before
    assert extra["ns_per_op"] > 0 and extra["rounds"] == 2
    assert all(s["check"] == s["ops"] == 20 for s in extra["samples"])
    assert extra["forking_process"] == smallproc.describe(case.helper, case.family)
    assert extra["parent_rss_kib"] > 0 and extra["parent_pte_kib"] > 0
    assert extra["parent_rss_kib"] < extra["measuring_process_rss_kib"] / 2
    assert extra["study_ns"] == 50980.0 and extra["ratio_to_study"] > 0
    assert "helper process" in extra["pinning"] and "(in the helper process)" in extra["timer"]
    json.dumps(extra)


def test_fork_from_this_process_has_no_study_ratio_and_costs_more():
    """The same C loop forking this (pytest) process and forking the tiny C helper: the row
    from here carries its size and a note instead of the study's figure, and costs more
    (pytest is ~30x the helper's resident size; fork's cost grows with it)."""
    here = Runner(dataclasses.replace(micro.find("native-fork_waitpid", "create"), loops=30,
                                      rounds=3)).run()
    small = Runner(dataclasses.replace(micro.find("native-fork_waitpid-small_c", "create"),
                                       loops=30, rounds=3)).run()
    assert "study_ns" not in here and "ratio_to_study" not in here
    assert "not compared" in here["study_note"] and here["parent_pte_kib"] > 0
    assert here["forking_process"].startswith("the measuring process itself")
    assert small["parent_rss_kib"] * 8 < here["parent_rss_kib"]
    # ~30x apart here (133 us vs 3.9 ms), each the best of 3 rounds: the host's slow spells
    # (1.2-1.7x) cannot close that gap; an inverted or mixed-up measurement would.
    assert small["ns_per_op_min"] < here["ns_per_op_min"]
    text = "\n".join(table([here, small]))
    assert "no study ratio: not like for like" in text and "MiB resident" in text
    assert re.search(r"native-fork_waitpid-small_c .* 50,980 +[0-9.]+ ", text), text


def test_small_helper_is_killed_at_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^pcb_forkloop: did not finish within 0.3 s \(killed\)$"):
        smallproc.run("c", "native", 50_000_000, cpu=CPU_A, timeout=0.3)
    assert time.monotonic() - t0 < 10.0
    assert _children_of(os.getpid()) == []


def test_small_helper_failures_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(smallproc, "command", lambda kind, family, loops: [smallproc.program(), "0"])
    with pytest.raises(RuntimeError, match=r"^pcb_forkloop: exited with code 2: usage: ") as e:
        smallproc.run("c", "native", 10)
    assert "\n" not in str(e.value)
    monkeypatch.undo()

    monkeypatch.setattr(smallproc._native, "__file__", str(tmp_path / "missing.so"))
    with pytest.raises(RuntimeError) as e:
        smallproc.run("python", "native", 10)
    assert "\n" not in str(e.value)
    assert re.match(r"python -I -S forkloop.py native: exited with code 1: forkloop.py native: "
                    r"ImportError: .*missing.so", str(e.value)), str(e.value)
    monkeypatch.undo()

    fake = tmp_path / "forkloop.py"
    fake.write_text("print('no json here')\n")
    monkeypatch.setattr(smallproc, "SCRIPT", str(fake))
    with pytest.raises(RuntimeError, match=r"^python -I -S forkloop.py python: no usable report "):
        smallproc.run("python", "python", 10)


def test_small_c_helper_missing_is_a_skip_reason(monkeypatch):
    monkeypatch.setattr(smallproc, "PROGRAM", "pcb_no_such_program")
    with pytest.raises(Unavailable, match=r"native-fork_waitpid-small_c: pcb_no_such_program is "
                                          r"not built .* `pip install -e .`"):
        Runner(micro.find("native-fork_waitpid-small_c")).check_available()
    Runner(micro.find("python-fork_waitpid-small_py")).check_available()  # needs no build


@pytest.mark.parametrize("kind,family", [("c", "native"), ("python", "python")])
def test_small_helper_dies_with_the_process_that_started_it(kind, family):
    """A process running a helper is SIGKILLed: the kernel kills the helper too
    (PR_SET_PDEATHSIG, armed before exec), nothing is left running."""
    code = ("import sys; from pyconcbench.micro import smallproc; "
            f"smallproc.run({kind!r}, {family!r}, 50_000_000, timeout=300)")
    middle = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    marker = smallproc.PROGRAM if kind == "c" else "forkloop.py"
    helper = None
    try:
        deadline = time.monotonic() + 20
        while helper is None and time.monotonic() < deadline:
            assert middle.poll() is None, "the process running the helper exited early"
            found = [pid for pid, cmd in _children_of(middle.pid) if marker in cmd]
            helper = found[0] if found else None
            time.sleep(0.02)
        assert helper is not None, "the helper did not start"
    finally:
        middle.kill()
        middle.wait(10)
    deadline = time.monotonic() + 10
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(helper), f"helper {helper} outlived the process that started it"
