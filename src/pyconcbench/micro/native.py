"""The native baselines of the switch microbenchmarks: ``pyconcbench._native.micro_run``.

The loops are timed inside C (``CLOCK_MONOTONIC``), in a driver thread pinned to ``cpu_a``,
with the GIL released; see ``native/pcb_micro.h`` for each case and what one op is.
"""
from __future__ import annotations

from typing import Dict, Optional

from .. import _native

#: Seconds one native run may take before it is aborted (TimeoutError).
TIMEOUT = 120.0


def cases() -> Dict[str, Dict[str, bool]]:
    """name -> {'two_party': bool, 'threaded': bool}."""
    return _native.micro_cases()


def run(case: str, loops: int, threads: int = 1, cpu_a: Optional[int] = None,
        cpu_b: Optional[int] = None, timeout: float = TIMEOUT) -> Dict[str, int]:
    """One native run: {'ops', 'elapsed_ns', 'empty_ns', 'check', ...} (see micro_run)."""
    return _native.micro_run(case, loops, threads,
                             -1 if cpu_a is None else cpu_a, -1 if cpu_b is None else cpu_b,
                             timeout)
