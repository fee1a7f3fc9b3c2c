"""pyconcbench.harness: start-up failures, stopping, cleanup on every path, and pinning.

Misbehaving servers are fake interpreters: small scripts passed as ``python=``, which the
harness runs as ``SCRIPT -m pyconcbench.serve IMPL ...``.
"""
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from brokenservers import connect, exchange
from proctools import end
from pyconcbench import harness
from pyconcbench.harness import (
    PinningPlan,
    ServerBroken,
    ServerError,
    ServerProcess,
    ServerUnavailable,
    ServerUsage,
)

USAGE = {
    "impl": "selectors", "user": 0.5, "system": 0.25, "maxrss_kib": 10240, "accepted": 3,
    "bytes": 4096, "errors": 0, "signal": "SIGTERM",
}
# The fake servers below announce port 9 and serve nothing: they run with malloc="pristine",
# which makes no pre-flight connections.
READY = {
    "impl": "fake", "transport": "tcp", "host": "127.0.0.1", "port": 9, "path": None,
    "pid": 0, "cpu": [0], "python": "3",
}


@pytest.fixture
def fake_python(tmp_path):
    """fake_python(body) -> path of an executable Python script standing in for the server."""
    def make(body):
        path = tmp_path / "fake-python"
        path.write_text("#!%s\n%s" % (sys.executable, textwrap.dedent(body)))
        path.chmod(0o755)
        return str(path)
    return make


