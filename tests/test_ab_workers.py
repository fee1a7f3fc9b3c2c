"""Interleaved A/B runs of the switch and ZeroMQ families: a worker per side
(``python -m pyconcbench.worker`` driven by ``ab.WorkerSide``), alternated ABBA by
``ab.PairedRunner``.  The protocol (a round answered, a bad request, a package missing on one
side, a worker that dies or hangs: one line each, bounded, nothing left behind), the order and
the ratios' direction, the saved record against the schema, the gate and the report, and an
end-to-end pytest run with A = B = this interpreter."""
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import proctools
from pyconcbench import ab, gate, metrics, micro, procs, report, worker
from pyconcbench import rounds as rounds_engine
from pyconcbench import zmq as pcbzmq
from pyconcbench.report import ab_tables
from pyconcbench.report.results import split
from skipping import zmq_unavailable
from pyconcbench import suite as pcb_suite

BENCH_DIR = Path(pcb_suite.SUITE_DIR)
SWITCH_CASE = "python-generator_next"  # ~0.1 s a round
ZMQ_CASE = "pyzmq_single-200B-if1"


def environment(side, env=None):
    return ab.Environment(side=side, given=sys.executable, python=sys.executable, env=dict(env or {}),
                          described={"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable})


def switch_request(case=SWITCH_CASE):
    return {"family": "switch", "case": case, "cpus": None}


def zmq_request(case=ZMQ_CASE):
    return {"family": "zmq", "case": case, "cpus": None, "requests": 300, "timeout": 10.0, "probe_baseline": None}


@pytest.fixture
def hide(tmp_path):
    """Environment variables that make ``module`` not installed in a side's interpreter: a
    sitecustomize that maps it to None in sys.modules (importlib.util.find_spec then finds
    nothing), as a venv without the package would."""
    def make(module):
        (tmp_path / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
        return {"PYTHONPATH": str(tmp_path)}

    return make


def gone(pid):
    """The worker and every process of its group (its guard) are gone."""
    return proctools.wait_for(lambda: not proctools.alive(pid) and not proctools.group(pid), 10.0)


# ---- the protocol ------------------------------------------------------------------------------

def test_a_switch_worker_answers_ready_a_round_and_its_summary():
    w = ab.WorkerSide(environment("a"), switch_request())
    try:
        ready = w.start()
        assert ready["case"] == SWITCH_CASE and ready["pid"] == w.pid
        (first, t1), (second, t2) = w.round(), w.round()
        summary = w.end()
    finally:
        w.close()
    assert w.child.returncode == procs.EXIT_OK and gone(ready["pid"])
    for r, seconds in ((first, t1), (second, t2)):
        assert r["ns_per_op"] > 0 and r["ops"] == micro.find(SWITCH_CASE).loops
        assert seconds * 1e9 >= r["elapsed_ns"] + r["empty_ns"]  # the whole round: empty loop and workload
        assert r["ns_per_op"] == pytest.approx((r["elapsed_ns"] - r["empty_ns"]) / r["ops"], abs=1e-3)
    # the summary is what a normal run saves, of exactly the rounds answered, measured once each
    assert summary["micro"] == SWITCH_CASE and summary["rounds"] == 2
    assert [s["ns_per_op"] for s in summary["samples"]] == [first["ns_per_op"], second["ns_per_op"]]
    assert summary["noisy_rounds_rejected"] == 0 and "measured once" in summary["noise_rule"]


def test_a_zmq_worker_answers_a_round():
    why = zmq_unavailable("pyzmq_single")
    if why:
        pytest.skip(why)
    w = ab.WorkerSide(environment("b"), zmq_request())
    try:
        w.start()
        r, seconds = w.round()
        summary = w.end()
    finally:
        w.close()
    assert r["elapsed"] <= seconds < r["elapsed"] + 0.5  # the round's own time: its load, its /proc reads
    assert r["requests"] == 300 and r["requests_per_s"] > 0 and 0 < r["latency_p50_us"] <= r["latency_p99_us"]
    assert r["cpu_us_per_req"] > 0 and "noisy" in r
    assert summary["mode"] == "pyzmq_single" and summary["rounds"] == [r] and summary["noisy_rounds_rejected"] == 0


@pytest.mark.parametrize("request_, message", [
    (switch_request("python-no_such_case"), "A/B side A: no switch microbenchmark 'python-no_such_case'"),
    (zmq_request("pyzmq_single-3B-if1"), "A/B side A: no ZeroMQ case 'pyzmq_single-3B-if1'"),
    ({"family": "http", "case": "x"}, "A/B side A: the first request must name a family (switch, zmq) and a case, "
                                      "got 'http'"),
])
def test_a_bad_case_is_one_line_and_the_worker_exits_unusable(request_, message):
    w = ab.WorkerSide(environment("a"), request_)
    with pytest.raises(ab.ABError) as info:
        w.start()
    assert str(info.value) == message
    assert w.child.returncode == procs.EXIT_UNUSABLE and gone(w.pid)


@pytest.mark.parametrize("request_, module, message", [
    (switch_request("python-greenlet_pingpong"), "greenlet",
     "A/B side B: python-greenlet_pingpong needs greenlet (not installed); install pyconcbench[greenlet] ("),
    (zmq_request(), "zmq", "A/B side B: pyzmq_single needs pyzmq (pip install pyzmq, or 'pyconcbench[zmq]'): "
                           "not installed ("),
])
def test_a_package_missing_on_one_side_names_the_side(hide, request_, module, message):
    w = ab.WorkerSide(environment("b", hide(module)), request_)
    with pytest.raises(ab.ABError) as info:
        w.start()
    text = str(info.value)
    assert text.startswith(message) and text.endswith(f"({sys.executable})") and "\n" not in text
    assert w.child.returncode == procs.EXIT_MISSING and gone(w.pid)


def test_a_worker_killed_mid_run_is_one_line_and_leaves_nothing():
    w = ab.WorkerSide(environment("a"), switch_request())
    w.start()
    w.round()
    pid = w.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ab.ABError) as info:
        w.round()
    assert str(info.value) == "A/B side A: its worker exited during round 2 (killed by SIGKILL)"
    assert gone(pid)


def test_a_worker_that_hangs_mid_run_is_killed_after_the_round_timeout():
    w = ab.WorkerSide(environment("b"), switch_request(), round_timeout=1.0)
    w.start()
    w.round()
    pid = w.pid
    os.kill(pid, signal.SIGSTOP)  # it never answers again
    started = time.monotonic()
    with pytest.raises(ab.ABError) as info:
        w.round()
    assert time.monotonic() - started < 8.0
    assert str(info.value) == "A/B side B: its worker did not answer round 2 within 1 s (killed)"
    assert w.child.returncode == -signal.SIGKILL and gone(pid)


def test_the_raw_protocol_refuses_a_request_that_is_not_json():
    child = procs.Child([sys.executable, "-m", "pyconcbench.worker"], stdin_pipe=True).start()
    try:
        child.write_line(b"hello")
        answer = json.loads(child.read_line(60))
        code = child.wait(30)
    finally:
        child.close()
    assert answer == {"error": "a request that is not JSON: 'hello'", "kind": "unusable"}
    assert code == procs.EXIT_UNUSABLE
    assert child.stderr_tail(1) == ["pyconcbench.worker: a request that is not JSON: 'hello'"]
    out = subprocess.run([sys.executable, "-m", "pyconcbench.worker", "extra"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == procs.EXIT_UNUSABLE and "takes no arguments" in out.stderr


def _raise(exc):
    raise exc


@pytest.mark.parametrize("exc, kind, code", [
    (micro.Unavailable("x needs y"), "missing", procs.EXIT_MISSING),
    (pcbzmq.Unavailable("m needs pyzmq"), "missing", procs.EXIT_MISSING),
    (micro.Broken("go: does not build"), "broken", procs.EXIT_BROKEN),
    (worker.Unusable("no such case"), "unusable", procs.EXIT_UNUSABLE),
    (micro.WorkloadError("the other side\ncounted 3"), "failed", procs.EXIT_FAILED),
    (pcbzmq.RoundError("no reply within 10 s"), "failed", procs.EXIT_FAILED),
])
def test_each_failure_has_its_kind_and_exit_code(exc, kind, code):
    text, got_kind, got_code = worker.failure(exc)
    assert (got_kind, got_code) == (kind, code) and "\n" not in text and text.split()[0] == str(exc).split()[0]


def test_an_unexpected_error_is_one_line_with_where_it_was_raised():
    try:
        _raise(ZeroDivisionError("division by zero"))
    except ZeroDivisionError as exc:
        text, kind, code = worker.failure(exc)
    assert text.startswith("ZeroDivisionError: division by zero (") and "test_ab_workers.py:" in text
    assert (kind, code) == ("failed", procs.EXIT_FAILED)


# ---- the pairs ----------------------------------------------------------------------------------

class FakeWorker:
    """A worker's stand-in: answers rounds of a fixed ns/op and logs every call in a shared log."""

    def __init__(self, side, ns, log, fail_at=None):
        self.side, self.ns, self.log, self.fail_at = side, ns, log, fail_at
        self.samples, self.closed = [], False

    def start(self):
        self.log.append("start " + self.side)

    def round(self):
        self.log.append(self.side)
        if len(self.samples) + 1 == self.fail_at:
            raise ab.ABError(f"A/B side {self.side.upper()}: its worker exited during round {self.fail_at}")
        self.samples.append({"ns_per_op": self.ns, "noisy": None})
        return self.samples[-1], self.ns / 1e4  # seconds: 10 ms for 100 ns/op

    def end(self):
        return {"micro": SWITCH_CASE, "case": "generator_next", "ns_per_op": self.ns, "samples": self.samples}

    def close(self):
        self.closed = True


class Bench:
    """pytest-benchmark's benchmark, as far as the runner uses it: each round timed by its
    timer, ROUND_CLOCK (the suite's)."""

    def __init__(self):
        self.extra_info = {}
        self.times = []

    def pedantic(self, fn, rounds, iterations, warmup_rounds):
        assert (iterations, warmup_rounds) == (1, 0)
        for _ in range(rounds):
            started = rounds_engine.ROUND_CLOCK()
            fn()
            self.times.append(rounds_engine.ROUND_CLOCK() - started)


def paired(rounds=6, family="switch", case=SWITCH_CASE, job=None, **timeouts):
    settings = types.SimpleNamespace(ab={s: environment(s) for s in ab.SIDES}, rounds=rounds, cpus=None)
    found = micro.find(case) if family == "switch" else {c.id: c for c in pcbzmq.cases()}[case]
    return ab.PairedRunner(settings, family, found, found.rounds if family == "switch" else 5, job, **timeouts)


def test_pairs_alternate_abba_one_round_at_a_time_and_ns_per_op_is_b_over_a():
    runner = paired(6)
    log = []
    runner.workers = {"a": FakeWorker("a", 100.0, log), "b": FakeWorker("b", 110.0, log)}
    bench = Bench()
    extra = runner.run(bench)
    assert log == ["start a", "start b"] + list("abbaabbaabba")
    # pytest-benchmark is handed each pair's two rounds' own time (10 ms + 11 ms), not the IPC's
    assert bench.times == pytest.approx([0.021] * 6)
    assert extra["order"] == "ABBAABBAABBA" and bench.extra_info is not extra
    assert bench.extra_info == extra
    assert [p["ns_per_op"] for p in extra["pairs"]] == [1.1] * 6  # B/A: B takes 10 % longer
    iv = extra["intervals"]["ns_per_op"]
    assert (iv["ratio"], iv["low"], iv["high"], iv["pairs"]) == (1.1, 1.1, 1.1, 6)
    assert extra["ab_family"] == "switch" and extra["case"] == SWITCH_CASE
    assert extra["a"]["environment"]["given"] == sys.executable and extra["b"]["ns_per_op"] == 110.0
    assert all(w.closed for w in runner.workers.values())


def test_pairs_default_to_twice_the_case_rounds():
    assert paired(None).pairs == ab.PAIRS_PER_ROUND * micro.find(SWITCH_CASE).rounds
    assert paired(3).pairs == 3


def test_a_side_failing_mid_run_closes_both_workers():
    runner = paired(4)
    log = []
    runner.workers = {"a": FakeWorker("a", 100.0, log), "b": FakeWorker("b", 100.0, log, fail_at=2)}
    with pytest.raises(ab.ABError, match="side B: its worker exited during round 2"):
        runner.run(Bench())
    assert log == ["start a", "start b", "a", "b", "b"]  # the second pair is B first
    assert all(w.closed for w in runner.workers.values())


def test_a_zmq_round_timeout_outlasts_the_rounds_own_deadline():
    runner = paired(2, "zmq", ZMQ_CASE, {"requests": 300, "timeout": 40.0})
    assert runner.workers["a"].timeouts["round"] == 460.0  # 10 x 40 s, the session's deadline, + 60 s
    assert paired(2).workers["b"].timeouts["round"] == ab.ROUND_TIMEOUT
    with pytest.raises(ValueError, match="not 'echo'"):
        ab.PairedRunner(types.SimpleNamespace(ab={}, rounds=2, cpus=None), "echo", None, 5)


# ---- the saved record: schema, gate, report ------------------------------------------------------

def bench_of(extra, name):
    return {"name": name, "fullname": f"tests/bench/{name}", "group": "g",
            "stats": {"median": 0.1, "data": [0.1, 0.1]}, "extra_info": extra}


@pytest.fixture(scope="module")
def switch_record():
    """A real switch A/A record: two workers of this interpreter, 2 pairs."""
    return bench_of(paired(2).run(Bench()), f"test_switch[{SWITCH_CASE}]")


def test_a_real_switch_record_passes_the_schema_and_the_gate(switch_record):
    info = switch_record["extra_info"]
    assert metrics.check_benchmark(switch_record) is None
    assert info["pcb_family"] == "ab" and info["order"] == "ABBA" and len(info["pairs"]) == 2
    assert info["a"]["round_plan"] == info["b"]["round_plan"] == "2 rounds" and info["a"]["rounds"] == 2
    for pair, a, b in zip(info["pairs"], info["a"]["samples"], info["b"]["samples"]):
        assert pair["ns_per_op"] == pytest.approx(b["ns_per_op"] / a["ns_per_op"], rel=1e-5)
    (change,) = gate.check_ab(switch_record, gate.parse_fail_on("ns_per_op:+200%,msgs_per_s:-5%"))
    assert change.metric == "ns_per_op" and change.status == "unchanged"
    assert change.base == info["a"]["ns_per_op"] and change.new == info["b"]["ns_per_op"]
    assert change.n_new == 2 and change.low <= change.change + 1 <= change.high


@pytest.mark.parametrize("where, value, field, problem", [
    ("a", {"ns_per_op": "fast"}, "extra_info.a.ns_per_op", "expected a finite number"),
    ("b", {"micro": None}, "extra_info.b.micro", "null"),
    ("", {"ab_family": "http"}, "extra_info.ab_family", "expected one of echo, switch, zmq"),
    ("", {"intervals": {"ns_per_op": {"ratio": 1.0, "low": 1.1, "high": 1.2, "confidence": 0.5}}},
     "extra_info.intervals.ns_per_op", "not an interval"),
])
def test_a_damaged_switch_record_is_refused_naming_the_field(switch_record, where, value, field, problem):
    damaged = json.loads(json.dumps(switch_record))
    (damaged["extra_info"][where] if where else damaged["extra_info"]).update(value)
    found = metrics.check_benchmark(damaged)
    assert found is not None and found[0] == field and problem in found[1]


def record(family, case, metric, ratio, low, high, a_value, b_value):
    """A saved A/B record of ``family`` with one interval (as a run saves it, by hand)."""
    iv = {"ratio": ratio, "low": low, "high": high, "confidence": 0.97, "pairs": 10}
    side = {"switch": {"micro": case, "case": case.split("-", 1)[1], "samples": []},
            "zmq": {"mode": case.split("-")[0], "rounds": []}}[family]
    key = metrics.AB_PAIR_KEYS[family][metric]
    return bench_of({**metrics.stamp(metrics.AB), "ab_family": family, "case": case, "order": "AB" * 5,
                     "pairs": [{"order": "AB", metric: ratio}] * 10, "intervals": {metric: iv},
                     "a": {**side, key: a_value, "environment": {"given": "venv-a", "python": "3.12.1"}},
                     "b": {**side, key: b_value, "environment": {"given": "venv-b", "python": "3.13.0"}}},
                    f"test_{family}[{case}]")


@pytest.mark.parametrize("low, high, threshold, status", [
    (1.06, 1.09, 0.05, "regression"),   # B takes 6-9 % longer per op: worse, beyond +5 %
    (1.02, 1.09, 0.05, "unchanged"),    # worse, but not all beyond
    (0.80, 0.90, 0.05, "improved"),     # B takes 10-20 % less
])
def test_ns_per_op_is_worse_when_b_over_a_is_above_one(low, high, threshold, status):
    bench = record("switch", SWITCH_CASE, "ns_per_op", (low + high) / 2, low, high, 40.0, 40.0 * (low + high) / 2)
    assert metrics.check_benchmark(bench) is None
    (change,) = gate.check_ab(bench, gate.parse_fail_on(f"ns_per_op:+{threshold * 100:g}%"))
    assert change.status == status
    if status == "regression":
        assert (f"test_switch[{SWITCH_CASE}]: ns_per_op B/A 1.075 [1.060, 1.090] (97.0 % interval over 10 "
                "interleaved pairs; A 40.00 ns, B 43.00 ns): the whole interval is beyond the threshold +5%"
                ) == change.line()


def test_the_tables_show_each_family_in_its_own_direction():
    switch = record("switch", SWITCH_CASE, "ns_per_op", 1.041, 1.028, 1.056, 40.0, 41.64)
    zmq = record("zmq", ZMQ_CASE, "requests_per_s", 0.9, 0.85, 0.95, 20000.0, 18000.0)
    assert metrics.check_benchmark(switch) is None and metrics.check_benchmark(zmq) is None
    text = report.to_markdown([], report.sections(split([switch, zmq])))
    assert "## Interleaved A/B (switch, zmq)" in text
    assert f"| switch {SWITCH_CASE} | 40.00 | 41.64 | 1.041 [1.028, 1.056] 97% | 10 | B slower by 4.1 % |" in text
    assert f"| zmq {ZMQ_CASE} | 20,000 | 18,000 | 0.900 [0.850, 0.950] 97% | - | - | 10 | B slower by 10.0 % |" in text
    assert "### B against A, per case (zmq)" in text and "(lower is better)" in text
    lines = ab_tables.table_lines([switch["extra_info"], zmq["extra_info"]])
    assert any(line.startswith("case") and "B/A ns/op [interval]" in line for line in lines)
    assert any(line.startswith(f"switch {SWITCH_CASE}") and line.rstrip().endswith("B slower by 4.1 %")
               for line in lines)
    faster = record("switch", SWITCH_CASE, "ns_per_op", 0.8, 0.75, 0.85, 40.0, 32.0)["extra_info"]
    assert ab_tables.rows([faster], "switch")[0][-1] == "B faster by 20.0 %"


# ---- end to end ---------------------------------------------------------------------------------

@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_switch=(BENCH_DIR / "test_switch.py").read_text(),
                        test_zmq=(BENCH_DIR / "test_zmq.py").read_text())
    return pytester


#: A as this interpreter, B as its venv; NAME=VALUE, so pytest does not take the paths for test paths
#: (whose common directory would make this project's the run's rootdir and ini).
AB = [f"--pcb-ab-a={sys.executable}", f"--pcb-ab-b={os.path.dirname(os.path.dirname(sys.executable))}",
      "--pcb-rounds", "2", "--pcb-messages", "2000", "-p", "no:cacheprovider"]


def test_an_ab_run_of_a_switch_and_a_zmq_case_saves_both_records(suite):
    ids = [f"test_switch.py::test_switch[{SWITCH_CASE}]"]
    if zmq_unavailable("pyzmq_single") is None:
        ids.append(f"test_zmq.py::test_zmq[{ZMQ_CASE}]")
    result = suite.runpytest_subprocess(*ids, *AB, "--benchmark-json", "ab.json",
                                        "--pcb-fail-on", "ns_per_op:+100%,requests_per_s:-50%")
    result.assert_outcomes(passed=len(ids))
    families = ", ".join(["switch", "zmq"][:len(ids)])
    # A against itself: never a regression (2 pairs on a busy machine may still call one
    # "improved" when the whole interval clears the wide threshold the other way)
    result.stdout.fnmatch_lines(["baseline none (interleaved A/B*; fail-on *; *",
                                 f"*pyconcbench interleaved A/B ({families})*",
                                 f"switch {SWITCH_CASE} *  2*"])
    assert result.ret == 0 and "regression" not in result.stdout.str().split("fail-on", 1)[1].splitlines()[0]
    data = json.loads((suite.path / "ab.json").read_text())
    assert metrics.check_run(data) is None
    infos = {b["extra_info"]["ab_family"]: b["extra_info"] for b in data["benchmarks"]}
    assert sorted(infos) == families.split(", ")
    for family, info in infos.items():
        primary = {"switch": "ns_per_op", "zmq": "requests_per_s"}[family]
        iv = info["intervals"][primary]
        assert info["pcb_family"] == "ab" and info["order"] == "ABBA" and iv["pairs"] == 2
        assert 0 < iv["low"] <= iv["ratio"] <= iv["high"]
        for side in ab.SIDES:
            assert os.path.samefile(info[side]["environment"]["executable"], sys.executable)
        assert info["b"]["environment"]["given"] != info["a"]["environment"]["given"]
        assert info["a"]["round_plan"] == "2 rounds"
    if "zmq" in infos:
        assert set(infos["zmq"]["intervals"]) == set(metrics.AB_PAIR_KEYS["zmq"])


def test_a_package_missing_on_side_b_fails_the_test_in_one_line(suite, hide):
    env = ",".join(f"{k}={v}" for k, v in hide("greenlet").items())
    result = suite.runpytest_subprocess("test_switch.py::test_switch[python-greenlet_pingpong]", *AB,
                                        "--pcb-ab-b-env", env)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*python-greenlet_pingpong: A/B side B: python-greenlet_pingpong needs greenlet "
                                 "(not installed); install pyconcbench[[]greenlet] (*)"])
    assert "Traceback" not in result.stdout.str()
