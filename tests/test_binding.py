"""The C binding (native/pcb_module.c) refuses what it cannot hold and cannot be misused: every
integer argument range-checked (nothing wraps), a load busy while a phase or an open runs
(close() or a second phase() then raise, from a thread or a signal handler), the cache-line
probe bounded and interruptible, huge seconds clamped, a latency beyond the histogram's range
failing the round in one line.  The fuzzing of the same arguments is in test_fuzz_binding.py.

The tests that, with a faulty binding, would crash or hang the interpreter run their case in a
child process with a timeout, so a regression is one failed test, not a lost session."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pyconcbench import _native, loadgen
from pyconcbench.loadgen import LoadError, LoadSpec

from brokenservers import BrokenServer

TESTS = Path(__file__).resolve().parent
CPU = sorted(os.sched_getaffinity(0))[0]
#: How long a child case may take before it counts as hung (a clean case takes about 2 s).
CHILD_TIMEOUT = 60.0


def run_child(body: str) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter (same environment: a sanitizer pass's build and
    preloads too) with `silent_listener()` defined; a hang is killed after CHILD_TIMEOUT."""
    prelude = textwrap.dedent("""
        import os, signal, socket, sys, threading, time
        from pyconcbench import _native

        def silent_listener():
            # accepts nothing: connections complete in the backlog, no byte is ever echoed
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(16)
            return s
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)


def child_lines(proc: subprocess.CompletedProcess) -> list:
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.splitlines()


# ---- integers: range-checked, never wrapped ----------------------------------------------

LOAD_ARGS = dict(family="tcp", address="127.0.0.1", port=9, connections=1, size=64)


@pytest.mark.parametrize("changes, error, fragment", [
    (dict(connections=-1), ValueError, "connections: must be an int in 1 .. 1048576, got -1"),
    (dict(connections=2 ** 32 + 1), ValueError, "connections: must be an int in 1 .. 1048576, got 4294967297"),
    (dict(connections=0), ValueError, "connections: must be an int in 1 .. 1048576, got 0"),
    (dict(connections=(1 << 20) + 1), ValueError, "connections: must be an int in 1 .. 1048576"),
    (dict(size=-1), ValueError, "size: must be an int in 1 .. 1048576, got -1"),
    (dict(size=2 ** 32 + 64), ValueError, "size: must be an int in 1 .. 1048576, got 4294967360"),
    (dict(max_errors=-1), ValueError, "max_errors: must be an int in 0 .. 4294967295, got -1"),
    (dict(max_errors=2 ** 32), ValueError, "max_errors: must be an int in 0 .. 4294967295, got 4294967296"),
    (dict(seed=-1), ValueError, "seed: must be an int in 0 .. 18446744073709551615, got -1"),
    (dict(seed=2 ** 64), ValueError, "seed: must be an int in 0 .. 18446744073709551615"),
    (dict(cpu=-2), ValueError, "cpu: must be an int in -1 .. 1023, got -2"),
    (dict(cpu=1024), ValueError, "cpu: must be an int in -1 .. 1023, got 1024"),
    (dict(cpu=2 ** 40), ValueError, "cpu: must be an int in -1 .. 1023"),
    (dict(port=2 ** 32 + 9), ValueError, "port: must be an int in 0 .. 65535, got 4294967305"),
    (dict(port=-1), ValueError, "port: must be an int in 0 .. 65535, got -1"),
    (dict(connections=4096, size=1 << 20), ValueError, "needs more than 2 GiB of message buffers"),
    (dict(connections=1.5), TypeError, "connections: must be an int, got float"),
    (dict(seed="1"), TypeError, "seed: must be an int, got str"),
])
def test_load_refuses_out_of_range_integers(changes, error, fragment):
    args = dict(LOAD_ARGS, **changes)
    with pytest.raises(error) as info:
        _native.Load(**args)
    assert fragment in str(info.value)


def test_load_accepts_the_edges_of_each_range():
    _native.Load("tcp", "127.0.0.1", 65535, 1 << 20, 2048, cpu=1023, max_errors=2 ** 32 - 1,
                 seed=2 ** 64 - 1)
    _native.Load("tcp", "127.0.0.1", 1, 2048, 1 << 20, cpu=-1, max_errors=0, seed=0)


@pytest.mark.parametrize("changes, fragment", [
    (dict(messages=2 ** 63), "LoadSpec.messages: must be at most 9223372036854775807"),
    (dict(warmup_messages=2 ** 70), "LoadSpec.warmup_messages: must be at most"),
    (dict(max_errors=2 ** 32), "LoadSpec.max_errors: must be at most 4294967295, got 4294967296"),
    (dict(connections=(1 << 20) + 1, size=1), "LoadSpec.connections: must be at most 1048576"),
])
def test_spec_has_upper_bounds(changes, fragment):
    with pytest.raises(ValueError) as info:
        LoadSpec(port=9, **changes)
    assert fragment in str(info.value)


def test_spec_limits_are_the_engines():
    # the documented values, which test_fuzz_binding.py writes out too
    assert loadgen.MAX_PAYLOAD_MEMORY == _native.MAX_PAYLOAD_MEMORY == 2 << 30
    assert loadgen.MAX_CONNECTIONS == _native.MAX_CONNECTIONS == 1 << 20
    assert loadgen.MAX_SIZE == _native.MAX_SIZE == 1 << 20
    assert loadgen.MAX_MESSAGES == _native.MAX_MESSAGES == 2 ** 63 - 1
    assert loadgen.MAX_ERRORS == _native.MAX_ERRORS == 2 ** 32 - 1
    assert _native.CACHELINE_MAX_ITERATIONS == 10 ** 7


def test_phase_refuses_negative_and_huge_message_counts():
    with BrokenServer("echo") as server:
        load = _native.Load("tcp", server.address[0], server.address[1], 1, 64)
        assert load.open()["status"] == "ok"
        try:
            for messages in (-1, 2 ** 64 + 5, 2 ** 63):
                with pytest.raises(ValueError, match=r"messages: must be an int in 0 \.\. 9223372036854775807"):
                    load.phase(messages, 0.0, 1.0, 0.5)
            assert load.phase(5, 0.0, 1.0, 5.0)["completed"] == 5  # still usable
        finally:
            load.close()


def test_histogram_count_is_checked_not_wrapped():
    h = _native.Histogram()
    with pytest.raises(ValueError, match=r"count: must be an int in 1 \.\. 4611686018427387904, got -1"):
        h.record(1000, -1)
    with pytest.raises(ValueError, match="got 18446744073709551617"):
        h.record(1000, 2 ** 64 + 1)  # would have been a count of 1
    assert h.count == 0 and h.out_of_range == 0


def test_histogram_counts_never_wrap():
    h = _native.Histogram()
    for _ in range(3):
        h.record(1000, 2 ** 62)
    h.record(1000, 2 ** 62 - 1)
    assert h.count == 2 ** 64 - 1
    with pytest.raises(OverflowError, match=r"count: the histogram would hold more than 2\*\*64-1 values"):
        h.record(2000)
    with pytest.raises(OverflowError, match="record_many: the histogram would hold more"):
        h.record_many([3000])
    one = _native.Histogram()
    one.record(1000)
    with pytest.raises(OverflowError, match="merge: the histogram would hold more"):
        one.merge(h)
    assert h.count == 2 ** 64 - 1 and one.count == 1  # nothing added by a refused call
    assert h.record(10 ** 12) is False and h.out_of_range == 1  # out of range still counts


def test_micro_run_integers_are_checked_not_wrapped():
    with pytest.raises(ValueError, match=r"threads: must be an int in 1 \.\. 4096, got -1"):
        _native.micro_run("sched_yield", 10, -1)
    with pytest.raises(ValueError, match=r"n: must be an int in 1 \.\. 4000000000, got -1"):
        _native.micro_run("call", -1)


# ---- seconds: clamped, never overflowed ----------------------------------------------------

def test_huge_seconds_are_clamped():
    # Before the clamp, 1e300 s became a negative deadline: the connect "timed out" at once and
    # the phase stalled at its first check.
    with BrokenServer("echo") as server:
        load = _native.Load("tcp", server.address[0], server.address[1], 2, 64, connect_timeout=1e300)
        res = load.open()
        assert res["status"] == "ok", res["message"]
        try:
            for stall, deadline in ((1e300, 1e300), (float("inf"), float("inf")), (1e18, 1e10)):
                res = load.phase(0, 0.3, stall, deadline)
                assert res["status"] == "ok", res["message"]
                assert res["completed"] > 0 and res["elapsed"] >= 0.25
        finally:
            load.close()


def test_spec_with_huge_timeouts_runs():
    with BrokenServer("echo") as server:
        r = loadgen.run(LoadSpec(host=server.address[0], port=server.address[1], connections=2,
                                 messages=0, duration=0.3, warmup_messages=10,
                                 connect_timeout=1e300, stall_timeout=1e300, deadline=1e300))
    assert r.completed > 0


def test_micro_run_with_a_huge_timeout_runs():
    assert _native.micro_run("call", 1000, timeout=1e300)["ops"] == 1000


# ---- busy: close() and a second phase() refuse while a phase runs ------------------------

def test_close_from_another_thread_during_a_phase_is_refused():
    lines = child_lines(run_child("""
        lst = silent_listener()
        load = _native.Load("tcp", "127.0.0.1", lst.getsockname()[1], 2, 64)
        assert load.open()["status"] == "ok"
        outcome = []
        def closer():
            while load.busy != "phase":  # the main thread is inside its phase (no fixed sleep)
                time.sleep(0.005)
            for call in (load.close, lambda: load.phase(1, 0.0, 1.0, 1.0), load.open):
                try:
                    call()
                    outcome.append("accepted")
                except RuntimeError as exc:
                    outcome.append(str(exc))
        t = threading.Thread(target=closer)
        t.start()
        res = load.phase(1, 0.0, 1.5, 10.0)
        t.join()
        print(res["status"])
        print("\\n".join(outcome))
        print("open after:", load.is_open)
        load.close()
        print("closed:", not load.is_open)
    """))
    assert lines[0] == "stall"  # the phase ran to its own end, the load intact
    assert lines[1] == ("Load.close(): refused while Load.phase() runs (from another thread or a "
                        "signal handler); call it after that returns")
    assert lines[2].startswith("Load.phase(): refused while Load.phase() runs")
    assert lines[3].startswith("Load.open(): refused while Load.phase() runs")
    assert lines[4:] == ["open after: True", "closed: True"]


def test_busy_names_the_call_holding_the_load():
    lines = child_lines(run_child("""
        lst = silent_listener()
        load = _native.Load("tcp", "127.0.0.1", lst.getsockname()[1], 2, 64)
        print(load.busy)
        assert load.open()["status"] == "ok"
        seen = []
        def watcher():
            while not seen:
                if load.busy is not None:
                    seen.append(load.busy)
                time.sleep(0.001)
        t = threading.Thread(target=watcher)
        t.start()
        load.phase(1, 0.0, 1.0, 10.0)
        t.join()
        print(seen[0], load.busy)
        load.close()
    """))
    assert lines == ["None", "phase None"]


def test_a_huge_int_is_refused_naming_the_argument_not_the_digit_limit():
    with pytest.raises(ValueError, match=r"^port: must be an int in 0 \.\. 65535, got one of 16610 bits$"):
        _native.Load("tcp", "127.0.0.1", 10 ** 5000, 1, 64)


def test_percentiles_from_a_list_that_changes_under_it_cannot_crash():
    """An item's __float__ empties the list being read (or another thread does, without the
    GIL): the histogram reads a private copy."""
    proc = run_child("""
        h = _native.Histogram()
        h.record(1000)
        lst = []
        class Sneaky:
            def __float__(self):
                lst.clear()
                return 50.0
        lst.extend([Sneaky(), 60.0, 70.0, 80.0])
        print(h.percentiles(lst))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[1000,", "1000,", "1000,", "1000]"]


