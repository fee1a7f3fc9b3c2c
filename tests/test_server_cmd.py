"""--pcb-server-cmd: any program as an echo server, through the plugin (pytester) -- {port},
{unix}, {fd}; a program that exits at once or never listens; a command without a placeholder;
and a server with a listen backlog of 5 under 100 connections: stalled, with the diagnosis, and
passing once the connects are paced (--pcb-connect-rate)."""
import pathlib
import sys

import pytest

from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)

# A small echo server as a user would write one: listen(5), a thread per connection; told where
# to listen by --port N, --unix PATH or --fd N.
ECHO_SERVER = """
import socket, sys, threading

def serve(conn):
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            conn.sendall(data)

how, where = sys.argv[1], sys.argv[2]
if how == "--port":
    srv = socket.socket()
    srv.bind(("127.0.0.1", int(where)))
    srv.listen(5)
elif how == "--unix":
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(where)
    srv.listen(5)
else:
    srv = socket.socket(fileno=int(where))
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_echo=(BENCH_DIR / "test_echo.py").read_text())
    return pytester


@pytest.fixture
def echo5(suite):
    """The command that runs the backlog-5 echo server (its placeholder to be added)."""
    script = suite.path / "echo5.py"
    script.write_text(ECHO_SERVER)
    return f"{sys.executable} {script}"

RUN = ["-p", "no:cacheprovider", "--benchmark-disable", "--pcb-messages", "300", "--pcb-rounds", "1"]


@pytest.mark.parametrize("how, placeholder, transport", [
    ("--port", "{port}", "tcp"), ("--unix", "{unix}", "unix"), ("--fd", "{fd}", "tcp"), ("--fd", "{fd}", "unix")])
def test_a_program_is_benchmarked_through_each_placeholder(suite, echo5, how, placeholder, transport):
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "10", "--pcb-transport", transport,
                                        "--pcb-server-cmd", f"{echo5} {how} {placeholder}",
                                        "--pcb-server-name", "echo5", "-v")
    result.assert_outcomes(passed=1)  # the command alone: --pcb-impl was not given
    scale = "c10-64B" + ("-unix" if transport == "unix" else "")
    result.stdout.fnmatch_lines([f"*test_echo[[]echo5-{scale}[]] PASSED*", "*pyconcbench echo results*", "echo5 *"])


def test_beside_the_implementations_given_and_named_after_its_program(suite, echo5):
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "10", "--pcb-impl", "native_epoll",
                                        "--pcb-server-cmd", f"{echo5} --port {{port}}", "--collect-only", "-q")
    # the profile's UNIX case is not generated for a {port} command; the default name is its program's
    assert [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line] == [
        "test_echo[native_epoll-c10-64B]", f"test_echo[cmd_{pathlib.Path(sys.executable).name}-c10-64B]"]


@pytest.mark.parametrize("args, message", [
    (["--pcb-server-cmd", "my-server --port 8080"],
     "--pcb-server-cmd: 'my-server --port 8080' needs exactly one of {port}, {unix}, {fd}*"),
    (["--pcb-server-cmd", "my-server {port} {fd}"], "--pcb-server-cmd: *needs exactly one of*got {port} x1, {fd} x1*"),
    (["--pcb-server-cmd", "my-server '{port}"], "--pcb-server-cmd: * is not a command line: No closing quotation"),
    (["--pcb-server-cmd", "my-server {port}", "--pcb-transport", "unix"],
     "--pcb-server-cmd: its {port} serves tcp only, and the run's cases are over unix only (--pcb-transport)*"),
    (["--pcb-server-cmd", "my-server {port}", "--pcb-server-name", "a b"], "--pcb-server-name: 'a b' is not a server name*"),
    (["--pcb-server-name", "x"], "--pcb-server-name: names the --pcb-server-cmd server, and none is given"),
    (["--pcb-connect-rate", "0"], "--pcb-connect-rate: '0' is outside 0.1 .. 1e+07 connections per second"),
    (["--pcb-connect-rate", "fast"], "--pcb-connect-rate: 'fast' is not a rate*"),
    (["--pcb-server-cmd", "my-server {port}", "--pcb-ab-a", sys.executable, "--pcb-ab-b", sys.executable],
     "--pcb-server-cmd: an A/B run compares two environments' servers, and a --pcb-server-cmd program is the "
     "same on both sides*"),
])
def test_bad_server_commands_are_one_line_usage_errors(suite, args, message):
    result = suite.runpytest_subprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: " + message])
    assert "Traceback" not in result.stderr.str()


def test_the_environment_gives_the_command_too(suite, monkeypatch):
    monkeypatch.setenv("PCB_SERVER_CMD", "my-server")
    result = suite.runpytest_subprocess("--collect-only", "-q")
    result.stderr.fnmatch_lines(["ERROR: PCB_SERVER_CMD (environment): 'my-server' needs exactly one of*"])


def one_failure_line(result, start, errors=0):
    """The one line the failure (or setup error) is, starting with ``start``; no traceback."""
    result.assert_outcomes(failed=1 - errors, errors=errors)
    assert "Traceback" not in result.stdout.str()
    lines = [line for line in result.stdout.lines if line.startswith(start)]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def test_a_program_that_exits_at_once_is_one_line_with_its_exit_code(suite):
    exits = suite.path / "exits.py"
    exits.write_text("import sys\nprint('no config file', file=sys.stderr)\nsys.exit(7)\n")
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "10",
                                        "--pcb-server-cmd", f"{sys.executable} {exits} --port {{port}}")
    line = one_failure_line(result, "server command", errors=1)  # the server fixture's
    assert "exited with code 7 before listening on 127.0.0.1:" in line
    assert line.endswith("; stderr: no config file")


def test_a_program_that_never_listens_is_killed_after_the_ready_timeout(suite):
    quiet = suite.path / "quiet.py"
    quiet.write_text("import time\ntime.sleep(600)\n")
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "10", "--pcb-server-ready-timeout", "1",
                                        "--pcb-server-cmd", f"{sys.executable} {quiet} --unix {{unix}}",
                                        "--pcb-transport", "unix")
    line = one_failure_line(result, "server command", errors=1)
    assert "did not listen on /" in line and "echo.sock within 1 s (stderr empty)" in line
    assert result.duration < 60  # bounded by the ready timeout, not the sleep
    # (the conftest's leak check in the pytester run would have failed on a process left behind)


# ---- a listen backlog of 5 under 100 connections opened at once ------------------------------
# Measured here (Linux 6.18, tcp_syncookies 1, tcp_abort_on_overflow 0): the kernel completes the
# handshake of connections that do not fit the accept queue from the client's side, drops the
# server's half, and some are still unserved 40 s later -- the stall is reliable, not a race.

def test_an_overflowed_accept_queue_is_named_in_the_stall(suite, echo5):
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "100", "--pcb-stall-timeout", "2",
                                        "--pcb-server-cmd", f"{echo5} --port {{port}}")
    line = one_failure_line(result, "cmd_")
    assert "load stall: stalled: no round trip completed for 2.0 s;" in line
    assert ("of 100 connections were established but never served (no echo at all): the server's accept "
            "queue probably overflowed (listen backlog smaller than the connections opened at once); raise "
            "its backlog or pace the connects with --pcb-connect-rate") in line


def test_paced_connects_fit_a_small_backlog(suite, echo5):
    result = suite.runpytest_subprocess(*RUN, "--pcb-conns", "100", "--pcb-stall-timeout", "2",
                                        "--pcb-connect-rate", "200",
                                        "--pcb-server-cmd", f"{echo5} --port {{port}}")
    result.assert_outcomes(passed=1)


# ---- the harness directly: a server that forks its worker ------------------------------------

FORKING_SERVER = """
import os, socket, sys, time
srv = socket.socket(fileno=int(sys.argv[1]))
if os.fork() == 0:  # the worker serves; the parent only waits, as a master process does
    while True:
        conn, _ = srv.accept()
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
srv.close()
os.wait()
"""


def test_cpu_and_memory_are_the_whole_process_tree(tmp_path):
    from pyconcbench import harness, instruments, loadgen

    script = tmp_path / "forking.py"
    script.write_text(FORKING_SERVER)
    with harness.CommandServer(f"{sys.executable} {script} {{fd}}", cpu=None) as server:
        pids = server.measured_pids
        assert len(pids) == 2 and pids[0] == server.pid  # the master and its worker
        host, port = server.address
        before = server.cpu_times()
        loadgen.run(loadgen.LoadSpec(host=host, port=port, connections=1, messages=20_000, warmup_messages=0))
        after = server.cpu_times()
        own = instruments.process_cpu(server.pid)
        worked = sum(after) - sum(before)
        assert worked > 0.05  # the worker's CPU is counted ...
        assert sum(own) < 0.05  # ... and the master alone did next to nothing
        assert server.rss_kib() > instruments.proc_status_kib(server.pid, "VmRSS")
        assert server.stop() is None  # it counts nothing


@pytest.mark.parametrize("command, name", [
    ("/opt/bin/my-server --port {port}", "cmd_my-server"),
    ("env GOMAXPROCS=1 ./echo {fd}", "cmd_echo"),
    ("'./my server+' {unix}", "cmd_my_server_"),
])
def test_the_default_name_is_the_programs(command, name):
    from pyconcbench import harness

    assert harness.command_name(harness.parse_command(command)[0]) == name
