"""The open-loop workload: latency at a fixed offered rate, corrected for coordinated omission.

A closed loop (the echo family) sends each connection's next message when the last echo is back,
so a stalled server simply receives less: its p99 mostly restates connections / rate.  Here each
message has an intended send time (LoadSession.round(rate=R)): the load generator keeps to a
schedule whatever the server does, a message due while its connection still waits queues, and
latency is measured from the intended time (corrected) as well as from the actual send
(uncorrected).  The rates are shares of the implementation's closed-loop maximum, measured first
in the same run on the same connections (``closed_loop_max``), so one set of cases draws each
implementation's latency-against-throughput curve; or absolute rates.

    options (Settings) -> openloop_cases -> OpenLoopRunner(server from harness, rounds, loadgen)
                                              -> extra_info (metrics: "openloop")
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import harness, instruments, loadgen, metrics, rounds
from .echo import PERCENTILES, EchoCase, EchoOutcome, EchoRunner
from .options import PROFILES, Settings

#: Percentiles of the saved latency spectrum (HdrHistogram's percentile distribution ticks:
#: halving the distance to 100 % each step), and the report's distribution plot.
SPECTRUM = (0.0, 50.0, 75.0, 87.5, 93.75, 96.875, 98.4375, 99.0, 99.21875, 99.609375, 99.8046875, 99.9,
            99.90234375, 99.951171875, 99.9755859375, 99.99, 99.998779296875, 100.0)
#: A rate is held when the achieved rate is at least this share of the asked one.
HELD_SHARE = 0.95
#: Round trips of a round at the least (a low rate still gives a spread of latencies).
MIN_MESSAGES = 500
#: Closed-loop rounds that measure an implementation's maximum before its first open-loop case (the best counts).
MAX_ROUNDS = 3


@dataclass(frozen=True)
class OpenLoopCase:
    """One open-loop benchmark: an echo case (server, scale) at one rate.  ``rate`` is a share of
    the closed-loop maximum when ``relative``, else round trips per second over every
    connection."""

    echo: EchoCase
    rate: float
    relative: bool
    arrival: str = "uniform"

    @property
    def rate_label(self) -> str:
        if self.relative:
            return f"{self.rate * 100:g}pct"
        return f"{self.rate:.0f}ps"

    @property
    def id(self) -> str:
        """``impl-cN-SIZE[-pK][-unix][-malloc_STATE]-RATE[-poisson]``: the echo case's id and the rate."""
        return f"{self.echo.id}-{self.rate_label}" + ("" if self.arrival == "uniform" else f"-{self.arrival}")

    @property
    def group(self) -> str:
        return f"openloop-{self.echo.scale}-{self.rate_label}"


def openloop_cases(settings: Settings) -> List[OpenLoopCase]:
    """Every open-loop case of a run, each implementation's rates in a row and ascending (so its
    closed-loop maximum is measured once, by its first case)."""
    out: List[OpenLoopCase] = []
    impls = list(settings.openloop_impls)
    command = settings.server_cmd
    for conns, size, transport in settings.openloop_cases:
        echoes = [EchoCase(impl, conns, size, transport, pipeline=settings.pipeline) for impl in impls]
        if command and transport in harness.command_transports(command):
            echoes.append(EchoCase(settings.server_name, conns, size, transport, command=command,
                                   pipeline=settings.pipeline))
        for echo_case in echoes:
            for rate, relative in sorted(settings.rates, key=lambda r: (not r[1], r[0])):
                out.append(OpenLoopCase(echo_case, rate, relative, settings.arrival))
    return out


#: Closed-loop maxima measured in this process, by the echo case they were measured on (without
#: its rate): (msgs/s, the case id that measured it, whether the load generator bound it).
_MAXIMA: Dict[EchoCase, Tuple[float, str, bool]] = {}


def forget_maxima() -> None:
    """Clears the maxima measured so far (tests)."""
    _MAXIMA.clear()


