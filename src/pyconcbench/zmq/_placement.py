"""Where a ZeroMQ session's threads run: the placements, and every thread read back from /proc.

A thread's CPU affinity is inherited by the threads it creates (and by a child process), so a
session pins the calling thread *before* the workload starts: libzmq's I/O and reaper threads
(started with a context's first socket), an in-process server thread and the server process
all start on that CPU.  Contexts the package creates also carry libzmq's own
``ZMQ_THREAD_AFFINITY_CPU_ADD`` for their I/O threads.  What counts is the read-back here:
``/proc/PID/task/TID/status`` (``Cpus_allowed_list``) and ``/proc/PID/task/TID/comm`` (libzmq
names its threads ``ZMQbg/IO/0``, ``ZMQbg/Reaper``; a thread that has just started may still
carry its creator's name for a moment).

Placements (``Session(placement=...)``, with ``cpus`` = (server CPU, client CPU)):

- ``1cpu`` (the default): every thread of the measurement on the client CPU -- the client
  thread, the server (the same thread, its own thread, or its process and that process's
  threads), every libzmq I/O and reaper thread (like the switch suite's ``-1cpu``);
- ``2cpu``: the client thread on the client CPU, everything else on the server CPU, so every
  request crosses CPUs (the cost of a cross-CPU wake-up, which on a VM can dominate).

Imports neither pyzmq nor aiozmq.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Set

PLACEMENTS = ("1cpu", "2cpu")
DEFAULT_PLACEMENT = "1cpu"

@dataclass(frozen=True)
class Task:
    """One thread of a process as /proc shows it."""

    pid: int
    tid: int
    name: str
    cpus: FrozenSet[int]


def parse_cpu_list(text: str) -> FrozenSet[int]:
    """``Cpus_allowed_list`` text (``0-2,5``) -> {0, 1, 2, 5}."""
    out: Set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def format_cpus(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _pid(pid: Optional[int]) -> int:
    return os.getpid() if pid is None else pid


def tids(pid: Optional[int] = None) -> Set[int]:
    """The ids of the process's threads now (None: this process)."""
    try:
        return {int(t) for t in os.listdir("/proc/%d/task" % _pid(pid))}
    except OSError:
        return set()


def read_task(pid: int, tid: int) -> Optional[Task]:
    """One thread's name and allowed CPUs, or None if it has exited."""
    base = "/proc/%d/task/%d/" % (pid, tid)
    try:
        with open(base + "comm") as f:
            name = f.read().rstrip("\n")
        with open(base + "status") as f:
            status = f.read()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return Task(pid, tid, name, parse_cpu_list(line.split(":", 1)[1]))
    return None


def tasks(pid: Optional[int] = None) -> List[Task]:
    """Every thread of the process (None: this one), by thread id; threads that exit while
    they are read are left out."""
    pid = _pid(pid)
    out = []
    for tid in sorted(tids(pid)):
        task = read_task(pid, tid)
        if task is not None:
            out.append(task)
    return out


def pin(tid: int, cpu: int) -> bool:
    """Pins one thread (of any process this user owns) to ``cpu``; False if it has exited."""
    try:
        os.sched_setaffinity(tid, {cpu})
    except ProcessLookupError:
        return False
    return True
