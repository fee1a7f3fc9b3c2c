"""A benchmark run stopped from outside in the middle of a measured round: Ctrl-C (SIGINT),
SIGTERM (a CI runner cancelling the job) and SIGKILL (the runner's last resort).  Whatever stops
pytest, it stops promptly and no server process outlives it: SIGINT and SIGTERM through the
fixtures' own clean-up, SIGKILL through the parent-death signal each server arms."""
import os
import signal
import subprocess
import sys
import time
import pathlib

import pytest

BENCH_DIR = pathlib.Path(__file__).parent / "bench"


def _children_of(pid):
    """Pids of the live processes whose parent is ``pid``, with their command lines."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            out[int(name)] = cmd
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(cond, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_run_stopped_mid_round_leaves_no_server_behind(pytester, signum):
    pytester.makepyfile(test_echo=(BENCH_DIR / "test_echo.py").read_text())
    # one round of 60 s: the signal always lands inside a measured round
    proc = pytester.popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--pcb-impl", "selectors", "--pcb-conns", "10", "--pcb-duration", "60",
                           "--pcb-rounds", "1", "--pcb-reference", "none", "--pcb-malloc", "representative",
                           "-k", "c10-64B and not unix"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    servers = {}
    try:
        assert _wait_for(lambda: servers.update({p: c for p, c in _children_of(proc.pid).items()
                                                 if "pyconcbench.serve" in c}) or servers, 60), \
            "the server never started"
        time.sleep(3)  # connected, warmed up, inside the measured round
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        started = time.monotonic()
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - started
        text = out.decode(errors="replace")
        assert _wait_for(lambda: not any(_alive(p) for p in servers), 15), \
            f"server processes left running after {signal.Signals(signum).name}: {servers}"
        assert took < 20, f"pytest took {took:.1f} s to stop after {signal.Signals(signum).name}"
        if signum == signal.SIGINT:
            assert proc.returncode == 2 and "KeyboardInterrupt" in text, text[-2000:]
        else:
            assert proc.returncode == -signum, text[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in servers:  # a failed check must not leave its orphans to the next test
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
