"""The measured round, for every workload (echo, ZeroMQ, switch): the clock pytest-benchmark
reads, the noise judges, and the one retry loop.

A round is measured; if a judge finds it noisy it is measured again after a growing pause, up
to ``retries`` more times, and the last try is kept (marked noisy) when none was clean.  The
judges of rounds that run on pinned CPUs (echo, ZeroMQ) are in ``NoiseJudge``: a slow spell of
a CPU the round runs on (``instruments.SpeedGauge``), the cache-line round trip between the two
pinned CPUs far above the quiet machine's, other processes busy during the round.  The switch
workload brings its own judge (the measuring thread waited for its CPU), through the same loop.

``ROUND_CLOCK`` is the timer pytest-benchmark reads around a round: ``perf_counter`` less the
time spent in probes and in rejected tries, so a round's duration is the accepted try's alone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

from . import instruments, machine

T = TypeVar("T")

#: A round is noisy when the cache-line probe exceeds both of these ...
PROBE_NOISY_FACTOR = 2.0
PROBE_NOISY_MARGIN_NS = 150.0
#: ... or other processes used more than this share of one CPU during it (beyond two clock
#: ticks, the resolution of /proc/stat).
OTHER_CPU_NOISY_SHARE = 0.25


class RoundClock:
    """The timer pytest-benchmark reads around each round: ``perf_counter`` less the time
    excluded so far (probes, rejected noisy tries)."""

    __name__ = "round_clock"
    __module__ = "pyconcbench.rounds"

    def __init__(self) -> None:
        self.excluded = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.excluded


ROUND_CLOCK = RoundClock()


def retry_pause(attempt: int) -> None:
    """Before measuring a noisy round again: a slow spell of the host lasts seconds, so wait a
    little longer each time."""
    if attempt:
        time.sleep(min(2.0, 0.5 * attempt))


@dataclass
class Try(Generic[T]):
    """One try of a round: what the workload measured, why it was noisy ('' when clean), and
    which try it was (0 = the first)."""

    value: T
    noisy: str
    attempt: int


@dataclass
class Outcome(Generic[T]):
    kept: Try[T]
    rejected: List[Try[T]] = field(default_factory=list)


def measure_round(measure: Callable[[int], Tuple[T, str, float]], retries: int,
                  clock: Optional[RoundClock] = ROUND_CLOCK) -> Outcome[T]:
    """Runs ``measure(attempt) -> (value, why_noisy, timed_seconds)`` until a try is clean, at
    most ``retries`` more times; with a ``clock``, everything but the kept try's timed seconds
    is excluded from it."""
    entered = time.perf_counter()
    rejected: List[Try[T]] = []
    for attempt in range(retries + 1):
        retry_pause(attempt)
        value, why, timed = measure(attempt)
        if not why or attempt == retries:
            if clock is not None:
                clock.excluded += (time.perf_counter() - entered) - timed
            return Outcome(Try(value, why, attempt), rejected)
        rejected.append(Try(value, why, attempt))
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class Probes:
    """The machine probed just before or just after a round."""

    speed: Optional[Dict[int, float]] = None  # cpu -> fixed-loop ns now
    cacheline_ns: Optional[float] = None


def noise_reason(speed: Optional[instruments.SpeedGauge], speed_probes: Sequence[Any],
                 probe_baseline: Optional[float], probes: Sequence[Optional[float]],
                 other_cpu: Optional[float], elapsed: float) -> str:
    """Why a measured round is noisy, or '': a slow spell of a CPU in the speed probes around
    it, the cache-line round trip far above the quiet machine's, or other processes busy
    during it."""
    if speed is not None:
        slow = speed.judge(*speed_probes)
        if slow:
            return slow
    worst = max((p for p in probes if p is not None), default=None)
    if probe_baseline and worst is not None:
        limit = max(probe_baseline * PROBE_NOISY_FACTOR, probe_baseline + PROBE_NOISY_MARGIN_NS)
        if worst > limit:
            return f"cache-line probe {worst:.0f} ns > {limit:.0f} ns"
    tick = 1.0 / machine.CLK_TCK
    if other_cpu is not None and elapsed > 0 and other_cpu - 2 * tick > OTHER_CPU_NOISY_SHARE * elapsed:
        return f"other processes used {other_cpu / elapsed:.0%} of a CPU"
    return ""


class NoiseJudge:
    """The machine-state judges of a workload on pinned CPUs.  ``speed_cpus``: the CPUs whose
    speed matters to the round (None: every CPU the gauge watches); ``pair``: the two CPUs
    whose cache-line round trip is probed (None: the round does not cross CPUs)."""

    def __init__(self, speed: Optional[instruments.SpeedGauge], probe_baseline: Optional[float],
                 pair: Optional[Tuple[int, int]], speed_cpus: Optional[Sequence[int]] = None) -> None:
        self.speed = speed
        self.probe_baseline = probe_baseline
        self.pair = pair
        self.speed_cpus = None if speed_cpus is None else set(speed_cpus)

    def probe(self) -> Probes:
        speed = None
        if self.speed is not None:
            speed = {cpu: ns for cpu, ns in self.speed.probe().items()
                     if self.speed_cpus is None or cpu in self.speed_cpus}
        rtt = instruments.cacheline_rtt(*self.pair) if self.pair else None
        return Probes(speed, rtt)

    def reason(self, before: Probes, after: Probes, other_cpu: Optional[float], elapsed: float) -> str:
        return noise_reason(self.speed, (before.speed, after.speed), self.probe_baseline,
                            (before.cacheline_ns, after.cacheline_ns), other_cpu, elapsed)

    def slowdown(self, probes: Probes) -> Optional[Dict[int, float]]:
        """cpu -> loop time / the best seen, None without a gauge."""
        if self.speed is None or probes.speed is None:
            return None
        return self.speed.slowdown(probes.speed)

    @staticmethod
    def rule(retries: int) -> str:
        """The rule in words, saved with every result."""
        return (f"a round is noisy when a fixed loop ran > {instruments.SPEED_NOISY_FACTOR}x slower than "
                f"its best on either pinned CPU, or the cache-line probe exceeded the larger of "
                f"{PROBE_NOISY_FACTOR}x its quiet value and the quiet value + "
                f"{PROBE_NOISY_MARGIN_NS:.0f} ns, or other processes used > "
                f"{OTHER_CPU_NOISY_SHARE:.0%} of a CPU beyond two clock ticks; it is measured again up to "
                f"{retries} times, waiting 0.5 s more each time")


def ratios(speed: Optional[Dict[int, float]]) -> Optional[Dict[str, float]]:
    """{cpu: loop time / best} as JSON keeps it (string keys)."""
    return None if speed is None else {str(cpu): round(r, 3) for cpu, r in speed.items()}
