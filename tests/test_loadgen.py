"""The load engine and its Python face: validation, verified echoes, every error kind within
its bound, interruption, the fd-limit check."""
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from pyconcbench import _native, harness, loadgen
from pyconcbench.loadgen import LoadError, LoadSpec

from brokenservers import BrokenServer, unused_tcp_address


def spec_for(server, **kw):
    address = server.address
    if isinstance(address, str):
        return LoadSpec(transport="unix", path=address, **kw)
    return LoadSpec(host=address[0], port=address[1], **kw)


# ---- LoadSpec validation ---------------------------------------------------------------

@pytest.mark.parametrize("changes, fragment", [
    (dict(transport="udp"), "LoadSpec.transport: must be 'tcp' or 'unix', got 'udp'"),
    (dict(port=0), "LoadSpec.port: must be an int in 1..65535, got 0"),
    (dict(port=70000), "LoadSpec.port"),
    (dict(port="80"), "LoadSpec.port"),
    (dict(connections=0), "LoadSpec.connections: must be an int >= 1, got 0"),
    (dict(connections=True), "LoadSpec.connections"),
    (dict(size=0), "LoadSpec.size: must be an int >= 1, got 0"),
    (dict(size=(1 << 20) + 1), "LoadSpec.size: must be at most 1048576 bytes"),
    (dict(messages=-1), "LoadSpec.messages"),
    (dict(messages=0), "LoadSpec.messages: is 0, so duration must be > 0"),
    (dict(duration=-1.0), "LoadSpec.duration"),
    (dict(stall_timeout=0), "LoadSpec.stall_timeout: must be a number of seconds > 0, got 0"),
    (dict(deadline=float("nan")), "LoadSpec.deadline"),
    (dict(connect_timeout=float("inf")), "LoadSpec.connect_timeout"),
    (dict(cpu=4096), "LoadSpec.cpu: must be one of this process's CPUs"),
    (dict(seed=-1), "LoadSpec.seed"),
    (dict(connect_rate=-1), "LoadSpec.connect_rate: must be 0 (unpaced) or 0.1 .. 1e+07 connections a second, got -1"),
    (dict(connect_rate=0.01), "LoadSpec.connect_rate"),
    (dict(connect_rate=float("inf")), "LoadSpec.connect_rate"),
    (dict(connect_rate="100"), "LoadSpec.connect_rate"),
    (dict(connections=10_000, size=1 << 20), "GiB of message buffers"),
    (dict(transport="unix"), "LoadSpec.path: must be the server's UNIX socket path"),
    (dict(transport="unix", path="/tmp/" + "x" * 200), "107 bytes"),
])
def test_spec_rejects_bad_fields_naming_field_and_value(changes, fragment):
    base = dict(port=9)
    base.update(changes)
    with pytest.raises(ValueError) as info:
        LoadSpec(**base)
    assert fragment in str(info.value)


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.1.1", "8.8.8.8", "::2", "example.com", "0.0.0.0"])
def test_spec_refuses_non_loopback_hosts(host):
    with pytest.raises(ValueError, match="LoadSpec.host"):
        LoadSpec(host=host, port=9)


@pytest.mark.parametrize("host", ["10.0.0.1", "8.8.8.8", "::2", "not-an-ip"])
def test_engine_itself_refuses_non_loopback(host):
    with pytest.raises(ValueError, match="address"):
        _native.Load("tcp", host, 9, 1, 64)


def test_spec_accepts_loopback_forms():
    assert LoadSpec(host="localhost", port=9).host == "127.0.0.1"
    assert LoadSpec(host="127.1.2.3", port=9).host == "127.1.2.3"
    assert LoadSpec(host="::1", port=9).host == "::1"
    spec = LoadSpec(port=9)
    assert spec.with_(size=128).size == 128
    assert spec.as_dict()["connections"] == 10


# ---- a correct server ------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 64, 100 * 1024, 1 << 20])
def test_echo_round_trips_are_verified(size):
    messages = 400 if size < 1024 else 40
    with BrokenServer("echo") as server:
        r = loadgen.run(spec_for(server, connections=8, size=size, messages=messages, warmup_messages=8))
    assert r.completed == messages
    assert r.bytes == messages * size
    assert not any(r.errors.values())
    assert r.fairness.min >= 1  # every connection got through (the selector server is not fair with 1 MiB)
    assert r.latency["count"] == messages
    assert 0 < r.latency["p50"] <= r.latency["p99"] <= r.latency["max"]
    assert r.elapsed > 0 and r.msgs_per_s > 0
    assert r.connect_seconds > 0 and r.connect_rate > 0


def test_unix_socket_path():
    with BrokenServer("echo", transport="unix") as server:
        r = loadgen.run(spec_for(server, connections=4, size=64, messages=200, warmup_messages=0))
    assert r.completed == 200 and r.transport == "unix"


def test_duration_mode_runs_for_about_that_long():
    with BrokenServer("echo") as server:
        r = loadgen.run(spec_for(server, connections=4, messages=0, duration=0.3, warmup_seconds=0.1))
    # stops by itself at the duration: the bound is 10x, which no descheduling reaches
    assert 0.25 < r.elapsed < 3.0
    assert r.completed > 10


