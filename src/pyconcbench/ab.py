"""Interleaved A/B runs: two environments measured round by round in one run, on the same
CPUs -- the echo family's servers by the same load generator, the switch and ZeroMQ families'
workloads in a worker process per environment (``pyconcbench.worker``, pyperf-style).

Comparing two separate runs fights the machine's drift (this kind of VM runs 1.2-1.7x slower
for seconds at a time, and same-code runs an hour apart differ by up to 20 %).  Here every
case starts a server from environment A and one from environment B (another interpreter or
venv: a uvloop PR build against its main, Python 3.12 against 3.13; or other environment
variables), keeps a set of connections open to each, and alternates their measured rounds in a
balanced order -- A B, B A, A B, B A ... -- so that each pair of adjacent rounds shares the
machine's state of the moment and any drift hits both orders equally.  Each pair gives a
ratio B/A per metric (a round alone is never measured again; an echo pair with a round in a
slow spell is, both rounds, see ABRunner); the verdict is the Hodges-Lehmann estimate of the pairs' log-ratios with
its exact Wilcoxon signed-rank interval (``stats.paired_interval``): "B is 4.1 % slower
[2.8 %, 5.6 %]".  The gate fails a metric only when the whole interval lies beyond its
threshold.

    options (--pcb-ab-a/--pcb-ab-b, PCB_AB_A/PCB_AB_B) -> Environment (resolved, described)
    echo case -> ABRunner(two servers, two LoadSessions, echo.EchoRunner each) -> extra_info
              (family "ab", ab_family "echo": both sides' echo figures, the pairs, the intervals)
    switch or ZeroMQ case -> PairedRunner(two WorkerSides: a worker each, started with the
              side's interpreter and environment) -> extra_info (family "ab", ab_family
              "switch"/"zmq": both sides' figures as a normal run saves them, the pairs, the
              intervals)

Which figures a pair compares is the gate's: ``metrics.AB_PAIR_KEYS`` per family (switch:
ns_per_op, lower is better; zmq: requests_per_s, the latencies and the client's CPU per
request; echo: msgs_per_s, the latencies and the server's CPU per round trip).

No pytest here: the plugin's fixtures wire it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import metrics, procs, stats

SIDES = ("a", "b")

#: The interval's coverage asked for; with few pairs the exact interval cannot reach it and
#: the coverage it has is saved and printed beside it.
CONFIDENCE = 0.95

#: Pairs per case when --pcb-rounds is not given: twice the profile's rounds (each side then
#: runs that many rounds); 5 pairs cannot give a 95 % interval (the widest has 93.75 %).
PAIRS_PER_ROUND = 2


class ABError(ValueError):
    """An A/B environment that cannot be used, in one line naming the side."""


# Runs in the side's interpreter: what it is, and whether it can run our servers at all.
_DESCRIBE = r"""
import json, platform, sys
out = {"executable": sys.executable, "python": sys.version.split()[0],
       "implementation": platform.python_implementation()}
try:
    import pyconcbench, pyconcbench.serve
    from pyconcbench import machine
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
else:
    out["pyconcbench"] = pyconcbench.__version__
    out["pyconcbench_path"] = pyconcbench.__file__
    out["libraries"] = machine.collect_versions()
    out.update(machine.python_build())
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Environment:
    """One side of an A/B run: the interpreter its servers run with, the environment variables
    added for them, and what the interpreter said about itself (``described``)."""

    side: str
    given: str                 #: as the user wrote it
    python: str                #: the interpreter's path
    env: Dict[str, str] = field(default_factory=dict)
    described: Dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        d = self.described
        extra = "".join(f" {k}={v}" for k, v in sorted(self.env.items()))
        python = metrics.python_label(d.get("python", "?"), d.get("python_build"), d.get("gil_enabled"))
        return f"{self.side.upper()}: {self.given} (Python {python}){extra}"

    def as_dict(self) -> Dict[str, Any]:
        return {"given": self.given, "python": self.python, "env": dict(self.env), **self.described}