def test_closing_a_session_during_its_round_is_refused_and_it_stays_open():
    lines = child_lines(run_child("""
        from pyconcbench import loadgen
        lst = silent_listener()
        spec = loadgen.LoadSpec(port=lst.getsockname()[1], connections=2, messages=1,
                                warmup_messages=0, stall_timeout=1.0)
        session = loadgen.LoadSession(spec).open()
        def closer():
            while session._load is None or session._load.busy != "phase":
                time.sleep(0.005)
            try:
                session.close()
                print("closed")
            except RuntimeError as exc:
                print(exc)
        t = threading.Thread(target=closer)
        t.start()
        try:
            session.round()
        except loadgen.LoadError as exc:
            t.join()
            print(exc.kind)
        print(session._load is not None and session._load.is_open)
        session.close()
        print(session._load is None)
    """))
    assert lines == ["Load.close(): refused while Load.phase() runs (from another thread or a signal "
                     "handler); call it after that returns", "stall", "True", "True"]


@pytest.mark.parametrize("call", ["close()", "phase(1, 0.0, 1.0, 1.0)"])
def test_a_signal_handler_cannot_close_or_rerun_the_running_phase(call):
    lines = child_lines(run_child(f"""
        lst = silent_listener()
        load = _native.Load("tcp", "127.0.0.1", lst.getsockname()[1], 2, 64)
        assert load.open()["status"] == "ok"
        def handler(signum, frame):
            load.{call}
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        try:
            load.phase(1, 0.0, 30.0, 30.0)
            print("no error")
        except RuntimeError as exc:
            print(type(exc).__name__, exc)
        print(time.monotonic() - t0 < 10)
        # the load is intact: the interrupted phase closed the connection that was out of step
        # (its message outstanding); the other one runs the next phase (into the silent server)
        res = load.phase(1, 0.0, 0.5, 5.0)
        print(res["status"], res["live"])
        load.close()
    """))
    assert lines[0].startswith("RuntimeError Load.")
    assert "refused while Load.phase() runs" in lines[0]
    assert lines[1:] == ["True", "stall 1"]


