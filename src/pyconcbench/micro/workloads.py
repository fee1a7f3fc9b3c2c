"""The Python side of the switch microbenchmarks: plain callables, no pytest.

Each workload is ``f(loops, **params) -> int``: it sets up, runs an untimed warm-up, then
times ``for _ in range(loops): <body>`` with ``time.perf_counter_ns`` around the loop only,
tears down, and returns the nanoseconds it measured.  ``empty_loop(loops)`` times the same
loop with an empty body, which the caller subtracts.  A workload raises ``WorkloadError``
when the other side did not do its part (a peer that timed out, a child that failed, a count
that does not add up), so a broken switch can never pass as a fast one.

Thread workloads take ``peer_cpu``: the CPU their second thread pins itself to (the caller
pins the calling thread).  Every wait has a timeout (``TIMEOUT`` seconds), every thread is
joined, every child process reaped, every event loop and gevent hub closed before return.

Size: one small function per Python workload of the catalogue (about 30), each with its own
set-up and tear-down; splitting them would only scatter the catalogue.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import threading
from time import perf_counter_ns
from typing import Any, Callable, List, Optional

#: Seconds any single wait may take before the workload fails.
TIMEOUT = 30.0
#: Untimed iterations before the timed loop (the specialising interpreter, caches, peers).
WARM = 2000


class WorkloadError(RuntimeError):
    """A workload did not do the work it claims to have timed."""


def _warm(loops: int) -> int:
    return min(WARM, max(10, loops // 10))


def empty_loop(loops: int) -> int:
    """The baseline: the loop every workload times, with nothing in it."""
    t0 = perf_counter_ns()
    for _ in range(loops):
        pass
    return perf_counter_ns() - t0


def pin(cpu: Optional[int]) -> None:
    """Pins the calling thread (Linux: pid 0 is the thread) to one CPU; None: no-op."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


# ---- calls and generators -------------------------------------------------------------------

def _noop() -> None:
    pass


def call(loops: int) -> int:
    """One call of a Python function that returns at once."""
    f = _noop
    for _ in range(_warm(loops)):
        f()
    t0 = perf_counter_ns()
    for _ in range(loops):
        f()
    return perf_counter_ns() - t0


def _leaf():
    while True:
        yield


def generator_next(loops: int) -> int:
    """One ``next(g)``: resume a generator until its next ``yield``."""
    g = _leaf()
    nxt = next
    for _ in range(_warm(loops)):
        nxt(g)
    t0 = perf_counter_ns()
    for _ in range(loops):
        nxt(g)
    elapsed = perf_counter_ns() - t0
    g.close()
    return elapsed


def generator_send(loops: int) -> int:
    """One ``g.send(value)`` into a generator that receives it at ``yield``."""

    def echo():
        value = None
        while True:
            value = yield value

    g = echo()
    next(g)
    send = g.send
    for _ in range(_warm(loops)):
        send(1)
    t0 = perf_counter_ns()
    for _ in range(loops):
        send(1)
    elapsed = perf_counter_ns() - t0
    if send(7) != 7:
        raise WorkloadError("generator_send: the generator did not receive the value")
    g.close()
    return elapsed


# ---- yield-from and await chains (the depth sweep) ------------------------------------------
# Depth d = d delegating frames (``yield from`` / ``await``) above one leaf that yields.
# Each op resumes the whole chain down to the leaf and suspends it all the way up again.

def _delegate(child):
    yield from child


def yield_from_chain(depth: int):
    g = _leaf()
    for _ in range(depth):
        g = _delegate(g)
    return g


def yield_from(loops: int, depth: int) -> int:
    """One ``next()`` through ``depth`` levels of ``yield from``."""
    g = yield_from_chain(depth)
    nxt = next
    for _ in range(_warm(loops)):
        nxt(g)
    t0 = perf_counter_ns()
    for _ in range(loops):
        nxt(g)
    elapsed = perf_counter_ns() - t0
    g.close()
    return elapsed


class _Suspend:
    """A bare awaitable whose ``__await__`` yields to whoever drives the coroutine."""

    __slots__ = ()

    def __await__(self):
        while True:
            yield


async def _await(child):
    await child


def await_chain(depth: int):
    c: Any = _Suspend()
    for _ in range(depth):
        c = _await(c)
    return c


def await_(loops: int, depth: int) -> int:
    """One ``coro.send(None)`` through ``depth`` levels of ``await`` (no event loop)."""
    c = await_chain(depth)
    send = c.send
    for _ in range(_warm(loops)):
        send(None)
    t0 = perf_counter_ns()
    for _ in range(loops):
        send(None)
    elapsed = perf_counter_ns() - t0
    c.close()
    return elapsed


