"""python -m pyconcbench.serve: its command line, its refusals, and every implementation through
two of the conformance properties (``pyconcbench.conformance``: echo over TCP and UNIX, SIGTERM
with connections open) with the usage report each leaves; test_conformance.py runs the rest."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from brokenservers import connect, exchange
from skipping import start_or_skip
from pyconcbench import conformance, harness, serve, servers
from pyconcbench.harness import ServerProcess

def run_serve(*args, env=None, timeout=30):
    return subprocess.run(
        [sys.executable, "-m", "pyconcbench.serve", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def started(impl, **kwargs):
    """A started ServerProcess; skips when the implementation cannot run here."""
    server = ServerProcess(impl, **kwargs)
    return start_or_skip(server)


def test_help():
    result = run_serve("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: python -m pyconcbench.serve" in result.stdout
    for impl in servers.IMPLS:
        assert impl in result.stdout


def test_unknown_impl_is_one_line_naming_the_known_ids():
    result = run_serve("nope")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "unknown implementation 'nope'" in lines[0]
    for impl in servers.IMPLS:
        assert impl in lines[0]


# 0.0.0.0 and :: would bind fine, 10.0.0.1 would fail as "cannot bind": a "refusing" line
# shows the check comes before any socket is bound.
@pytest.mark.parametrize("host", ["8.8.8.8", "10.0.0.1", "0.0.0.0", "::", "example.com"])
def test_non_loopback_host_is_refused_before_binding(host):
    result = run_serve("selectors", "--host", host)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pyconcbench.serve: refusing host %r" % host)


def test_port_in_use():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = run_serve("selectors", "--port", str(port))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "pyconcbench.serve: cannot bind 127.0.0.1:%d: [Errno 98] Address already in use" % port
    )


def test_invalid_cpu():
    cpu = max(harness.cpus_available()) + 1000
    result = run_serve("selectors", "--cpu", str(cpu))
    assert result.returncode == 2
    assert result.stderr.startswith("pyconcbench.serve: cannot pin to CPU %d" % cpu)


def test_unix_path_that_is_not_a_socket_is_left_alone(tmp_path):
    path = tmp_path / "not-a-socket"
    path.write_text("keep me")
    result = run_serve("selectors", "--unix", str(path))
    assert result.returncode == 2
    assert "exists and is not a socket" in result.stderr
    assert path.read_text() == "keep me"


FAILING_IMPL = """
import sys
from pyconcbench import serve

def broken(sock, stop_fd, stats):
    stats.accepted = 1
    raise RuntimeError("kaput")

