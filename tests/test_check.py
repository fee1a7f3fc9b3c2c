"""``pyconcbench check IMPL``: the conformance properties (pyconcbench.conformance) against a
server, one line per failed property and a summary; and that each property catches the server
it is about (the misbehaving servers of brokenservers.py)."""
import os
import subprocess
import sys

import pytest

import brokenservers
from pyconcbench import cli, conformance, harness

TESTS = os.path.dirname(os.path.abspath(__file__))
ALL = len(conformance.PROPERTIES)

#: python -c: serve.main with brokenservers.serve_function(KIND, AT, DEAF) as the implementation
SERVE_BROKEN = """
import sys
sys.path.insert(0, %r)
import brokenservers
from pyconcbench import serve
kind, at, deaf = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "deaf"
serve.servers.load = lambda impl: brokenservers.serve_function(kind, at, deaf)
sys.exit(serve.main(sys.argv[4:]))
""" % TESTS


class BrokenProcess(harness.ServerProcess):
    """A server process (python -m pyconcbench.serve's main) serving a brokenservers kind."""

    def __init__(self, kind, at, transport="tcp", deaf=False, stop_timeout=conformance.STOP_TIMEOUT):
        super().__init__("selectors", transport=transport, cpu=None, malloc="pristine", stop_timeout=stop_timeout)
        self.kind, self.at, self.deaf = kind, at, deaf

    def argv(self):
        serve_args = super().argv()[3:]  # selectors --host ... --port 0
        return [self.python, "-c", SERVE_BROKEN, self.kind, str(self.at), "deaf" if self.deaf else "-"] + serve_args


def run_check(capsys, argv, server_for=None):
    """cli.main(check ...) in this process: its exit status, stdout and stderr lines; every
    socket and server it opened is closed again."""
    fds = set(os.listdir("/proc/self/fd"))
    code = cli.main(["check", *argv], server_for=server_for)
    out, err = capsys.readouterr()
    leaked = set(os.listdir("/proc/self/fd")) - fds
    assert not leaked, "file descriptors left open: %s" % sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in leaked
                                                                   if os.path.exists(f"/proc/self/fd/{fd}"))
    assert harness.child_servers() == []
    return code, out.splitlines(), err.splitlines()


