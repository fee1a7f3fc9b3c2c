"""The extension on a free-threaded CPython (3.13t+): importing it leaves the GIL off
(``Py_mod_gil`` = not used), and what it shares between threads is guarded -- a Histogram's
counts (each method holds the object's lock), a Load's calls (claimed atomically).  The
concurrency checks run on every build (with the GIL they check the same contract); the GIL
check needs a free-threaded interpreter (``tox -e py314t``, or ``tools/get_pythons.sh 3.13t``)."""
import os
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import textwrap

import pytest

from pyconcbench import _native

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@pytest.mark.skipif(not FREE_THREADED, reason="not a free-threaded interpreter (the GIL build has no GIL to keep off)")
def test_importing_the_extension_leaves_the_gil_off():
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("error")  # the re-enabling warning would be an error
        before = sys._is_gil_enabled()
        import pyconcbench._native
        print(before, sys._is_gil_enabled())
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], out.stdout


def test_threads_recording_into_one_histogram_lose_nothing():
    h = _native.Histogram()
    threads, per = 8, 20_000
    values = [1000 + 37 * i for i in range(per)]
    start = threading.Barrier(threads)

    def work():
        start.wait()
        for v in values:
            h.record(v)
        h.record_many(values)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert h.count == threads * per * 2
    assert h.min == min(values) and h.max == max(values)


def test_threads_merging_into_one_histogram_lose_nothing():
    total = _native.Histogram()
    part = _native.Histogram()
    part.record_many(range(1000, 2000))
    start = threading.Barrier(6)

    def work():
        start.wait()
        for _ in range(500):
            total.merge(part)
            total.summary()  # readers alongside the writers

    ts = [threading.Thread(target=work) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert total.count == 6 * 500 * 1000


def test_threads_racing_close_against_a_running_phase_cannot_free_it():
    """One thread runs a phase against a server that never answers; others try close() and
    phase() meanwhile: each is refused (RuntimeError) and the phase ends by its own stall timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        load = _native.Load("tcp", "127.0.0.1", port, 4, 64)
        assert load.open()["status"] == "ok"
        started = threading.Event()
        refused = []

        def rival(call):
            started.wait()
            time.sleep(0.5)  # well inside the phase, which stalls for 3 s
            for _ in range(50):
                try:
                    call()
                except RuntimeError as exc:
                    refused.append(str(exc))

        rivals = [threading.Thread(target=rival, args=(c,))
                  for c in (load.close, lambda: load.phase(1, 0.0, 3.0, 10.0)) * 3]
        for t in rivals:
            t.start()
        started.set()
        res = load.phase(1, 0.0, 3.0, 10.0)  # stalls for 3 s: nobody echoes
        for t in rivals:
            t.join()
        assert res["status"] == "stall", res
        assert load.is_open
        load.close()
        assert not load.is_open
    assert len(refused) == 300 and all("refused while Load.phase() runs" in r for r in refused), refused[:3]


def test_machine_facts_say_which_build_and_whether_the_gil_is_on():
    from pyconcbench import machine
    facts = machine.machine_facts()
    assert facts["python_build"] == ("free-threaded" if FREE_THREADED else "default")
    expected = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    assert facts["gil_enabled"] is expected


def test_tables_name_a_free_threaded_python_by_its_gil():
    from pyconcbench import metrics
    assert metrics.python_label("3.13.15", "default", True) == "3.13.15"
    assert metrics.python_label("3.13.15", "free-threaded", False) == "3.13.15t (no GIL)"
    assert metrics.python_label("3.13.15", "free-threaded", True) == "3.13.15t (GIL on)"
    assert metrics.python_label("3.11.7") == "3.11.7"  # runs saved before the fact existed


def test_a_baseline_from_the_other_build_is_another_python_to_the_gate():
    from pyconcbench import gate
    base = {"pyconcbench": {"python": "3.13.15", "python_build": "default", "gil_enabled": True}}
    new = {"pyconcbench": {"python": "3.13.15", "python_build": "free-threaded", "gil_enabled": False}}
    assert gate.fact_differences(base, new) == ["python_build: default -> free-threaded", "gil_enabled: True -> False"]
