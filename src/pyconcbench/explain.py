"""Numbers that explain themselves: what a server does per round trip, and what that means.

Once per implementation in a run (at 100 connections x 64 B over TCP when the run has it, else
at its first case), one extra, untimed round is traced after the measured ones: the server's
syscalls by name, its context switches and CPU migrations per round trip (``syscalls``: perf's
tracepoints, else strace).  ``findings`` turns those counts into short sentences -- the ones
that explain a striking rate -- which the terminal table, its "per round trip" block and the
report show beside the measured figures.  The measured rounds are never traced.

Pure functions of the counts: no process, no pytest (the tracing is ``echo.EchoRunner``'s).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

#: Calls that wait for readiness: one per loop iteration.
WAITS = ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6")
#: Calls that receive bytes.
READS = ("read", "readv", "recvfrom", "recvmsg", "recvmmsg")
#: A message of at most this size arrives in one read: more reads per round trip are reads that
#: found nothing (EAGAIN) before the wait.
ONE_READ_SIZE = 4096
EXTRA_READS_PER_MSG = 0.8
#: Counts per round trip at or above which a finding is worth a note in the table.
ALLOCATOR_PER_MSG = 0.5
SWITCHES_PER_MSG = 0.5
FUTEX_PER_MSG = 0.5
EPOLL_CTL_PER_MSG = 0.5
#: A loop waiting at least this often per round trip wakes for every message; at most the
#: other figure, it handles several per wake-up.
WAKE_EVERY = 0.8
WAKE_BATCH = 0.34


def _get(per: Dict[str, Any], name: str) -> float:
    value = per.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def top_calls(per: Dict[str, Any], n: int = 3) -> List[str]:
    """The ``n`` most frequent named syscalls per round trip: ['recvfrom 1.00', ...]."""
    named = [(k, _get(per, k)) for k in per if k not in ("total", "other", "context_switches", "cpu_migrations")]
    named = sorted((kv for kv in named if kv[1] > 0), key=lambda kv: -kv[1])[:n]
    return [f"{k} {v:.2f}" for k, v in named]


def findings(per: Dict[str, Any], size: Optional[int] = None) -> List[Dict[str, str]]:
    """What the counts per round trip say, each {"key", "text", "note"}: ``text`` the sentence
    for the report's block, ``note`` (may be '') its short form for the table's notes column,
    given only to what explains a rate (the allocator, thread wake-ups, locks)."""
    out: List[Dict[str, str]] = []
    total = _get(per, "total")
    if total:
        calls = top_calls(per)
        out.append({"key": "syscalls", "note": "",
                    "text": f"{total:.1f} syscalls per round trip" + (f" ({', '.join(calls)})" if calls else "")})
    mapped = _get(per, "mmap") + _get(per, "munmap") + _get(per, "mremap")
    if _get(per, "mmap") >= ALLOCATOR_PER_MSG or _get(per, "munmap") >= ALLOCATOR_PER_MSG:
        parts = ", ".join(f"{k} {_get(per, k):.2f}" for k in ("mmap", "munmap", "mremap") if _get(per, k))
        out.append({"key": "allocator",
                    "note": f"allocator maps each receive buffer ({parts} per round trip): try --pcb-malloc tuned",
                    "text": f"the allocator maps and unmaps a receive buffer per read ({parts} per round trip): glibc "
                            "serves blocks above its mmap threshold with mmap until the process frees one (see "
                            "--pcb-malloc: a server that has seen a client disconnect, or runs with "
                            "--pcb-malloc tuned, keeps them on the heap)"})
    elif mapped >= ALLOCATOR_PER_MSG:
        out.append({"key": "allocator", "note": f"{mapped:.2f} allocator mappings per round trip",
                    "text": f"{mapped:.2f} mmap/munmap/mremap calls per round trip"})
    switches = _get(per, "context_switches")
    if switches >= SWITCHES_PER_MSG:
        out.append({"key": "context_switches",
                    "note": f"{switches:.1f} context switches per round trip",
                    "text": f"{switches:.1f} context switches per round trip: a thread is put to sleep and woken "
                            "for messages (thread per connection, or threads handing off)"})
    futex = _get(per, "futex")
    if futex >= FUTEX_PER_MSG:
        out.append({"key": "futex", "note": f"futex {futex:.1f} per round trip",
                    "text": f"futex {futex:.1f} per round trip: threads wait on each other (the GIL or a lock)"})
    waits = sum(_get(per, k) for k in WAITS)
    if waits >= WAKE_EVERY:
        out.append({"key": "wakeups", "note": "",
                    "text": f"{waits:.2f} readiness waits per round trip: the loop wakes for every message"})
    elif 0 < waits <= WAKE_BATCH:
        out.append({"key": "wakeups", "note": "",
                    "text": f"{1 / waits:.1f} round trips per readiness wait: the loop handles several "
                            "connections per wake-up"})
    reads = sum(_get(per, k) for k in READS)
    if size is not None and size <= ONE_READ_SIZE and reads - 1 >= EXTRA_READS_PER_MSG:
        out.append({"key": "reads", "note": f"{reads:.1f} reads per round trip",
                    "text": f"{reads:.1f} reads per round trip for a message that arrives in one: a read that "
                            "finds nothing (EAGAIN) before each wait"})
    ctl = _get(per, "epoll_ctl")
    if ctl >= EPOLL_CTL_PER_MSG:
        out.append({"key": "epoll_ctl", "note": f"epoll_ctl {ctl:.1f} per round trip",
                    "text": f"epoll_ctl {ctl:.1f} per round trip: the loop changes its interest per message "
                            "(registers and unregisters a reader or writer)"})
    return out


def record(per: Dict[str, float], completed: int, tool: str, case_id: str,
           size: Optional[int] = None) -> Dict[str, Any]:
    """The saved ``explain`` record of one traced round: its counts per round trip
    (``syscalls.per_message``) and findings."""
    return {"tool": tool, "round_trips": completed, "case": case_id, "per_msg": per, "findings": findings(per, size),
            "note": f"one extra, untimed round of {completed} round trips traced with {tool} after the "
                    "measured ones"}


def unavailable(why: str, case_id: str) -> Dict[str, Any]:
    """The record when the round could not be traced."""
    return {"tool": None, "round_trips": 0, "case": case_id, "per_msg": {}, "findings": [], "note": why}

