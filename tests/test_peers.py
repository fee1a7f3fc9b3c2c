"""External peers (go_net, node_net): the launcher (servers.peers.Peer) against a fake peer,
the worker_pid / measured_pid hook through serve and the harness, the peer's own usage in the
report, its death with serve, a Go build that fails; and the stop signals of every server
whose framework or process has signal handling of its own."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from brokenservers import connect, exchange
from skipping import start_or_skip
from pyconcbench import gobuild, harness, servers
from pyconcbench.harness import ServerBroken, ServerError, ServerProcess, ServerUnavailable
from pyconcbench.servers import go_net, peers
from pyconcbench.servers.peers import Peer, PeerError

PEERS = ["go_net", "node_net"]
# Servers whose stop could be disturbed by their framework's own signal handling (trio's
# SIGINT and wake-up fd, Twisted's handlers), or that relay the stop to another process.
OWN_SIGNAL_HANDLING = ["tornado", "twisted", "twisted_epoll", "trio", "anyio", "curio"] + PEERS
#: Where the Go builds are cached (read before pytester gives a test a HOME of its own).
GO_CACHE_HOME = os.path.dirname(gobuild.cache_root())


def started(impl, **kwargs):
    server = ServerProcess(impl, **kwargs)
    return start_or_skip(server)


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


def broken_go_copy(source, directory):
    """A copy of the Go program ``source`` in ``directory`` with a call to an undefined
    function planted as main()'s first statement; (its path, the planted line's number)."""
    with open(source) as f:
        lines = f.read().splitlines(keepends=True)
    at = lines.index("func main() {\n") + 1
    lines.insert(at, "\tpcbPlantedBug()\n")
    path = directory / os.path.basename(source)
    path.write_text("".join(lines))
    return path, at + 1


# go on PATH and the build fails -- our echo.go does not compile, or the toolchain or cache does
# not work: exit 4 (broken: a failure), never 3 (not available here: the harness's skip).
@pytest.mark.parametrize("env, why", [
    ({"GOROOT": "/nonexistent"}, "go build exited with code 2: go: cannot find GOROOT"),
    ({"XDG_CACHE_HOME": "/dev/null/cache"}, "Not a directory"),
    (None, "go build exited with code 1: # command-line-arguments; "),  # echo.go broken
], ids=["goroot", "cache", "source"])
def test_a_go_build_that_fails_is_exit_4_with_one_line(tmp_path, env, why):
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    if env is not None:  # the shipped echo.go, in a cold cache that does not get that far
        result = run_serve("go_net", env=dict({"XDG_CACHE_HOME": str(tmp_path)}, **env))
    else:  # a copy that does not compile, in the usual (warm) cache
        source, line = broken_go_copy(go_net.SOURCE, tmp_path)
        why += "%s:%d:2: undefined: pcbPlantedBug" % (source, line)
        code = ("import sys; from pyconcbench.servers import go_net; go_net.SOURCE = %r; "
                "from pyconcbench import serve; sys.exit(serve.main(['go_net']))" % str(source))
        result = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=300)
    assert result.returncode == 4, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "pyconcbench.serve: implementation 'go_net' cannot build its Go peer: ")
    assert why in lines[0]


def test_go_not_on_path_is_exit_3_and_the_only_skip(monkeypatch):
    result = run_serve("go_net", env={"PATH": "/nonexistent"})
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "pyconcbench.serve: implementation 'go_net' needs 'go' on PATH (not found)"]
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ServerUnavailable, match=r"^pyconcbench\.serve: implementation 'go_net' needs "
                                                r"'go' on PATH \(not found\)$"):
        ServerProcess("go_net", cpu=None).start()


def test_a_go_peer_that_does_not_compile_fails_the_harness_not_skips(tmp_path, monkeypatch):
    """Before, the harness and every test's ``started`` skipped it as a missing toolchain."""
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    source, line = broken_go_copy(go_net.SOURCE, tmp_path)
    monkeypatch.setattr(go_net, "SOURCE", str(source))
    with pytest.raises(ServerError) as info:
        ServerProcess("go_net", cpu=None).start()
    assert not isinstance(info.value, ServerUnavailable)
    assert isinstance(info.value, ServerBroken)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("implementation 'go_net' cannot build its Go peer: go build exited "
                              "with code 1: # command-line-arguments; ")
    assert message.endswith("%s:%d:2: undefined: pcbPlantedBug" % (source, line))
    with pytest.raises(pytest.fail.Exception, match="^" + re.escape(message) + "$"):
        started("go_net", cpu=None)


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
            server._child.wait(10)
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


def test_a_go_peer_that_does_not_compile_fails_the_benchmark_not_skips(pytester, tmp_path):
    """Through the plugin's echo_server fixture: an error in one line, no skip, no traceback."""
    if shutil.which("go") is None:
        pytest.skip("go not on PATH")
    source, line = broken_go_copy(go_net.SOURCE, tmp_path)
    pytester.makeconftest(  # pytester's HOME is new: keep the usual (warm) Go build cache
        "import os\nos.environ['XDG_CACHE_HOME'] = %r\n"
        "from pyconcbench.servers import go_net\ngo_net.SOURCE = %r\n"
        % (GO_CACHE_HOME, str(source)))
    pytester.makepyfile(test_go="""
        def test_echo(echo_case, echo_server):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pcb-impl", "go_net",
                                           "--pcb-conns", "10", "--benchmark-disable")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([  # the error's whole report: one line
        "*_ ERROR at setup of test_echo[[]go_net-c10-64B] _*",
        "implementation 'go_net' cannot build its Go peer: go build exited with code 1: "
        "# command-line-arguments; *echo.go:%d:2: undefined: pcbPlantedBug" % line,
        "=*"], consecutive=True)
