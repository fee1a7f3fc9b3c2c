"""--pcb-workers / ``pyconcbench.serve --workers N``: one implementation on several processes
(SO_REUSEPORT sockets over TCP, one shared socket over UNIX), supervised and summed by serve."""
import os
import signal
import subprocess
import sys
import time

import pytest

from pyconcbench import harness, instruments, loadgen, options
from pyconcbench.echo import EchoCase, echo_cases

CONNECTIONS = 300
WARMUP, MESSAGES, SIZE = 600, 3000, 64


def _gone(pids, timeout=5.0):
    """True once none of ``pids`` runs (a zombie not yet reaped counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(harness._process_state(pid) in (None, "Z", "X") for pid in pids):
            return True
        time.sleep(0.02)
    return False


def _load(server, connections=CONNECTIONS):
    address = server.address
    where = dict(transport="unix", path=address) if server.transport == "unix" else dict(
        transport="tcp", host=address[0], port=address[1])
    spec = loadgen.LoadSpec(connections=connections, size=SIZE, messages=MESSAGES, warmup_messages=WARMUP,
                            deadline=60.0, **where)
    with loadgen.LoadSession(spec) as session:
        result = session.round()
    assert result.completed == MESSAGES
    return result


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", ["asyncio_protocol", "native_epoll"])
def test_three_workers_serve_every_connection(impl, transport):
    server = harness.ServerProcess(impl, transport=transport, cpu=None, workers=3)
    with server:
        workers = server.worker_pids
        assert len(workers) == 3 and server.ready["workers"] == 3
        assert server.measured_pids == (server.pid,) + workers
        before = instruments.snapshot(server.measured_pids).server_runtime  # ns-exact, over every process
        ticks = server.cpu_times()
        _load(server)
        server.check_alive()
        assert instruments.snapshot(server.measured_pids).server_runtime > before
        assert sum(server.cpu_times()) >= sum(ticks)  # clock ticks: a fast server may not cross one
        assert server.rss_kib() > 3 * 1024  # summed over serve and its three workers
        usage = server.stop()
    assert _gone(workers)
    assert usage.accepted == CONNECTIONS
    assert usage.bytes == (WARMUP + MESSAGES) * SIZE
    assert usage.errors == 0 and usage.signal == "SIGTERM"
    assert [row["pid"] for row in usage.per_worker] == list(workers)
    assert sum(row["accepted"] for row in usage.per_worker) == CONNECTIONS + server.preflight_connections
    served = [row for row in usage.per_worker if row["accepted"] > 0]
    if transport == "tcp":  # the kernel spreads SO_REUSEPORT connections by a hash of the ports
        assert len(served) >= 2, usage.per_worker
    assert usage.user + usage.system > 0 and usage.maxrss_kib > 0


def test_workers_spread_over_the_cpu_set():
    cpus = harness.cpus_available()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    with harness.ServerProcess("native_epoll", cpu=cpus[:2], workers=3) as server:
        assert server.ready["worker_cpus"] == [cpus[0], cpus[1], cpus[0]]
        for pid, cpu in zip(server.worker_pids, server.ready["worker_cpus"]):
            assert os.sched_getaffinity(pid) == {cpu}
        assert server.workers_note == "3 workers on 2 CPUs: a functional check, not a scaling figure"
    with harness.ServerProcess("native_epoll", cpu=cpus[0], workers=2) as server:
        assert server.ready["worker_cpus"] == [cpus[0], cpus[0]]
        assert server.workers_note == "2 workers on 1 CPU: a functional check, not a scaling figure"


def test_a_killed_worker_fails_the_server_in_one_line():
    with harness.ServerProcess("asyncio_protocol", cpu=None, workers=3) as server:
        victim = server.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        with pytest.raises(harness.ServerError) as info:
            while time.monotonic() < deadline:
                server.check_alive()
                time.sleep(0.02)
        message = str(info.value)
        assert "\n" not in message
        assert ("worker 2 of 3 (pid %d)" % victim) in message
        with pytest.raises(harness.ServerError) as info:
            server.stop()
        assert "worker 2 of 3" in str(info.value)
        assert _gone(server.worker_pids)


def test_the_serve_parent_killed_takes_its_workers():
    with harness.ServerProcess("native_epoll", cpu=None, workers=2) as server:
        workers = server.worker_pids
        os.kill(server.pid, signal.SIGKILL)
        assert _gone(workers), "workers outlived their serve process"
        with pytest.raises(harness.ServerError):
            server.stop()


def test_peers_are_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "pyconcbench.serve", "node_net", "--workers", "2"],
                         capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    if out.returncode == 3:
        pytest.skip(lines[-1])  # node not on PATH: missing before the refusal
    assert out.returncode == 2 and len(lines) == 1
    assert "program of its own" in lines[0] and "--workers 1" in lines[0]


def test_plain_and_command_servers_refuse_workers():
    with pytest.raises(ValueError, match="one process of its own"):
        harness.PlainServer("asyncio_protocol", workers=2)
    with pytest.raises(ValueError, match="runs its own processes"):
        harness.CommandServer("prog {port}", workers=2)
    with pytest.raises(ValueError, match="workers must be 1 .. 256"):
        harness.ServerProcess("native_epoll", workers=0)


def _settings(**given):
    return options.resolve(lambda name: (given.get(name), "--pcb-" + name if name in given else "default"))


def test_option_parsing():
    assert options.parse_workers("1,2,4") == (1, 2, 4)
    assert options.parse_workers("2, 2,1") == (2, 1)
    for bad, why in (("0", "'0'"), ("x", "'x'"), ("", "empty"), ("1,300", "'300'")):
        with pytest.raises(ValueError, match=why):
            options.parse_workers(bad)
    with pytest.raises(options.OptionError, match=r"^--pcb-workers: '-1'"):
        _settings(workers="-1")
    assert _settings().workers == (1,)
    assert _settings(workers="1,2").workers == (1, 2)


def test_cases_ids_and_labels():
    settings = _settings(workers="1,4", impl="native_epoll,go_net", conns="100", transport="tcp", reference="all")
    cases = echo_cases(settings)
    ids = [c.id for c in cases]
    assert "native_epoll-c100-64B" in ids and "native_epoll-c100-64B-w4" in ids
    assert "go_net-c100-64B" in ids and "go_net-c100-64B-w4" not in ids  # a peer: one process
    assert not any(c.plain and c.workers != 1 for c in cases)  # plain references: 1 worker only
    four = [c for c in cases if c.workers == 4][0]
    assert four.label == "native_epoll+w4" and not four.explain and not four.count_alloc
    assert EchoCase("x", 10, 64, "unix", workers=2).id == "x-c10-64B-unix-w2"


def test_cpu_sets_and_the_crowded_note():
    cpus = harness.cpus_available()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    settings = _settings(cpus=f"{cpus[0]},{cpus[1]}", workers="1,4")
    assert settings.cpus == (cpus[0], cpus[1]) and settings.server_cpus == ()
    assert settings.pinning_note.endswith("; 4 workers on 1 CPU: a functional check, not a scaling figure")
    assert "workers" not in _settings(cpus=f"{cpus[0]},{cpus[1]}").pinning_note
    with pytest.raises(options.OptionError, match=r"^--pcb-cpus: .*same CPU"):
        _settings(cpus=f"{cpus[0]}-{cpus[1]},{cpus[1]}")


def test_workers_table():
    from pyconcbench.report.echo_tables import echo_table, workers_table

    def row(impl, workers, rate, note=""):
        r = {"impl": impl, "label": impl + ("" if workers == 1 else f"+w{workers}"), "workers": workers,
             "connections": 100, "size": 64, "transport": "tcp", "msgs_per_s": rate, "latency_p50_us": 1.0,
             "latency_p99_us": 2.0, "server_cpu_share": 1.0, "loadgen_cpu_share": 1.0}
        if note:
            r["workers_note"] = note
        return r

    rows = [row("native_epoll", 1, 1000.0), row("native_epoll", 2, 1500.0, "2 workers on 1 CPU: a functional "
                                                                            "check, not a scaling figure")]
    lines = workers_table(rows)
    assert any("native_epoll" in line and "1,500 (1.50x)" in line for line in lines)
    assert lines[-1].startswith("⚠ 2 workers on 1 CPU")
    assert workers_table(rows[:1]) == []
    table = "\n".join(echo_table(rows))
    assert "native_epoll+w2" in table and "1.50x 1 worker" in table


def test_the_profiles_allocator_variants_stay_at_one_worker():
    settings = _settings(workers="1,2", impl="asyncio_protocol", conns="100", transport="tcp", reference="none")
    ids = [c.id for c in echo_cases(settings)]
    assert ids == ["asyncio_protocol-c100-64B", "asyncio_protocol-c100-64B-w2",
                   "asyncio_protocol-c100-64B-malloc_pristine"]
