"""ZeroMQ request/response loops: aiozmq against raw pyzmq and zmq.asyncio (the aiozmq study).

One pytest-benchmark round is one timed loop of N verified requests on sockets opened (and
warmed up) before the first round.  Ids read ``test_zmq[aiozmq_rpc-uvloop-200B-if1]``
(``-ipc`` appended over ipc://, then ``-2cpu`` for the 2cpu placement), groups
``zmq-200B-if1`` (``zmq-200B-if1-2cpu``) so each table compares the modes on the same work and
the same thread placement.  Requests/s, latency percentiles, CPU per request, the placement and
every thread of the measurement with its CPUs (read back from /proc after the warm-up), and
every round's own figures are in ``extra_info``.

Thread placement (``pyconcbench.zmq.Session``): by default (``1cpu``) every thread of the
measurement -- the client, an in-process server thread, the server process and its threads,
every libzmq I/O and reaper thread -- runs on the load-generator CPU of ``--pcb-cpus``, like
the switch suite's ``-1cpu``: the library's cost, not the VM's cross-CPU wake-ups.  The
``-2cpu`` rows keep the client thread there and put everything else on the server CPU: the
cross-CPU cost.  With ``--pcb-cpus none`` nothing is pinned and the ``-2cpu`` rows are skipped
(they would be the 1cpu rows again).

A round is noisy, as in the echo suite, when a fixed loop timed on a CPU the round runs on
(both pinned CPUs under 2cpu, the client CPU under 1cpu: ``noise_cpus`` in ``extra_info``)
before or after it ran more than 1.35x slower than its best (the host's slow spells), when
other processes used more than a quarter of a CPU during it, or (2cpu only) when the cache-line
round trip between the two pinned CPUs, probed before and after it, was well above the quiet
machine's (a VM whose virtual CPUs the host placed apart, or that shares them: every
cross-CPU wake-up is dearer then).  A noisy round is measured
again once the machine is quiet, up to ``--pcb-noise-retries`` times (``pyconcbench.rounds``);
pytest-benchmark is handed each kept try's own time (``ROUND_CLOCK``), and ``extra_info``
keeps the probes and the rejected tries.

The matrix follows ``--pcb-profile`` (see ``pyconcbench.zmq.cases``): ``quick`` (default) is
every mode at 200 B / 1 in flight / TCP plus a few variants, ``full`` every mode x 200 B, 1 KiB,
64 KiB x 1, 10, 100 in flight x tcp, ipc.  ``--pcb-rounds``, ``--pcb-messages`` (requests per
round), ``--pcb-cpus`` and ``--pcb-stall-timeout`` (the longest wait for a reply) apply.
"""
import pytest



def test_zmq(zmq_case, zmq_bench, pcb_settings):
    info = zmq_bench()
    if info["pcb_family"] == "ab":
        check_ab(info, zmq_case, pcb_settings)
    else:
        check(info, zmq_case, pcb_settings)


def check_ab(info, zmq_case, pcb_settings):
    """An interleaved A/B run (--pcb-ab-a/--pcb-ab-b: a worker per side): each side's figures as
    a normal run's, as many rounds a side as pairs in ABBA order, and each pair's requests/s B's
    round over A's adjacent one."""
    a, b, pairs = info["a"], info["b"], info["pairs"]
    check(a, zmq_case, pcb_settings)
    check(b, zmq_case, pcb_settings)
    assert info["ab_family"] == "zmq" and len(pairs) == len(a["rounds"]) == len(b["rounds"])
    assert info["order"] == "".join(("AB", "BA")[i % 2] for i in range(len(pairs)))
    for pair, ra, rb in zip(pairs, a["rounds"], b["rounds"]):
        assert pair["requests_per_s"] == pytest.approx(rb["requests_per_s"] / ra["requests_per_s"], rel=1e-4)
    assert info["noisy_pairs"] == sum(1 for p in pairs if p.get("noisy"))


def check(info, zmq_case, pcb_settings):
    requests = pcb_settings.messages or zmq_case.requests
    rounds = info["rounds"]

    assert 1 <= len(rounds) <= (pcb_settings.rounds or len(rounds))  # one with --benchmark-disable
    # Every request of every round was answered and verified (a wrong reply fails the round).
    assert all(r["requests"] == requests for r in rounds)
    assert info["requests_per_s"] > 0
    assert 0 < info["latency_p50_us"] <= info["latency_p99_us"]
    assert info["mode"] == zmq_case.mode
    assert info["placement"] == (zmq_case.placement if pcb_settings.cpus else "off")
    assert info["noisy_rounds_rejected"] == len(info["rejected_rounds"])
