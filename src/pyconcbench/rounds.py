"""The measured rounds, for every workload (echo, ZeroMQ, switch): how many (``Plan``), the one
retry loop, the noise judges, the session's noise budget, and the clock pytest-benchmark reads.

A round is measured; if a judge finds it noisy, the loop waits for the machine to be quiet
again (polling the judge's probes, at most ``SETTLE_SECONDS``) and measures it once more, up to
``retries`` times; a spell that outlasts the wait, or a session whose noise budget is spent
(``NoiseBudget``: rejected tries and waits may take a tenth of the session, plus an allowance),
keeps the try, marked noisy.  The judges of rounds that run on pinned CPUs (echo, ZeroMQ) are in
``NoiseJudge``: a slow spell of a CPU the round runs on (``instruments.SpeedGauge``), the
cache-line round trip between the two pinned CPUs far above the quiet machine's, other
processes busy during the round.  The switch workload brings its own judge (the measuring thread
waited for its CPU), through the same loop.

A case measures at least ``Plan.least`` rounds and at most ``Plan.most``, and stops in between
once its clean rounds agree within ``Plan.tight`` (``run_rounds``).  The rounds are measured by
this loop, then handed to pytest-benchmark (``replay``): ``ROUND_CLOCK``, the timer it reads,
gives back each round's own measured time (the accepted try's load phase, probes and rejected
tries left out), so its statistics are those of the rounds kept.
"""
from __future__ import annotations

import statistics
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


#: After a noisy try, how long the loop waits for the machine to be quiet again before
#: measuring the round once more; a slow spell of this host lasts from seconds to minutes, and
#: one that outlasts the wait is not waited out (the try is kept, marked noisy).
SETTLE_SECONDS = 1.0
#: How often the judge's probes are read while waiting (each costs a few milliseconds).
SETTLE_POLL = 0.05
#: Without probes to poll (the switch workload), the pause before measuring again.
RETRY_PAUSE = 0.1


class RoundClock:
    """The timer pytest-benchmark reads around each round.  While ``replay`` hands it a case's
    rounds, it gives back their measured times (two reads per round: 0 and the round's
    seconds); otherwise ``perf_counter``."""

    __name__ = "round_clock"
    __module__ = "pyconcbench.rounds"

    def __init__(self) -> None:
        self._script: List[float] = []
        self.replaying = False
        self.reads = 0  # reads while replaying (replay checks them)

    def __call__(self) -> float:
        if self.replaying:
            self.reads += 1
        if self._script:
            return self._script.pop()
        return time.perf_counter()


ROUND_CLOCK = RoundClock()


class NoiseBudget:
    """How much of a session may go to noise: rejected tries and waits for quiet together at
    most ``share`` of the session's time so far plus ``allowance`` seconds.  On a host in a long
    slow spell every round is noisy and measuring it again rarely helps (measured here: 892
    rejected tries and 829 s of pauses in a 23-minute run, and still 225 of 390 kept rounds
    noisy); the budget bounds what a run spends on them.  Once it is spent, rounds are measured
    once, and a judge that finds one noisy marks it so."""

    def __init__(self, share: float = 0.10, allowance: float = 30.0) -> None:
        self.share = share
        self.allowance = allowance
        self.reset()

    def reset(self) -> None:
        self.started = time.monotonic()
        self.spent = 0.0

    def left(self) -> float:
        return self.allowance + self.share * (time.monotonic() - self.started) - self.spent

    def charge(self, seconds: float) -> None:
        self.spent += max(0.0, seconds)


#: The session's budget (reset when a pytest session or ``python -m pyconcbench.micro`` starts).
BUDGET = NoiseBudget()


@dataclass
class Try(Generic[T]):
    """One try of a round: what the workload measured, why it was noisy ('' when clean), and
    which try it was (0 = the first)."""

    value: T
    noisy: str
    attempt: int


