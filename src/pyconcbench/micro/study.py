"""The context-switch study's figures, for the switch microbenchmarks to be compared with.

The context-switch study (2014: Pentium G2030 at 3 GHz, two cores, Debian jessie, Linux 3.16,
Python 2.7 and 3, Go 1.3) timed whole programs with ``time``; its figures are converted here to
this suite's operations (a round trip is two swapcontext calls, for example).  Where the
study gives only a plot (the sched_yield, mutex, Gosched and channel curves, the yield-from
depth sweep) the figure is read off its text, or left out.

fork is compared like with like only: the study forked a small C program, and fork's cost
grows with the forking process's memory, so only the rows that fork from a small helper
process (``-small_c``, the same setting; ``-small_py``, a fresh ~9 MiB Python) carry the
study's ``s_fork``; the rows that fork the measuring (pytest) process get a note instead
(``NOT_COMPARED``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

#: (test, case id) -> (ns per op, where it comes from)
STUDY: Dict[Tuple[str, str], Tuple[float, str]] = {
    ("switch", "native-call"): (2.34, "s_call: 2.34 ns per call"),
    ("switch", "native-syscall_getpid"): (49.47, "s_syscall: 49.47 ns per getpid"),
    ("switch", "native-setjmp_longjmp"): (5.715, "s_jmp: 5.7 ns per setjmp+longjmp, on one stack"),
    ("switch", "native-swapcontext"): (334.6, "s_context: 167.3 ns per swapcontext, two per round trip"),
    ("switch", "native-sched_yield-t100"): (
        398.2, "t_sleep: 1315 ns per usleep(0) at 100 threads is '916.8 ns more than the same pure "
               "scheduling' (t_yield)"),
    ("switch", "native-usleep0-t1"): (54740.0, "t_sleep: 54.74 us per usleep(0), one thread"),
    ("switch", "native-usleep0-t100"): (1315.0, "t_sleep: 1315 ns per usleep(0), 100 threads"),
    ("create", "native-pthread_create_join"): (9530.0, "t_thread: 9530 ns per thread create + exit"),
    ("create", "native-fork_waitpid-small_c"): (
        50980.0, "s_fork: 51 us per fork + exit + wait (46.7 us child first), from a small C "
                 "program; like for like: here too a small C program of its own"),
    ("create", "native-fork_waitpid-small_py"): (
        50980.0, "s_fork (a small C program): 51 us; here the same C loop in a fresh "
                 "`python -I -S` process, several times the C program's resident size"),
    ("create", "python-fork_waitpid-small_py"): (
        50980.0, "s_fork (a small C program): 51 us; here os.fork() in a fresh `python -I -S` "
                 "process"),
    ("switch", "python-empty_loop"): (63.2, "py_yield_from: 63.2 ns per loop iteration on py3 (54 on py2)"),
    ("switch", "python-generator_next"): (25.1, "py_yield_from: +25.1 ns per yield on py3 (+22 on py2)"),
    ("depth", "yield_from-d1"): (50.5, "py_yield_from: +50.5 ns per yield from, one level, py3"),
    ("switch", "python-greenlet_pingpong"): (481.0, "py_greenlet: +481 ns per switch-and-back loop (py2)"),
    ("create", "go-goroutine"): (568.0, "g_goroutine: 568 ns per go f() (not waited for)"),
    ("handoff", "go-chan_pingpong"): (65.0, "g_chan: 60-70 ns, flat over concurrency"),
    ("handoff", "go-mutex_handoff"): (
        30.0, "g_lock: ~30 ns per lock/unlock with n goroutines (not a hand-off)"),
    ("switch", "go-gosched-g16384"): (250.0, "g_sched: ~250 ns at 16K goroutines"),
}

#: (test, case id) -> why the study's figure for the same operation is not compared.
NOT_COMPARED: Dict[Tuple[str, str], str] = {
    ("create", "native-fork_waitpid"): (
        "not compared with s_fork (51 us): this forks the measuring process (pytest, ~50 MiB "
        "resident), the study a small C program; see native-fork_waitpid-small_c"),
    ("create", "python-fork_waitpid"): (
        "not compared with s_fork (51 us): this forks the measuring process (pytest, ~50 MiB "
        "resident), the study a small C program; see python-fork_waitpid-small_py"),
}

def study_figure(case: Any) -> Optional[Tuple[float, str]]:
    """The study's ns/op for a Case, when it gives one."""
    return STUDY.get((case.test, case.id))


def not_compared_note(case: Any) -> Optional[str]:
    """Why a Case has no study ratio although the study timed the same operation, or None."""
    return NOT_COMPARED.get((case.test, case.id))