def gone(pid):
    """True once pid has exited (a zombie nobody reaped counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_ready_timeout_kills_the_server(fake_python):
    script = fake_python("""
        import sys, time
        print("warming up", file=sys.stderr, flush=True)
        time.sleep(30)
    """)
    server = ServerProcess("selectors", python=script, ready_timeout=0.5, cpu=None)
    began = time.monotonic()
    with pytest.raises(ServerError, match=r"did not print READY within 0.5 s") as info:
        server.start()
    assert time.monotonic() - began < 3.0
    assert "warming up" in str(info.value)
    assert gone(server.pid)
    with pytest.raises(ServerError) as again:
        server.stop()
    assert again.value is info.value


def test_crash_at_start_up_carries_its_stderr(fake_python):
    script = fake_python("""
        import sys
        print("boom: the config is broken", file=sys.stderr)
        sys.exit(1)
    """)
    with pytest.raises(ServerError, match="exited with code 1 before READY") as info:
        ServerProcess("selectors", python=script, cpu=None).start()
    assert not isinstance(info.value, ServerUnavailable)
    assert "boom: the config is broken" in str(info.value)


def test_exit_code_3_means_unavailable_with_the_servers_line(fake_python):
    script = fake_python("""
        import sys
        print("implementation 'x' needs y: pip install 'pyconcbench[y]'", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(ServerUnavailable) as info:
        ServerProcess("x", python=script, cpu=None).start()
    assert str(info.value) == "implementation 'x' needs y: pip install 'pyconcbench[y]'"


def test_exit_code_4_means_broken_with_the_servers_line(fake_python):
    script = fake_python("""
        import sys
        print("implementation 'x': its module pyconcbench.servers.x does not import: NameError: "
              "name 'y' is not defined (pyconcbench/servers/x.py:3)", file=sys.stderr)
        sys.exit(4)
    """)
    with pytest.raises(ServerBroken) as info:
        ServerProcess("x", python=script, cpu=None).start()
    assert not isinstance(info.value, ServerUnavailable)
    assert str(info.value) == ("implementation 'x': its module pyconcbench.servers.x does not import: "
                               "NameError: name 'y' is not defined (pyconcbench/servers/x.py:3)")


def test_exit_code_2_cannot_run_as_asked_is_a_failure_not_a_skip(fake_python):
    script = fake_python("""
        import sys
        print("pyconcbench.serve: cannot pin to CPU 4096 (allowed: [0, 1]): Invalid argument", file=sys.stderr)
        sys.exit(2)
    """)
    with pytest.raises(ServerError) as info:
        ServerProcess("x", python=script, cpu=None).start()
    assert not isinstance(info.value, ServerUnavailable)
    assert str(info.value) == ("server 'x' cannot run as asked (exit code 2): pyconcbench.serve: cannot "
                               "pin to CPU 4096 (allowed: [0, 1]): Invalid argument")


def test_unknown_impl_is_a_failure_not_a_skip():
    with pytest.raises(ServerError, match="unknown implementation 'nope'; known: ") as info:
        ServerProcess("nope").start()
    assert not isinstance(info.value, ServerUnavailable)


def test_a_broken_server_module_is_broken_not_unavailable(fake_python, tmp_path):
    """A module of ours that raises on import (here selectors' module, replaced by a copy with a
    NameError): serve exits 4 with one line naming the error and where; the harness raises
    ServerBroken (a failure), never ServerUnavailable (a skip)."""
    from pyconcbench.servers import selectors

    with open(selectors.__file__) as f:
        lines = f.read().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("from __future__ ")) + 1
    lines.insert(at, "pcb_planted_bug\n")
    (tmp_path / "pcb_broken.py").write_text("".join(lines))
    script = fake_python("""
        import sys
        from pyconcbench import serve, servers
        servers.IMPLS["selectors"] = servers.IMPLS["selectors"]._replace(module="pcb_broken")
        servers.__path__.append(%r)
        sys.exit(serve.main(sys.argv[3:]))  # as python -m pyconcbench.serve
    """ % str(tmp_path))
    line = ("pyconcbench.serve: implementation 'selectors': its module pyconcbench.servers.pcb_broken "
            "does not import: NameError: name 'pcb_planted_bug' is not defined (%s:%d)"
            % (tmp_path / "pcb_broken.py", at + 1))
    result = subprocess.run([script, "-m", "pyconcbench.serve", "selectors"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr.splitlines()) == (4, "", [line])
    with pytest.raises(ServerError) as info:
        ServerProcess("selectors", python=script, cpu=None).start()
    assert not isinstance(info.value, ServerUnavailable)
    assert isinstance(info.value, ServerBroken) and str(info.value) == line


def test_garbage_instead_of_ready(fake_python):
    script = fake_python("""
        import time
        print("hello", flush=True)
        time.sleep(30)
    """)
    server = ServerProcess("selectors", python=script, cpu=None)
    with pytest.raises(ServerError, match="printed b'hello' instead of READY"):
        server.start()
    assert gone(server.pid)


def test_unreadable_ready_line(fake_python):
    script = fake_python("""
        import time
        print("READY {not json", flush=True)
        time.sleep(30)
    """)
    server = ServerProcess("selectors", python=script, cpu=None)
    with pytest.raises(ServerError, match="unreadable READY line"):
        server.start()
    assert gone(server.pid)


def test_server_ignoring_sigterm_is_killed_and_said_so(fake_python):
    script = fake_python("""
        import json, os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("READY " + json.dumps(dict(%s, pid=os.getpid())), flush=True)
        time.sleep(30)
    """ % (READY,))
    server = ServerProcess("fake", python=script, cpu=None, malloc="pristine", stop_timeout=0.5).start()
    with pytest.raises(ServerError, match=r"ignored SIGTERM for 0.5 s and was killed \(SIGKILL\)"):
        server.stop()
    assert gone(server.pid)
    with pytest.raises(ServerError, match="SIGKILL"):  # the same error again
        server.stop()


def test_stop_parses_the_last_json_line(fake_python):
    script = fake_python("""
        import json, os, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        print("READY " + json.dumps(dict(%s, pid=os.getpid())), flush=True)
        signal.sigwait([signal.SIGTERM])
        print(json.dumps(%s))
    """ % (READY, USAGE))
    server = ServerProcess("fake", python=script, cpu=None, malloc="pristine")
    with server:
        assert server.address == ("127.0.0.1", 9)
        assert server.ready["pid"] == server.pid
    assert server.stop() == ServerUsage.from_dict(USAGE)


def test_stop_is_idempotent_and_exit_after_stop_is_quiet():
    with ServerProcess("selectors", cpu=None) as server:
        first = server.stop()
        assert server.stop() is first
    assert first.signal == "SIGTERM"
    with pytest.raises(ServerError, match="exited with code"):
        server.check_alive()


def test_error_in_the_body_stops_the_server_and_propagates():
    with pytest.raises(KeyError):
        with ServerProcess("selectors", cpu=None) as server:
            raise KeyError("body")
    assert gone(server.pid)


def test_collected_server_object_kills_its_process():
    server = ServerProcess("selectors", cpu=None).start()
    pid = server.pid
    del server
    gc.collect()
    assert gone(pid)


def test_a_server_killed_from_outside_is_reported():
    server = ServerProcess("selectors", cpu=None).start()
    os.kill(server.pid, signal.SIGKILL)
    assert wait_gone(server.pid, 2.0)
    with pytest.raises(ServerError, match=r"exited with code -9"):
        server.check_alive()
    with pytest.raises(ServerError, match=r"exited with code -9"):
        server.stop()


def test_cpu_times_and_rss_while_running():
    with ServerProcess("selectors", cpu=None) as server:
        with connect(server.address) as sock:
            assert exchange(sock, b"x" * 1_000_000) == b"x" * 1_000_000
        user, system = server.cpu_times()
        assert user >= 0 and system >= 0 and user + system > 0
        rss, peak = server.rss_kib(), server.peak_rss_kib()
        assert 0 < rss <= peak
        server.check_alive()
        usage = server.stop()
    assert usage.user + usage.system >= user + system - 0.02
    with pytest.raises(ServerError):
        server.cpu_times()


def test_unix_transport_uses_a_temporary_directory_and_removes_it():
    with ServerProcess("selectors", transport="unix", cpu=None) as server:
        path = server.address
        assert os.path.exists(path)
        with connect(path) as sock:
            assert exchange(sock, b"over unix") == b"over unix"
    assert not os.path.exists(os.path.dirname(path))


def test_extra_env_reaches_the_server(fake_python):
    script = fake_python("""
        import json, os, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        ready = dict(%s, pid=os.getpid(), impl=os.environ["PCB_TEST_VALUE"])
        print("READY " + json.dumps(ready), flush=True)
        signal.sigwait([signal.SIGTERM])
    """ % (READY,))
    server = ServerProcess("fake", python=script, cpu=None, malloc="pristine", env={"PCB_TEST_VALUE": "seen"})
    try:
        assert server.start().ready["impl"] == "seen"
    finally:
        with pytest.raises(ServerError, match="no usable usage report"):
            server.stop()


@pytest.mark.parametrize("kwargs, message", [
    (dict(transport="udp"), "transport must be"),
    (dict(host="8.8.8.8"), "not a loopback address"),
    (dict(cpu=10_000), "cannot pin the server to CPU 10000"),
    (dict(ready_timeout=0), "must be > 0"),
])
def test_bad_arguments_fail_before_starting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerProcess("selectors", **kwargs)


MIDDLE = """
import sys, time
from pyconcbench.harness import ServerProcess
server = ServerProcess("selectors", cpu=None).start()
print(server.pid, flush=True)
time.sleep(30)
"""


def test_server_dies_with_its_parent():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL)
    try:
        server_pid = int(middle.stdout.readline())
    finally:
        middle.kill()
        middle.wait()
        middle.stdout.close()
    assert wait_gone(server_pid, 2.0), "server %d outlived its parent" % server_pid


