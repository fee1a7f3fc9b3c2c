"""External peers (go_net, node_net): the launcher (servers.peers.Peer) against a fake peer,
the worker_pid / measured_pid hook through serve and the harness, the peer's own usage in the
report, its death with serve, a Go build that fails; and the stop signals of every server
whose framework or process has signal handling of its own."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from brokenservers import connect, exchange
from pyconcbench import harness, servers
from pyconcbench.harness import ServerError, ServerProcess, ServerUnavailable
from pyconcbench.servers import peers
from pyconcbench.servers.peers import Peer, PeerError

PEERS = ["go_net", "node_net"]
# Servers whose stop could be disturbed by their framework's own signal handling (trio's
# SIGINT and wake-up fd, Twisted's handlers), or that relay the stop to another process.
OWN_SIGNAL_HANDLING = ["tornado", "twisted", "twisted_epoll", "trio", "anyio", "curio"] + PEERS


def started(impl, **kwargs):
    server = ServerProcess(impl, **kwargs)
    try:
        return server.start()
    except ServerUnavailable as exc:
        pytest.skip(str(exc))


def proc_stat(pid):
    """(state, ppid) of pid, or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def wait_gone(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z":
            return True
        time.sleep(0.02)
    return False


# -- the launcher, against a fake peer in Python -----------------------------------------------

FAKE_PEER = textwrap.dedent("""
    import json, signal, socket, sys, time
    mode, fd = sys.argv[1], int(sys.argv[-1])
    listener = socket.socket(fileno=fd)
    if mode == "early":
        sys.exit(3)
    def report(signum, frame):
        print("a stray line")
        print(json.dumps({"accepted": 1, "bytes": 42, "errors": 0}), flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else report)
    if mode != "silent":
        print("starting up")
        print("READY", flush=True)
    if mode == "dies":
        time.sleep(0.2)
        sys.exit(3)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
""")


@pytest.fixture
def listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


@pytest.fixture
def stop_pipe():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def start_fake(peer, mode, listener):
    return peer.start([sys.executable, "-c", FAKE_PEER, mode], listener)


def test_peer_reports_counts_and_its_own_usage(listener, stop_pipe, capsys):
    peer = Peer("fake")
    pid = start_fake(peer, "report", listener)
    assert proc_stat(pid)[1] == os.getpid()
    assert peer.usage() is None  # not reaped yet
    os.write(stop_pipe[1], b"x")
    stats = servers.Stats()
    peer.serve(stop_pipe[0], stats)
    assert (stats.accepted, stats.bytes, stats.errors) == (1, 42, 0)
    usage = peer.usage()
    assert set(usage) == {"user", "system", "maxrss_kib"}
    assert usage["user"] + usage["system"] > 0 and usage["maxrss_kib"] > 0
    assert peer.proc.returncode == 0
    err = capsys.readouterr().err
    assert "starting up" in err and "a stray line" in err


def test_peer_that_ignores_sigterm_is_killed_promptly(listener, stop_pipe):
    peer = Peer("fake")
    start_fake(peer, "stubborn", listener)
    os.write(stop_pipe[1], b"x")
    began = time.monotonic()
    with pytest.raises(PeerError, match=r"fake peer \(pid \d+\) was killed by SIGKILL when told"):
        peer.serve(stop_pipe[0], servers.Stats())
    assert time.monotonic() - began < peers.STOP_TIMEOUT + 1.0
    assert peer.usage() is not None


def test_peer_that_exits_before_ready_fails_start(listener):
    peer = Peer("fake")
    with pytest.raises(PeerError, match=r"exited with code 3 before it was ready"):
        start_fake(peer, "early", listener)
    assert peer.usage() is not None


def test_peer_that_never_reports_ready_is_stopped(listener, monkeypatch):
    monkeypatch.setattr(peers, "READY_TIMEOUT", 0.5)
    peer = Peer("fake")
    with pytest.raises(PeerError,
                       match=r"did not report READY within 0.5 s \(then exited with code 0\)"):
        start_fake(peer, "silent", listener)


def test_peer_that_exits_while_serving_is_an_error(listener, stop_pipe):
    peer = Peer("fake")
    start_fake(peer, "dies", listener)
    with pytest.raises(PeerError, match=r"exited with code 3 before it was told to stop"):
        peer.serve(stop_pipe[0], servers.Stats())
    assert peer.usage() is not None


def test_serve_before_start_is_an_error(stop_pipe):
    with pytest.raises(PeerError, match="before start"):
        Peer("fake").serve(stop_pipe[0], servers.Stats())


# -- through serve and the harness -------------------------------------------------------------

def test_a_python_server_is_measured_itself():
    server = started("selectors", cpu=None)
    with server:
        assert "worker_pid" not in server.ready
        assert server.measured_pid == server.pid


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", PEERS)
def test_ready_names_the_worker_and_the_report_is_its_usage(impl, transport):
    cpu = max(harness.cpus_available())
    server = started(impl, transport=transport, cpu=cpu)
    with server:
        worker = server.ready["worker_pid"]
        assert worker != server.pid
        assert server.measured_pid == worker
        assert proc_stat(worker)[1] == server.pid  # serve's child
        assert os.sched_getaffinity(worker) == {cpu}  # pinned like serve
        with open("/proc/%d/cmdline" % worker, "rb") as f:
            assert b"echo" in f.read()
        with connect(server.address) as sock:
            assert exchange(sock, b"x" * 100_000) == b"x" * 100_000
        assert sum(server.cpu_times()) >= 0
        peak = server.peak_rss_kib()  # the worker's, not serve's
        usage = server.stop()
    assert wait_gone(worker, 1.0)
    assert (usage.accepted, usage.bytes, usage.errors) == (1, 100_000, 0)
    # serve (Python) and the peer differ in size by far more than this
    assert abs(usage.maxrss_kib - peak) <= peak // 4 + 1024, (usage.maxrss_kib, peak)


@pytest.mark.parametrize("impl", PEERS)
def test_the_peer_dies_with_serve(impl):
    server = started(impl, cpu=None)
    with server:
        worker = server.ready["worker_pid"]
        os.kill(server.pid, signal.SIGKILL)
        assert wait_gone(worker), "peer %d outlived serve" % worker
        with pytest.raises(ServerError, match="exited with code -9"):
            server.stop()


@pytest.mark.parametrize("impl", PEERS)
def test_a_peer_that_dies_fails_serve_with_a_clear_line(impl):
    server = started(impl, cpu=None)
    with server:
        worker = server.ready["worker_pid"]
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # serve exits on its own
            try:
                server.check_alive()
            except ServerError:
                break
            time.sleep(0.02)
        with pytest.raises(ServerError) as info:
            server.stop()
    assert "exited with code 1" in str(info.value)
    assert ("pyconcbench.serve: %s failed: PeerError: %s peer (pid %d) was killed by SIGKILL "
            "before it was told to stop" % (impl, impl, worker)) in server.stderr_text()


def run_serve(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "pyconcbench.serve", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, **env),
    )


