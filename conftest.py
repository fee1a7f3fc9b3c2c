"""Project-wide test configuration: pytester for the plugin tests, and a leak check after
every test (child processes, server processes, file descriptors)."""
import os

import pytest

pytest_plugins = ["pytester"]


def _children():
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = "?"
            out.append(f"{pid} {cmd}")
    return out


def _fds():
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fails a test that leaves a child process behind or a file descriptor open."""
    fds = _fds()
    yield
    left = _children()
    if left:
        pytest.fail("test left child processes running: " + "; ".join(left), pytrace=False)
    leaked = _fds() - fds
    if leaked:
        targets = []
        for fd in sorted(leaked, key=int):
            try:
                targets.append(f"{fd} -> {os.readlink('/proc/self/fd/' + fd)}")
            except OSError:
                pass
        if targets:
            pytest.fail("test leaked file descriptors: " + ", ".join(targets), pytrace=False)


@pytest.fixture(autouse=True)
def fresh_noise_budget(request, monkeypatch):
    """Each unit test gets its own noise budget (pyconcbench.rounds.BUDGET): the session's is
    spent by the benchmark runs before it on a noisy host, and a spent budget turns every retry
    a test expects into 'noise budget spent'.  The benchmark suite (pyconcbench/suite) keeps the
    session's, as a real run does."""
    if "suite" in request.node.path.parts:
        yield
        return
    from pyconcbench import rounds
    monkeypatch.setattr(rounds, "BUDGET", rounds.NoiseBudget())
    yield
