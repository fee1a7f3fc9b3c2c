"""Echo servers under an open loop: latency at a fixed offered rate, corrected for coordinated omission.

Each message has an intended send time (each connection on its own schedule at rate /
connections); one due while its connection still waits for an echo queues, and its wait counts.
The rates are shares of each implementation's closed-loop maximum, measured first in the same
run (``--pcb-rate 25%,50%,90%``), or round trips per second (``--pcb-rate 20k``).  Parametrized by
the pyconcbench plugin over implementation x scale x rate; ids read
``test_openloop[asyncio_protocol-c100-64B-50pct]``, groups ``openloop-c100-64B-50pct``.
"""
import pytest

from pyconcbench import rounds as rounds_engine
from pyconcbench import servers

pytestmark = pytest.mark.timeout(3600)


def test_openloop(openloop_case, echo_server, openloop_bench):
    outcome = openloop_bench()
    extra = outcome.extra
    rounds = extra["rounds"]
    assert outcome.rounds == len(rounds) >= 1
    assert all(r["kept"] != rounds_engine.REJECTED for r in rounds)

    # Every round completed its round trips, each verified byte for byte, all at the asked rate.
    assert all(r["completed"] == outcome.messages_per_round for r in rounds)
    assert all(r["rate_asked"] == pytest.approx(extra["rate_asked"], rel=1e-6) for r in rounds)
    if openloop_case.relative:
        assert extra["rate_asked"] == pytest.approx(openloop_case.rate * extra["closed_loop_max_msgs_per_s"],
                                                    rel=1e-3)
    else:
        assert extra["rate_asked"] == pytest.approx(openloop_case.rate, rel=1e-6)
    # achieved vs asked, and the verdict on it, agree with each other
    assert extra["rate_achieved_share"] == pytest.approx(extra["msgs_per_s"] / extra["rate_asked"], rel=1e-3)
    assert extra["rate_held"] == (extra["rate_achieved_share"] >= 0.95)

    # Latencies from the intended send time include the wait before the actual send: never less
    # than from the actual send (the histograms' 1 % buckets aside).
    assert 0 < extra["latency_p50_us"] <= extra["latency_p99_us"] <= extra["latency_p99_9_us"] \
        <= extra["latency_max_us"]
    for p in ("p50", "p99", "p99_9", "max"):
        assert extra[f"latency_{p}_us"] >= 0.98 * extra[f"latency_uncorrected_{p}_us"]
    spectrum = extra["latency_spectrum"]
    assert spectrum and spectrum[-1][0] == 100.0
    assert all(a[1] <= b[1] for a, b in zip(spectrum, spectrum[1:]))
    assert extra["sent"] == sum(r["completed"] for r in
                                ([r for r in rounds if not r["noisy"]] or rounds))
    assert extra["server_cpu_us_per_msg"] > 0

    usage = echo_server.stop()
    if openloop_case.echo.command is not None or (servers.user_spec(openloop_case.echo.impl) is not None
                                                  and usage.accepted == usage.bytes == 0):
        return  # a server of the user's own may count nothing: the engine verified every byte
    assert usage.accepted >= openloop_case.echo.connections
    assert usage.bytes >= outcome.completed * openloop_case.echo.size