# ---- greenlet ---------------------------------------------------------------------------------

def _nest_py(depth: int, fn: Callable[[], Any]) -> Any:
    """Calls fn under ``depth`` more Python frames (on 3.11+ these use no C stack)."""
    if depth == 0:
        return fn()
    return _nest_py(depth - 1, fn)


def _nest_c(depth: int, fn: Callable[[], Any]) -> Any:
    """Calls fn under ``depth`` more Python frames, each entered from C (``map``), so that
    every level also grows the C stack, which greenlet copies when it switches."""
    if depth == 0:
        return fn()
    return next(map(_nest_c, (depth - 1,), (fn,)))


def greenlet_pingpong(loops: int, depth: int = 0, via: str = "py") -> int:
    """One round trip between two greenlets: main switches to the child, the child switches
    back.  With depth > 0 the child switches from under ``depth`` extra frames."""
    import greenlet

    main = greenlet.getcurrent()
    warm = _warm(loops)
    total = warm + loops

    def body() -> str:
        sw = main.switch
        for i in range(total + 1):
            sw(i)
        return "done"

    nest = _nest_c if via == "c" else _nest_py
    child = greenlet.greenlet(lambda: nest(depth, body))
    gsw = child.switch
    v = gsw()  # starts the child: it nests, then switches back with 0
    for _ in range(warm):
        v = gsw()
    t0 = perf_counter_ns()
    for _ in range(loops):
        v = gsw()
    elapsed = perf_counter_ns() - t0
    last = v
    end = gsw()  # the child leaves its loop and returns
    if last != total or end != "done" or not child.dead:
        raise WorkloadError(f"greenlet_pingpong: child reported {last!r}/{end!r}, expected {total}")
    return elapsed


def greenlet_create(loops: int) -> int:
    """Create a greenlet, switch into it, let it finish (back to the parent)."""
    import greenlet

    make = greenlet.greenlet
    f = _noop
    for _ in range(_warm(loops)):
        make(f).switch()
    t0 = perf_counter_ns()
    for _ in range(loops):
        make(f).switch()
    return perf_counter_ns() - t0


# ---- gevent -----------------------------------------------------------------------------------

def _gevent_run(body: Callable[[], int]) -> int:
    """Runs body with a fresh gevent hub in this thread and destroys the hub (and its loop's
    file descriptors) afterwards."""
    import gevent

    gevent.get_hub()
    try:
        return body()
    finally:
        gevent.get_hub().destroy(destroy_loop=True)


def gevent_sleep0(loops: int) -> int:
    """One ``gevent.sleep(0)``: main greenlet -> hub (one loop iteration) -> main."""
    import gevent

    def body() -> int:
        sleep = gevent.sleep
        for _ in range(_warm(loops)):
            sleep(0)
        t0 = perf_counter_ns()
        for _ in range(loops):
            sleep(0)
        return perf_counter_ns() - t0

    return _gevent_run(body)


def gevent_spawn_join(loops: int) -> int:
    """``gevent.spawn(f).join()`` of a function that returns at once."""
    import gevent

    def body() -> int:
        spawn = gevent.spawn
        f = _noop
        for _ in range(_warm(loops)):
            spawn(f).join()
        t0 = perf_counter_ns()
        for _ in range(loops):
            spawn(f).join()
        return perf_counter_ns() - t0

    return _gevent_run(body)


def gevent_event(loops: int) -> int:
    """Hand-offs between two greenlets through two ``gevent.event.Event``s (set, wait,
    clear); each loop is two hand-offs, each through the hub."""
    import gevent
    from gevent.event import Event

    def body() -> int:
        warm = _warm(loops)
        ping, pong = Event(), Event()
        answered: List[int] = [0]

        def peer() -> None:
            for _ in range(warm + loops):
                if not ping.wait(TIMEOUT):
                    return
                ping.clear()
                answered[0] += 1
                pong.set()

        g = gevent.spawn(peer)

        def round_trip() -> None:
            ping.set()
            if not pong.wait(TIMEOUT):
                raise WorkloadError("gevent_event: the peer greenlet did not answer")
            pong.clear()

        for _ in range(warm):
            round_trip()
        t0 = perf_counter_ns()
        for _ in range(loops):
            round_trip()
        elapsed = perf_counter_ns() - t0
        g.join(TIMEOUT)
        if answered[0] != warm + loops:
            raise WorkloadError(f"gevent_event: {answered[0]} answers, expected {warm + loops}")
        return elapsed

    return _gevent_run(body)