#: Why a try was kept (``Outcome.kept_because``).
CLEAN, RETRIES_SPENT, SPELL, BUDGET_SPENT = "clean", "retries spent", "still noisy after the wait", "noise budget spent"
#: What a rejected try says instead (it was measured again).
REJECTED = "rejected: measured again"


@dataclass
class Outcome(Generic[T]):
    kept: Try[T]
    rejected: List[Try[T]] = field(default_factory=list)
    timed: float = 0.0          #: the kept try's own measured seconds (its round time)
    kept_because: str = CLEAN   #: CLEAN, RETRIES_SPENT, SPELL or BUDGET_SPENT


def measure_round(measure: Callable[[int], Tuple[T, str, float]], retries: int,
                  settle: Optional[Callable[[float], bool]] = None,
                  budget: Optional[NoiseBudget] = None) -> Outcome[T]:
    """Runs ``measure(attempt) -> (value, why_noisy, timed_seconds)`` until a try is clean, at
    most ``retries`` more times.  Before each new try, ``settle(limit)`` waits up to ``limit``
    seconds for the machine to be quiet and says whether it is (None: a short pause); a spell
    that outlasts the wait keeps the noisy try (measuring again in it would find the same).
    The rejected tries and the waits are charged to ``budget`` (default: the session's
    ``BUDGET``); once it is spent, a noisy try is kept."""
    budget = BUDGET if budget is None else budget
    rejected: List[Try[T]] = []
    attempt = 0
    while True:
        value, why, timed = measure(attempt)
        kept = Try(value, why, attempt)
        if not why:
            return Outcome(kept, rejected, timed, CLEAN)
        if attempt >= retries:
            return Outcome(kept, rejected, timed, RETRIES_SPENT)
        if budget.left() <= 0:
            return Outcome(kept, rejected, timed, BUDGET_SPENT)
        waited_from = time.perf_counter()
        if settle is None:
            time.sleep(RETRY_PAUSE)
            quiet = True
        else:
            quiet = settle(max(0.0, min(SETTLE_SECONDS, budget.left())))
        budget.charge(time.perf_counter() - waited_from)
        if not quiet:
            return Outcome(kept, rejected, timed, SPELL)
        budget.charge(timed)  # this try is measured again: its time went to noise
        rejected.append(kept)
        attempt += 1