def run_cli(*argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "pyconcbench.cli", *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_a_correct_server_holds_every_property():
    result = run_cli("check", "native_epoll")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == f"native_epoll: {ALL} of {ALL} properties hold\n"
    assert result.stderr == ""
    assert harness.child_servers() == []


def test_verbose_names_every_property_in_order_sigterm_last(capsys):
    code, out, err = run_check(capsys, ["selectors", "-v", "--transport", "unix"])
    assert code == 0, out + err
    assert [line.split(": ")[1] for line in out[:-1]] == conformance.names()
    assert all(line.startswith("selectors: ") and ": holds (" in line for line in out[:-1])
    assert out[-1] == f"selectors: {ALL} of {ALL} properties hold"
    assert conformance.names()[-1] == "sigterm"
    assert err == []


def test_a_broken_server_fails_one_line_per_property_each_on_a_fresh_server(capsys):
    """A server that echoes 200,000 B per connection and then half-closes: the 1 MiB echo, the
    2,000 round trips of 1 KiB and the held-back client fail, the rest hold; after each failure
    the next property gets a fresh server."""
    made = []

    def server_for(spec, transport):
        made.append(BrokenProcess("truncate", 200_000, transport))
        return made[-1]

    code, out, err = run_check(capsys, ["truncating"], server_for)
    assert code == 1
    assert err == []
    assert len(out) == 4, out
    left = 200_000 - sum(conformance.ECHO_SIZES[:-1])
    assert out[0] == f"truncating: echo: echo of 1048576 B over tcp: got {left} B back before EOF"
    assert out[1].startswith("truncating: one_connection_load: 2000 round trips of 1024 B on one connection over "
                             "tcp: load errors: connection 0: early EOF"), out[1]
    assert out[2] == (f"truncating: backpressure: a client that sends and never reads over tcp: the server read "
                      f"{conformance.BACKPRESSURE_LIMIT} B and still reads (unbounded buffering)")
    assert out[3] == f"truncating: 3 of {ALL} failed"
    assert len(made) == 4  # the first, and one after each failure
    assert harness.child_servers() == []


def test_a_server_that_ignores_sigterm_fails_sigterm(capsys):
    code, out, err = run_check(capsys, ["deaf", "--only", "sigterm,echo"],
                               lambda spec, t: BrokenProcess("echo", 0, t, deaf=True, stop_timeout=2.0))
    assert code == 1
    assert err == []
    assert len(out) == 2, out
    assert out[0].startswith("deaf: sigterm: SIGTERM with 7 connections open over tcp, expected exit status 0: "
                             "server 'selectors' ignored SIGTERM for 2 s and was killed (SIGKILL)"), out[0]
    assert out[1] == "deaf: 1 of 2 failed"


def test_several_servers_and_transports_each_get_a_summary(capsys):
    made = []

    def server_for(spec, transport):
        made.append((spec, transport))
        return BrokenProcess("flip" if spec == "flipping" else "echo", 200, transport)

    code, out, err = run_check(capsys, ["fine", "flipping", "--transport", "tcp,unix", "--only", "echo"], server_for)
    assert code == 1
    differs = "byte 135 differs (sent 0x%02x, got 0x%02x; 4096 B back)" % _flipped(135)
    assert out == ["fine (tcp): 1 of 1 properties hold", "fine (unix): 1 of 1 properties hold",
                   f"flipping (tcp): echo: echo of 4096 B over tcp: {differs}", "flipping (tcp): 1 of 1 failed",
                   f"flipping (unix): echo: echo of 4096 B over unix: {differs}", "flipping (unix): 1 of 1 failed"]
    assert made[:4] == [("fine", "tcp"), ("fine", "unix"), ("flipping", "tcp"), ("flipping", "unix")]


def _flipped(i):
    """The byte at offset 200 of the connection, which is offset i of the 4 KiB echo."""
    sent = conformance.payload(4096)[i]
    return sent, sent ^ 1


def test_unknown_impl_is_a_usage_error_in_one_line():
    result = run_cli("check", "native_epoll", "nope")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pyconcbench: error: unknown implementation 'nope'; known: native_epoll, ")
    assert harness.child_servers() == []


@pytest.mark.parametrize("argv, message", [
    (["--only", "echo,bogus"], "--only: unknown property 'bogus'; known: " + ", ".join(conformance.names())),
    (["--only", ","], "--only: no property named in ','; known: " + ", ".join(conformance.names())),
    (["--transport", "udp"], "--transport: expected tcp, unix or tcp,unix, got 'udp'"),
])
def test_bad_options_are_usage_errors_in_one_line(capsys, argv, message):
    code, out, err = run_check(capsys, ["selectors", *argv], lambda spec, t: pytest.fail("a server was made"))
    assert code == 2
    assert out == []
    assert err == ["pyconcbench: error: " + message]


class Unstartable:
    """A server whose start() raises ``error``."""

    def __init__(self, error):
        self.error = error

    def start(self):
        raise self.error


@pytest.mark.parametrize("error, code, line", [
    (harness.ServerUnavailable("implementation 'x' needs frob: pip install frob"), 3,
     "x: not available here: implementation 'x' needs frob: pip install frob"),
    (harness.ServerBroken("implementation 'x': its module does not import: SyntaxError"), 4,
     "x: pyconcbench's own code is broken: implementation 'x': its module does not import: SyntaxError"),
])
def test_unavailable_and_broken_are_one_line_with_their_exit_status(capsys, error, code, line):
    got, out, err = run_check(capsys, ["x"], lambda spec, t: Unstartable(error))
    assert got == code
    assert out == []
    assert err == [line]


def test_a_server_that_does_not_start_fails_in_one_line(capsys):
    error = harness.ServerError("server 'x' exited with code 1 before READY; stderr:\n    Traceback\n    boom")
    code, out, err = run_check(capsys, ["x"], lambda spec, t: Unstartable(error))
    assert code == 1
    assert out == ["x: the server does not start: server 'x' exited with code 1 before READY (stderr: boom)",
                   f"x: 0 of {ALL} failed, {ALL} not run"]
    assert err == []


def test_the_help_names_every_property():
    assert list(cli.CHECK_PROPERTIES) == conformance.names()
    result = run_cli("check", "--help", timeout=60)
    assert result.returncode == 0
    for name in conformance.names():
        assert name in result.stdout


# -- each property catches what it is about ----------------------------------------------------

def test_partial_io_catches_a_flipped_byte():
    with brokenservers.BrokenServer("flip", at=200) as server:
        with pytest.raises(conformance.PropertyFailed) as caught:
            conformance.partial_io(server)
    sent = conformance.payload(conformance.PARTIAL_SIZE, 1)[200]
    assert str(caught.value) == (f"3000 B sent in 7-byte pieces over tcp: byte 200 differs (sent 0x{sent:02x}, got "
                                 f"0x{sent ^ 1:02x}; 3000 B back)")


def test_concurrent_connections_catches_a_server_that_serves_only_some(monkeypatch):
    """A server that serves 500 connections at a time (a fixed pool of workers) leaves the other
    500 of the 1,000 waiting: the load stalls."""
    monkeypatch.setattr(conformance, "CONCURRENT_STALL", 3.0)
    with brokenservers.BrokenServer("capped", at=500) as server:
        with pytest.raises(conformance.PropertyFailed) as caught:
            conformance.concurrent_connections(server)
    assert str(caught.value).startswith(
        "1000 concurrent connections over tcp: load stall: stalled: no round trip completed for 3.0 s; 500 of 1000 "
        "connections waiting for an echo"), caught.value


def test_a_property_this_machine_cannot_check_is_said_and_exits_3(capsys, monkeypatch):
    monkeypatch.setattr(conformance.shutil, "which", lambda name: None)
    code, out, err = run_check(capsys, ["x", "--only", "backpressure,echo"],
                               lambda spec, t: BrokenProcess("echo", 0, t))
    assert code == 3
    assert out == ["x: backpressure: not checked here: backpressure is proven from the kernel's side with `ss` "
                   "(iproute2), which is not on PATH", "x: 1 of 2 properties hold, 1 not checked here"]
    assert err == []
