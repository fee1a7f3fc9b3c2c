"""Echo server with several asyncio event loops, one per OS thread, all accepting on the same
listening socket: the kernel gives each new connection to one of them, and that loop serves it
with asyncio_protocol's Protocol callbacks.  The model a server reaches for to use more than one
CPU without processes -- which only pays where threads run in parallel, on a free-threaded
CPython (3.13t+); with the GIL the loops take turns.

``LOOPS`` loops: one per CPU this process may run on, at least two (so the model is exercised,
contention included, on a server pinned to one CPU); ``PCB_LOOPS`` in the environment sets it.
Each loop accepts on its own duplicate of the socket (one accept queue, one descriptor per
loop, so closing one loop's server cannot pull the socket from under another), counts into its
own Stats, and the totals are added when every loop has stopped: nothing is shared between
loops on the hot path, so nothing needs a lock.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Callable, List, Optional

from pyconcbench.servers import Stats, asyncio_protocol

LOOPS_ENV = "PCB_LOOPS"


def loops() -> int:
    """How many loops to run: PCB_LOOPS, else one per allowed CPU, at least 2."""
    text = os.environ.get(LOOPS_ENV, "").strip()
    if text:
        if not text.isdigit() or not 1 <= int(text) <= 256:
            raise ValueError(f"{LOOPS_ENV}={text!r}: must be a whole number of loops in 1 .. 256")
        return int(text)
    return max(2, len(os.sched_getaffinity(0)))


def serve_loops(sock: socket.socket, stop_fd: int, stats: Stats,
                loop_factory: Optional[Callable] = None) -> None:
    """Runs ``loops()`` event loops from ``loop_factory`` (asyncio's default loop when None),
    each in its own thread on a duplicate of ``sock``, until stop_fd is readable."""
    n = loops()
    counts = [Stats() for _ in range(n)]
    failures: List[BaseException] = []

    def one_loop(i: int, listener: socket.socket) -> None:
        try:
            with listener:
                asyncio_protocol.run(asyncio_protocol.serve_async(listener, stop_fd, counts[i]), loop_factory)
        except BaseException as exc:  # the thread's own error, re-raised by serve_loops
            failures.append(exc)

    listeners: List[socket.socket] = []
    try:
        for _ in range(n):
            listeners.append(sock.dup())
    except OSError:  # EMFILE: none of them may leak
        for listener in listeners:
            listener.close()
        raise
    threads = [threading.Thread(target=one_loop, args=(i, listener), name=f"loop-{i}", daemon=True)
               for i, listener in enumerate(listeners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in counts:
        stats.accepted += c.accepted
        stats.bytes += c.bytes
        stats.errors += c.errors
    if failures:
        raise failures[0]


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    serve_loops(sock, stop_fd, stats)