# ---- asyncio and uvloop ----------------------------------------------------------------------

def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _on_loop(kind: str, coro_fn: Callable[[], Any]) -> int:
    loop = new_loop(kind)
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


def asyncio_sleep0(loops: int, loop: str = "asyncio") -> int:
    """One ``await asyncio.sleep(0)``: task -> event loop iteration -> task."""

    async def main() -> int:
        sleep = asyncio.sleep
        for _ in range(_warm(loops)):
            await sleep(0)
        t0 = perf_counter_ns()
        for _ in range(loops):
            await sleep(0)
        return perf_counter_ns() - t0

    return _on_loop(loop, main)


async def _noop_coro() -> None:
    pass


def asyncio_create_task(loops: int, loop: str = "asyncio") -> int:
    """``await loop.create_task(coro())`` of a coroutine that returns at once."""

    async def main() -> int:
        create = asyncio.get_running_loop().create_task
        f = _noop_coro
        for _ in range(_warm(loops)):
            await create(f())
        t0 = perf_counter_ns()
        for _ in range(loops):
            await create(f())
        return perf_counter_ns() - t0

    return _on_loop(loop, main)


def asyncio_future(loops: int, loop: str = "asyncio") -> int:
    """Hand-offs between two tasks through Futures: each side sets the future the other
    awaits and awaits a fresh one; each loop is two hand-offs."""

    async def main() -> int:
        lp = asyncio.get_running_loop()
        warm = _warm(loops)
        box = {"peer": lp.create_future(), "main": lp.create_future()}
        answered: List[int] = [0]

        async def peer() -> None:
            for _ in range(warm + loops):
                await box["peer"]
                box["peer"] = lp.create_future()
                answered[0] += 1
                box["main"].set_result(None)

        task = lp.create_task(peer())

        async def round_trip() -> None:
            box["peer"].set_result(None)
            await box["main"]
            box["main"] = lp.create_future()

        for _ in range(warm):
            await round_trip()
        t0 = perf_counter_ns()
        for _ in range(loops):
            box["peer"].set_result(None)
            await box["main"]
            box["main"] = lp.create_future()
        elapsed = perf_counter_ns() - t0
        await asyncio.wait_for(task, TIMEOUT)
        if answered[0] != warm + loops:
            raise WorkloadError(f"asyncio_future: {answered[0]} answers, expected {warm + loops}")
        return elapsed

    return _on_loop(loop, main)


CALL_SOON_BATCH = 100


