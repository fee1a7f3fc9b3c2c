"""Soak at the fd limit: the most connections one process may hold (``--pcb-conns max``), all
open at once for a minute against one server, every round trip verified by the C engine.

What must hold, for a C server and for the asyncio one (the model the studies found leaking
most easily): no connection error of any kind, every connection served in every round (none
starved to zero), and the server's resident memory flat once warmed up — a per-message leak of
even 100 bytes at the rates here grows it by tens of MiB over the minute.  The figures are
printed (run with ``-s``) and kept as test properties."""
import resource
import time

import pytest

from skipping import start_or_skip
from pyconcbench import harness, loadgen

#: Seconds the connections are held and driven.
SOAK_SECONDS = 60.0
#: Seconds per measured round (each one checks errors and that every connection was served).
ROUND_SECONDS = 5.0
#: Rounds of warm-up before the memory baseline is taken (buffers, free lists, heap growth).
WARMUP_ROUNDS = 2
#: Allowed growth of the server's RSS after warm-up: 5 % plus 4 MiB (allocator noise).
RSS_GROWTH_SHARE = 0.05
RSS_GROWTH_KIB = 4096


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["native_epoll", "asyncio_protocol"])
def test_soak_at_the_fd_limit(impl, record_property):
    connections = loadgen.max_connections()
    if connections < 10_000:
        pytest.skip(f"the hard fd limit allows only {connections} connections here; the soak needs 10,000+")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    loadgen.ensure_fd_limit(connections)  # the server inherits the raised soft limit
    try:
        _soak(impl, connections, record_property)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the tests after this one get theirs back


def _soak(impl, connections, record_property):
    server = harness.ServerProcess(impl, cpu=0, stop_timeout=30.0)
    start_or_skip(server)
    with server:  # stopped however the body ends
        host, port = server.address
        spec = loadgen.LoadSpec(host=host, port=port, connections=connections, size=64, messages=0,
                                duration=ROUND_SECONDS, warmup_messages=connections,
                                connect_timeout=120.0, stall_timeout=30.0, deadline=120.0, cpu=1)
        rounds = []
        rss = []
        with loadgen.LoadSession(spec) as session:
            connect_s = session.connect_seconds
            rss_connected = server.rss_kib()
            end = time.monotonic() + SOAK_SECONDS
            while time.monotonic() < end:
                r = session.round()
                server.check_alive()
                rounds.append(r)
                rss.append(server.rss_kib())
                assert not any(r.errors.values()), f"round {len(rounds)}: connection errors {r.errors}"
                assert r.fairness.min > 0, (
                    f"round {len(rounds)}: {r.fairness.starving} connections starving, the least "
                    f"served got {r.fairness.min} round trips in {r.elapsed:.1f} s")
    usage = server.stop()
    assert usage.accepted == connections, f"the server accepted {usage.accepted} of {connections} connections"

    assert len(rounds) > WARMUP_ROUNDS + 2, f"only {len(rounds)} rounds in {SOAK_SECONDS:.0f} s"
    total = sum(r.completed for r in rounds)
    seconds = sum(r.elapsed for r in rounds)
    warm, last = rss[WARMUP_ROUNDS - 1], rss[-1]
    allowed = warm * (1 + RSS_GROWTH_SHARE) + RSS_GROWTH_KIB
    p99 = max(r.latency["p99"] for r in rounds) / 1e6
    figures = (f"{impl}: {connections:,} connections (connected in {connect_s:.1f} s), "
               f"{len(rounds)} rounds, {total:,} verified round trips in {seconds:.0f} s "
               f"({total / seconds:,.0f}/s), 0 errors, least-served connection per round "
               f"{min(r.fairness.min for r in rounds)}, worst round p99 {p99:.0f} ms; server RSS "
               f"{rss_connected / 1024:.1f} MiB connected, {warm / 1024:.1f} MiB warm, "
               f"{last / 1024:.1f} MiB at the end (peak {usage.maxrss_kib / 1024:.1f} MiB)")
    print("\n" + figures)
    record_property("soak", figures)
    assert last <= allowed, (f"server RSS grew from {warm} KiB after warm-up to {last} KiB at the end "
                             f"(allowed {allowed:.0f}): {rss}")