def test_a_signal_handler_cannot_close_a_load_being_opened():
    lines = child_lines(run_child("""
        lst = silent_listener()
        # more connections than the backlog holds: open() waits for the connect timeout
        load = _native.Load("tcp", "127.0.0.1", lst.getsockname()[1], 64, 64, connect_timeout=2.0)
        def handler(signum, frame):
            load.close()
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            load.open()
            print("no error")
        except RuntimeError as exc:
            print(exc)
        print(load.is_open)
    """))
    assert lines == ["Load.close(): refused while Load.open() runs (from another thread or a signal "
                     "handler); call it after that returns", "False"]


# ---- the cache-line probe: bounded and interruptible ---------------------------------------

@pytest.mark.parametrize("args, fragment", [
    ((CPU, CPU, 10 ** 9), "iterations: must be an int in 1 .. 10000000, got 1000000000"),
    ((CPU, CPU, 2 ** 70), "iterations: must be an int in 1 .. 10000000"),
    ((CPU, CPU, 0), "iterations: must be an int in 1 .. 10000000, got 0"),
    ((-1, CPU, 100), "cpu_a: must be an int in 0 .. 1023, got -1"),
    ((CPU, 2 ** 40, 100), "cpu_b: must be an int in 0 .. 1023"),
])
def test_cacheline_rtt_refuses_out_of_range_arguments(args, fragment):
    # in a child: an unbounded probe of 10**9 round trips would run for hours
    lines = child_lines(run_child(f"""
        try:
            _native.cacheline_rtt{args!r}
            print("accepted")
        except ValueError as exc:
            print(exc)
    """))
    assert len(lines) == 1 and lines[0].startswith(fragment), lines


