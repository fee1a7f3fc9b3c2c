"""Echo servers under closed-loop ping-pong, one pytest-benchmark round per measured phase.

Parametrized by the pyconcbench plugin over implementation x connections x size x transport
(``--pcb-profile``, ``--pcb-impl``, ``--pcb-conns``, ``--pcb-size``, ``--pcb-transport``);
ids read ``test_echo[asyncio_protocol-c100-64B]``, groups ``echo-c100-64B``.
"""
import pytest

from pyconcbench import rounds as rounds_engine
from pyconcbench import servers

# The engine bounds every round itself (stall watchdog, per-phase deadline); the slowest
# models at the full profile's 10k+ connections need far longer than a unit test's timeout.
pytestmark = pytest.mark.timeout(7200)


def test_echo(echo_case, echo_servers, echo_bench):
    run = echo_bench()
    for side, (outcome, server) in run.sides.items():
        check_outcome(echo_case, outcome, server)
    if run.ab is not None:
        check_ab(run)


def check_outcome(echo_case, outcome, server):
    extra = outcome.extra
    rounds = extra["rounds"]

    # Every round completed its round trips, each one verified byte for byte by the engine (an
    # error of any kind stops the load with a failure: the engine runs with max_errors=0).
    assert outcome.rounds == len(rounds) >= 1
    assert outcome.completed == sum(r["completed"] for r in rounds)
    if outcome.messages_per_round:
        assert all(r["completed"] == outcome.messages_per_round for r in rounds)

    # The headline rate is the clean rounds' round trips over their summed wall time (every
    # round's when none was clean: the judge found the machine slowed or busy during it).
    clean = [r for r in rounds if not r["noisy"]]
    used = clean or rounds
    assert extra["msgs_per_s"] == pytest.approx(sum(r["completed"] for r in used)
                                                / sum(r["elapsed"] for r in used), rel=1e-3)
    assert extra["figures_from"] == (f"the {len(clean)} clean of {len(rounds)} rounds" if clean
                                     else f"all {len(rounds)} rounds (none was clean)")
    assert all(r["kept"] != rounds_engine.REJECTED for r in rounds)
    assert all(r["kept"] == rounds_engine.REJECTED for r in extra["rejected_rounds"])
    assert 0 < extra["fairness_jain"] <= 1
    assert 0 <= extra["fairness_min"] <= extra["fairness_max"]
    assert 0 < extra["latency_p50_us"] <= extra["latency_p99_us"] <= extra["latency_p99_9_us"] \
        <= extra["latency_max_us"]
    # The server worked for every round trip: its CPU time was read, not defaulted.
    assert extra["server_cpu_us_per_msg"] > 0 and extra["server_cpu"] > 0
    assert extra["loadgen_cpu_us_per_msg"] > 0

    # The server saw every connection and echoed at least every verified byte (a plain
    # reference server, or a program the user brings, counts nothing: the load generator
    # verified every byte it echoed).
    usage = server.stop()
    if echo_case.plain or echo_case.command is not None:
        assert usage is None
    elif servers.user_spec(echo_case.impl) is not None and usage.accepted == usage.bytes == 0:
        pass  # a server of the user's own may count nothing: the engine verified every byte
    else:
        assert usage.accepted >= echo_case.connections
        assert usage.bytes >= outcome.completed * echo_case.size


def check_ab(run):
    """An interleaved A/B case: as many rounds on each side as pairs, in ABBA order, and each
    pair's ratio is B's round over A's adjacent one."""
    extra = run.extra
    a, b = run.sides["a"][0].extra, run.sides["b"][0].extra
    pairs = extra["pairs"]
    assert len(pairs) == len(a["rounds"]) == len(b["rounds"]) >= 1
    assert a["round_plan"] == b["round_plan"] == f"{len(pairs)} rounds"  # one per pair, never early
    assert extra["order"] == "".join(("AB", "BA")[i % 2] for i in range(len(pairs)))
    for pair, ra, rb in zip(pairs, a["rounds"], b["rounds"]):
        assert pair["msgs_per_s"] == pytest.approx(rb["msgs_per_s"] / ra["msgs_per_s"], rel=1e-4)
    iv = extra["intervals"]["msgs_per_s"]
    # over the pairs outside slow spells when there are enough of them (ab.interval_pairs),
    # else over all; the interval over every pair beside it
    clean = [p for p in pairs if not p.get("spell")]
    used = clean if len(clean) >= 6 else pairs
    assert iv["low"] <= iv["ratio"] <= iv["high"] and iv["pairs"] == len(used)
    assert extra["intervals_all"]["msgs_per_s"]["pairs"] == len(pairs)
    assert extra["interval_pairs"].startswith(f"the {len(clean)} pairs of" if 6 <= len(clean) < len(pairs)
                                              else f"all {len(pairs)} pairs")
    assert all(r["kept"] != rounds_engine.REJECTED for r in a["rounds"] + b["rounds"])
    assert extra["a"]["environment"]["python"] and extra["b"]["environment"]["python"]