def interpreter(side: str, given: str) -> str:
    """The interpreter of ``given``: a venv (or any prefix) directory with bin/python, a Python
    executable's path, or a command name on PATH.  ABError in one line otherwise."""
    text = given.strip()
    if not text:
        raise ABError(f"A/B side {side.upper()}: empty; give a Python executable or a venv directory")
    if os.path.isdir(text):
        for name in ("bin/python", "bin/python3"):
            candidate = os.path.join(text, name)
            if os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
        raise ABError(f"A/B side {side.upper()}: {text!r} is a directory without bin/python: not a venv")
    if os.sep in text:
        if os.path.isfile(text) and os.access(text, os.X_OK):
            return os.path.abspath(text)
        raise ABError(f"A/B side {side.upper()}: {text!r} is not an executable file")
    found = shutil.which(text)
    if found is None:
        raise ABError(f"A/B side {side.upper()}: {text!r} is neither a venv directory, an executable "
                      "nor a command on PATH")
    return found


def parse_env(text: str) -> Dict[str, str]:
    """'K=V,K2=V2' -> {K: V, K2: V2}; an empty text is {}.  ValueError for an item without '='
    or with a name that is not an environment variable's."""
    out: Dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name or not (name[0].isalpha() or name[0] == "_") \
                or not all(c.isalnum() or c == "_" for c in name):
            raise ValueError(f"{item!r} is not NAME=VALUE (e.g. MALLOC_ARENA_MAX=2)")
        out[name] = value
    return out


