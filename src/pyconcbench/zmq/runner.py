"""The measured rounds of one ZeroMQ case (``Runner``), as the echo workload's ``EchoRunner``:
a ``Session`` opened and warmed up, then rounds of N verified requests through the one retry
loop of ``pyconcbench.rounds``, summed up into the extra_info saved with the benchmark.  No
pytest here: the plugin parametrizes ``test_zmq`` and wires this to fixtures.

Noise: the CPUs the measurement runs on (``noise_cpus``: the client CPU under 1cpu, both pinned
CPUs under 2cpu) are watched by the CPU-speed gauge; the cache-line round trip between the two
pinned CPUs is probed only when the round crosses them (2cpu); other processes' CPU, as in the
echo suite.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import metrics, rounds
from . import DEFAULT_PLACEMENT, Case, RoundError, RoundResult, Session, summarize

#: Unmeasured requests before the first round, at most.
WARMUP = 500


class Runner:
    """Runs the measured rounds of one case; ``run(pedantic)`` returns the extra_info dict."""

    def __init__(self, case: Case, *, requests: int, plan: rounds.Plan, retries: int, timeout: float,
                 cpus: Optional[Tuple[int, int]], probe_baseline: Optional[float],
                 speed: Any = None) -> None:
        if cpus is None and case.placement != DEFAULT_PLACEMENT:
            raise ValueError(f"the {case.placement} placement needs two pinned CPUs")
        self.case = case
        self.requests = requests
        self.plan = plan  # how many rounds
        self.retries = retries
        self.cpus = cpus
        self.probe_baseline = probe_baseline
        self.session = Session(case.mode, size=case.size, inflight=case.inflight, transport=case.transport,
                               timeout=timeout, cpus=cpus, placement=case.placement)
        # The CPUs the measurement runs on: a slow spell elsewhere, or the cache-line round trip
        # between the two CPUs, cannot touch a 1cpu round.
        self.used: Tuple[int, ...] = ((cpus[1],) if cpus and case.placement == "1cpu" else tuple(cpus or ()))
        pair = (cpus[0], cpus[1]) if cpus and len(self.used) == 2 else None
        self.judge = rounds.NoiseJudge(speed, probe_baseline, pair, speed_cpus=self.used)
        self.results: List[RoundResult] = []
        self.records: List[Dict[str, Any]] = []
        self.rejected: List[Dict[str, Any]] = []

    def _measure(self, attempt: int) -> Tuple[Tuple[RoundResult, Dict[str, Any]], str, float]:
        before = self.judge.probe()
        started = time.perf_counter()
        result = self.session.round(self.requests)
        finished = time.perf_counter()
        if result.requests != self.requests or len(result.latencies_ns) != self.requests:
            raise RoundError(f"{self.case.id}: a round of {self.requests} requests came back with "
                             f"{result.requests} requests and {len(result.latencies_ns)} latencies")
        after = self.judge.probe()
        note = self.judge.reason(before, after, result.other_cpu, result.elapsed)
        record = {"probe_before_ns": _ns(before.cacheline_ns), "probe_after_ns": _ns(after.cacheline_ns),
                  "noisy": note or None, "attempt": attempt}
        return (result, record), note, finished - started

    def one_round(self) -> float:
        """One round (rounds.measure_round); returns its time, the kept try's seconds."""
        outcome = rounds.measure_round(self._measure, self.retries, settle=self.judge.settle)
        result, record = outcome.kept.value
        record["kept"] = outcome.kept_because
        self.results.append(result)
        self.records.append(record)
        self.rejected.extend(dict(r.as_dict(), **rec) for r, rec in (t.value for t in outcome.rejected))
        return outcome.timed

    def clean_figures(self) -> List[float]:
        """Requests/s of the clean rounds so far (what Plan.done reads)."""
        return [r.requests / r.elapsed for r, rec in zip(self.results, self.records) if not rec["noisy"]]

    def warm_up(self) -> None:
        """Unmeasured requests on the open session (at most WARMUP), the threads placed."""
        self.session.warmup(min(WARMUP, self.requests))

    def round_record(self, n: int) -> Dict[str, Any]:
        """Round ``n``'s figures as saved: the round's own, its probes and why it was noisy."""
        return dict(self.results[n].as_dict(), **self.records[n])

    def run(self, pedantic: Callable[..., Any]) -> Dict[str, Any]:
        """Opens the session, warms it up, runs the rounds through ``pedantic``
        (pytest-benchmark's ``benchmark.pedantic``); Unavailable, Broken or RoundError when it
        cannot."""
        with self.session:
            self.warm_up()
            rounds.run_rounds(pedantic, self.one_round, self.plan, self.clean_figures)
        return self.extra()

    def extra(self) -> Dict[str, Any]:
        info: Dict[str, Any] = dict(metrics.stamp(metrics.ZMQ))
        info.update(self.session.describe())
        info.update(summarize(self.results))
        info["rounds"] = [self.round_record(n) for n in range(len(self.results))]
        info["probe_baseline_ns"] = _ns(self.probe_baseline)
        info["noise_cpus"] = list(self.used)
        info["noisy_rounds_kept"] = sum(1 for record in self.records if record["noisy"])
        info["noisy_rounds_rejected"] = len(self.rejected)
        info["rejected_rounds"] = self.rejected
        info["timer"] = "wall time of one round of verified requests (rejected noisy rounds left out)"
        info["round_plan"] = self.plan.describe()
        return info


def _ns(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)


__all__: Sequence[str] = ("Runner", "WARMUP")
