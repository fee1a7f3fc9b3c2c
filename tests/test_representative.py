"""Representative numbers: the allocator state reaches the server, and the project's servers
agree with plain reference servers written as a user would (pyconcbench.plain).

The ratio checks are correctness checks on the harness, not performance targets: the two
servers run side by side, driven in turn round by round, under the same load, and the band
(0.75 .. 1.33 on server CPU per round trip) is far wider than this machine's noise between
neighbouring rounds, yet far narrower than the 3-4x a harness artifact such as the pristine
allocator state produces.
"""
import ast
import os
import statistics
import sys

import pytest

from skipping import start_or_skip
from pyconcbench import harness, loadgen, instruments, plain, servers, syscalls
from pyconcbench.harness import PlainServer, ServerProcess

RATIO_BAND = (0.75, 1.33)  # server CPU per round trip, project / plain
RATE_BAND = (0.5, 2.0)     # msgs/s: the pristine allocator state alone is 3-4x
CONNECTIONS = 100
MESSAGES = 20_000
PAIRS = 7


def cpus():
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else (None, None)


def start(kind, impl, **kwargs):
    server = kind(impl, cpu=cpus()[0], **kwargs)
    return start_or_skip(server)


def rate(server, messages=MESSAGES):
    """The median msgs/s of 3 rounds of ping-pong at 100 connections, 64 B, after a warm-up."""
    host, port = server.address
    spec = loadgen.LoadSpec(transport="tcp", host=host, port=port, connections=CONNECTIONS, size=64,
                            messages=messages, warmup_messages=2000, cpu=cpus()[1], stall_timeout=10.0)
    with loadgen.LoadSession(spec) as session:
        return statistics.median(session.round().msgs_per_s for _ in range(3))


def allocator_calls(server, tool):
    """mmap + munmap + mremap per round trip over one round."""
    host, port = server.address
    spec = loadgen.LoadSpec(transport="tcp", host=host, port=port, connections=10, size=64,
                            messages=5000, warmup_messages=500, cpu=cpus()[1], stall_timeout=10.0)
    with loadgen.LoadSession(spec) as session:
        counter = syscalls.SyscallCounter(server.measured_pid, tool, names=syscalls.ALLOCATOR).start()
        try:
            result = session.round()
        finally:
            counts = counter.stop()
    return sum(counts.get(name, 0) for name in ("mmap", "munmap", "mremap")) / result.completed


# ---- the allocator state ----------------------------------------------------------------

@pytest.mark.parametrize("malloc, probe", [("pristine", "mmap"), ("representative", "mmap"), ("tuned", "heap")])
def test_the_start_up_state_is_read_back(malloc, probe):
    """READY reads glibc's state back before any connection: a fresh process maps a 256 KiB
    block on its own unless the thresholds were tuned (the pre-flight changes it after)."""
    server = start(ServerProcess, "selectors", malloc=malloc)
    try:
        if server.ready["malloc_probe"] is None:
            pytest.skip("the C library is not glibc 2.33+: no mallinfo2 to read the state with")
        assert server.ready["malloc_probe"] == probe
        assert server.preflight_connections == (0 if malloc == "pristine" else harness.PREFLIGHT_CONNECTIONS)
    finally:
        usage = server.stop()
    assert usage.accepted == 0 and usage.bytes == 0  # the pre-flight is left out of the counts


def test_a_tuned_state_outside_comes_not_through(monkeypatch):
    """MALLOC_* in the caller's environment do not leak into a representative measurement."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    server = start(ServerProcess, "selectors")
    try:
        if server.ready["malloc_probe"] is None:
            pytest.skip("the C library is not glibc 2.33+")
        assert server.ready["malloc_probe"] == "mmap"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def counting_tool():
    tool = syscalls.available_tool()
    if tool is None:
        pytest.skip("counting the allocator's calls needs perf (linux-perf) or strace on PATH")
    return tool


@pytest.mark.parametrize("kind", [ServerProcess, PlainServer], ids=["project", "plain"])
def test_the_allocator_state_reaches_the_asyncio_server(kind, counting_tool):
    """End to end: pristine maps, remaps and unmaps a buffer on every read (three calls per round
    trip); representative (the pre-flight's disconnects) and tuned make none."""
    per = {}
    for malloc in ("pristine", "representative") + (("tuned",) if kind is ServerProcess else ()):
        server = start(kind, "asyncio_protocol", malloc=malloc)
        try:
            per[malloc] = allocator_calls(server, counting_tool)
        finally:
            server.stop()
    assert per["pristine"] > 2.5, per
    assert per["representative"] < 0.05, per
    assert per.get("tuned", 0.0) < 0.05, per


def test_the_preflight_fails_clearly_on_a_server_that_does_not_echo(tmp_path):
    # The server reads the message, then ends its side without echoing: the client sees EOF
    # (closing without reading would race the client's send into a reset).
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexec %s -c \"\nimport json, os, socket, time\n"
                      "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(5)\n"
                      "print('READY ' + json.dumps(dict(impl='x', transport='tcp', host='127.0.0.1', "
                      "port=s.getsockname()[1], path=None, pid=os.getpid())), flush=True)\n"
                      "c, _ = s.accept(); c.recv(64); c.shutdown(socket.SHUT_WR); time.sleep(30)\n\"\n" % sys.executable)
    script.chmod(0o755)
    server = ServerProcess("x", python=str(script), cpu=None)
    with pytest.raises(harness.ServerError, match="server 'x' echoed b'' to the pre-flight message"):
        server.start()


