"""Several load engines as one: past one process's file descriptors and one address's ports.

One process holds at most ``ulimit -n`` sockets (about 20,000 here), and one (source address,
server address) pair at most the local port range (28,232 here).  ``EngineSet`` splits a load's
connections over several engine processes (``python -m pyconcbench.engines``), each a
``loadgen.LoadSession`` of its share, each binding its own source address in 127.0.0.0/8 when the
ports would run out, and runs every round on all of them at the same instant; the results are
merged exactly (the latency histograms travel whole: ``Histogram.to_bytes``), and fairness is
over every connection.  It has LoadSession's interface (open, warmup, round, close,
connect_seconds), so the workloads take either.

The engine process speaks JSON lines on private copies of stdin and stdout (file descriptor 1
is its stderr while it runs):

    {"do": "open", "spec": {LoadSpec fields}}          -> {"ready": {"connect_seconds": S}}
    {"do": "round", "at": T, "messages": N, "duration": S, "rate": R, "arrival": A,
     "deadline": S|null}                               -> {"round": {... "histogram": B64 ...}}
    {"do": "close"}                                    -> {"closed": true}, exit 0

``at`` is a CLOCK_MONOTONIC time (the same clock in every process of the machine): each engine
starts its round then.  A failure is ``{"error": ONE LINE, "kind": KIND}`` (a LoadError's kind,
or ``usage``); the parent raises it as a LoadError naming the engine.  No pytest here.
"""
from __future__ import annotations

import base64
import json
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Sequence

from . import loadgen, procs

#: Connections one engine takes at most: under one process's fd limit and, per source address,
#: well under the local port range (net.ipv4.ip_local_port_range: 28,232 ports here).
PORTS_PER_SOURCE = 25_000
#: How long before the round's common start the request goes out, seconds.
START_AHEAD = 0.05
#: Seconds an engine may take to open its connections and warm up, beyond the spec's timeouts.
OPEN_SLACK = 60.0


def engines_for(connections: int, limit: Optional[int] = None) -> int:
    """The fewest engines that hold ``connections``: each below this process's fd limit (less
    its margin) and PORTS_PER_SOURCE."""
    per = min(limit if limit is not None else loadgen.max_connections(), PORTS_PER_SOURCE)
    if per <= 0:
        raise loadgen.FdLimitError("no file descriptors left for a load engine's connections")
    return max(1, math.ceil(connections / per))