class OpenLoopRunner(EchoRunner):
    """The measured rounds of one open-loop case against a started server: the echo runner's
    rounds, noise judge and figures, each round an open loop at the case's rate."""

    def __init__(self, settings: Settings, case: OpenLoopCase, server: harness.ServerProcess,
                 probe_baseline: Optional[float], speed: Optional[instruments.SpeedGauge] = None):
        super().__init__(settings, case.echo, server, probe_baseline, speed)
        self.olcase = case
        profile = PROFILES[settings.profile]()
        self.seconds = settings.duration or profile.openloop_seconds
        # every round is at the same rate, so their number is fixed: no early stop
        self.plan = rounds.Plan.fixed(settings.rounds or profile.openloop_rounds)
        self.maximum: Optional[Tuple[float, str, bool]] = None
        self.engines = 1
        self.asked = 0.0

    def closed_loop_max(self, session: loadgen.LoadSession) -> Tuple[float, str, bool]:
        """The implementation's closed-loop maximum at this scale: the best of MAX_ROUNDS closed
        rounds on these connections, measured by the first of its cases in the run and kept."""
        if self.case not in _MAXIMA:  # an EchoCase is frozen: it is the key itself
            results = [session.round() for _ in range(MAX_ROUNDS)]
            best = max(results, key=lambda r: r.msgs_per_s)
            _MAXIMA[self.case] = (best.msgs_per_s, self.olcase.id, any(r.loadgen_bound for r in results))
        return _MAXIMA[self.case]

    def run(self, benchmark: Any) -> EchoOutcome:
        case = self.olcase
        self.read_idle_rss()
        with self.session() as session:
            self.engines = getattr(session, "engines", 1)
            self.read_connected_rss()
            # the maximum is measured for an absolute rate too: a round asked far beyond what the
            # server can do is cut to about twice its maximum's worth of messages (it is not held
            # either way), and every round's deadline follows from it
            self.maximum = self.closed_loop_max(session)
            self.asked = case.rate * self.maximum[0] if case.relative else case.rate
            if not loadgen.MIN_OPEN_RATE <= self.asked <= loadgen.MAX_OPEN_RATE:
                raise loadgen.LoadError("system", f"{case.id}: asked rate {self.asked:g}/s is outside "
                                        f"{loadgen.MIN_OPEN_RATE:g} .. {loadgen.MAX_OPEN_RATE:g}")
            served = min(self.asked, 2 * self.maximum[0]) if self.maximum[0] > 0 else self.asked
            self.messages = max(MIN_MESSAGES, round(served * self.seconds))
            expected = self.messages / min(self.asked, self.maximum[0] or self.asked)
            self.round_kwargs = dict(messages=self.messages, rate=self.asked, arrival=case.arrival,
                                     deadline=max(self.spec.deadline, 3 * expected + 60))
            rounds.run_rounds(benchmark.pedantic, lambda: self.one_round(session), self.plan, self.clean_figures)
        outcome = EchoOutcome.from_records(self, session.connect_seconds)
        outcome.extra.update(self.open_figures())
        for saved, records in (("rounds", self.records), ("rejected_rounds", self.rejected)):
            for rd, more in zip(outcome.extra[saved], round_figures(records)):
                rd.update(more)
        outcome.fill(benchmark.extra_info)
        return outcome

    def open_figures(self) -> Dict[str, Any]:
        """The open loop's own figures over the same rounds as the headline's (the clean ones,
        else all): the family's stamp, the rate asked and achieved, the uncorrected latencies,
        how late the sends went out, the whole corrected and uncorrected spectra."""
        case = self.olcase
        clean = [r for r in self.records if not r.noisy]
        results = [r.result for r in (clean or self.records)]
        completed = sum(r.completed for r in results)
        elapsed = sum(r.elapsed for r in results)
        achieved = completed / elapsed if elapsed else 0.0
        corrected = loadgen.merged(results)
        uncorrected = loadgen.merged(results, uncorrected=True)
        pct = uncorrected.percentiles(PERCENTILES)
        sent = sum(r.sent for r in results)
        maximum = self.maximum
        out: Dict[str, Any] = {
            **metrics.stamp(metrics.OPENLOOP),
            "mode": "open",
            "arrival": case.arrival,
            "rate_label": case.rate_label,
            "rate_fraction": case.rate if case.relative else None,
            "rate_asked": round(self.asked, 1),
            "rate_achieved_share": float(f"{achieved / self.asked:.5g}") if self.asked else 0.0,
            "rate_held": bool(self.asked and achieved >= HELD_SHARE * self.asked),
            "closed_loop_max_msgs_per_s": round(maximum[0], 1) if maximum else None,
            "messages_cut": self.messages < round(self.asked * self.seconds),
            "closed_loop_max_from": maximum[1] if maximum else None,
            "closed_loop_max_loadgen_bound": maximum[2] if maximum else None,
            "seconds_per_round": self.seconds,
            # pinned, the engine polls its own CPU before each send is due: its CPU share is no bound
            "loadgen_bound": None, "loadgen_cpu_share": None, "loadgen_cpu_us_per_msg": None,
            "engine_wait": ("pinned: sleeps until 150 us before each send is due, then polls"
                            if self.spec.cpu is not None and self.engines == 1
                            else "unpinned: sleeps until each send is due (a timer wake-up, tens of us late on a "
                                 "VM, counts in the corrected latency)"),
            "latency_uncorrected_p50_us": _us(pct[0]),
            "latency_uncorrected_p90_us": _us(pct[1]),
            "latency_uncorrected_p95_us": _us(pct[2]),
            "latency_uncorrected_p99_us": _us(pct[3]),
            "latency_uncorrected_p99_9_us": _us(pct[4]),
            "latency_uncorrected_max_us": _us(uncorrected.max if uncorrected.count else 0),
            "sent": sent,
            "sent_late": sum(r.late for r in results),
            "send_lag_mean_us": round(sum(r.lag_mean * r.sent for r in results) / sent * 1e6, 3) if sent else 0.0,
            "send_lag_max_us": round(max(r.lag_max for r in results) * 1e6, 3),
            "latency_spectrum": spectrum(corrected),
            "latency_uncorrected_spectrum": spectrum(uncorrected),
        }
        return out


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


def spectrum(hist: Any) -> List[List[float]]:
    """[[percentile, latency us], ...] at SPECTRUM's percentiles: the distribution, whole (what an
    HdrHistogram .hgrm file lists), for the report's percentile plot."""
    if not hist.count:
        return []
    values = hist.percentiles(SPECTRUM)
    return [[p, _us(v)] for p, v in zip(SPECTRUM, values)]


def round_figures(records: List[Any]) -> List[Dict[str, Any]]:
    """Each round's open-loop figures (what the per-round dicts of the echo record gain)."""
    out = []
    for rec in records:
        r = rec.result
        unc = r.latency_uncorrected or {}
        out.append({"rate_asked": round(r.rate, 1),
                    "latency_uncorrected_p99_us": _us(unc.get("p99", 0.0)),
                    "sent_late": r.late})
    return out