def test_payloads_differ_per_connection_and_per_message():
    seen = {}
    lock = threading.Lock()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(5)

    def serve_one(conn, idx):
        with conn:
            while True:
                data = conn.recv(16)
                if not data:
                    return
                with lock:
                    seen.setdefault(idx, []).append(data)
                conn.sendall(data)

    def acceptor():
        threads = []
        for idx in range(3):
            conn, _ = srv.accept()
            t = threading.Thread(target=serve_one, args=(conn, idx), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(10)

    t = threading.Thread(target=acceptor, daemon=True)
    t.start()
    r = loadgen.run(LoadSpec(port=srv.getsockname()[1], connections=3, size=16, messages=30,
                             warmup_messages=0))
    t.join(10)
    srv.close()
    assert r.completed == 30
    messages = [m for msgs in seen.values() for m in msgs]
    assert len(messages) == 30
    assert len(set(messages)) == 30  # no two messages alike, across and within connections


@pytest.mark.parametrize("rate", [-1.0, 0.05, float("nan"), 1e8])
def test_engine_itself_refuses_a_bad_connect_rate(rate):
    with pytest.raises(ValueError, match="connect_rate: must be 0 .unpaced. or 0.1 .. 1e.07"):
        _native.Load("tcp", "127.0.0.1", 9, 1, 64, connect_rate=rate)


def test_paced_connects_keep_their_rate():
    with BrokenServer("echo") as server:
        t0 = time.monotonic()
        with loadgen.LoadSession(spec_for(server, connections=50, messages=100, warmup_messages=0,
                                          connect_rate=100)) as s:
            took = time.monotonic() - t0
            r = s.round()
        unpaced = loadgen.run(spec_for(server, connections=50, messages=100, warmup_messages=0))
    # 50 connects 10 ms apart: the last is due 0.49 s after the first, never earlier
    assert s.connect_seconds >= 0.45 and took >= 0.45
    assert r.completed == 100
    assert unpaced.connect_seconds < 0.45  # what makes the bound above the pacing's


def test_a_paced_connect_has_its_deadline_after_the_last_connect_due():
    # nobody accepts: 3 connects at 2 a second are due over 1 s, then 0.5 s of timeout
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    host, port = srv.getsockname()
    # fill the accept queue (and then some) so the engine's connects hang in SYN-SENT
    fillers = []
    try:
        for _ in range(3):
            sock = socket.socket()
            fillers.append(sock)
            sock.setblocking(False)
            sock.connect_ex((host, port))
        time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(LoadError) as info:
            loadgen.run(LoadSpec(host=host, port=port, connections=3, connect_rate=2, connect_timeout=0.5))
        took = time.monotonic() - t0
    finally:
        for sock in fillers:
            sock.close()
        srv.close()
    assert info.value.kind == "connect"
    assert "timed out after 1.5 s" in str(info.value)
    assert 1.4 <= took < BOUND


def test_session_reuses_connections_across_rounds():
    with BrokenServer("echo") as server:
        with loadgen.LoadSession(spec_for(server, connections=5, messages=100, warmup_messages=10)) as s:
            rounds = [s.round() for _ in range(3)]
            n, elapsed, cpu = s.minimal_round(100)
        assert server.accepted == 5
    assert [r.completed for r in rounds] == [100, 100, 100]
    assert n == 100 and elapsed > 0


# ---- broken servers: each error kind, within its bound -----------------------------------

# The kind asserted says which mechanism caught the fault (a reset at once, the stall watchdog
# after stall_timeout, the phase deadline); the time bound only proves the load stops by itself,
# so it is generous: no descheduling of this shared machine reaches it.
BOUND = 20.0


def run_broken(kind, expect_kind, *, bound=BOUND, transport="tcp", **kw):
    opts = dict(connections=4, size=64, messages=400, warmup_messages=0, stall_timeout=1.0, deadline=10.0)
    opts.update(kw)
    with BrokenServer(kind, transport=transport, at=opts.pop("at", 200)) as server:
        t0 = time.monotonic()
        with pytest.raises(LoadError) as info:
            loadgen.run(spec_for(server, **opts))
        took = time.monotonic() - t0
    assert info.value.kind == expect_kind, str(info.value)
    assert took < bound, f"{kind}: took {took:.1f}s"
    return info.value


def test_flipped_byte_is_a_payload_mismatch():
    err = run_broken("flip", "payload_mismatch")
    assert err.errors["payload_mismatch"] == 1
    assert "connection 0: payload mismatch in message 4 at byte 8 of 64" in str(err)


def test_flip_in_a_large_message():
    # one connection, so the flipped third message is surely sent
    err = run_broken("flip", "payload_mismatch", size=100 * 1024, at=300_000, messages=20, connections=1)
    assert "payload mismatch in message 3 at byte 95200" in str(err)


def test_duplicated_echo_is_caught():
    err = run_broken("duplicate", "payload_mismatch")
    assert err.errors["payload_mismatch"] == 1


def test_close_mid_message_is_an_early_eof():
    err = run_broken("close_mid", "errors")
    assert err.errors["early_eof"] == 1
    assert "early EOF" in str(err)


def test_reset_is_counted_as_reset():
    err = run_broken("reset", "errors")
    assert err.errors["reset"] == 1


def test_tolerated_errors_let_the_round_finish():
    with BrokenServer("close_mid") as server:
        r = loadgen.run(spec_for(server, connections=4, messages=400, warmup_messages=0, max_errors=1))
    assert r.completed == 400
    assert r.errors["early_eof"] == 1
    assert r.fairness.starving == 1 and r.fairness.min == 4  # 4 round trips, then the server closed it


def test_server_that_stops_reading_stalls_with_the_waiting_count():
    err = run_broken("stop_reading", "stall")
    assert "4 of 4 connections waiting" in str(err)
    assert err.errors["timeout"] == 1


def test_one_connection_delayed_forever_stalls():
    err = run_broken("delay_one", "stall")
    assert "1 of 4 connections waiting" in str(err)
    # accepted and left waiting (the server's kernel acknowledged its bytes): not an accept queue
    assert "never served" not in str(err) and err.result["unserved"] == 0 and err.result["served"] == 3


def test_deadline_ends_a_phase():
    err = run_broken("stop_reading", "deadline", stall_timeout=30.0, deadline=1.0)
    assert "deadline" in str(err)


def test_connection_refused():
    host, port = unused_tcp_address()
    t0 = time.monotonic()
    with pytest.raises(LoadError) as info:
        loadgen.run(LoadSpec(host=host, port=port, connections=3))
    assert time.monotonic() - t0 < BOUND  # refused at once; the bound only catches a hang
    assert info.value.kind == "connect"
    assert info.value.errors["connect_refused"] == 1
    assert "Connection refused" in str(info.value)


def test_signal_handler_interrupts_a_long_run_promptly():
    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        with BrokenServer("stop_reading") as server:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            t0 = time.monotonic()
            with pytest.raises(Interrupted):
                loadgen.run(spec_for(server, connections=2, warmup_messages=0, stall_timeout=60, deadline=60))
            took = time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert took < 30.0  # the signal, not the 60 s stall timeout or deadline, ended the run


# ---- file descriptors ------------------------------------------------------------------

def test_fd_limit_too_low_is_one_clear_error():
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))\n"
        "from pyconcbench import loadgen\n"
        "try:\n"
        "    loadgen.run(loadgen.LoadSpec(port=9, connections=500))\n"
        "except loadgen.FdLimitError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("need 564 file descriptors for 500 connections, limit is 200")


