"""ZeroMQ request/response loops: aiozmq against raw pyzmq and zmq.asyncio (the aiozmq study).

One pytest-benchmark round is one timed loop of N verified requests on sockets opened (and
warmed up) before the first round.  Ids read ``test_zmq[aiozmq_rpc-uvloop-200B-if1]``
(``-ipc`` appended over ipc://), groups ``zmq-200B-if1`` so each table compares the modes on
the same work.  Requests/s, latency percentiles, CPU per request and every round's own figures
are in ``extra_info``.

The matrix follows ``--pcb-profile`` (see ``pyconcbench.zmq.cases``): ``quick`` (default) is
every mode at 200 B / 1 in flight / TCP plus a few variants, ``full`` every mode x 200 B, 1 KiB,
64 KiB x 1, 10, 100 in flight x tcp, ipc.  ``--pcb-rounds``, ``--pcb-messages`` (requests per
round), ``--pcb-cpus`` and ``--pcb-stall-timeout`` (the longest wait for a reply) apply.
"""
import pytest

from pyconcbench import zmq as pcbzmq
from pyconcbench.plugin import SETTINGS_KEY

#: Unmeasured requests before the first round, at most.
WARMUP = 500


def pytest_generate_tests(metafunc):
    if "zmq_case" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash[SETTINGS_KEY]
    metafunc.parametrize("zmq_case", [
        pytest.param(case, id=case.id, marks=pytest.mark.benchmark(group=case.group))
        for case in pcbzmq.cases(settings.profile)
    ])


def test_zmq(zmq_case, benchmark, pcb_settings):
    requests = pcb_settings.messages or zmq_case.requests
    session = pcbzmq.Session(zmq_case.mode, size=zmq_case.size, inflight=zmq_case.inflight,
                             transport=zmq_case.transport, timeout=pcb_settings.stall_timeout,
                             cpus=pcb_settings.cpus)
    results = []
    skipped = failure = None
    try:
        with session:
            session.warmup(min(WARMUP, requests))
            benchmark.pedantic(lambda: results.append(session.round(requests)),
                               rounds=pcb_settings.rounds, iterations=1, warmup_rounds=0)
    except pcbzmq.Unavailable as exc:
        skipped = str(exc)
    except pcbzmq.RoundError as exc:
        failure = "%s: %s" % (zmq_case.id, exc)
    # Outside the except blocks: one line, no chained traceback.
    if skipped is not None:
        pytest.skip(skipped)
    if failure is not None:
        pytest.fail(failure, pytrace=False)

    # pytest-benchmark keeps a reference to this very dict: update it, never rebind it.
    benchmark.extra_info.update(session.describe())
    benchmark.extra_info.update(pcbzmq.summarize(results))
    benchmark.extra_info["timer"] = "wall time of one round of verified requests"

    assert len(results) >= 1
    assert all(r.requests == requests and len(r.latencies_ns) == requests for r in results)