# ---- plain reference servers ------------------------------------------------------------

@pytest.mark.parametrize("impl", sorted(plain.PLAIN))
def test_plain_servers_hold_no_project_code(impl):
    """Written as a user would: the script imports nothing of pyconcbench, and its process
    maps no project module (no _native extension)."""
    with open(plain.script_path(impl), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert "pyconcbench" not in imported
    server = start(PlainServer, impl)
    try:
        with open("/proc/%d/maps" % server.pid) as f:
            assert "pyconcbench" not in f.read()
        with open("/proc/%d/status" % server.pid) as f:
            allowed = next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))
        if cpus()[0] is not None:
            assert allowed == str(cpus()[0])
        rate(server, messages=2000)
    finally:
        assert server.stop() is None


@pytest.mark.parametrize("impl", ["asyncio_protocol", "uvloop_protocol", "selectors"])
def test_the_project_server_agrees_with_its_plain_counterpart(impl):
    """The project's server and its plain counterpart, both representative and both running,
    driven in turn round by round (A B A B ...) at 100 connections: the median of the paired
    ratios of server CPU per round trip stays in RATIO_BAND, and of rates in RATE_BAND.

    CPU per round trip is the server's own cost (its threads' schedstat run time over the
    round trips it served): another process competing for the CPUs delays it but hardly changes
    it, so it is the figure a loaded machine cannot push out of the band.  The rate gets the
    wider band: it moves with everything else the machine runs."""
    if impl not in servers.IMPLS or impl not in plain.PLAIN:
        pytest.fail(f"{impl} has no project server or no plain counterpart")
    project = start(ServerProcess, impl)
    try:
        reference = start(PlainServer, impl)
        try:
            with session_for(project) as a, session_for(reference) as b:
                pairs = [(measured_round(a, project), measured_round(b, reference)) for _ in range(PAIRS)]
        finally:
            reference.stop()
    finally:
        project.stop()
    cpu = statistics.median(x[0] / y[0] for x, y in pairs)
    rates = statistics.median(x[1] / y[1] for x, y in pairs)
    detail = "; ".join(f"{x[0] * 1e6:.1f}/{y[0] * 1e6:.1f} us, {x[1]:,.0f}/{y[1]:,.0f} msgs/s" for x, y in pairs)
    assert RATIO_BAND[0] <= cpu <= RATIO_BAND[1], f"{impl}: {cpu:.2f}x its plain server's CPU per round trip ({detail})"
    assert RATE_BAND[0] <= rates <= RATE_BAND[1], f"{impl}: {rates:.2f}x its plain server's rate ({detail})"


def session_for(server):
    host, port = server.address
    return loadgen.LoadSession(loadgen.LoadSpec(
        transport="tcp", host=host, port=port, connections=CONNECTIONS, size=64, messages=MESSAGES,
        warmup_messages=2000, cpu=cpus()[1], stall_timeout=10.0))


def measured_round(session, server):
    """(server CPU seconds per round trip, msgs/s) of one round."""
    before = instruments.process_runtime(server.measured_pid)
    result = session.round()
    after = instruments.process_runtime(server.measured_pid)
    assert before is not None and after is not None, "the server's /proc/PID/task is unreadable"
    return (after - before) / result.completed, result.msgs_per_s


def test_a_plain_server_that_cannot_start_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(plain.PLAIN, "selectors", plain.Plain("no_such_script.py", (), "missing"))
    with pytest.raises(harness.ServerError, match="plain_selectors' exited with code 2 before READY"):
        PlainServer("selectors", cpu=None).start()


def test_plain_server_arguments_are_checked():
    with pytest.raises(ValueError, match="no plain reference server for 'tornado'"):
        PlainServer("tornado")
    with pytest.raises(ValueError, match="representative or pristine, not tuned"):
        PlainServer("selectors", malloc="tuned")
