"""Context-switch microbenchmarks: what a switch costs in Python, beside native C and Go.

The catalogue (``cases()``) reproduces and extends the context-switch study: function call,
syscall, fork, thread create, thread switch (``sched_yield`` with 1 … 1024 threads), mutex,
``usleep(0)``, setjmp/longjmp between two stacks, ``swapcontext`` and a stackless coroutine
in C; generator ``next``/``send``, ``yield from`` and ``await`` chains by depth, greenlet,
gevent, asyncio and uvloop, thread hand-offs and processes in Python; goroutine create,
channel and mutex hand-offs and ``runtime.Gosched`` in Go.

Every figure is **ns per operation**: each round times N operations inside the workload
(Python: ``time.perf_counter_ns`` around the loop; C: ``CLOCK_MONOTONIC`` inside C; Go:
inside Go) and subtracts the same number of iterations of an empty loop, timed just before
in the same language.  What one operation is, is in each case's ``op``; a round trip of a
two-party hand-off is two operations.  Workloads check that the work they timed was done
(counts from the other side), so a broken switch can never pass as a fast one.

A ``Runner`` pins what it measures (the calling thread for Python, C's driver thread, the Go
process) to one CPU, or puts the peer of a ``-2cpu`` hand-off on a second one, warms up with
one untimed round, and keeps every round's sample.  A round of a one-thread case during which
the measuring thread waited for its CPU (another process ran there) is measured again, up to
``NOISE_RETRIES`` times, and counted when it stays noisy.  It knows nothing of pytest: give
``run()`` pytest-benchmark's ``benchmark.pedantic`` to have each round timed by it too.
``python -m pyconcbench.micro`` runs cases without pytest.

fork copies the forking process's page tables, so its cost grows with that process's memory:
``*-fork_waitpid`` forks the measuring process itself (pytest: ~50 MiB resident) and is not
compared with the study, while ``*-fork_waitpid-small_c`` / ``-small_py`` fork from a small
helper process started for each round (``smallproc``: a tiny C program, the study's setting,
or a fresh ``python -I -S``), whose resident size goes into extra_info beside the figure.

Size: the catalogue of cases (Python, C, Go, with the study's parameters) and ``Runner``; the
round loop is ``pyconcbench.rounds``', the /proc readers ``pyconcbench.instruments``', the
study's figures ``micro.study``, the tables ``report.switch_tables``.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import instruments, metrics
from .. import rounds as round_engine
from ..stats import fit_line  # noqa: F401  (re-exported: micro.fit_line)
from ..broken import Broken
from . import workloads
from .workloads import WorkloadError

__all__ = ["Broken", "Case", "Sample", "Runner", "Unavailable", "WorkloadError", "cases", "find",
           "fit_line", "DEPTHS", "YIELD_THREADS", "GOSCHED_GOROUTINES"]

#: The depth sweep: delegating levels of ``yield from`` / ``await``.
DEPTHS = (1, 2, 4, 8, 16, 32)
#: sched_yield with n threads (the study's curve; 100 is the study's usleep comparison point).
YIELD_THREADS = (1, 2, 4, 8, 16, 32, 64, 100, 128, 256, 512, 1024)
#: runtime.Gosched with n goroutines.
GOSCHED_GOROUTINES = (1, 4, 16, 64, 256, 1024, 4096, 16384)

#: The pytest-benchmark group of each kind of test.
GROUPS = {"switch": "switch-{family}", "create": "create", "handoff": "handoff",
          "depth": "depth-sweep"}


class Unavailable(Exception):
    """The case cannot run here (a module not installed or not importable on this Python, 'go'
    not on PATH, one CPU): a skip reason.  Our own code that does not build (the Go baselines)
    is ``Broken`` instead: a failure."""


@dataclass(frozen=True)
class Sample:
    """One round: ``ops`` operations timed in ``elapsed_ns``, and the empty loop of the same
    length in ``empty_ns`` (0 when nothing is subtracted)."""

    elapsed_ns: int
    empty_ns: int
    ops: int
    check: Optional[int] = None  # operations counted by the other side, when it counts
    waited_ns: Optional[int] = None  # the measuring thread runnable but off its CPU

    @property
    def ns_per_op(self) -> float:
        return (self.elapsed_ns - self.empty_ns) / self.ops

    def as_dict(self) -> Dict[str, Any]:
        d = {"ns_per_op": round(self.ns_per_op, 3), "elapsed_ns": self.elapsed_ns,
             "empty_ns": self.empty_ns, "ops": self.ops}
        if self.check is not None:
            d["check"] = self.check
        if self.waited_ns is not None:
            d["waited_ns"] = self.waited_ns
        return d

    @property
    def waited_share(self) -> Optional[float]:
        """The share of the timed loop the measuring thread spent waiting for its CPU."""
        if self.waited_ns is None or self.elapsed_ns <= 0:
            return None
        return self.waited_ns / self.elapsed_ns


@dataclass(frozen=True)
class Case:
    """One microbenchmark.

    ``target`` is the workload: a function in ``workloads`` (python), a case of
    ``_native.micro_run`` (native) or of ``go/switch.go`` (go); ``params`` its fixed keyword
    arguments.  ``loops`` iterations of the timed loop per round, ``ops_per_loop`` operations
    per iteration.  ``cpus`` 2: the peer thread or process runs on a second CPU.  ``helper``:
    the loop runs in a small helper process started per round (``smallproc``), not in this
    one."""

    test: str
    family: str
    name: str
    target: str
    op: str
    loops: int
    rounds: int = 5
    ops_per_loop: int = 1
    cpus: int = 1
    needs: Tuple[str, ...] = ()
    subtract: bool = True
    params: Tuple[Tuple[str, Any], ...] = ()
    step: int = 1  # loops must be a multiple of this
    depth: Optional[int] = None
    helper: str = ""  # run in a small process of its own: "c" or "python" (see smallproc)

    @property
    def id(self) -> str:
        """The pytest id: ``python-generator_next``, ``native-futex-2cpu``, ``yield_from-d8``."""
        return self.name if self.test == "depth" else f"{self.family}-{self.name}"

    @property
    def group(self) -> str:
        return GROUPS[self.test].format(family=self.family)

    @property
    def kwargs(self) -> Dict[str, Any]:
        return dict(self.params)

    @property
    def solo(self) -> bool:
        """One thread does all the work (Python's calling thread, C's driver): any time it
        waited for its CPU was taken by another process, and makes the round noisy."""
        return (self.test in ("switch", "depth") and self.family in ("python", "native")
                and "threads" not in self.kwargs)

    def warm_loops(self) -> int:
        return max(self.step, self.loops // 10 // self.step * self.step)


# ---- the catalogue ------------------------------------------------------------------------------

RT = "round trip: resume the other side until it suspends again (two one-way switches)"
FROM_HERE = ("forked from the measuring process itself (pytest, ~50 MiB resident, or "
             "python -m pyconcbench.micro; see parent_rss_kib), not a small process as in the "
             "study: no study ratio")
SMALL_C = ("forked from pcb_forkloop, a fresh C program of its own (libc only, about 1.5 MiB "
           "resident, see parent_rss_kib), as the study's s_fork was")
SMALL_PY = ("forked from a fresh `python -I -S` process (no site, no pytest; about 9 MiB "
            "resident, see parent_rss_kib)")
HANDOFF = "one-way hand-off: one side wakes the other and waits (a round trip is 2 ops)"


def _python() -> List[Case]:
    P = "python"
    out = [
        Case("switch", P, "empty_loop", "empty_loop", "one iteration of `for _ in range(n)` "
             "(the baseline every Python figure subtracts; not itself subtracted)",
             5_000_000, rounds=7, subtract=False),
        Case("switch", P, "call", "call", "one call of a Python function that returns at once",
             2_500_000, rounds=7),
        Case("switch", P, "generator_next", "generator_next", f"next(g): {RT}", 2_500_000, rounds=7),
        Case("switch", P, "generator_send", "generator_send", f"g.send(x): {RT}", 2_500_000, rounds=7),
        Case("switch", P, "greenlet_pingpong", "greenlet_pingpong",
             f"greenlet switch to a child and back: {RT}", 200_000, rounds=7, needs=("greenlet",)),
        Case("switch", P, "greenlet_pingpong-py200", "greenlet_pingpong",
             f"the same, the child 200 Python frames deep: {RT}", 200_000, rounds=7,
             needs=("greenlet",), params=(("depth", 200), ("via", "py"))),
        Case("switch", P, "greenlet_pingpong-c200", "greenlet_pingpong",
             f"the same, the child 200 frames deep, each entered from C (map), so the C stack "
             f"greenlet copies is deep too: {RT}", 20_000, rounds=7,
             needs=("greenlet",), params=(("depth", 200), ("via", "c"))),
        Case("switch", P, "gevent_sleep0", "gevent_sleep0",
             f"gevent.sleep(0): main greenlet -> hub (one loop iteration) -> main: {RT}",
             100_000, rounds=7, needs=("gevent",)),
    ]
    for loop in ("asyncio", "uvloop"):
        needs = ("uvloop",) if loop == "uvloop" else ()
        out += [
            Case("switch", P, f"{loop}_sleep0", "asyncio_sleep0",
                 f"await asyncio.sleep(0) on {loop}: task -> loop iteration -> task: {RT}",
                 50_000 if loop == "asyncio" else 100_000, rounds=7, needs=needs,
                 params=(("loop", loop),)),
            Case("switch", P, f"{loop}_call_soon", "asyncio_call_soon",
                 f"loop.call_soon(cb) on {loop} and the loop running cb (batches of 100)",
                 150_000 if loop == "asyncio" else 500_000, rounds=7, needs=needs,
                 params=(("loop", loop),), step=100),
        ]
    out += [Case("depth", P, f"yield_from-d{d}", "yield_from",
                 f"next() through {d} levels of `yield from` to a yielding leaf: {RT}",
                 max(200_000, 3_000_000 // d), rounds=7, params=(("depth", d),), depth=d)
            for d in DEPTHS]
    out += [Case("depth", P, f"await-d{d}", "await_",
                 f"coro.send(None) through {d} levels of `await` to a yielding awaitable: {RT}",
                 max(200_000, 3_000_000 // d), rounds=7, params=(("depth", d),), depth=d)
            for d in DEPTHS]
    out += [
        Case("create", P, "thread_start_join", "thread_start_join",
             "threading.Thread(target=f).start() + join()", 2_000),
        Case("create", P, "fork_waitpid", "fork_waitpid",
             f"os.fork() of a child that os._exit(0)s + os.waitpid(), {FROM_HERE}", 200),
        Case("create", P, "fork_waitpid-small_py", "fork_waitpid",
             f"os.fork() of a child that os._exit(0)s + os.waitpid(), {SMALL_PY}", 500,
             helper="python"),
        Case("create", P, "mp_process", "mp_process",
             "multiprocessing Process (fork context) start() + join()", 40, rounds=3),
        Case("create", P, "greenlet_create", "greenlet_create",
             "greenlet(f).switch(): create, first switch, finish", 300_000, needs=("greenlet",)),
        Case("create", P, "gevent_spawn_join", "gevent_spawn_join",
             "gevent.spawn(f).join()", 100_000, needs=("gevent",)),
    ]
    for loop in ("asyncio", "uvloop"):
        needs = ("uvloop",) if loop == "uvloop" else ()
        out.append(Case("create", P, f"{loop}_create_task", "asyncio_create_task",
                        f"await loop.create_task(coro()) on {loop}", 100_000, needs=needs,
                        params=(("loop", loop),)))
    for name, target in (("condition", "condition"), ("lock_pair", "lock_pair"),
                         ("queue", "queue_handoff")):
        for cpus, loops, rounds in ((1, 20_000, 5), (2, 2_000, 3)):
            out.append(Case("handoff", P, f"{name}-{cpus}cpu", target,
                            f"{HANDOFF}; threads via {name.replace('_', ' ')}", loops,
                            rounds=rounds, ops_per_loop=2, cpus=cpus, params=(("peer", True),)))
    out += [
        Case("handoff", P, "gevent_event", "gevent_event",
             f"{HANDOFF}; greenlets via gevent Event set/wait", 50_000, ops_per_loop=2,
             needs=("gevent",)),
    ]
    for loop in ("asyncio", "uvloop"):
        needs = ("uvloop",) if loop == "uvloop" else ()
        out.append(Case("handoff", P, f"{loop}_future", "asyncio_future",
                        f"{HANDOFF}; tasks via Future set_result/await on {loop}", 50_000,
                        ops_per_loop=2, needs=needs, params=(("loop", loop),)))
    return out


def _native_cases() -> List[Case]:
    N = "native"
    out = [
        Case("switch", N, "call", "call", "one call of a non-inlined C function (call + ret)",
             200_000_000, rounds=7),
        Case("switch", N, "syscall_getpid", "syscall_getpid", "one syscall(SYS_getpid)",
             1_000_000, rounds=7),
        Case("switch", N, "setjmp_longjmp", "setjmp_longjmp",
             f"_setjmp/_longjmp between two stacks (a real coroutine switch): {RT}",
             20_000_000, rounds=7),
        Case("switch", N, "swapcontext", "swapcontext", f"two swapcontext() calls: {RT}",
             300_000, rounds=7),
        Case("switch", N, "coroutine", "coroutine",
             f"stackless switch-based C coroutine (protothreads), resume until it yields: {RT}",
             100_000_000, rounds=7),
        Case("switch", N, "mutex_uncontended", "mutex_uncontended",
             "pthread_mutex_lock + unlock, one thread", 5_000_000, rounds=7),
        Case("switch", N, "usleep0-t1", "usleep0", "one usleep(0), one thread (wake-up latency)",
             1_000, params=(("threads", 1),)),
        Case("switch", N, "usleep0-t100", "usleep0",
             "one usleep(0) by any of 100 threads on one CPU", 30_000, params=(("threads", 100),)),
    ]
    out += [Case("switch", N, f"sched_yield-t{t}", "sched_yield",
                 f"one sched_yield() by any of {t} threads on one CPU", 100_000,
                 params=(("threads", t),))
            for t in YIELD_THREADS]
    out += [
        Case("create", N, "pthread_create_join", "pthread_create_join",
             "pthread_create + pthread_join of a thread that returns at once", 5_000),
        Case("create", N, "fork_waitpid", "fork_waitpid",
             f"fork() of a child that _exit(0)s + waitpid(), {FROM_HERE}", 300),
        Case("create", N, "fork_waitpid-small_c", "fork_waitpid",
             f"fork() of a child that _exit(0)s + waitpid(), {SMALL_C}", 1000, helper="c"),
        Case("create", N, "fork_waitpid-small_py", "fork_waitpid",
             f"fork() of a child that _exit(0)s + waitpid() in the extension's C loop, "
             f"{SMALL_PY}", 1000, helper="python"),
    ]
    for name, target, what in (("futex", "futex_handoff", "a futex word (wake, wait)"),
                               ("pipe_threads", "pipe_threads", "a pipe pair, 1 byte, threads"),
                               ("pipe_processes", "pipe_processes",
                                "a pipe pair, 1 byte, this process and a forked child")):
        for cpus, loops, rounds in ((1, 50_000, 5), (2, 2_000, 3)):
            out.append(Case("handoff", N, f"{name}-{cpus}cpu", target, f"{HANDOFF}; {what}",
                            loops, rounds=rounds, ops_per_loop=2, cpus=cpus))
    for cpus, loops in ((1, 4_000_000), (2, 1_000_000)):
        out.append(Case("handoff", N, f"mutex_contended-{cpus}cpu", "mutex_contended",
                        "pthread_mutex_lock + unlock by either of two threads", loops,
                        cpus=cpus))
    return out


def _go() -> List[Case]:
    G = "go"
    out = [
        Case("create", G, "goroutine", "goroutine",
             "go f() and f finishing (batches of 1000, then wait), GOMAXPROCS=1", 300_000,
             needs=("go",)),
        Case("handoff", G, "chan_pingpong", "chan_pingpong",
             f"{HANDOFF}; goroutines via an unbuffered channel, GOMAXPROCS=1", 300_000,
             ops_per_loop=2, needs=("go",)),
        Case("handoff", G, "mutex_handoff", "mutex_handoff",
             f"{HANDOFF}; goroutines via a sync.Mutex pair, GOMAXPROCS=1", 200_000,
             ops_per_loop=2, needs=("go",)),
    ]
    out += [Case("switch", G, f"gosched-g{g}", "gosched",
                 f"one runtime.Gosched() by any of {g} goroutines, GOMAXPROCS=1", 300_000,
                 rounds=7, needs=("go",), params=(("goroutines", g),))
            for g in GOSCHED_GOROUTINES]
    return out


_CASES: Optional[List[Case]] = None


def cases() -> List[Case]:
    """Every case, in a fixed order."""
    global _CASES
    if _CASES is None:
        _CASES = _python() + _native_cases() + _go()
        ids = [(c.test, c.id) for c in _CASES]
        assert len(ids) == len(set(ids)), "duplicate case ids"
    return list(_CASES)


def find(case_id: str, test: Optional[str] = None) -> Case:
    for c in cases():
        if c.id == case_id and (test is None or c.test == test):
            return c
    raise KeyError(case_id)


# ---- measuring ---------------------------------------------------------------------------------

def default_cpus() -> Tuple[int, ...]:
    """The first two CPUs this process may use (one when it may use only one)."""
    return tuple(sorted(os.sched_getaffinity(0))[:2])


def attach_depth_fit(case: Case, rows: List[Dict[str, Any]]) -> None:
    """Every depth case of ``case``'s kind among ``rows`` (extra_info dicts, updated in place)
    carries the line fitted over all its depths measured so far, so the last one to run
    completes it in each of them."""
    from ..report.switch_tables import depth_fits

    kind = case.name.rsplit("-d", 1)[0]
    infos = [r for r in rows if r.get("depth") is not None and r["case"].rsplit("-d", 1)[0] == kind]
    fit = depth_fits(infos).get(kind)
    if fit is None:
        return
    slope, intercept, r2, depths = fit
    for d in infos:
        d.update(fit_slope_ns_per_level=round(slope, 3), fit_intercept_ns=round(intercept, 3),
                 fit_r2=round(r2, 4), fit_depths=depths)


#: A round of a solo case whose measuring thread waited for its CPU more than this share of
#: the round (another process ran there) is noisy, and measured again ...
NOISY_WAIT_SHARE = 0.01
#: ... at most this many more times (the last try is kept, and counted as noisy).  What
#: this cannot see: on a shared VM the host's other work slows the virtual CPU itself, with
#: no trace in the guest's scheduler statistics (see the run-to-run spread in the README).
NOISE_RETRIES = 2


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


class Runner:
    """Measures one case: ``run()`` pins, warms up, runs the rounds, returns the extra_info
    dict (also ``self.extra``)."""

    def __init__(self, case: Case, cpus: Optional[Sequence[int]] = None):
        self.case = case
        allowed = tuple(cpus) if cpus else default_cpus()
        self.cpus: Tuple[int, ...] = allowed[:case.cpus] if len(allowed) >= case.cpus else ()
        self.samples: List[Sample] = []
        self.other_cpu: List[Optional[float]] = []  # per round: other processes' CPU share
        self.noisy: List[str] = []  # per kept round: why it is still noisy after the retries
        self.rejected: List[Tuple[Sample, str]] = []  # noisy rounds measured again
        self.plan = round_engine.Plan.fixed(case.rounds)  # how many rounds (set by run)
        self.extra: Dict[str, Any] = {}
        self.go_version: Optional[str] = None
        self.helper_reports: List[Dict[str, Any]] = []  # every helper run's own report
        #: noisy rounds measured again at most this many times (0 in an A/B worker: a slow
        #: spell hits both rounds of a pair and cancels in B/A, see pyconcbench.ab)
        self.retries = NOISE_RETRIES

    # -- availability ------------------------------------------------------------------------

    def check_available(self) -> None:
        """Raises Unavailable (a one-line reason) when the case cannot run here, decided
        before any of its code runs; Broken (one line) when the Go baselines do not build."""
        if not self.cpus:
            raise Unavailable(f"{self.case.id} needs {self.case.cpus} CPUs to pin to; this "
                              f"process may use {sorted(os.sched_getaffinity(0))}")
        if self.case.helper:
            from . import smallproc

            why = smallproc.unavailable(self.case.helper)
            if why is not None:
                raise Unavailable(f"{self.case.id}: {why}")
        for need in self.case.needs:
            if need == "go":
                from . import golang

                try:
                    golang.build()  # Broken, a failure, when it does not build
                except golang.GoUnavailable as exc:
                    raise Unavailable(str(exc)) from None
            else:
                try:
                    found = importlib.util.find_spec(need) is not None
                except ValueError:  # imported already, without a spec
                    found = True
                if not found:
                    raise Unavailable(f"{self.case.id} needs {need} (not installed); install "
                                      f"pyconcbench[{need}]")
                try:
                    importlib.import_module(need)
                except Exception as exc:  # installed, but this release does not import here
                    raise Unavailable(f"{self.case.id}: {need} does not import on Python "
                                      f"{platform.python_version()}: {type(exc).__name__}: "
                                      f"{exc}") from None

    # -- one measurement ---------------------------------------------------------------------

    def measure(self, loops: int) -> Sample:
        case = self.case
        a = self.cpus[0]
        b = self.cpus[-1]  # == a on one CPU
        if case.helper:
            from . import smallproc

            d = smallproc.run(case.helper, case.family, loops, cpu=a)
            self.helper_reports.append(d)
        elif case.family == "python":
            fn: Callable[..., int] = getattr(workloads, case.target)
            kwargs = case.kwargs
            if kwargs.pop("peer", False):
                kwargs["peer_cpu"] = b
            enabled = gc.isenabled()
            gc.disable()
            try:
                empty = workloads.empty_loop(loops) if case.subtract else 0
                w0 = instruments.thread_waited_ns()
                elapsed = fn(loops, **kwargs)
                w1 = instruments.thread_waited_ns()
            finally:
                if enabled:
                    gc.enable()
            waited = w1 - w0 if w0 is not None and w1 is not None else None
            return Sample(elapsed, empty, loops * case.ops_per_loop, waited_ns=waited)
        elif case.family == "native":
            from . import native

            d = native.run(case.target, loops, threads=case.kwargs.get("threads", 1), cpu_a=a,
                           cpu_b=b)
        else:
            from . import golang

            d = golang.run(case.target, loops, goroutines=case.kwargs.get("goroutines", 1), cpu=a)
            self.go_version = d.get("go")
        waited = d.get("waited_ns")
        s = Sample(int(d["elapsed_ns"]), int(d["empty_ns"]) if case.subtract else 0,
                   int(d["ops"]), int(d["check"]),
                   waited_ns=int(waited) if (case.family == "native" or case.helper)
                   and waited is not None and waited >= 0 else None)
        expected = s.ops // case.ops_per_loop
        if s.ops < 1 or s.check != expected:
            raise WorkloadError(f"{case.id}: the other side counted {s.check} operations, "
                                f"expected {expected} (ops {s.ops})")
        return s

    def _measure(self, attempt: int) -> Tuple[Tuple[Sample, Optional[float]], str, float]:
        """One try of a round (rounds.measure_round), with the share of its CPUs other
        processes used meanwhile (clock ticks: a rough figure)."""
        other = instruments.OtherCpu(self.cpus).start()
        t0 = time.monotonic()
        sample = self.measure(self.case.loops)
        t1 = time.monotonic()
        seconds = other.stop()
        share = None
        if seconds is not None and t1 > t0:
            share = round(seconds / (t1 - t0) / len(self.cpus), 3)
        return (sample, share), self._judge(sample), t1 - t0

    def one_round(self) -> float:
        """One measured round; returns its time (the wall time of the whole kept try, which
        pytest-benchmark is handed).  A solo case's round in which the measuring thread waited
        for its CPU (another process took it) is measured again, up to ``retries`` times."""
        outcome = round_engine.measure_round(self._measure, self.retries)
        sample, share = outcome.kept.value
        self.samples.append(sample)
        self.other_cpu.append(share)
        self.noisy.append(outcome.kept.noisy)
        self.rejected.extend((t.value[0], t.noisy) for t in outcome.rejected)
        return outcome.timed

    def clean_figures(self) -> List[float]:
        """ns/op of the clean rounds so far (what rounds.Plan.done reads)."""
        return [s.ns_per_op for s, why in zip(self.samples, self.noisy) if not why]

    def _judge(self, sample: Sample) -> str:
        """Why the round is noisy, or ''."""
        waited = sample.waited_share
        if self.case.solo and waited is not None and waited > NOISY_WAIT_SHARE:
            return f"the measuring thread waited {waited:.1%} of the round for its CPU"
        return ""

    @property
    def pins_caller(self) -> bool:
        """Whether the workload runs in the calling thread, which must be pinned: Python's;
        C's driver, the Go process and a small-process helper pin themselves."""
        return self.case.family == "python" and not self.case.helper

    def warm_up(self) -> None:
        """One untimed round of a tenth of the loops."""
        self.measure(self.case.warm_loops())

    def run(self, pedantic: Optional[Callable[..., Any]] = None,
            rounds: Optional[int] = None, plan: Optional[round_engine.Plan] = None) -> Dict[str, Any]:
        """Checks availability, pins (Python: the calling thread, restored after), runs one
        untimed warm-up round and the measured rounds (``plan``, else exactly ``rounds``, else
        the case's; handed to pytest-benchmark through ``pedantic`` when given:
        ``benchmark.pedantic``), and returns the extra_info dict."""
        self.check_available()
        self.plan = plan or round_engine.Plan.fixed(rounds or self.case.rounds)
        saved = os.sched_getaffinity(0)
        pin_here = self.pins_caller
        if pin_here:
            workloads.pin(self.cpus[0])
        try:
            self.warm_up()
            round_engine.run_rounds(pedantic, self.one_round, self.plan, self.clean_figures)
        finally:
            if pin_here:
                os.sched_setaffinity(0, saved)
        self.extra = self.summary()
        return self.extra

    # -- results ----------------------------------------------------------------------------

    @property
    def ns_per_op(self) -> float:
        """The median of the rounds' ns/op."""
        return statistics.median(s.ns_per_op for s in self.samples)

    def pinning(self) -> str:
        c = self.case
        if c.helper:
            return f"the helper process on CPU {self.cpus[0]} (and the children it forks)"
        if c.test == "handoff" and c.family != "go":
            if c.cpus == 2:
                return f"the two parties on CPUs {self.cpus[0]} and {self.cpus[1]}"
            return f"both parties on CPU {self.cpus[0]}"
        if c.family == "python":
            return f"calling thread on CPU {self.cpus[0]}"
        if c.family == "native":
            return f"C driver thread on CPU {self.cpus[0]} (and what it starts)"
        return f"Go process on CPU {self.cpus[0]}, GOMAXPROCS=1"

    def summary(self) -> Dict[str, Any]:
        from .study import not_compared_note, study_figure

        c = self.case
        per_op = [s.ns_per_op for s in self.samples]
        med = statistics.median(per_op)
        ops = self.samples[-1].ops if self.samples else c.loops * c.ops_per_loop
        extra: Dict[str, Any] = {
            **metrics.stamp(metrics.SWITCH),
            "micro": c.id,
            "group": c.group,
            "family": c.family,
            "case": c.name,
            "op": c.op,
            "ns_per_op": round(med, 3),
            "ns_per_op_min": round(min(per_op), 3),
            "ns_per_op_max": round(max(per_op), 3),
            "spread_pct": round(100.0 * (max(per_op) - min(per_op)) / med, 2) if med else None,
            "loops_per_round": c.loops,
            "ops_per_round": ops,
            "ops_per_iteration": ops,  # one pytest-benchmark iteration = one round
            "rounds": len(self.samples),
            "round_plan": self.plan.describe(),
            "subtracted": ("the same number of empty-loop iterations, timed just before "
                           "in the same language") if c.subtract else "nothing",
            "empty_ns_per_loop": round(statistics.median(s.empty_ns / c.loops for s in self.samples), 3)
            if c.subtract and self.samples else 0.0,
            "timer": {"python": "time.perf_counter_ns around the loop",
                      "native": "clock_gettime(CLOCK_MONOTONIC) inside C",
                      "go": "time.Now/time.Since inside Go"}[c.family]
                     + (" (in the helper process)" if c.helper else "")
                     + "; pytest-benchmark's round time is the wall time of the whole round"
                     + (", the helper's start included" if c.helper else ""),
            "gc": "disabled while timing, as timeit does" if c.family == "python" else None,
            "cpus": list(self.cpus),
            "pinning": self.pinning(),
            "samples": [self.round_record(n) for n in range(len(self.samples))],
            "noise_rule": (f"a round whose measuring thread waited for its CPU more than "
                           f"{NOISY_WAIT_SHARE:.0%} of it is "
                           + (f"measured again, up to {self.retries} times" if self.retries
                              else "marked noisy (measured once: an interleaved A/B round)"))
                          if c.solo else "none (not a one-thread case)",
            "noisy_rounds_rejected": len(self.rejected),
            "noisy_rounds_kept": sum(1 for n in self.noisy if n),
            "rejected_samples": [dict(s.as_dict(), noisy=why) for s, why in self.rejected],
            "other_cpu_share_max": max((o for o in self.other_cpu if o is not None), default=None),
            "versions": self.versions(),
        }
        if c.depth is not None:
            extra["depth"] = c.depth
        if "fork" in c.name or c.name == "mp_process":
            # fork copies the parent's page tables: its cost grows with the parent's memory
            extra.update(self.forking_process())
        study = study_figure(c)
        if study is not None:
            extra["study_ns"] = study[0]
            extra["study_note"] = study[1]
            extra["ratio_to_study"] = round(med / study[0], 3)
        else:
            note = not_compared_note(c)
            if note is not None:
                extra["study_note"] = note
        return extra

    def round_record(self, n: int) -> Dict[str, Any]:
        """Round ``n``'s figures as saved: its sample, other processes' CPU share, why noisy."""
        return dict(self.samples[n].as_dict(), other_cpu_share=self.other_cpu[n], noisy=self.noisy[n] or None)

    def forking_process(self) -> Dict[str, Any]:
        """What the process that forks is and how big: its resident size, virtual size,
        page tables (KiB) and mappings; for a helper the largest of its rounds' figures, and
        the measuring process's own resident size beside them."""
        here = {"rss_kib": instruments.proc_status_kib("self", "VmRSS"),
                "vm_kib": instruments.proc_status_kib("self", "VmSize"),
                "pte_kib": instruments.proc_status_kib("self", "VmPTE"), "maps": instruments.mappings()}
        if not self.case.helper:
            return {"forking_process": "the measuring process itself (pytest, or python -m "
                                       "pyconcbench.micro), in which the loop runs",
                    **{f"parent_{k}": v for k, v in here.items()}}
        from . import smallproc

        out: Dict[str, Any] = {
            "forking_process": smallproc.describe(self.case.helper, self.case.family)}
        for k in ("rss_kib", "vm_kib", "pte_kib", "maps"):
            seen = [r[k] for r in self.helper_reports if r.get(k, -1) >= 0]
            out[f"parent_{k}"] = max(seen) if seen else None
        out["measuring_process_rss_kib"] = here["rss_kib"]
        return out

    def versions(self) -> Dict[str, Optional[str]]:
        v: Dict[str, Optional[str]] = {"python": platform.python_version()}
        for need in self.case.needs:
            if need == "go":
                v["go"] = self.go_version
            else:
                v[need] = _version(need)
        return v