serve.servers.load = lambda impl: broken
sys.exit(serve.main(["selectors"]))
"""


def test_an_implementation_that_raises_still_reports_then_exits_1():
    result = subprocess.run([sys.executable, "-c", FAILING_IMPL], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stderr == "pyconcbench.serve: selectors failed: RuntimeError: kaput\n"
    ready, report = result.stdout.splitlines()
    assert ready.startswith("READY {")
    usage = harness.ServerUsage.from_dict(json.loads(report))
    assert usage.accepted == 1 and usage.signal is None


def test_exits_at_once_when_its_parent_is_already_gone():
    result = run_serve("selectors", env={"PCB_PARENT_PID": "1"}, timeout=10)
    assert result.returncode == 1
    assert result.stdout == ""


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", list(servers.IMPLS))
def test_echo_conformance(impl, transport):
    """The echo property (1 B .. 1 MiB byte for byte, and a second connection), then the usage
    report counts exactly what it sent."""
    server = started(impl, transport=transport)
    with server:
        assert server.ready["impl"] == impl
        assert server.ready["transport"] == transport
        assert server.ready["pid"] == server.pid
        conformance.echo(server)
        usage = server.stop()
    assert usage.impl == impl
    assert usage.accepted == conformance.ECHO_CONNECTIONS
    assert usage.bytes == conformance.ECHO_BYTES
    assert usage.errors == 0
    assert usage.signal == "SIGTERM"
    assert usage.user + usage.system > 0
    assert usage.maxrss_kib > 0


@pytest.mark.parametrize("impl", list(servers.IMPLS))
def test_sigterm_with_connections_open_exits_promptly(impl):
    """The sigterm property (exit status 0 within conformance.STOP_TIMEOUT of SIGTERM, with
    idle, held-back and active connections open), then the usage report of that stop."""
    server = started(impl, stop_timeout=conformance.STOP_TIMEOUT)
    with server:
        conformance.sigterm(server)
        usage = server.stop()  # the report of the stop the property made
    assert usage.accepted == conformance.SIGTERM_CONNECTIONS
    assert usage.signal == "SIGTERM"


def test_sigint_is_a_clean_stop_too():
    server = started("selectors", cpu=None)
    with server:
        os.kill(server.pid, signal.SIGINT)
        usage = server.stop()
    assert usage.signal == "SIGINT"


def test_unix_socket_replaces_a_stale_socket_and_removes_its_own(tmp_path):
    path = str(tmp_path / "echo.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    server = started("selectors", transport="unix", unix_path=path)
    with server:
        assert server.address == path
        assert server.ready["path"] == path and server.ready["port"] is None
        with connect(path) as sock:
            assert exchange(sock, b"hello") == b"hello"
    assert not os.path.exists(path)


def test_ready_reports_the_cpu_it_is_pinned_to():
    cpu = max(harness.cpus_available())
    server = started("selectors", cpu=cpu)
    with server:
        assert server.ready["cpu"] == [cpu]
        assert os.sched_getaffinity(server.pid) == {cpu}
        assert server.ready["python"] == sys.version.split()[0]


def test_unpinned_server_reports_every_allowed_cpu():
    server = started("selectors", cpu=None)
    with server:
        assert server.ready["cpu"] == harness.cpus_available()


def test_a_live_unix_socket_is_refused_in_one_line_and_keeps_serving(tmp_path):
    path = str(tmp_path / "live.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(path)
        live.listen(8)
        result = run_serve("selectors", "--unix", path, timeout=60)
        assert result.returncode == 2
        assert result.stderr == ("pyconcbench.serve: cannot bind %s: a server is listening there (stop it, or "
                                 "choose another path)\n" % path)
        assert result.stdout == ""
        with connect(path):  # still the live server's socket
            conn, _ = live.accept()
            conn.close()
    finally:
        live.close()


def test_a_live_unix_socket_with_a_full_queue_is_refused_as_live(tmp_path):
    path = str(tmp_path / "full.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held = []
    try:
        live.bind(path)
        live.listen(0)
        for _ in range(4):  # fill its accept queue: the next connect gets EAGAIN
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            held.append(c)
            try:
                c.connect(path)
            except BlockingIOError:
                break
        result = run_serve("selectors", "--unix", path, timeout=60)
        assert result.returncode == 2
        assert result.stderr == ("pyconcbench.serve: cannot bind %s: a server is listening there (its queue is "
                                 "full)\n" % path)
    finally:
        for c in held:
            c.close()
        live.close()


LOW_FD_LIMIT = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
os.execv(sys.executable, [sys.executable, "-m", "pyconcbench.serve", "selectors"])
"""


def test_a_server_started_by_hand_raises_its_own_fd_limit():
    """Started with a soft limit of 64 open files (a shell's is often 1024), it still serves
    200 connections: it raised its soft limit to the hard one."""
    import resource

    from pyconcbench import procs

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = 200
    assert hard == resource.RLIM_INFINITY or hard > 2 * connections, "the hard fd limit here is too low"
    child = procs.Child([sys.executable, "-c", LOW_FD_LIMIT]).start()
    socks = []
    try:
        line = child.read_line(60)
        assert line is not None and line.startswith(b"READY "), child.stderr_text()
        ready = json.loads(line[len(b"READY "):])
        for i in range(connections):
            socks.append(connect((ready["host"], ready["port"])))
        for i, sock in enumerate(socks):
            message = b"%04d" % i
            assert exchange(sock, message) == message, "connection %d got no echo" % i
        expected = hard if hard != resource.RLIM_INFINITY else serve.FD_LIMIT_CAP
        assert ready["fd_limit"] == expected
    finally:
        for sock in socks:
            sock.close()
        child.stop(30)