def test_cacheline_rtt_is_interrupted_by_a_signal():
    # The largest count allowed, on one CPU (a round trip of microseconds: minutes of work).
    lines = child_lines(run_child(f"""
        class Interrupted(Exception):
            pass
        def handler(signum, frame):
            raise Interrupted()
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        try:
            _native.cacheline_rtt({CPU}, {CPU}, 10_000_000)  # CACHELINE_MAX_ITERATIONS
            print("finished")
        except Interrupted:
            print("interrupted")
        print(round(time.monotonic() - t0, 1))
        print(sorted(os.sched_getaffinity(0)) == {sorted(os.sched_getaffinity(0))!r})
        print(_native.cacheline_rtt({CPU}, {CPU}, 2000) > 0)  # and the probe works after
    """))
    assert lines[0] == "interrupted"
    assert float(lines[1]) < 10.0  # the signal ended it, not the minutes of round trips
    assert lines[2:] == ["True", "True"]  # the affinity was restored


# ---- a latency beyond the histogram's range -----------------------------------------------

def test_histogram_counts_a_latency_above_its_range():
    h = _native.Histogram()
    assert h.record(200 * 10 ** 9) is False
    assert h.record(5000) is True
    assert h.out_of_range == 1 and h.count == 1
    assert h.summary()["out_of_range"] == 1 and h.summary()["max"] == 5000