def shares(total: int, parts: int) -> List[int]:
    """``total`` split into ``parts`` as evenly as whole numbers go (the first ones larger)."""
    base, extra = divmod(total, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def source_for(host: str, k: int) -> Optional[str]:
    """Engine k's source address: 127.0.0.(k+1) towards an IPv4 loopback server (engine 0 binds
    nothing: the kernel picks 127.0.0.1), none over IPv6 (::1 is the only loopback address)."""
    if ":" in host or k == 0:
        return None
    if k > 250:
        raise ValueError(f"{k + 1} engines: more source addresses than 127.0.0.2 .. 127.0.0.251")
    return f"127.0.0.{k + 1}"


class EngineSet:
    """Connections to one server spread over ``engines`` engine processes (see the module)."""

    def __init__(self, spec: loadgen.LoadSpec, engines: int, netns: Optional[str] = None) -> None:
        if not isinstance(spec, loadgen.LoadSpec):
            raise TypeError(f"EngineSet needs a LoadSpec, got {type(spec).__name__}")
        if not 1 <= engines <= spec.connections:
            raise ValueError(f"EngineSet: {engines} engines for {spec.connections} connections")
        self.spec = spec
        self.engines = engines
        self.netns = netns  # a simulated network's namespace (pyconcbench.netsim): the engines run there
        self.connect_seconds = 0.0
        self.children: List[procs.Child] = []
        self.specs: List[loadgen.LoadSpec] = []
        if spec.messages and spec.messages < engines:
            raise ValueError(f"EngineSet: {spec.messages} round trips cannot be split over {engines} engines")
        conns = shares(spec.connections, engines)
        warm = shares(spec.warmup_messages, engines)
        msgs = shares(spec.messages, engines)  # exact: the engines' round trips add up to the spec's
        for k in range(engines):
            # each engine process is pinned from outside (procs.Child), its spec unpinned: engines
            # sharing a CPU must sleep until their sends are due, not poll for them
            changes: Dict[str, Any] = dict(connections=conns[k], warmup_messages=warm[k], cpu=None,
                                           messages=msgs[k], seed=(spec.seed + k) % (1 << 64))
            if spec.transport == "tcp":
                changes["source"] = source_for(spec.host, k)
            self.specs.append(spec.with_(**changes))

    @property
    def pids(self) -> List[int]:
        """The engine processes (the noise judge counts their CPU as the load generator's)."""
        return [c.pid for c in self.children if c.proc is not None]

    # -- LoadSession's interface ------------------------------------------------------------------

    def open(self) -> "EngineSet":
        """Starts every engine; each connects its share and warms up (all at once)."""
        try:
            for k, spec in enumerate(self.specs):
                child = procs.Child([sys.executable, "-m", "pyconcbench.engines"], stdin_pipe=True,
                                    cpu=self.spec.cpu, netns=self.netns)
                self.children.append(child)
                try:
                    child.start()
                except procs.ChildError as exc:
                    raise loadgen.LoadError("system", f"engine {k + 1} of {self.engines}: {exc}") from None
                body = asdict(spec)
                child.write_line(json.dumps({"do": "open", "spec": body}).encode())
            timeout = self.spec.connect_timeout + OPEN_SLACK + self.spec.deadline
            answers = [self._answer(k, "ready", timeout) for k in range(self.engines)]
        except BaseException:
            self.close()
            raise
        self.connect_seconds = max(a["connect_seconds"] for a in answers)
        return self

    def warmup(self) -> None:
        """Each engine warmed up when it opened."""

    def round(self, messages: Optional[int] = None, duration: Optional[float] = None, rate: float = 0.0,
              arrival: str = "uniform", deadline: Optional[float] = None) -> loadgen.LoadResult:
        """One round on every engine at once, merged: LoadSession.round's arguments, split over
        the engines by their connections (messages, rate)."""
        spec = self.spec
        if messages is None and duration is None:
            messages, duration = spec.messages, spec.duration
        if messages and messages < self.engines:
            raise ValueError(f"EngineSet.round: {messages} round trips cannot be split over {self.engines} engines")
        # exact: the engines' round trips add up to those asked (a rounded share would not)
        parts = shares(messages, self.engines) if messages else [0] * self.engines
        at = time.monotonic() + START_AHEAD
        for k, (child, part) in enumerate(zip(self.children, self.specs)):
            share = part.connections / spec.connections
            request = {"do": "round", "at": at, "duration": duration or 0.0, "arrival": arrival,
                       "messages": parts[k], "rate": rate * share if rate else 0.0, "deadline": deadline}
            try:
                child.write_line(json.dumps(request).encode())
            except procs.ChildError as exc:
                self.close()
                raise loadgen.LoadError("system", f"engine {k + 1} of {self.engines}: {exc}") from None
        timeout = START_AHEAD + (deadline or spec.deadline) + 30.0
        answers = [self._answer(k, "round", timeout) for k in range(self.engines)]
        return merge([decode(a) for a in answers], spec, rate, arrival, self.connect_seconds)

    def close(self) -> None:
        """Asks each engine to close its connections and exit; kills those that do not."""
        for child in self.children:
            try:
                child.write_line(b'{"do": "close"}')
                child.read_line(10.0)
            except (procs.ChildError, TimeoutError, OSError):
                pass
            child.close()
        self.children = []

    def __enter__(self) -> "EngineSet":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the protocol ----------------------------------------------------------------------------

    def _answer(self, k: int, key: str, timeout: float) -> Dict[str, Any]:
        child = self.children[k]
        where = f"engine {k + 1} of {self.engines}"
        try:
            line = child.read_line(timeout)
        except TimeoutError:
            self.close()
            raise loadgen.LoadError("deadline", f"{where} did not answer within {timeout:g} s (killed)") from None
        if line is None:
            tail = "; ".join(child.stderr_tail(3))
            self.close()
            raise loadgen.LoadError("system", f"{where} exited" + (f": {tail}" if tail else ""))
        answer = json.loads(line)
        if "error" in answer:
            self.close()
            raise loadgen.LoadError(answer.get("kind") or "system", f"{where}: {answer['error']}",
                                    answer.get("result"))
        return answer[key]


def encode(result: loadgen.LoadResult, per_conn: Sequence[int]) -> Dict[str, Any]:
    """One engine's round for the parent: its figures, its histograms whole, its per-connection
    counts."""
    d = result.as_dict()
    for name in ("histogram", "histogram_uncorrected"):
        hist = getattr(result, name)
        d[name] = base64.b64encode(hist.to_bytes()).decode() if hist is not None else None
    d["per_conn"] = list(per_conn)
    return d


def decode(d: Dict[str, Any]) -> Dict[str, Any]:
    for name in ("histogram", "histogram_uncorrected"):
        if d.get(name) is not None:
            d[name] = loadgen.Histogram.from_bytes(base64.b64decode(d[name]))
    return d


def merge(parts: Sequence[Dict[str, Any]], spec: loadgen.LoadSpec, rate: float, arrival: str,
          connect_seconds: float) -> loadgen.LoadResult:
    """The engines' rounds as one: counts summed, the wall time the longest engine's (they
    started together), histograms merged exactly, fairness over every connection."""
    hist = loadgen.Histogram()
    for p in parts:
        hist.merge(p["histogram"])
    unc = None
    if all(p.get("histogram_uncorrected") is not None for p in parts) and rate:
        unc = loadgen.Histogram()
        for p in parts:
            unc.merge(p["histogram_uncorrected"])
    errors: Dict[str, int] = {}
    for p in parts:
        for kind, n in p["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    sent = sum(p["sent"] for p in parts)
    per_conn = [n for p in parts for n in p["per_conn"]]
    return loadgen.LoadResult(
        connections=spec.connections, size=spec.size, transport=spec.transport,
        completed=sum(p["completed"] for p in parts), elapsed=max(p["elapsed"] for p in parts),
        connect_seconds=connect_seconds, latency=hist.summary(), fairness=loadgen.fairness(per_conn),
        errors=errors, loadgen_cpu_user=sum(p["loadgen_cpu_user"] for p in parts),
        loadgen_cpu_sys=sum(p["loadgen_cpu_sys"] for p in parts), bytes=sum(p["bytes"] for p in parts),
        histogram=hist, rate=float(rate), arrival=arrival if rate else "",
        latency_uncorrected=unc.summary() if unc is not None else None, histogram_uncorrected=unc,
        sent=sent, late=sum(p["late"] for p in parts),
        lag_mean=sum(p["lag_mean"] * p["sent"] for p in parts) / sent if sent else 0.0,
        lag_max=max(p["lag_max"] for p in parts), pipeline=spec.pipeline)


# ---- the engine process ------------------------------------------------------------------------

def _serve(requests: Any, answers: Any) -> int:
    session: Optional[loadgen.LoadSession] = None

    def say(obj: Dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        for line in requests:
            request = json.loads(line)
            do = request.get("do")
            try:
                if do == "open":
                    session = loadgen.LoadSession(loadgen.LoadSpec(**request["spec"]))
                    session.open()
                    session.warmup()
                    say({"ready": {"connect_seconds": session.connect_seconds}})
                elif do == "round" and session is not None:
                    wait = request["at"] - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    result = session.round(messages=request["messages"] or None,
                                           duration=request["duration"] or None, rate=request["rate"],
                                           arrival=request["arrival"], deadline=request["deadline"])
                    say({"round": encode(result, session.last_per_conn)})
                elif do == "close":
                    if session is not None:
                        session.close()
                        session = None
                    say({"closed": True})
                    return procs.EXIT_OK
                else:
                    say({"error": f"cannot {do!r} now", "kind": "usage"})
                    return procs.EXIT_UNUSABLE
            except loadgen.LoadError as exc:
                result = {k: v for k, v in exc.result.items() if k in ("completed", "errors", "waiting", "live")}
                say({"error": exc.detail, "kind": exc.kind, "result": result})
                return procs.EXIT_FAILED
            except (ValueError, TypeError, loadgen.FdLimitError) as exc:
                say({"error": str(exc), "kind": "system"})
                return procs.EXIT_UNUSABLE
    finally:
        if session is not None:
            session.close()
    return procs.EXIT_OK


def main() -> int:
    # the protocol on private copies of stdin/stdout: nothing else can read a request or print
    # into an answer
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    procs.start_guard()
    return _serve(requests, answers)


if __name__ == "__main__":
    sys.exit(main())