def test_pinning_plan(monkeypatch):
    monkeypatch.setattr(harness, "cpus_available", lambda: [0])
    assert harness.pinning_plan() == PinningPlan(None, None, "pinning off: only one CPU available")
    monkeypatch.setattr(harness, "cpus_available", lambda: [0, 1, 2, 3])
    plan = harness.pinning_plan()
    assert (plan.server_cpu, plan.load_cpu) == (0, 1)
    assert (harness.pinning_plan(2, 3).server_cpu, harness.pinning_plan(2, 3).load_cpu) == (2, 3)
    monkeypatch.setattr(harness, "cpus_available", lambda: [4, 6])
    plan = harness.pinning_plan()
    assert (plan.server_cpu, plan.load_cpu) == (4, 6)
    assert "not both available" in plan.note
    with pytest.raises(ValueError, match="different CPUs"):
        harness.pinning_plan(1, 1)


def test_cpus_available_is_this_process_affinity():
    assert harness.cpus_available() == sorted(os.sched_getaffinity(0))


def test_server_usage_round_trip_and_validation():
    usage = ServerUsage.from_dict(USAGE)
    assert usage.as_dict() == USAGE
    assert ServerUsage.from_dict(json.loads(json.dumps(usage.as_dict()))) == usage
    with pytest.raises(ValueError, match="lacks bytes"):
        ServerUsage.from_dict({k: v for k, v in USAGE.items() if k != "bytes"})
    with pytest.raises(ValueError, match="accepted"):
        ServerUsage.from_dict(dict(USAGE, accepted=-1))
    with pytest.raises(ValueError, match="user"):
        ServerUsage.from_dict(dict(USAGE, user="1"))