class FakeLoad:
    """Stands in for _native.Load: connects at once; every phase returns `latencies`."""

    latencies = [5000, 200 * 10 ** 9]

    def __init__(self, *args, **kwargs):
        pass

    def open(self):
        return {"status": "ok", "message": "", "elapsed": 0.01}

    def phase(self, messages, duration, stall_timeout, deadline, minimal=False, rate=0.0, arrival="uniform"):
        hist = _native.Histogram()
        hist.record_many(self.latencies)
        return {"status": "ok", "message": "", "completed": len(self.latencies), "elapsed": 200.0,
                "cpu_user": 0.0, "cpu_sys": 0.0, "errors": {k: 0 for k in loadgen.ERROR_KINDS},
                "waiting": 0, "live": 1, "bytes": 64 * len(self.latencies), "latency": hist,
                "latency_uncorrected": None, "sent": 0, "late": 0, "lag_mean": 0.0, "lag_max": 0.0,
                "per_conn": [len(self.latencies)]}

    def close(self):
        pass


def test_a_round_with_a_latency_above_the_range_fails_in_one_line(monkeypatch):
    monkeypatch.setattr(loadgen._native, "Load", FakeLoad)
    session = loadgen.LoadSession(LoadSpec(port=9, connections=1, warmup_messages=0))
    session.open()
    with pytest.raises(LoadError) as info:
        session.round()
    err = info.value
    assert err.kind == "latency_range"
    assert str(err) == ("load latency_range: 1 of 2 round trips took longer than 100 s (or under "
                        "100 ns), outside the latency histogram's range; p99 and max would leave "
                        "them out (slowest in range: 0.005 ms)")
    assert err.result["latency"].out_of_range == 1  # counted, kept with the error
    session.close()


def test_a_round_within_the_range_is_not_failed(monkeypatch):
    monkeypatch.setattr(FakeLoad, "latencies", [5000, 100 * 10 ** 9])  # 100 s: the range's top
    monkeypatch.setattr(loadgen._native, "Load", FakeLoad)
    with loadgen.LoadSession(LoadSpec(port=9, connections=1, warmup_messages=0)) as session:
        r = session.round()
    assert r.latency["max"] == 100 * 10 ** 9 and r.latency["out_of_range"] == 0
