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

from proctools import alive, children, cmdline, group, wait_for
from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)


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
        assert wait_for(lambda: servers.update({p: cmdline(p) for p in children(proc.pid)
                                                if "pyconcbench.serve" in cmdline(p)}) or servers, 60), \
            "the server never started"
        time.sleep(3)  # connected, warmed up, inside the measured round
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        started = time.monotonic()
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - started
        text = out.decode(errors="replace")
        assert wait_for(lambda: not any(alive(p) for p in servers), 15), \
            f"server processes left running after {signal.Signals(signum).name}: {servers}"
        # nor anything of their process groups (each server's guard, anything it started)
        assert wait_for(lambda: not any(group(p) for p in servers), 15), \
            f"processes of the servers' groups left running: {[group(p) for p in servers]}"
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
            for left in group(pid):
                os.kill(left, signal.SIGKILL)