def describe(side: str, python: str, env: Dict[str, str], timeout: float = 60.0) -> Dict[str, Any]:
    """Asks the interpreter what it is and whether it imports pyconcbench.serve; ABError (one
    line) when it cannot run or cannot import it."""
    run_env = dict(os.environ)
    run_env.update(env)
    try:
        proc = subprocess.run([python, "-c", _DESCRIBE], capture_output=True, text=True,
                              timeout=timeout, env=run_env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ABError(f"A/B side {side.upper()}: {python} did not run: {exc}") from None
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        raise ABError(f"A/B side {side.upper()}: {python} exited with {proc.returncode}: {last}")
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ABError(f"A/B side {side.upper()}: {python} did not describe itself: {last or proc.stdout[:200]!r}") \
            from None
    if "error" in out:
        raise ABError(f"A/B side {side.upper()}: {python} cannot import pyconcbench.serve ({out['error']}): "
                      f"install pyconcbench in that environment ({python} -m pip install PATH_TO_THIS_PROJECT)")
    return out


def environment(side: str, given: str, env: Optional[Dict[str, str]] = None) -> Environment:
    """One side resolved (``interpreter``) and described (``describe``); ABError in one line."""
    env = dict(env or {})
    python = interpreter(side, given)
    return Environment(side=side, given=given, python=python, env=env,
                       described=describe(side, python, env))


# ---- the verdict ----------------------------------------------------------------------------

def order(pair: int) -> str:
    """The order of pair ``pair`` (0-based): AB, BA, AB, BA ... -- ABBA blocks."""
    return "ab" if pair % 2 == 0 else "ba"


def pair_ratios(a_rounds: Sequence[Dict[str, Any]], b_rounds: Sequence[Dict[str, Any]],
                orders: Sequence[str], family: str = metrics.ECHO) -> List[Dict[str, Any]]:
    """One dict per pair: its order, and B/A of every figure of the family's
    ``metrics.AB_PAIR_KEYS`` both rounds have."""
    if not len(a_rounds) == len(b_rounds) == len(orders):
        raise ValueError(f"pair_ratios: {len(a_rounds)} A rounds, {len(b_rounds)} B rounds, "
                         f"{len(orders)} orders: they must be as many")
    out = []
    for a, b, o in zip(a_rounds, b_rounds, orders):
        pair: Dict[str, Any] = {"order": o.upper()}
        for name, key in metrics.AB_PAIR_KEYS[family].items():
            va, vb = a.get(key), b.get(key)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va > 0 and vb > 0:
                pair[name] = round(vb / va, 6)
        if a.get("noisy") or b.get("noisy"):
            pair["noisy"] = True  # kept: the judge's flag, for the reader
        if metrics.is_spell(a.get("noisy")) or metrics.is_spell(b.get("noisy")):
            pair["spell"] = True  # a round in the host's slow spell: left out of the interval
        out.append(pair)
    return out


#: The interval is computed over the pairs with no round in one of the host's slow spells (the
#: CPU-speed and cache-line judges, ``metrics.is_spell``) when there are at least this many, else
#: over every pair.  A pair with a round in a slow spell carries a ratio the spell, not B,
#: decided: measured here, adjacent rounds of the same server differ by a robust SD of 2.3-3.8 %
#: when both are clean and 5.3-7.0 % over all rounds.  Those judges read probes around the
#: round, never its figures; other processes' CPU is not one of them (its threshold scales with
#: the round's length, so it would flag the faster side more often).  The interval over every
#: pair is saved beside it (``intervals_all``).
MIN_CLEAN_PAIRS = 6


def interval_pairs(pairs: Sequence[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], str]:
    """The pairs the interval is computed over, and which they are in words."""
    clean = [p for p in pairs if not p.get("spell")]
    if len(clean) == len(pairs):
        return list(pairs), f"all {len(pairs)} pairs (none in a slow spell)"
    if len(clean) >= MIN_CLEAN_PAIRS:
        return clean, f"the {len(clean)} pairs of {len(pairs)} outside slow spells"
    return list(pairs), (f"all {len(pairs)} pairs (only {len(clean)} outside slow spells, "
                         f"fewer than {MIN_CLEAN_PAIRS})")


def intervals(pairs: Sequence[Dict[str, Any]], confidence: float = CONFIDENCE,
              family: str = metrics.ECHO, every: bool = False) -> Dict[str, Dict[str, Any]]:
    """metric -> {ratio, low, high, confidence, pairs}: the Hodges-Lehmann B/A and its
    interval, computed on log-ratios (so B/A and A/B are symmetric) and given back as ratios,
    over ``interval_pairs(pairs)`` (``every``: over every pair)."""
    pairs = list(pairs) if every else interval_pairs(pairs)[0]
    out: Dict[str, Dict[str, Any]] = {}
    for name in metrics.AB_PAIR_KEYS[family]:
        logs = [math.log(p[name]) for p in pairs if isinstance(p.get(name), (int, float)) and p[name] > 0]
        if not logs:
            continue
        iv = stats.paired_interval(logs, confidence)
        out[name] = {"ratio": round(math.exp(iv.estimate), 6), "low": round(math.exp(iv.low), 6),
                     "high": round(math.exp(iv.high), 6), "confidence": round(iv.confidence, 4),
                     "pairs": iv.pairs}
    return out


def case_fields(family: str, case: Any) -> Dict[str, Any]:
    """What an A/B record says of its case, per family (the report's case column reads it)."""
    if family == metrics.ECHO:
        return {"impl": case.impl, "label": case.label, "connections": case.connections, "size": case.size,
                "transport": case.transport, "malloc": case.malloc, "plain": case.plain}
    if family == metrics.SWITCH:
        return {"case": case.id, "op": case.op}
    return {"case": case.id, "mode": case.mode, "size": case.size, "inflight": case.inflight,
            "transport": case.transport, "placement": case.placement}


def ab_extra(family: str, case: Any, environments: Dict[str, Environment], sides: Dict[str, Dict[str, Any]],
             orders: Sequence[str]) -> Dict[str, Any]:
    """The saved record of one A/B case: both sides' figures (as the family saves them), the
    pairs and the intervals."""
    rounds = metrics.AB_ROUNDS_KEY[family]
    pairs = pair_ratios(sides["a"][rounds], sides["b"][rounds], orders, family)
    ivs = intervals(pairs, family=family)
    return {
        **metrics.stamp(metrics.AB),
        metrics.AB_FAMILY_KEY: family,
        **case_fields(family, case),
        "order": "".join(o.upper() for o in orders),
        "pairs": pairs,
        "noisy_pairs": sum(1 for p in pairs if p.get("noisy")),
        "interval_pairs": interval_pairs(pairs)[1],
        "intervals": ivs,
        "intervals_all": intervals(pairs, family=family, every=True),
        "confidence_asked": CONFIDENCE,
        "method": ("per pair of adjacent rounds B/A; Hodges-Lehmann estimate of the log-ratios with the "
                   "exact Wilcoxon signed-rank interval"),
        "a": {"environment": environments["a"].as_dict(), **_side(sides["a"])},
        "b": {"environment": environments["b"].as_dict(), **_side(sides["b"])},
    }


def _side(extra: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in extra.items() if k not in (metrics.FAMILY_KEY, metrics.SCHEMA_KEY)}


# ---- the runner -----------------------------------------------------------------------------

@dataclass
class ABOutcome:
    """What an A/B case measured: each side's EchoOutcome, and the saved record."""

    sides: Dict[str, Any]      #: "a"/"b" -> echo.EchoOutcome
    orders: List[str]
    extra: Dict[str, Any]


class ABRunner:
    """Runs one echo case against two started servers (A's and B's), their rounds alternated in
    ABBA order.  Each side's rounds are echo.EchoRunner's (the same load spec and noise judge,
    no round measured again alone; a pair with a round in a slow spell measured again, both
    rounds); one pytest-benchmark round is one pair."""

    def __init__(self, settings: Any, case: Any, servers: Dict[str, Any], environments: Dict[str, Environment],
                 probe_baseline: Optional[float], speed: Any = None):
        from . import echo, loadgen, rounds
        try:
            loadgen.ensure_fd_limit(2 * case.connections)  # a set of connections to each server
        except loadgen.FdLimitError as exc:
            raise ABError(f"A/B keeps both servers' connections open: {exc}; run this scale without A/B") from None
        self.case = case
        self.environments = environments
        # A round alone is never measured again (that would break its pair's adjacency): a pair
        # with a round in a slow spell is, both rounds in the same order, once the machine is
        # quiet (rounds.measure_round over the pair: the same waits and noise budget as any round).
        self.retries = settings.noise_retries
        settings = dataclasses.replace(settings, noise_retries=0)
        self.runners = {s: echo.EchoRunner(settings, case, servers[s], probe_baseline, speed) for s in SIDES}
        self.rejected_pairs = 0
        self.pairs = settings.rounds or PAIRS_PER_ROUND * self.runners["a"].plan.most
        for runner in self.runners.values():
            runner.plan = rounds.Plan.fixed(self.pairs)  # what each side's saved round_plan says
        self.orders: List[str] = []

    def run(self, benchmark: Any) -> ABOutcome:
        from . import echo, loadgen, rounds
        for runner in self.runners.values():
            runner.read_idle_rss()  # both servers before either load generator connects
        with loadgen.LoadSession(self.runners["a"].spec) as sa, loadgen.LoadSession(self.runners["b"].spec) as sb:
            sessions = {"a": sa, "b": sb}
            for runner in self.runners.values():
                runner.read_connected_rss()

            def measure(attempt: int) -> Tuple[Dict[str, Any], str, float]:
                o = order(len(self.orders))
                recs: Dict[str, Any] = {}
                seconds, why = 0.0, ""
                for side in o:
                    rec, noisy, timed = self.runners[side]._measure(sessions[side], attempt)
                    recs[side] = rec
                    seconds += timed
                    # measured again only for the host's slow spells (metrics.is_spell): a
                    # judge that could depend on the round's own length is kept as a flag
                    why = why or (f"{side.upper()}: {noisy}" if metrics.is_spell(noisy) else "")
                return recs, why, seconds

            def pair() -> float:
                outcome = rounds.measure_round(measure, self.retries, settle=self.runners["a"].judge.settle)
                for side in SIDES:
                    self.runners[side].keep(outcome.kept.value[side], outcome.kept_because,
                                            [t.value[side] for t in outcome.rejected])
                self.rejected_pairs += len(outcome.rejected)
                self.orders.append(order(len(self.orders)))
                return outcome.timed

            # every pair: the interval needs them all (no early stop)
            rounds.run_rounds(benchmark.pedantic, pair, rounds.Plan.fixed(self.pairs), list)
            outcomes = {s: echo.EchoOutcome.from_records(self.runners[s], sessions[s].connect_seconds)
                        for s in SIDES}
        extra = ab_extra(metrics.ECHO, self.case, self.environments, {s: outcomes[s].extra for s in SIDES},
                         self.orders)
        extra["rejected_pairs"] = self.rejected_pairs
        benchmark.extra_info.update(extra)  # the very dict pytest-benchmark saves
        return ABOutcome(outcomes, list(self.orders), extra)


# ---- the switch and ZeroMQ families: a worker per side ------------------------------------------

#: How long a worker may take to import, check the case, warm up and answer READY (a Go
#: baseline may be built first).
READY_TIMEOUT = 300.0
#: How long one round may take before its worker is killed; a ZeroMQ round's own deadline
#: (10 stall timeouts, at least 120 s) fails it first, in the worker's own words.
ROUND_TIMEOUT = 300.0
#: How long a worker may take to send its summary and exit.
END_TIMEOUT = 60.0
#: How long a worker that answered with an error may take to exit before it is killed.
EXIT_WAIT = 5.0


class WorkerSide:
    """The parent's end of one side's worker: ``python -m pyconcbench.worker`` started with the
    side's interpreter and its environment variables added (through ``procs.Child``: its own
    process group, the parent-death signal, reaped), then asked one JSON line at a time -- the
    case (``start``: READY once warmed up), one round at a time (``round``), the summary
    (``end``).  Every answer has a deadline; any failure -- the worker's own one-line error, no
    answer in time, a worker that died -- is ABError naming the side, and the worker is killed
    and reaped then, so nothing is left behind and nothing hangs."""

    def __init__(self, environment: Environment, request: Dict[str, Any], *, ready_timeout: float = READY_TIMEOUT,
                 round_timeout: float = ROUND_TIMEOUT, end_timeout: float = END_TIMEOUT) -> None:
        self.environment = environment
        self.request = dict(request)
        self.timeouts = {"ready": ready_timeout, "round": round_timeout, "end": end_timeout}
        self.child: Optional[procs.Child] = None
        self.rounds = 0

    @property
    def pid(self) -> Optional[int]:
        return None if self.child is None or self.child.proc is None else self.child.pid

    def start(self) -> Dict[str, Any]:
        """Starts the worker and sends it the case; its READY answer once it has warmed up."""
        env = dict(os.environ)
        env.update(self.environment.env)
        self.child = procs.Child([self.environment.python, "-m", "pyconcbench.worker"], env=env, stdin_pipe=True)
        try:
            self.child.start()
        except procs.ChildError as exc:
            raise self._error(f"cannot start its worker: {exc}") from None
        return self._ask(self.request, "ready", "the case's start")["ready"]

    def round(self) -> Tuple[Dict[str, Any], float]:
        """One round measured by the worker: its figures, and its time in seconds (what a
        normal run hands pytest-benchmark for it)."""
        self.rounds += 1
        what = f"round {self.rounds}"
        answer = self._ask({"do": "round"}, "round", what)
        seconds = answer.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
            self.close()
            raise self._error(f"its worker answered {what} without its time in seconds: {seconds!r}")
        return answer["round"], float(seconds)

    def end(self) -> Dict[str, Any]:
        """The side's summary (what a normal run saves for the case); the worker then exits."""
        summary = self._ask({"do": "end"}, "end", "the end")["end"]
        assert self.child is not None
        code = self.child.run_to_end(self.timeouts["end"])
        self.close()
        if code != procs.EXIT_OK:
            raise self._error(f"its worker did not exit after its summary ({procs.meaning(self.child.returncode)})")
        return summary

    def close(self) -> None:
        """Kills the worker if it still runs and reaps it.  Idempotent."""
        if self.child is not None:
            self.child.close()

    def _error(self, text: str) -> ABError:
        return ABError(f"A/B side {self.environment.side.upper()}: {text}")

    def _ask(self, message: Dict[str, Any], key: str, what: str) -> Dict[str, Any]:
        """Sends ``message`` and returns its answer, whose ``key`` holds an object; ABError (the
        worker killed) when it answers with an error, not at all within the timeout, or dies."""
        assert self.child is not None
        timeout = self.timeouts[key]
        try:
            self.child.write_line(json.dumps(message).encode())
            line = self.child.read_line(timeout)
        except procs.ChildError:
            line = None
        except TimeoutError:
            self.close()
            raise self._error(f"its worker did not answer {what} within {timeout:g} s (killed)") from None
        if line is None:
            raise self._died(what)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            self.child.wait(EXIT_WAIT)  # it exits at once: reaped with its own exit code
            self.close()
            raise self._error(str(answer["error"]) + (f" ({self.environment.python})" if answer.get("kind") == "missing"
                                                      else ""))
        if not isinstance(answer, dict) or not isinstance(answer.get(key), dict):
            self.close()
            raise self._error(f"its worker answered {what} with {line[:200]!r}, not its {key!r} line")
        return answer

    def _died(self, what: str) -> ABError:
        """The worker closed its stdout: its exit and the last line it wrote to stderr."""
        assert self.child is not None
        self.child.wait(self.timeouts["end"])
        self.close()  # killed if it closed its stdout but lived on
        tail = self.child.stderr_tail(1)
        return self._error(f"its worker exited during {what} ({procs.meaning(self.child.returncode)})"
                           + (f": {tail[0].strip()}" if tail else ""))


class PairedRunner:
    """Runs one switch or ZeroMQ case in two workers, A's and B's, on the same CPUs (the run's
    --pcb-cpus: each worker pins as the family does in a normal run), their rounds alternated
    in ABBA order -- A B, B A, A B ... -- and never at once: the worker not measuring waits for
    its next request.  Each worker checks the case and warms up before the first pair; each
    round is measured once (a worker cannot take back a round it answered; the interval leaves
    out the pairs with a round in a slow spell, as ABRunner's); one pytest-benchmark round is one
    pair.  ``run`` returns the saved record (``ab_extra``)."""

    def __init__(self, settings: Any, family: str, case: Any, case_rounds: int,
                 job: Optional[Dict[str, Any]] = None, **timeouts: float) -> None:
        if family not in (metrics.SWITCH, metrics.ZMQ):
            raise ValueError(f"PairedRunner runs the switch and zmq families, not {family!r}")
        self.family = family
        self.case = case
        self.environments: Dict[str, Environment] = settings.ab
        self.pairs = settings.rounds or PAIRS_PER_ROUND * case_rounds
        request = {"family": family, "case": case.id, "cpus": list(settings.cpus) if settings.cpus else None,
                   "rounds": self.pairs, **(job or {})}
        # a ZeroMQ round fails by its own deadline (10 stall timeouts, at least 120 s) before this one
        timeouts.setdefault("round_timeout", max(ROUND_TIMEOUT, 10 * float(request.get("timeout") or 0) + 60))
        self.workers = {s: WorkerSide(self.environments[s], request, **timeouts) for s in SIDES}
        self.orders: List[str] = []
        self.rounds: Dict[str, List[Dict[str, Any]]] = {s: [] for s in SIDES}

    def pair(self) -> float:
        """One pair: the two sides' rounds in the next pair's order; the two rounds' time."""
        o = order(len(self.orders))
        seconds = 0.0
        for side in o:
            figures, timed = self.workers[side].round()
            self.rounds[side].append(figures)
            seconds += timed
        self.orders.append(o)
        return seconds

    def run(self, benchmark: Any) -> Dict[str, Any]:
        from . import rounds
        try:
            for side in SIDES:  # one after the other: each warms up alone on the CPUs
                self.workers[side].start()
            # every pair, as ABRunner's (the interval needs them all: no early stop), each pair's
            # time handed to pytest-benchmark through ROUND_CLOCK
            rounds.run_rounds(benchmark.pedantic, self.pair, rounds.Plan.fixed(self.pairs), list)
            sides = {s: self.workers[s].end() for s in SIDES}
        finally:
            for worker in self.workers.values():
                worker.close()
        extra = ab_extra(self.family, self.case, self.environments, sides, self.orders)
        benchmark.extra_info.update(extra)  # the very dict pytest-benchmark saves
        return extra
