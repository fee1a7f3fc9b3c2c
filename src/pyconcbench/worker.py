"""``python -m pyconcbench.worker``: one side of an interleaved A/B case of the switch or ZeroMQ
family, run in that side's interpreter and environment (a pyperf-style worker).

The echo family compares two environments' servers through the same load generator; a switch
microbenchmark or a ZeroMQ loop has no server to start, so the whole workload runs in a worker
of each side instead (``pyconcbench.ab.PairedRunner`` starts them, one per side and case, and
alternates their rounds in ABBA order on the same CPUs).  The worker builds the family's own
runner (``micro.Runner``; ``zmq.runner.Runner`` with its ``Session``), pins as a normal run
does, warms up, then measures one round per request -- once, without noise retries: in an A/B
run a slow spell hits both rounds of a pair and cancels in B/A.

The protocol is JSON lines: one request on stdin, one answer on stdout, in turn.

    {"family": "switch"|"zmq", "case": ID, "cpus": [0, 1]|null,         -> {"ready": {...}}
     "rounds": N (the pairs: what its summary's round_plan says),
     zmq: "requests": N, "timeout": S, "probe_baseline": NS|null}
    {"do": "round"}                                         -> {"round": {...}, "seconds": S}
    {"do": "end"}                                                        -> {"end": {...}}, exit 0

``round``: that round's figures as the family saves them per round (switch: ns_per_op, the
sample and why it was noisy; zmq: requests_per_s, latency percentiles in µs, cpu_us_per_req,
the probes and why it was noisy); ``seconds``: its time as a normal run hands it to
pytest-benchmark (the round's own measured time, ``rounds.measure_round``'s).  ``end``: the side's summary, what a normal run saves as
the case's extra_info.  Any failure is one answer ``{"error": ONE LINE, "kind": KIND}`` and the
exit code of its kind (``procs``): ``missing`` (a package not installed or not importable on
this side, EXIT_MISSING), ``broken`` (our own code, EXIT_BROKEN), ``unusable`` (a request it
cannot run: an unknown case, EXIT_UNUSABLE), ``failed`` (the workload failed, EXIT_FAILED).
In an A/B run each is a failure naming the side: a comparison lost on one side is never a skip.

The protocol has private copies of stdin and stdout: file descriptor 0 is /dev/null and 1 is
stderr while the worker runs, so nothing a workload, a library or a process they start reads
or prints can take a request or corrupt an answer.  Like every child of ours it stops on its
parent's death (the parent-death signal, and ``procs.start_guard``'s SIGKILL to its group).
No pytest here.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import sys
from typing import IO, Any, Dict, Optional, Tuple

from . import micro, procs, rounds
from . import zmq as pcbzmq
from .broken import Broken, describe

FAMILIES = ("switch", "zmq")


class Unusable(ValueError):
    """A request the worker cannot run: an unknown family, case or request."""


class _Side:
    """One family's case in this worker: its runner (``micro.Runner`` or ``zmq.runner.Runner``,
    both measuring one round per ``one_round`` and saving it as ``round_record``)."""

    runner: Any

    def start(self) -> None:
        """Checks the case can run here (Unavailable: a package missing), pins, warms up."""
        raise NotImplementedError

    def end(self) -> Dict[str, Any]:
        """The side's summary: what a normal run saves as the case's extra_info."""
        raise NotImplementedError

    def round(self) -> Tuple[Dict[str, Any], float]:
        """One round, measured once: its figures and its time."""
        seconds = self.runner.one_round()
        return self.runner.round_record(-1), seconds

    def close(self) -> None:
        pass


class _Switch(_Side):
    """A switch microbenchmark: ``micro.Runner``, the calling thread pinned as in a normal run
    (for the worker's whole life: it runs this one case)."""

    def __init__(self, request: Dict[str, Any]) -> None:
        try:
            case = micro.find(str(request.get("case")))
        except KeyError:
            raise Unusable(f"no switch microbenchmark {request.get('case')!r}") from None
        self.runner = micro.Runner(case, request.get("cpus") or None)
        self.runner.retries = 0
        self.runner.plan = rounds.Plan.fixed(int(request.get("rounds") or case.rounds))

    def start(self) -> None:
        from .micro import workloads

        self.runner.check_available()
        if self.runner.pins_caller:
            workloads.pin(self.runner.cpus[0])
        self.runner.warm_up()

    def end(self) -> Dict[str, Any]:
        return self.runner.summary()


class _Zmq(_Side):
    """A ZeroMQ case: ``zmq.runner.Runner`` and its session, judged by a speed gauge of this
    interpreter's own (its loop's speed is this Python's) and the parent's cache-line baseline."""

    def __init__(self, request: Dict[str, Any]) -> None:
        from . import instruments
        from .zmq.runner import Runner

        by_id = {c.id: c for c in pcbzmq.cases("full") + pcbzmq.cases("quick")}
        case = by_id.get(str(request.get("case")))
        if case is None:
            raise Unusable(f"no ZeroMQ case {request.get('case')!r}")
        cpus = request.get("cpus")
        cpus = (int(cpus[0]), int(cpus[1])) if cpus else None
        try:
            self.runner = Runner(case, requests=int(request.get("requests") or case.requests),
                                 plan=rounds.Plan.fixed(int(request.get("rounds") or 1)), retries=0,
                                 timeout=float(request.get("timeout") or pcbzmq.DEFAULT_TIMEOUT), cpus=cpus,
                                 probe_baseline=request.get("probe_baseline"),
                                 speed=instruments.SpeedGauge(cpus).warm() if cpus else None)
        except ValueError as exc:
            raise Unusable(f"{case.id}: {exc}") from None

    def start(self) -> None:
        self.runner.session.open()
        self.runner.warm_up()

    def end(self) -> Dict[str, Any]:
        return self.runner.extra()

    def close(self) -> None:
        self.runner.session.close()


def build(request: Any) -> _Side:
    """The family's side of the case a request names; Unusable when it names none."""
    if not isinstance(request, dict) or request.get("family") not in FAMILIES:
        family = request.get("family") if isinstance(request, dict) else request
        raise Unusable(f"the first request must name a family ({', '.join(FAMILIES)}) and a case, got {family!r}")
    return (_Switch if request["family"] == "switch" else _Zmq)(request)


def failure(exc: BaseException) -> Tuple[str, str, int]:
    """(one line, kind, exit code) of an exception raised while serving a request."""
    if isinstance(exc, (micro.Unavailable, pcbzmq.Unavailable)):
        return str(exc), "missing", procs.EXIT_MISSING
    if isinstance(exc, Broken):
        return str(exc), "broken", procs.EXIT_BROKEN
    if isinstance(exc, Unusable):
        return str(exc), "unusable", procs.EXIT_UNUSABLE
    if isinstance(exc, (micro.WorkloadError, pcbzmq.RoundError)):
        return " ".join(str(exc).split()), "failed", procs.EXIT_FAILED
    return describe(exc), "failed", procs.EXIT_FAILED  # its type, message and where it was raised


def _read(stream: IO[str]) -> Any:
    """The next request; None when the parent closed its end (it stopped, or died)."""
    line = stream.readline()
    if not line:
        return None
    try:
        return json.loads(line)
    except ValueError:
        raise Unusable(f"a request that is not JSON: {line.strip()[:200]!r}") from None


def _answer(stream: IO[str], **answer: Any) -> None:
    stream.write(json.dumps(answer) + "\n")
    stream.flush()


def serve(requests: IO[str], answers: IO[str]) -> int:
    """Answers the requests of one case until its end; the exit code."""
    side = None
    try:
        first = _read(requests)
        if first is None:
            return procs.EXIT_FAILED
        side = build(first)
        side.start()
        _answer(answers, ready={"pid": os.getpid(), "python": platform.python_version(), "case": first["case"]})
        while True:
            request = _read(requests)
            if request is None:
                return procs.EXIT_FAILED  # the parent went away mid-case
            do = request.get("do") if isinstance(request, dict) else None
            if do == "round":
                figures, seconds = side.round()
                _answer(answers, round=figures, seconds=seconds)
            elif do == "end":
                _answer(answers, end=side.end())
                return procs.EXIT_OK
            else:
                raise Unusable(f"unknown request {json.dumps(request)[:200]}")
    except Exception as exc:
        text, kind, code = failure(exc)
        try:
            _answer(answers, error=text, kind=kind)
        except OSError:  # the parent is gone
            pass
        print(f"pyconcbench.worker: {text}", file=sys.stderr)
        return code
    finally:
        if side is not None:
            side.close()


def _protocol_streams() -> Tuple[IO[str], IO[str]]:
    """Private copies of stdin and stdout for the protocol; fd 0 becomes /dev/null and fd 1
    stderr (see the module's docstring)."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    os.dup2(2, 1)
    return requests, answers


def main(argv: Optional[list] = None) -> int:
    if argv:
        print("pyconcbench.worker takes no arguments: it reads its case from stdin (see its docstring)",
              file=sys.stderr)
        return procs.EXIT_UNUSABLE
    if not procs.arm_parent_death(signal.SIGTERM):
        return procs.EXIT_FAILED  # the parent died before the death signal was armed
    procs.start_guard()  # before any thread: SIGKILL to this group if it outlives a dead parent
    requests, answers = _protocol_streams()
    return serve(requests, answers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
