"""fork timed from a small process of its own, as the context-switch study did.

``fork()`` copies the page-table entries of every page the caller has written (write-protecting
each for copy-on-write), and the child's exit frees them again: the cost grows with the
caller's resident memory (on the 2-vCPU VM this was written on, the same C loop took ~135 us
from a 1.4 MiB process and ~1.3 ms from a 48 MiB pytest).  Timed in the pytest process it
measures pytest as much as fork, so the study's
``s_fork`` (51 us, a small C program) is compared only with forks made by a small helper
process started for the purpose:

``c``
    ``pcb_forkloop`` (``native/helpers/pcb_forkloop.c``), a C program of its own built by
    setup.py beside the extension: libc only, about 1.5 MiB resident, like the study's.
``python``
    ``python -I -S forkloop.py ...``: a fresh interpreter (no site, no pytest, nothing but the
    modules it starts with and ``os``, about 9 MiB resident) running the ``os.fork()`` loop
    (a python case) or the extension's C loop, the extension loaded from its file (a native
    case).

Each round starts one helper, pinned to the measuring CPU (its children inherit it), which
times its loop inside and prints one JSON line with the figures and its own resident size,
page-table size and number of mappings, read just before the timed loop.  A helper is bounded
in time (killed and reaped on timeout, error or interrupt), dies with the thread that started
it (``PR_SET_PDEATHSIG``), and any failure is a RuntimeError of one line.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional

from .. import _native, procs

#: Seconds one helper run may take before it is killed.
RUN_TIMEOUT = 120.0
PROGRAM = "pcb_forkloop"
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkloop.py")
#: The integer fields every helper's report holds.
FIELDS = ("ops", "elapsed_ns", "empty_ns", "check", "waited_ns", "rss_kib", "vm_kib",
          "pte_kib", "maps")
KINDS = ("c", "python")



def program() -> str:
    """Where setup.py puts pcb_forkloop: beside the extension."""
    return os.path.join(os.path.dirname(os.path.abspath(_native.__file__)), PROGRAM)


def unavailable(kind: str) -> Optional[str]:
    """Why helper ``kind`` cannot run here (one line), or None."""
    if kind not in KINDS:
        return f"unknown small-process helper {kind!r} (one of {', '.join(KINDS)})"
    if kind == "c":
        path = program()
        if not os.access(path, os.X_OK):
            return (f"{PROGRAM} is not built ({path} missing): rebuild the extension, "
                    f"`pip install -e .` or `make install`")
    elif not sys.executable or not os.access(sys.executable, os.X_OK):
        return "no Python executable to start (sys.executable is empty)"
    return None


def command(kind: str, family: str, loops: int) -> List[str]:
    """The helper's argv: pcb_forkloop N, or python -I -S forkloop.py python|native N [EXT]."""
    if kind == "c":
        if family != "native":
            raise ValueError(f"the C helper runs native cases only, not {family!r}")
        return [program(), str(loops)]
    if family == "python":
        return [sys.executable, "-I", "-S", SCRIPT, "python", str(loops)]
    if family == "native":
        return [sys.executable, "-I", "-S", SCRIPT, "native", str(loops),
                os.path.abspath(_native.__file__)]
    raise ValueError(f"no small-process helper for family {family!r}")


def describe(kind: str, family: str) -> str:
    """What the forking process is, for extra_info and the table."""
    if kind == "c":
        return f"{PROGRAM}: a fresh C program of its own (libc only), as in the study"
    what = "os.fork() loop" if family == "python" else "extension's C loop"
    return (f"a fresh `python -I -S` process running the {what} (no site, no pytest; "
            f"{os.path.basename(SCRIPT)})")


def _label(argv: List[str]) -> str:
    if argv[0].endswith(PROGRAM):
        return PROGRAM
    return f"python -I -S {os.path.basename(SCRIPT)} {argv[4]}"


def run(kind: str, family: str, loops: int, cpu: Optional[int] = None,
        timeout: float = RUN_TIMEOUT) -> Dict[str, Any]:
    """Runs one helper once; returns its report (``FIELDS`` as ints, and ``case``).
    RuntimeError (one line) when it cannot start, fails, prints no usable report or does not
    finish within ``timeout`` seconds; the helper is killed and reaped in every case."""
    why = unavailable(kind)
    if why is not None:
        raise RuntimeError(why)
    argv = command(kind, family, loops)
    label = _label(argv)
    child = procs.Child(argv, cpu=cpu, death_signal=signal.SIGKILL)
    try:
        child.start()
    except procs.ChildError as exc:
        raise RuntimeError(f"{label}: cannot start: {exc}") from None
    try:  # on a timeout, an error or an interrupt: never leave it running
        code = child.run_to_end(timeout)
        err = child.stderr_text()
    finally:
        child.close()
    if code is None:
        raise RuntimeError(f"{label}: did not finish within {timeout:g} s (killed)")
    out = child.out
    if code != 0:
        lines = [line.strip() for line in err.splitlines()]
        detail = "; ".join(line for line in lines[-3:] if line) or "no output"
        how = f"was {procs.meaning(code)}" if code < 0 else f"exited with code {code}"
        raise RuntimeError(f"{label}: {how}: {detail}")
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
        if not isinstance(report, dict) or report.get("case") != "fork_waitpid":
            raise ValueError("not a fork_waitpid report")
        for key in FIELDS:
            report[key] = int(report[key])
    except (ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise RuntimeError(f"{label}: no usable report ({type(exc).__name__}: {exc}): "
                           f"{out[-200:]!r}") from None
    return report
