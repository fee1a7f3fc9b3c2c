"""The Go baselines of the switch microbenchmarks: ``go/switch.go``, built once, run per round.

The program is built once per source and toolchain into
``$XDG_CACHE_HOME/pyconcbench/micro_go-<key>/switch`` (``~/.cache`` without XDG_CACHE_HOME),
with its own GOCACHE and GOPATH there, as the ``go_net`` echo peer is.  Each round runs it once,
pinned to one CPU with ``GOMAXPROCS=1`` (the default of the Go the study used, 1.3): it times
the case inside Go and prints one JSON line.  ``python -m pyconcbench.micro.golang`` builds it
ahead.

Only ``go`` missing from PATH is a skip (GoUnavailable).  With ``go`` there, a build that fails
-- a compile error in ``switch.go``, a toolchain or cache that does not work -- is ``Broken``:
a failure in one line, never a skip.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional

from pyconcbench import gobuild
from pyconcbench.broken import Broken

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go", "switch.go")
BUILD_TIMEOUT = 300.0
#: Seconds one run may take before it is killed.
RUN_TIMEOUT = 120.0


class GoUnavailable(RuntimeError):
    """'go' is not on PATH: the Go cases' one skip reason (one line)."""


def build() -> str:
    """Returns the path of the built program, building it first unless a build of this source
    with this Go toolchain is cached.  Raises GoUnavailable when 'go' is not on PATH, Broken
    when the build fails (one line each)."""
    if shutil.which("go") is None:  # decided before any of our Go code is built
        raise GoUnavailable("the Go baselines need 'go' on PATH (not found)")
    try:
        return gobuild.build(SOURCE, "micro_go", "switch", BUILD_TIMEOUT)
    except gobuild.GoBuildError as exc:
        raise Broken(f"cannot build the Go baselines: {exc}") from None


def run(case: str, loops: int, goroutines: int = 1, cpu: Optional[int] = None,
        timeout: float = RUN_TIMEOUT) -> Dict[str, Any]:
    """Runs one case once; returns its JSON report ({'ops', 'elapsed_ns', 'empty_ns',
    'check', 'gomaxprocs', 'go', ...}).  RuntimeError when the program fails or times out
    (it is killed and reaped), or does not build (Broken, a RuntimeError)."""
    binary = build()

    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    try:
        proc = subprocess.run(
            [binary, case, str(loops), str(goroutines)],
            env=dict(os.environ, GOMAXPROCS="1"),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            timeout=timeout, preexec_fn=setup,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"go {case}: did not finish within {timeout:g} s (killed)") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"go {case}: exited with code {proc.returncode}: "
                           f"{'; '.join(err[:3]) or 'no output'}")
    try:
        report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        if not isinstance(report, dict) or report.get("case") != case:
            raise ValueError("not this case's report")
    except (ValueError, IndexError) as exc:
        raise RuntimeError(f"go {case}: no usable report ({exc}): {proc.stdout[-300:]!r}") from None
    return report


if __name__ == "__main__":
    try:
        print(build())
    except GoUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    except Broken as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
