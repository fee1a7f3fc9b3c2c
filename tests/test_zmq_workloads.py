"""pyconcbench.zmq: every mode answers correctly over tcp and ipc; a wrong reply, a silent
server and a dead server end the round with a one-line RoundError within its timeout; nothing
is left behind (threads, OS threads, child processes, file descriptors, ipc directories, CPU
affinity); a missing dependency is Unavailable with the reason; the benchmark module's ids,
groups and extra_info through pytester."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from proctools import alive, group
from skipping import zmq_unavailable
from pyconcbench import zmq as pcbzmq
from pyconcbench.zmq import Fault, RoundError, RoundResult, Session, Unavailable, run_round
from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
#: How much later than its timeout a round may end: the watchdog's and the waits' slices are
#: tens of ms, the rest is room for a loaded shared machine (a descheduled test must not fail),
#: still far below the 30 s timeouts the "at once" tests tell apart.
SLACK = 5.0


_unavailable = zmq_unavailable


@pytest.fixture(params=list(pcbzmq.MODES))
def mode(request):
    reason = _unavailable(request.param)
    if reason is not None:
        pytest.skip(reason)
    return request.param


@pytest.fixture(scope="module", autouse=True)
def libuv_global_pipe():
    """libuv opens one process-wide pipe (its signal pipe) with the first uvloop loop and keeps
    it: open it before the leak checks start counting."""
    try:
        import uvloop
    except Exception:
        yield
        return
    loop = uvloop.new_event_loop()
    loop.close()
    yield


def _os_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.fixture(autouse=True)
def nothing_left():
    """No Python thread, OS thread (libzmq's I/O threads) or pinning left after each test;
    child processes and fds are checked by the project's conftest."""
    threads = set(threading.enumerate())
    tasks = _os_threads()
    affinity = os.sched_getaffinity(0)
    yield
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and (set(threading.enumerate()) - threads or _os_threads() > tasks):
        time.sleep(0.01)
    left = set(threading.enumerate()) - threads
    assert not left, "threads left running: %s" % left
    assert _os_threads() <= tasks, "OS threads left running: %d, were %d" % (_os_threads(), tasks)
    assert os.sched_getaffinity(0) == affinity


# ---- every mode -------------------------------------------------------------------------

@pytest.mark.parametrize("inflight", [1, 10])
def test_answers_correctly(mode, inflight):
    result = run_round(mode, 60, inflight=inflight, timeout=5)
    assert result.requests == 60
    assert len(result.latencies_ns) == 60
    assert all(ns > 0 for ns in result.latencies_ns)
    assert result.elapsed > 0 and result.requests_per_s > 0
    assert result.cpu >= 0
    assert result.other_cpu is None or result.other_cpu >= 0
    assert (result.server_cpu is not None) == (mode == "pyzmq_process")
    p50, p99 = result.latency_percentiles((50, 99))
    assert 0 < p50 <= p99


def test_answers_over_ipc_and_removes_its_directory(mode):
    with Session(mode, transport="ipc", timeout=5) as session:
        directory = session.ipc_dir
        assert os.path.isdir(directory)
        assert session.round(20).requests == 20
    assert not os.path.exists(directory)


@pytest.mark.parametrize("size", [pcbzmq.MIN_SIZE, 64 * 1024])
def test_payload_sizes(mode, size):
    assert run_round(mode, 10, size=size, inflight=3, timeout=5).requests == 10


def test_rounds_on_one_session(mode):
    with Session(mode, inflight=7, timeout=5) as session:
        session.warmup(13)
        results = [session.round(n) for n in (1, 29, 50)]
    assert [r.requests for r in results] == [1, 29, 50]


@pytest.mark.parametrize("kind, message", [
    ("wrong_id", r"id"),
    ("wrong_payload", r"payload|differs|byte"),
])
def test_wrong_reply_is_caught(mode, kind, message):
    started = time.monotonic()
    with pytest.raises(RoundError, match=message) as info:
        run_round(mode, 30, inflight=4, timeout=30, fault=Fault(kind, after=5))
    text = str(info.value)
    assert text.startswith(mode + ": ") and "\n" not in text
    assert time.monotonic() - started < 15  # caught by the check, not by the 30 s timeout


@pytest.mark.parametrize("inflight", [1, 10])
def test_silent_server_ends_the_round_within_its_timeout(mode, inflight):
    timeout = 0.5
    with Session(mode, inflight=inflight, timeout=timeout, fault=Fault("silent", after=3)) as session:
        started = time.monotonic()
        with pytest.raises(RoundError) as info:
            session.round(50)
        took = time.monotonic() - started
        # and the session says so from then on
        with pytest.raises(RoundError, match="unusable after an earlier failure"):
            session.round(1)
    text = str(info.value)
    assert text.startswith(mode + ": no reply within 0.5 s") and "\n" not in text
    assert "of 50 answered" in text
    assert timeout <= took < timeout + SLACK


EXIT_MESSAGES = {
    "pyzmq_process": "the server process (pid *) exited with code 5",
    "pyzmq_thread": "the server thread has stopped",
    "zmq_asyncio": "the server task has ended",
    "aiozmq_core": "the server transport has closed",
}


def test_dead_server_ends_the_round_within_its_timeout(mode):
    timeout = 2.0
    started = time.monotonic()
    with pytest.raises(RoundError) as info:
        run_round(mode, 50, timeout=timeout, fault=Fault("exit", after=3))
    took = time.monotonic() - started
    text = str(info.value)
    assert "\n" not in text
    expected = EXIT_MESSAGES.get(pcbzmq.MODES[mode].workload, "no reply within 2 s")
    import fnmatch

    assert fnmatch.fnmatch(text, "%s: %s*" % (mode, expected)), text
    assert took < timeout + SLACK


# ---- the server process -------------------------------------------------------------------

def test_killed_server_process_is_reported_at_once():
    if _unavailable("pyzmq_process"):
        pytest.skip(_unavailable("pyzmq_process"))
    with Session("pyzmq_process", timeout=30) as session:
        session.round(10)
        os.kill(session.server_pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RoundError, match=r"pyzmq_process: the server process \(pid \d+\) exited with code -9"):
            session.round(10)
        assert time.monotonic() - started < SLACK  # noticed by the wait's slice, not the 30 s


@pytest.mark.skipif(not TWO_CPUS, reason="needs two CPUs to pin")
@pytest.mark.parametrize("placement", ["1cpu", "2cpu"])
def test_server_process_pinned_and_client_thread_restored(placement):
    if _unavailable("pyzmq_process"):
        pytest.skip(_unavailable("pyzmq_process"))
    cpus = sorted(os.sched_getaffinity(0))[:2]
    before = os.sched_getaffinity(0)
    server_cpu = cpus[1] if placement == "1cpu" else cpus[0]
    with Session("pyzmq_process", cpus=(cpus[0], cpus[1]), placement=placement, timeout=5) as session:
        assert os.sched_getaffinity(0) == {cpus[1]}
        assert os.sched_getaffinity(session.server_pid) == {server_cpu}
        assert session.round(20).requests == 20
        if placement == "1cpu":
            assert session.pinning.startswith("1cpu: client thread, the server process (all its threads) "
                                              "and every libzmq I/O and reaper thread")
            assert session.pinning.endswith("on CPU %d" % cpus[1])
        else:
            assert session.pinning.startswith("2cpu: client thread on CPU %d; the server process" % cpus[1])
            assert session.pinning.endswith("on CPU %d" % cpus[0])
    assert os.sched_getaffinity(0) == before


ORPHAN_SCRIPT = """
import sys, time
from pyconcbench.zmq import Session
session = Session("pyzmq_process", timeout=5).open()
print(session.server_pid, flush=True)
time.sleep(60)
"""


def test_server_process_dies_with_its_parent():
    if _unavailable("pyzmq_process"):
        pytest.skip(_unavailable("pyzmq_process"))
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL)
    try:
        line = parent.stdout.readline()
        server = int(line)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(server):
        time.sleep(0.05)
    assert not alive(server), "the server process outlived its parent"
    # nothing of its process group either (its guard, see procs.start_guard, goes with it)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and group(server):
        time.sleep(0.05)
    assert not group(server), f"processes of the server's group outlived it: {group(server)}"


