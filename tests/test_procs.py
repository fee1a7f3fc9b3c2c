"""pyconcbench.procs: the one child-process helper every spawner of the suite uses."""
import os
import signal
import subprocess
import sys
import time

import pytest

from pyconcbench import procs
from proctools import alive, end, wait_for

PY = sys.executable


def test_ready_line_and_clean_stop_with_its_last_words():
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(0)))\n"
            "print('READY {\"x\": 1}', flush=True)\n"
            "time.sleep(60)\n")
    child = procs.Child([PY, "-c", code]).start()
    assert child.read_line(10) == b'READY {"x": 1}'
    assert child.poll() is None
    assert child.stop(10) == 0 and not child.killed
    assert child.out.strip() == b"bye"
    assert child.rusage is not None  # reaped with wait4
    assert child.stop(10) == 0  # idempotent


def test_a_line_protocol_over_its_stdin():
    code = "import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)\n"
    child = procs.Child([PY, "-c", code], stdin_pipe=True).start()
    try:
        child.write_line(b"ping")
        assert child.read_line(10) == b"PING"
        child.write_line(b"again")
        assert child.read_line(10) == b"AGAIN"
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        with pytest.raises(procs.ChildError, match="cannot write to"):  # its end closed: one line, no hang
            child.write_line(b"anyone?")
    finally:
        child.close()
    with procs.Child([PY, "-c", "pass"]).start() as plain:  # stdin /dev/null unless asked
        with pytest.raises(procs.ChildError, match="no stdin pipe"):
            plain.write_line(b"x")


def test_exit_before_ready_gives_none_its_code_and_stderr():
    child = procs.Child([PY, "-c", "import sys; print('no luck', file=sys.stderr); sys.exit(3)"]).start()
    try:
        assert child.read_line(10) is None
        assert child.wait(10) == procs.EXIT_MISSING
        assert child.stderr_tail() == ["no luck"]
        assert procs.meaning(child.returncode) == "not available here"
    finally:
        child.close()


def test_silence_is_a_timeout_and_close_kills_and_reaps():
    child = procs.Child([PY, "-c", "import time; time.sleep(60)"]).start()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        child.read_line(0.3)
    assert 0.25 < time.monotonic() - started < 5
    pid = child.pid
    child.close()
    assert child.returncode == -signal.SIGKILL and not alive(pid)


def test_sigterm_ignored_means_sigkill_to_the_whole_group():
    # the child ignores SIGTERM and starts a grandchild that ignores it too
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
            "print(g.pid, flush=True)\n"
            "time.sleep(60)\n")
    child = procs.Child([PY, "-c", code]).start()
    grandchild = int(child.read_line(10))
    started = time.monotonic()
    code = child.stop(0.5)
    assert child.killed and code == -signal.SIGKILL
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(grandchild)  # the group got the SIGKILL, not only the child


MIDDLE = """
import sys, time
from pyconcbench import procs
child = procs.Child([sys.executable, "-c", "import time; time.sleep(60)"]).start()
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_dies_with_its_parent():
    middle = subprocess.Popen([PY, "-c", MIDDLE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        grandchild = int(middle.stdout.readline())
        assert alive(grandchild)
        middle.kill()  # no clean-up of its own: only the parent-death signal can stop the child
        middle.wait(10)
        deadline = time.monotonic() + 5
        while alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not alive(grandchild)
    finally:
        middle.stdout.close()
        if middle.poll() is None:
            middle.kill()
            middle.wait()


def test_pinned_before_exec_and_run_to_end():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    child = procs.Child([PY, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], cpu=cpu).start()
    try:
        assert child.run_to_end(10) == 0
        assert child.out.strip() == str([cpu]).encode()
    finally:
        child.close()


def test_a_program_that_cannot_start_is_one_line():
    with pytest.raises(procs.ChildError, match="cannot start /nonexistent/prog"):
        procs.Child(["/nonexistent/prog"]).start()


def test_the_parent_check_in_the_child():
    env = dict(os.environ, **{procs.PARENT_ENV: str(os.getpid())})
    code = "from pyconcbench import procs; import sys; sys.exit(0 if procs.arm_parent_death() else 1)"
    assert subprocess.run([PY, "-c", code], env=env).returncode == 0
    env[procs.PARENT_ENV] = "1"  # not our parent: the child must give up
    assert subprocess.run([PY, "-c", code], env=env).returncode == 1


@pytest.mark.parametrize("code, words", [(0, "ok"), (2, "cannot run as asked"), (4, "our own code is broken"),
                                         (5, "stopped by an injected fault"), (-9, "killed by SIGKILL"),
                                         (7, "exit code 7"), (None, "still running")])
def test_exit_code_meanings(code, words):
    assert procs.meaning(code) == words


# ---- the guard: a child that outlives its parent is killed -----------------------------------------

GUARDED = """
import os, signal, sys, time
from pyconcbench import procs
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the parent-death signal
assert procs.arm_parent_death()
print(procs.start_guard(grace=float(sys.argv[1])), flush=True)
if sys.argv[2] == "exit":
    os._exit(0)
