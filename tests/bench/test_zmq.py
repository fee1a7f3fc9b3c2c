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
before or after it ran more than 1.15x slower than its best (the host's slow spells), when
other processes used more than a quarter of a CPU during it, or (2cpu only) when the cache-line
round trip between the two pinned CPUs, probed before and after it, was well above the quiet
machine's (a VM whose virtual CPUs the host placed apart, or that shares them: every
cross-CPU wake-up is dearer then).  A noisy round is measured
again, up to ``--pcb-noise-retries`` times; pytest-benchmark's timer (``ROUND_CLOCK``) leaves
the probes and the rejected tries out, and ``extra_info`` keeps them.

The matrix follows ``--pcb-profile`` (see ``pyconcbench.zmq.cases``): ``quick`` (default) is
every mode at 200 B / 1 in flight / TCP plus a few variants, ``full`` every mode x 200 B, 1 KiB,
64 KiB x 1, 10, 100 in flight x tcp, ipc.  ``--pcb-rounds``, ``--pcb-messages`` (requests per
round), ``--pcb-cpus`` and ``--pcb-stall-timeout`` (the longest wait for a reply) apply.
"""
import time

import pytest

from pyconcbench import machine
from pyconcbench import zmq as pcbzmq
from pyconcbench.plugin import PROFILES, ROUND_CLOCK, SETTINGS_KEY, noise_reason, retry_pause

#: Unmeasured requests before the first round, at most.
WARMUP = 500


@pytest.fixture(scope="module", autouse=True)
def libuv_global_pipe():
    """libuv opens one process-wide pipe (its signal pipe) with the first uvloop loop and keeps
    it: open it before the project's fd-leak check starts counting."""
    try:
        import uvloop
    except Exception:
        yield
        return
    uvloop.new_event_loop().close()
    yield


def pytest_generate_tests(metafunc):
    if "zmq_case" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash[SETTINGS_KEY]
    metafunc.parametrize("zmq_case", [
        pytest.param(case, id=case.id, marks=pytest.mark.benchmark(group=case.group, timer=ROUND_CLOCK))
        for case in pcbzmq.cases(settings.profile)
    ])


def test_zmq(zmq_case, benchmark, pcb_settings, pcb_probe_baseline, pcb_speed_gauge):
    requests = pcb_settings.messages or zmq_case.requests
    rounds = pcb_settings.rounds or PROFILES[pcb_settings.profile]().rounds
    retries = pcb_settings.noise_retries
    cpus = pcb_settings.cpus
    if cpus is None and zmq_case.placement != pcbzmq.DEFAULT_PLACEMENT:
        pytest.skip("pinning off (--pcb-cpus none): the %s placement needs two CPUs" % zmq_case.placement)
    session = pcbzmq.Session(zmq_case.mode, size=zmq_case.size, inflight=zmq_case.inflight,
                             transport=zmq_case.transport, timeout=pcb_settings.stall_timeout,
                             cpus=cpus, placement=zmq_case.placement)
    results, records, rejected = [], [], []

    # The CPUs the measurement runs on: a slow spell elsewhere, or the cache-line round trip
    # between the two CPUs, cannot touch a 1cpu round.
    used = (cpus[1],) if cpus and zmq_case.placement == "1cpu" else tuple(cpus or ())
    crosses = len(used) == 2

    def probe():
        return machine.cacheline_rtt(cpus[0], cpus[1]) if crosses else None

    def speed():
        if not pcb_speed_gauge:
            return None
        return {cpu: ns for cpu, ns in pcb_speed_gauge.probe().items() if cpu in used}

    def one_round():
        entered = time.perf_counter()
        for attempt in range(retries + 1):
            retry_pause(attempt)
            speed_before = speed()
            before = probe()
            started = time.perf_counter()
            result = session.round(requests)
            finished = time.perf_counter()
            after = probe()
            speed_after = speed()
            note = noise_reason(pcb_speed_gauge, (speed_before, speed_after), pcb_probe_baseline, (before, after),
                                result.other_cpu, result.elapsed)
            record = {"probe_before_ns": _ns(before), "probe_after_ns": _ns(after), "noisy": note or None,
                      "attempt": attempt}
            if not note or attempt == retries:
                results.append(result)
                records.append(record)
                ROUND_CLOCK.excluded += (time.perf_counter() - entered) - (finished - started)
                return
            rejected.append(dict(result.as_dict(), **record))

    skipped = failure = None
    try:
        with session:
            session.warmup(min(WARMUP, requests))
            benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    except pcbzmq.Unavailable as exc:  # a package not installed, or not importable on this Python
        skipped = str(exc)
    except (pcbzmq.RoundError, pcbzmq.Broken) as exc:  # Broken: our own module does not import
        failure = "%s: %s" % (zmq_case.id, exc)
    # Outside the except blocks: one line, no chained traceback.
    if skipped is not None:
        pytest.skip(skipped)
    if failure is not None:
        pytest.fail(failure, pytrace=False)

    # pytest-benchmark keeps a reference to this very dict: update it, never rebind it.
    info = benchmark.extra_info
    info.update(session.describe())
    info.update(pcbzmq.summarize(results))
    for summary, record in zip(info["rounds"], records):
        summary.update(record)
    info["probe_baseline_ns"] = _ns(pcb_probe_baseline)
    info["noise_cpus"] = list(used)
    info["noisy_rounds_kept"] = sum(1 for record in records if record["noisy"])
    info["noisy_rounds_rejected"] = len(rejected)
    info["rejected_rounds"] = rejected
    info["timer"] = "wall time of one round of verified requests (rejected noisy rounds left out)"

    assert 1 <= len(results) <= rounds  # one with --benchmark-disable
    assert all(r.requests == requests and len(r.latencies_ns) == requests for r in results)


def _ns(value):
    return None if value is None else round(value, 1)