def test_server_cli_help():
    result = subprocess.run([sys.executable, "-m", "pyconcbench.zmq.server", "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "--transport {tcp,ipc}" in result.stdout


# ---- settings, dependencies, results -------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="nope"), "unknown mode 'nope'; known: pyzmq_single"),
    (dict(size=7), r"size: expected an integer in 8 \.\. 1048576, got 7"),
    (dict(size=(1 << 20) + 1), "size: expected an integer"),
    (dict(inflight=0), "inflight: expected an integer in 1 .. 500, got 0"),
    (dict(transport="udp"), "transport: 'udp' is not one of tcp, ipc"),
    (dict(timeout=0), "timeout: expected seconds > 0, got 0"),
    (dict(deadline=float("inf")), "deadline: expected seconds > 0"),
    (dict(cpus=(0, 0)), "cpus: expected two different CPUs"),
    (dict(placement="3cpu"), "placement: '3cpu' is not one of 1cpu, 2cpu"),
    (dict(fault="silent"), "fault: expected a Fault"),
])
def test_bad_settings(kwargs, message):
    mode = kwargs.pop("mode", "pyzmq_single")
    with pytest.raises(ValueError, match=message):
        Session(mode, **kwargs)


def test_bad_fault():
    with pytest.raises(ValueError, match="Fault.kind: 'crash' is not one of"):
        Fault("crash")
    with pytest.raises(ValueError, match="is not KIND"):
        Fault.parse("silent@x")
    assert Fault.parse("exit@4") == Fault("exit", 4)