# ---- how many rounds --------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """How many rounds a case measures: at least ``least``, at most ``most``, and in between it
    stops once its clean rounds (at least ``least`` of them) agree within ``tight``: their range
    at most that share of their median.  ``tight`` 0: always ``most``."""

    least: int
    most: int
    tight: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.least <= self.most:
            raise ValueError(f"Plan: need 1 <= least <= most, got {self.least}, {self.most}")
        if not 0.0 <= self.tight < 1.0:
            raise ValueError(f"Plan: tight must be in [0, 1), got {self.tight}")

    @classmethod
    def fixed(cls, rounds: int) -> "Plan":
        return cls(rounds, rounds, 0.0)

    def done(self, measured: int, clean: Sequence[float]) -> bool:
        """Whether a case that has measured ``measured`` rounds, ``clean`` the figures of its
        clean ones (e.g. msgs/s), needs no more."""
        if measured >= self.most:
            return True
        if measured < self.least or not self.tight or len(clean) < self.least:
            return False
        mid = statistics.median(clean)
        return mid > 0 and (max(clean) - min(clean)) / mid <= self.tight

    def describe(self) -> str:
        if self.least == self.most or not self.tight:
            return f"{self.most} rounds"
        return (f"{self.least} to {self.most} rounds: stops once at least {self.least} clean rounds agree "
                f"within {self.tight:.0%} of their median")


def run_rounds(pedantic: Optional[Callable[..., Any]], one_round: Callable[[], float], plan: Plan,
               clean: Callable[[], Sequence[float]]) -> int:
    """Measures rounds until ``plan`` is done (``one_round()`` measures one and returns its
    time in seconds; ``clean()`` gives the clean rounds' figures so far), then hands their
    times to pytest-benchmark through ``pedantic`` (``replay``).  Returns the rounds measured.
    With pytest-benchmark disabled (``--benchmark-disable``: a test run), one round, as
    pytest-benchmark itself runs a disabled benchmark once."""
    if pedantic is not None and _disabled(pedantic):
        plan = Plan.fixed(1)
    times: List[float] = []
    while True:
        times.append(one_round())
        if plan.done(len(times), clean()):
            break
    if pedantic is not None:
        replay(pedantic, times)
    return len(times)


def _fixture(pedantic: Callable[..., Any]) -> Any:
    """The pytest-benchmark fixture whose bound ``pedantic`` this is (None for another callable)."""
    return getattr(pedantic, "__self__", None)


def _disabled(pedantic: Callable[..., Any]) -> bool:
    """Whether pytest-benchmark is disabled for it (``--benchmark-disable``)."""
    return bool(getattr(_fixture(pedantic), "disabled", False))


def replay(pedantic: Callable[..., Any], times: Sequence[float]) -> None:
    """Hands measured round times to pytest-benchmark: ``pedantic`` runs an empty round per
    time, and ``ROUND_CLOCK`` (its timer for every family here) reads 0 before and the round's
    time after it.  Exactly two reads per round are required (none when pytest-benchmark is
    disabled): a benchmark without ROUND_CLOCK as its timer, or a pytest-benchmark that reads it
    otherwise, would save wrong times, so it is refused and the benchmark marked failed."""
    script: List[float] = []
    for t in reversed(times):
        script += [float(t), 0.0]  # popped from the end: 0.0 (the start), then t (the end) of each round
    fixture = _fixture(pedantic)
    ROUND_CLOCK._script, ROUND_CLOCK.reads, ROUND_CLOCK.replaying = script, 0, True

    def nothing() -> None:
        return None

    try:
        pedantic(nothing, rounds=len(times), iterations=1, warmup_rounds=0)
    finally:
        reads, ROUND_CLOCK._script, ROUND_CLOCK.reads, ROUND_CLOCK.replaying = ROUND_CLOCK.reads, [], 0, False
    expected = 0 if _disabled(pedantic) else 2 * len(times)
    if reads != expected:
        if fixture is not None and hasattr(fixture, "has_error"):
            fixture.has_error = True  # pytest-benchmark then leaves it out of the saved run
        raise RuntimeError(f"pyconcbench: pytest-benchmark read the round clock {reads} times for {len(times)} "
                           f"rounds, not {expected}: is rounds.ROUND_CLOCK the benchmark's timer "
                           "(pytest.mark.benchmark(timer=...))? Its round times would be wrong")


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

    def settle(self, limit: float) -> bool:
        """Waits up to ``limit`` seconds for the machine to be quiet again (the CPU-speed and
        cache-line probes within their rule), polling every ``SETTLE_POLL`` s; whether it is."""
        deadline = time.monotonic() + limit
        while True:
            probes = self.probe()
            if not noise_reason(self.speed, (probes.speed,), self.probe_baseline, (probes.cacheline_ns,), None, 0.0):
                return True
            if time.monotonic() + SETTLE_POLL > deadline:
                return False
            time.sleep(SETTLE_POLL)

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
                f"{OTHER_CPU_NOISY_SHARE:.0%} of a CPU beyond two clock ticks; it is measured again, up to "
                f"{retries} times, once the probes show the machine quiet (waiting at most {SETTLE_SECONDS:g} s; "
                f"a longer spell keeps the try), while the session's noise budget lasts "
                f"({BUDGET.share:.0%} of its time + {BUDGET.allowance:g} s)")


def ratios(speed: Optional[Dict[int, float]]) -> Optional[Dict[str, float]]:
    """{cpu: loop time / best} as JSON keeps it (string keys)."""
    return None if speed is None else {str(cpu): round(r, 3) for cpu, r in speed.items()}