time.sleep(300)
"""

GUARD_MIDDLE = """
import sys
from pyconcbench import procs
child = procs.Child([sys.executable, "-c", %r, "0.5", "hang"]).start()
print(child.pid, int(child.read_line(30)), flush=True)
sys.stdin.read()  # until the test kills this process
""" % GUARDED


def test_a_child_deaf_to_sigterm_is_killed_by_its_guard_when_the_parent_is_killed():
    middle = subprocess.Popen([PY, "-c", GUARD_MIDDLE], stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    pids = []
    try:
        pids = [int(p) for p in middle.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        middle.kill()  # SIGKILL: no clean-up of its own; the child gets SIGTERM and ignores it
        middle.wait(10)
        for pid in pids:  # the guard's grace is 0.5 s; a generous bound for a busy machine
            assert wait_for(lambda: not alive(pid), 60), f"pid {pid} outlived its parent"
    finally:
        end(middle, pids)


def test_the_guard_dies_with_its_child():
    child = procs.Child([PY, "-c", GUARDED, "60", "exit"]).start()
    try:
        guard = int(child.read_line(30))
        assert child.wait(30) == 0
        assert wait_for(lambda: not alive(guard), 30)
    finally:
        child.close()


def test_no_guard_for_a_process_that_does_not_lead_its_group():
    """Started with PCB_PARENT_PID but in its parent's process group (not by Child): a guard
    would SIGKILL the parent's whole group (a shell pipeline, tox), so there is none."""
    env = dict(os.environ, **{procs.PARENT_ENV: str(os.getpid())})
    code = "from pyconcbench import procs; print(procs.start_guard())"
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None", out.stderr


def test_no_guard_without_a_parent_of_ours():
    env = {k: v for k, v in os.environ.items() if k != procs.PARENT_ENV}
    code = "from pyconcbench import procs; print(procs.start_guard())"
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None"


# ---- temporary directories -----------------------------------------------------------------------

def test_make_tmpdir_names_its_maker_and_is_private():
    path = procs.make_tmpdir("sock")
    try:
        assert os.path.basename(path).startswith(f"pcb-sock-{os.getpid()}-")
        assert os.stat(path).st_mode & 0o777 == 0o700
    finally:
        os.rmdir(path)


def test_sweep_removes_only_the_directories_of_makers_that_are_gone(tmp_path):
    dead = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60).stdout.strip()
    stale = tmp_path / f"pcb-sock-{dead}-abc_123"
    stale.mkdir()
    (stale / "echo.sock").write_text("")
    mine = tmp_path / f"pcb-zmq-{os.getpid()}-xyz"
    mine.mkdir()
    old_style = tmp_path / "pcb-q1w2e3"  # no maker in its name: not ours to judge
    old_style.mkdir()
    a_file = tmp_path / f"pcb-sys-{dead}-file"
    a_file.write_text("")
    young = tmp_path / f"pcb-sock-{dead}-young"  # its server may be in its guard's grace still
    young.mkdir()
    made_up = tmp_path / ("pcb-sock-" + "9" * 30 + "-abc")  # no such pid can exist: no OverflowError
    made_up.mkdir()
    old = time.time() - procs.STALE_AGE - 60
    for path in (stale, mine, old_style, a_file, made_up):
        os.utime(path, (old, old))
    assert sorted(procs.sweep_stale_tmpdirs(str(tmp_path))) == sorted([str(stale), str(made_up)])
    assert not stale.exists() and not made_up.exists()
    assert mine.exists() and old_style.exists() and a_file.exists() and young.exists()
    assert procs.sweep_stale_tmpdirs(str(tmp_path / "nonexistent")) == []