@pytest.mark.parametrize("blocked, mode, message", [
    ("aiozmq", "aiozmq_core", "aiozmq_core needs aiozmq (pip install aiozmq, or 'pyconcbench[zmq]')"),
    ("msgpack", "aiozmq_rpc", "aiozmq_rpc needs msgpack (pip install msgpack, or 'pyconcbench[zmq]')"),
    ("uvloop", "zmq_asyncio-uvloop", "zmq_asyncio-uvloop needs uvloop (pip install uvloop, or 'pyconcbench[uvloop]')"),
    ("zmq", "pyzmq_single", "pyzmq_single needs pyzmq (pip install pyzmq, or 'pyconcbench[zmq]')"),
])
def test_missing_dependency_is_unavailable(monkeypatch, blocked, mode, message):
    monkeypatch.setitem(sys.modules, blocked, None)  # import raises ImportError
    with pytest.raises(Unavailable) as info:
        Session(mode).open()
    assert str(info.value).startswith(message)


def test_aiozmq_core_does_not_need_msgpack(monkeypatch):
    if _unavailable("aiozmq_core"):
        pytest.skip(_unavailable("aiozmq_core"))
    for name in ("msgpack", "aiozmq.rpc"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "pyconcbench.zmq._aiozmq", raising=False)
    assert run_round("aiozmq_core", 5, timeout=5).requests == 5
    with pytest.raises(Unavailable, match="aiozmq_rpc needs msgpack"):
        Session("aiozmq_rpc").open()


def test_dependency_that_does_not_import_is_unavailable(monkeypatch, tmp_path):
    (tmp_path / "pcb_broken_dep.py").write_text("raise AttributeError('module asyncio has no attribute coroutine')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = pcbzmq.Mode("broken", "broken", None, "_pyzmq", "Single", ("pcb_broken_dep",), "test")
    with pytest.raises(Unavailable, match=r"broken: pcb_broken_dep does not import on Python 3\.\d+\.\d+: "
                                          r"AttributeError: module asyncio has no attribute coroutine"):
        Session(broken).open()


# A bug planted in a copy of the project's own module (after its __future__ import), and what
# the failure's one line says about it.
PLANTED_BUGS = {
    "NameError": ("pcb_planted_bug", "NameError: name 'pcb_planted_bug' is not defined"),
    "SyntaxError": ("def pcb_planted_bug(:", "SyntaxError: "),
    "ImportError": ("from pyconcbench.zmq._common import pcb_planted_bug",
                    "ImportError: cannot import name 'pcb_planted_bug' from 'pyconcbench.zmq._common'"),
}


def _broken_copy(directory, name, planted):
    """Writes the project's ``_pyzmq.py`` as ``directory/name.py`` with the line ``planted``
    right after its __future__ import; returns that line's number."""
    lines = (pathlib.Path(pcbzmq.__file__).parent / "_pyzmq.py").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("from __future__ ")) + 1
    lines.insert(at, planted + "\n")
    (directory / (name + ".py")).write_text("".join(lines))
    return at + 1