@pytest.mark.parametrize("env, why", [
    ({"GOROOT": "/nonexistent"}, "go build exited with code 2: go: cannot find GOROOT"),
    ({"XDG_CACHE_HOME": "/dev/null/cache"}, "Not a directory"),
])
def test_a_go_build_that_fails_is_exit_2_with_one_line(tmp_path, env, why):
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    result = run_serve("go_net", env=dict({"XDG_CACHE_HOME": str(tmp_path)}, **env))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "pyconcbench.serve: implementation 'go_net' cannot build its Go peer: ")
    assert why in lines[0]


@pytest.mark.slow
def test_the_harness_builds_the_go_peer_before_the_timed_start(tmp_path, monkeypatch):
    """A cold Go cache takes longer to build than serve may take to print READY: the harness
    builds first, in its own process."""
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    harness.prepare("go_net")
    assert any(name.startswith("go_net-") for name in os.listdir(tmp_path / "pyconcbench"))
    server = ServerProcess("go_net", cpu=None, ready_timeout=5.0).start()
    with server:
        with connect(server.address) as sock:
            assert exchange(sock, b"built") == b"built"


def test_prepare_is_a_no_op_for_python_servers():
    harness.prepare("selectors")
    harness.prepare("no-such-impl")


# -- stop signals ------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("impl", OWN_SIGNAL_HANDLING)
def test_sigint_and_sighup_are_clean_stops_too(impl, signum):
    server = started(impl, cpu=None)
    with server:
        with connect(server.address) as sock:
            assert exchange(sock, b"ping") == b"ping"
            os.kill(server.pid, signum)
            # the signal alone must stop it: wait for that, so stop()'s SIGTERM cannot race it
            server._proc.wait(timeout=10)
            usage = server.stop()
    assert usage.signal == signal.Signals(signum).name
    assert (usage.accepted, usage.bytes) == (1, 4)
    assert server.stderr_text() == ""


# -- listen backlog ----------------------------------------------------------------------------

def listen_backlog(server):
    """The listening socket's backlog as the kernel reports it (ss Send-Q), or None."""
    if server.transport == "unix":
        argv = ["ss", "-lxH", "src", server.address]
        column = 3
    else:
        argv = ["ss", "-ltnH", "sport = :%d" % server.address[1]]
        column = 2
    try:
        fields = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(fields[column]) if len(fields) > column else None


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", OWN_SIGNAL_HANDLING)
def test_frameworks_that_listen_again_keep_the_backlog(impl, transport):
    """Node calls listen() again on the descriptor it is given, Twisted on an adopted UNIX
    socket: both must keep serve's backlog (the kernel clamps it to somaxconn), not their own
    defaults of 511 and 50."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) not on PATH")
    with open("/proc/sys/net/core/somaxconn") as f:
        expected = min(servers.BACKLOG, int(f.read()))
    server = started(impl, transport=transport, cpu=None)
    with server:
        assert listen_backlog(server) == expected