def test_soft_fd_limit_is_raised_to_the_hard_limit():
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from pyconcbench import loadgen\n"
        "print(loadgen.ensure_fd_limit(1000) == hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_max_connections_leaves_a_margin():
    assert loadgen.max_connections() == loadgen.fd_limit()[1] - loadgen.FD_MARGIN


# ---- derived figures -------------------------------------------------------------------

def test_fairness_figures():
    even = loadgen.fairness([10, 10, 10, 10])
    assert even.jain == 1.0 and even.starving == 0 and even.median == 10
    one = loadgen.fairness([40, 0, 0, 0])
    assert one.jain == 0.25 and one.starving == 3 and one.min == 0 and one.max == 40
    assert loadgen.fairness([]).jain == 0.0


def test_loadgen_bound_flag():
    base = dict(connections=1, size=64, transport="tcp", completed=1000, elapsed=0.5, connect_seconds=0.01,
                latency={}, fairness=loadgen.fairness([1000]), errors={}, bytes=64000)
    busy = loadgen.LoadResult(loadgen_cpu_user=0.1, loadgen_cpu_sys=0.36, **base)
    idle = loadgen.LoadResult(loadgen_cpu_user=0.1, loadgen_cpu_sys=0.1, **base)
    assert busy.msgs_per_s == 2000.0 and busy.connect_rate == 100.0
    assert busy.loadgen_cpu_share == pytest.approx(0.92) and busy.loadgen_bound
    assert idle.loadgen_cpu_share == pytest.approx(0.4) and not idle.loadgen_bound
    assert busy.as_dict()["loadgen_bound"] is True


# ---- real servers ----------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native_epoll", "native_threads", "asyncio_protocol", "asyncio_streams",
                                  "selectors"])
def test_engine_against_each_server(impl):
    with harness.ServerProcess(impl, cpu=None) as server:
        r = loadgen.run(spec_for(server, connections=50, messages=3000, warmup_messages=200))
        usage = server.stop()
    assert r.completed == 3000 and not any(r.errors.values())
    assert r.fairness.min > 0
    assert usage.accepted == 50
    assert usage.bytes >= (3000 + 200) * 64


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["native_epoll", "asyncio_protocol"])
def test_ten_thousand_connections(impl):
    with harness.ServerProcess(impl, cpu=None) as server:
        r = loadgen.run(spec_for(server, connections=10_000, messages=30_000, warmup_messages=10_000,
                                 stall_timeout=20.0))
        usage = server.stop()
    assert r.completed == 30_000 and not any(r.errors.values())
    assert usage.accepted == 10_000