def _broken_mode(monkeypatch, tmp_path, bug):
    """A mode whose implementation is a copy of _pyzmq with ``bug`` planted, importable as
    pyconcbench.zmq._pcb_broken_pyzmq; (mode, the line the bug is on)."""
    line = _broken_copy(tmp_path, "_pcb_broken_pyzmq", PLANTED_BUGS[bug][0])
    monkeypatch.setattr(pcbzmq, "__path__", [*pcbzmq.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "pyconcbench.zmq._pcb_broken_pyzmq", raising=False)
    return pcbzmq.Mode("broken", "broken", None, "_pcb_broken_pyzmq", "Single", (), "test"), line


@pytest.mark.parametrize("bug", list(PLANTED_BUGS))
def test_a_broken_project_module_is_broken_not_unavailable(monkeypatch, tmp_path, bug):
    """Our own module that does not import is a bug (Broken, one line naming the error and
    where), never Unavailable -- an ImportError included: nothing of ours is 'not installed'."""
    broken, line = _broken_mode(monkeypatch, tmp_path, bug)
    with pytest.raises(Exception) as info:
        Session(broken).open()
    assert not isinstance(info.value, Unavailable)
    assert isinstance(info.value, pcbzmq.Broken)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("broken: its implementation pyconcbench.zmq._pcb_broken_pyzmq does not "
                              "import: " + PLANTED_BUGS[bug][1])
    assert message.endswith("(%s:%d)" % (tmp_path / "_pcb_broken_pyzmq.py", line))


def test_a_broken_project_module_fails_the_mode_fixture_not_skips(monkeypatch, tmp_path):
    broken, line = _broken_mode(monkeypatch, tmp_path, "NameError")
    monkeypatch.setitem(pcbzmq.MODES, "broken", broken)
    with pytest.raises(pytest.fail.Exception,
                       match=r"^broken: its implementation pyconcbench\.zmq\._pcb_broken_pyzmq does not "
                             r"import: NameError: name 'pcb_planted_bug' is not defined \(.*:%d\)$" % line):
        _unavailable("broken")


def test_absolute_zmq_import_is_pyzmq():
    """``pyconcbench.zmq`` does not shadow pyzmq: inside it ``import zmq`` is pyzmq."""
    zmq = pytest.importorskip("zmq")
    from pyconcbench.zmq import _pyzmq

    assert _pyzmq.zmq is zmq
    assert hasattr(zmq, "Context") and "pyconcbench" not in zmq.__file__
    assert pcbzmq.__name__ == "pyconcbench.zmq"


def test_round_result_and_summary():
    r = RoundResult(requests=4, elapsed=2.0, latencies_ns=(1000, 2000, 3000, 100000), cpu=0.004,
                    other_cpu=0.5)
    assert r.requests_per_s == 2.0
    p50, p99 = r.latency_percentiles((50, 99))
    assert p50 == pytest.approx(2000, rel=0.01) and p99 == pytest.approx(100000, rel=0.01)
    other = RoundResult(requests=4, elapsed=1.0, latencies_ns=(1000,) * 4, cpu=0.0)
    s = pcbzmq.summarize([r, other])
    assert s["requests_per_round"] == 4
    assert s["requests_per_s"] == round(8 / 3.0, 1)
    assert s["requests_per_s_median"] == 3.0
    assert s["latency_p50_us"] == pytest.approx(1.0, rel=0.01)
    assert s["latency_max_us"] == 100.0
    assert s["cpu_us_per_req"] == 500.0
    assert s["server_cpu_us_per_req"] is None
    assert s["other_cpu_share_max"] == 0.25
    assert [x["requests_per_s"] for x in s["rounds"]] == [2.0, 4.0]
    with pytest.raises(ValueError, match="latencies_ns: 1 values for 2 requests"):
        RoundResult(requests=2, elapsed=1.0, latencies_ns=(1,))
    with pytest.raises(ValueError, match="elapsed"):
        RoundResult(requests=1, elapsed=0.0, latencies_ns=(1,))


def test_matrix():
    quick = pcbzmq.cases("quick")
    ids = [c.id for c in quick]
    assert len(ids) == len(set(ids))
    for name in pcbzmq.MODES:
        assert name + "-200B-if1" in ids
    assert "aiozmq_rpc-uvloop-200B-if1" in ids
    assert pcbzmq.Case("pyzmq_single").group == "zmq-200B-if1"
    assert pcbzmq.Case("pyzmq_single", 1024, 10, "ipc").id == "pyzmq_single-1KiB-if10-ipc"
    assert pcbzmq.Case("pyzmq_single", 1024, 10, "ipc").group == "zmq-1KiB-if10-ipc"
    for name in pcbzmq.MODES:  # every mode on both placements at the study's scale
        assert name + "-200B-if1-2cpu" in ids
    assert not [i for i in ids if i.endswith("-2cpu") and "-200B-if1-" not in i]
    assert pcbzmq.Case("pyzmq_single", placement="2cpu").group == "zmq-200B-if1-2cpu"
    assert pcbzmq.Case("pyzmq_single", transport="ipc", placement="2cpu").id == "pyzmq_single-200B-if1-ipc-2cpu"
    full = pcbzmq.cases("full")
    assert len(full) == len({c.id for c in full}) == len(pcbzmq.MODES) * (3 * 3 * 2 + 2)
    assert set(ids) <= {c.id for c in full}
    assert {c.id for c in full if c.placement == "2cpu"} == {
        "%s-200B-if1%s-2cpu" % (m, t) for m in pcbzmq.MODES for t in ("", "-ipc")}
    with pytest.raises(ValueError, match="unknown profile"):
        pcbzmq.cases("huge")


# ---- the benchmark module through pytest ----------------------------------------------------

@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_zmq_bench=(BENCH_DIR / "test_zmq.py").read_text())
    return pytester


