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

    # Every round completed its round trips, each one verified byte for byte by the engine.
    assert outcome.rounds >= 1
    if outcome.messages_per_round:
        assert outcome.completed == outcome.rounds * outcome.messages_per_round
    assert outcome.errors == {}
    assert outcome.extra["fairness_min"] >= 0

    # The server saw every connection and echoed at least every verified byte (a plain
    # reference server counts nothing: the load generator verified every byte it echoed).
    usage = echo_server.stop()
    if echo_case.plain:
        assert usage is None
    else:
        assert usage.accepted >= echo_case.connections
        assert usage.bytes >= outcome.completed * echo_case.size