# ---- when the parent is killed: the guard's backstop, the socket's directory ---------------------

DEAF_SERVER = """
import os, signal, subprocess, sys, time
from pyconcbench import serve, servers

def deaf(sock, stop_fd, stats):
    # deaf to SIGTERM, with a process of its own (in its group) deaf to it too
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helper = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                               "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    with open(os.environ["PCB_TEST_PIDS"], "w") as f:
        f.write("%d %d\\n" % (os.getpid(), helper.pid))
    while True:
        time.sleep(1)

servers.load = lambda name: deaf
sys.exit(serve.main(sys.argv[3:]))
"""

KILLED_MIDDLE = """
import sys, time
from pyconcbench.harness import ServerProcess
python = sys.argv[1] or sys.executable
server = ServerProcess("selectors", python=python, transport="unix", cpu=None, malloc="pristine").start()
print(server.pid, server.unix_path, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _kill_middle_and_wait(fake, env=None):
    """Starts a process that starts a server (``fake``: its python, '' for the real one) and
    SIGKILLs it; returns (server pid, socket path)."""
    middle = subprocess.Popen([sys.executable, "-c", KILLED_MIDDLE, fake], stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, env=dict(os.environ, **(env or {})))
    try:
        line = middle.stdout.readline().split()
        assert len(line) == 2, "the middle process did not start its server"
        pid, path = int(line[0]), line[1].decode()
        return middle, pid, path
    except BaseException:
        middle.kill()
        middle.wait()
        raise


def test_a_server_deaf_to_sigterm_is_killed_with_its_group_when_pytest_is_killed(fake_python, tmp_path):
    """pytest SIGKILLed: the server gets the parent-death SIGTERM and ignores it; its guard
    kills it and its helper process after procs.ORPHAN_GRACE s and removes its socket's
    temporary directory."""
    pids_file = tmp_path / "pids"
    middle, server_pid, path = _kill_middle_and_wait(fake_python(DEAF_SERVER), {"PCB_TEST_PIDS": str(pids_file)})
    pids = [server_pid]
    try:
        deadline = time.monotonic() + 30
        while not pids_file.exists() or not pids_file.read_text().endswith("\n"):
            assert time.monotonic() < deadline, "the deaf server did not start its helper"
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert pids[0] == server_pid and not gone(pids[1])
        middle.kill()
        middle.wait(10)
        for pid in pids:  # a bound far above the grace, for a busy machine
            assert wait_gone(pid, 60), "pid %d outlived its parent" % pid
        tmpdir = os.path.dirname(path)
        deadline = time.monotonic() + 10
        while os.path.exists(tmpdir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(tmpdir)
    finally:
        end(middle, pids)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_a_server_removes_its_socket_directory_when_pytest_is_killed():
    middle, server_pid, path = _kill_middle_and_wait("")
    tmpdir = os.path.dirname(path)
    try:
        assert os.path.basename(tmpdir).startswith("pcb-sock-") and os.path.exists(path)
        middle.kill()
        middle.wait(10)
        assert wait_gone(server_pid, 60)
        deadline = time.monotonic() + 10
        while os.path.exists(tmpdir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(tmpdir), "the server left its socket's directory behind"
    finally:
        end(middle, [server_pid])
        shutil.rmtree(tmpdir, ignore_errors=True)
