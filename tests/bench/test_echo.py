"""Echo servers under closed-loop ping-pong, one pytest-benchmark round per measured phase.

Parametrized by the pyconcbench plugin over implementation x connections x size x transport
(``--pcb-profile``, ``--pcb-impl``, ``--pcb-conns``, ``--pcb-size``, ``--pcb-transport``);
ids read ``test_echo[asyncio_protocol-c100-64B]``, groups ``echo-c100-64B``.
"""
import pytest

# The engine bounds every round itself (stall watchdog, per-phase deadline); the slowest
# models at the full profile's 10k+ connections need far longer than a unit test's timeout.
pytestmark = pytest.mark.timeout(7200)


def test_echo(echo_case, echo_server, echo_bench):
    outcome = echo_bench()
    extra = outcome.extra
    rounds = extra["rounds"]

    # Every round completed its round trips, each one verified byte for byte by the engine (an
    # error of any kind stops the load with a failure: the engine runs with max_errors=0).
    assert outcome.rounds == len(rounds) >= 1
    assert outcome.completed == sum(r["completed"] for r in rounds)
    if outcome.messages_per_round:
        assert all(r["completed"] == outcome.messages_per_round for r in rounds)

    # The headline rate is the accepted rounds' round trips over their summed wall time.
    elapsed = sum(r["elapsed"] for r in rounds)
    assert extra["msgs_per_s"] == pytest.approx(outcome.completed / elapsed, rel=1e-3)
    assert 0 < extra["fairness_jain"] <= 1
    assert 0 <= extra["fairness_min"] <= extra["fairness_max"]
    assert 0 < extra["latency_p50_us"] <= extra["latency_p99_us"] <= extra["latency_p99_9_us"] \
        <= extra["latency_max_us"]
    # The server worked for every round trip: its CPU time was read, not defaulted.
    assert extra["server_cpu_us_per_msg"] > 0 and extra["server_cpu"] > 0
    assert extra["loadgen_cpu_us_per_msg"] > 0

    # The server saw every connection and echoed at least every verified byte (a plain
    # reference server counts nothing: the load generator verified every byte it echoed).
    usage = echo_server.stop()
    if echo_case.plain:
        assert usage is None
    else:
        assert usage.accepted >= echo_case.connections
        assert usage.bytes >= outcome.completed * echo_case.size