def test_benchmark_ids_and_groups(suite):
    result = suite.runpytest_subprocess("--collect-only", "-q")
    ids = [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]
    assert "test_zmq[pyzmq_single-200B-if1]" in ids
    assert "test_zmq[aiozmq_rpc-uvloop-200B-if1]" in ids
    assert "test_zmq[pyzmq_single-200B-if1-2cpu]" in ids
    assert len(ids) == len(pcbzmq.cases("quick"))
    full = suite.runpytest_subprocess("--collect-only", "-q", "--pcb-profile", "full")
    assert sum("::" in line for line in full.stdout.lines) == len(pcbzmq.cases("full"))


def test_small_benchmark_run(suite):
    if _unavailable("pyzmq_single"):
        pytest.skip(_unavailable("pyzmq_single"))
    result = suite.runpytest_subprocess(
        "-k", "pyzmq_single-200B-if1] or pyzmq_poller-200B-if1]",
        "--pcb-messages", "200", "--pcb-rounds", "3", "--benchmark-json", "out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["[[]1/2] zmq pyzmq_single-200B-if1 * req/s  p99 * us*"])
    data = json.loads((suite.path / "out.json").read_text())
    bench = {b["param"]: b for b in data["benchmarks"]}
    info = bench["pyzmq_single-200B-if1"]["extra_info"]
    assert (info["pcb_family"], info["pcb_schema"]) == ("zmq", 1)
    assert bench["pyzmq_single-200B-if1"]["group"] == "zmq-200B-if1"
    assert bench["pyzmq_single-200B-if1"]["stats"]["rounds"] == 3
    assert info["mode"] == "pyzmq_single" and info["size"] == 200 and info["inflight"] == 1
    assert info["requests_per_round"] == 200 and len(info["rounds"]) == 3
    assert info["requests_per_s"] > 0 and 0 < info["latency_p50_us"] <= info["latency_p99_us"]
    assert info["study_requests_per_s"] == 9895
    assert info["placement"] in ("1cpu", "off")
    if info["placement"] == "1cpu":  # every thread of the measurement on the one CPU, read back
        roles = {t["role"] for t in info["threads"]}
        assert roles == {"client", "in-process"}
        assert {t["name"] for t in info["threads"]} >= {"ZMQbg/IO/0", "ZMQbg/Reaper"}
        assert len({tuple(t["cpus"]) for t in info["threads"]}) == 1
        assert len(info["threads"][0]["cpus"]) == 1
    assert "pyzmq" in info["versions"]


def test_a_broken_project_module_fails_the_benchmark_not_skips(suite, tmp_path):
    """The benchmark module with pyconcbench.zmq._pyzmq replaced by a copy with a NameError:
    one failure with its one line, not a skip (before, a planted bug gave a green run)."""
    if _unavailable("pyzmq_single"):
        pytest.skip(_unavailable("pyzmq_single"))
    planted = tmp_path / "planted"
    planted.mkdir()
    line = _broken_copy(planted, "_pyzmq", PLANTED_BUGS["NameError"][0])
    suite.makeconftest("import pyconcbench.zmq\npyconcbench.zmq.__path__.insert(0, %r)\n" % str(planted))
    result = suite.runpytest_subprocess("-k", "pyzmq_single-200B-if1]", "--pcb-messages", "50",
                                        "--pcb-rounds", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([  # the failure's whole report: one line, no traceback
        "*_ test_zmq[[]pyzmq_single-200B-if1] _*",
        "pyzmq_single-200B-if1: pyzmq_single: its implementation pyconcbench.zmq._pyzmq does not import: "
        "NameError: name 'pcb_planted_bug' is not defined (%s:%d)" % (planted / "_pyzmq.py", line),
        "=*"], consecutive=True)