def asyncio_call_soon(loops: int, loop: str = "asyncio") -> int:
    """``loop.call_soon(cb)`` and the loop running cb: batches of 100 callbacks, then the
    task yields once so the loop runs them.  loops must be a multiple of 100."""
    if loops % CALL_SOON_BATCH:
        raise ValueError(f"asyncio_call_soon: loops must be a multiple of {CALL_SOON_BATCH}")
    batches = loops // CALL_SOON_BATCH

    async def main() -> int:
        call_soon = asyncio.get_running_loop().call_soon
        sleep = asyncio.sleep
        ran = [0]

        def cb() -> None:
            ran[0] += 1

        for _ in range(max(1, _warm(loops) // CALL_SOON_BATCH)):
            for _ in range(CALL_SOON_BATCH):
                call_soon(cb)
            await sleep(0)
        ran[0] = 0
        t0 = perf_counter_ns()
        for _ in range(batches):
            for _ in range(CALL_SOON_BATCH):
                call_soon(cb)
            await sleep(0)
        elapsed = perf_counter_ns() - t0
        if ran[0] != batches * CALL_SOON_BATCH:
            raise WorkloadError(f"asyncio_call_soon: {ran[0]} callbacks ran, expected "
                                f"{batches * CALL_SOON_BATCH}")
        return elapsed

    return _on_loop(loop, main)



# ---- threads ----------------------------------------------------------------------------------

def _two_threads(loops: int, peer_cpu: Optional[int], name: str,
                 peer_step: Callable[[], bool], main_step: Callable[[], bool]) -> int:
    """Runs peer_step in a second thread (pinned to peer_cpu) warm+loops times and times
    main_step over loops round trips after warm untimed ones.  A step returns False when its
    wait timed out."""
    warm = _warm(loops)
    failed: List[str] = []

    def peer() -> None:
        try:
            pin(peer_cpu)
            for _ in range(warm + loops):
                if not peer_step():
                    failed.append("the peer thread timed out waiting")
                    return
        except BaseException as exc:  # reported by the main thread
            failed.append(f"the peer thread failed: {exc!r}")

    t = threading.Thread(target=peer, name=f"pcb-{name}-peer", daemon=True)
    t.start()
    try:
        for _ in range(warm):
            if not main_step():
                raise WorkloadError(f"{name}: the peer did not answer within {TIMEOUT:g} s")
        t0 = perf_counter_ns()
        for _ in range(loops):
            if not main_step():
                raise WorkloadError(f"{name}: the peer did not answer within {TIMEOUT:g} s")
        elapsed = perf_counter_ns() - t0
    finally:
        t.join(TIMEOUT + 5)
    if t.is_alive():
        raise WorkloadError(f"{name}: the peer thread did not finish")
    if failed:
        raise WorkloadError(f"{name}: {failed[0]}")
    return elapsed


def condition(loops: int, peer_cpu: Optional[int] = None) -> int:
    """Hand-offs of a turn between two threads through one ``threading.Condition``
    (notify, wait); each loop is two hand-offs."""
    cond = threading.Condition()
    turn = [0]  # 0: main's turn, 1: the peer's

    def peer_step() -> bool:
        with cond:
            while turn[0] != 1:
                if not cond.wait(TIMEOUT):
                    return False
            turn[0] = 0
            cond.notify()
        return True

    def main_step() -> bool:
        with cond:
            turn[0] = 1
            cond.notify()
            while turn[0] != 0:
                if not cond.wait(TIMEOUT):
                    return False
        return True

    return _two_threads(loops, peer_cpu, "condition", peer_step, main_step)


def lock_pair(loops: int, peer_cpu: Optional[int] = None) -> int:
    """Hand-offs through two ``threading.Lock``s used as binary semaphores (each thread
    releases the lock the other waits on); each loop is two hand-offs."""
    a, b = threading.Lock(), threading.Lock()
    a.acquire()
    b.acquire()

    def peer_step() -> bool:
        if not a.acquire(timeout=TIMEOUT):
            return False
        b.release()
        return True

    def main_step() -> bool:
        a.release()
        return b.acquire(timeout=TIMEOUT)

    return _two_threads(loops, peer_cpu, "lock_pair", peer_step, main_step)


def queue_handoff(loops: int, peer_cpu: Optional[int] = None) -> int:
    """Hand-offs through two ``queue.Queue``s (put, get); each loop is two hand-offs."""
    to_peer: "queue.Queue[int]" = queue.Queue()
    to_main: "queue.Queue[int]" = queue.Queue()

    def peer_step() -> bool:
        try:
            to_main.put(to_peer.get(timeout=TIMEOUT))
        except queue.Empty:
            return False
        return True

    def main_step() -> bool:
        to_peer.put(1)
        try:
            to_main.get(timeout=TIMEOUT)
        except queue.Empty:
            return False
        return True

    return _two_threads(loops, peer_cpu, "queue", peer_step, main_step)


def thread_start_join(loops: int) -> int:
    """``threading.Thread(target=f).start()`` and ``.join()`` of a function that returns."""
    make = threading.Thread
    f = _noop
    for _ in range(min(50, _warm(loops))):
        t = make(target=f)
        t.start()
        t.join()
    t0 = perf_counter_ns()
    for _ in range(loops):
        t = make(target=f)
        t.start()
        t.join()
    return perf_counter_ns() - t0


# ---- processes --------------------------------------------------------------------------------

def fork_waitpid(loops: int) -> int:
    """``os.fork()`` of a child that ``os._exit(0)``s at once, and ``os.waitpid``."""
    failed = 0

    def one() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        return status != 0

    for _ in range(min(10, loops)):
        failed += one()
    t0 = perf_counter_ns()
    for _ in range(loops):
        failed += one()
    elapsed = perf_counter_ns() - t0
    if failed:
        raise WorkloadError(f"fork_waitpid: {failed} children did not exit 0")
    return elapsed


def mp_process(loops: int) -> int:
    """``multiprocessing.Process(target=f).start()`` and ``.join()`` with the fork start
    method (spawn and forkserver leave helper processes running)."""
    ctx = multiprocessing.get_context("fork")
    failed = []

    def one() -> None:
        p = ctx.Process(target=_noop)
        p.start()
        p.join(TIMEOUT)
        if p.exitcode != 0:
            failed.append(p.exitcode)
            if p.exitcode is None:
                p.kill()
                p.join()
        p.close()

    for _ in range(min(5, loops)):
        one()
    t0 = perf_counter_ns()
    for _ in range(loops):
        one()
    elapsed = perf_counter_ns() - t0
    if failed:
        raise WorkloadError(f"mp_process: children ended with exit codes {failed[:5]}")
    return elapsed
