"""Building the project's small Go programs once per source and toolchain.

A program is built into ``$XDG_CACHE_HOME/pyconcbench/<name>-<key>/<binary>`` (``~/.cache``
without XDG_CACHE_HOME), ``key`` hashing the source and the ``go`` binary, with a GOCACHE and
GOPATH of its own there (kept warm across builds).  Concurrent builds are safe: each builds in
a temporary directory and renames the result into place.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

BUILD_TIMEOUT = 300.0


class GoBuildError(RuntimeError):
    """The build failed or could not run: a compile error in the source, a toolchain or cache
    that does not work, a timeout, or 'go' not on PATH (which callers check first: that alone
    is their skip reason; everything else here is a failure).  The message is one line."""


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyconcbench")


def _all_cpus() -> None:
    """In the build process: every CPU, not just the one the caller may be pinned to (the
    kernel keeps the mask within the cgroup's cpuset)."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (OSError, ValueError):
        pass


def build(source: str, name: str, binary_name: str, timeout: float = BUILD_TIMEOUT) -> str:
    """Returns the path of the built program, building it first unless a build of this source
    with this Go toolchain is cached.  GoBuildError when it cannot."""
    go = shutil.which("go")
    if go is None:
        raise GoBuildError("'go' is not on PATH")
    try:
        with open(source, "rb") as f:
            code = f.read()
        real_go = os.path.realpath(go)
        st = os.stat(real_go)
    except OSError as exc:
        raise GoBuildError(str(exc)) from None
    key = hashlib.sha256(
        code + ("\0%s\0%d\0%d" % (real_go, st.st_size, st.st_mtime_ns)).encode()
    ).hexdigest()[:16]
    root = cache_root()
    target_dir = os.path.join(root, "%s-%s" % (name, key))
    binary = os.path.join(target_dir, binary_name)
    if os.access(binary, os.X_OK):
        return binary
    try:
        os.makedirs(target_dir, exist_ok=True)
        tmp_dir = tempfile.mkdtemp(prefix="build-", dir=target_dir)
    except OSError as exc:
        raise GoBuildError(str(exc)) from None
    env = dict(
        os.environ,
        GOCACHE=os.path.join(root, "go-build"),  # shared by every build, kept warm
        GOPATH=os.path.join(root, "gopath"),
        GOFLAGS="", GO111MODULE="", GOTOOLCHAIN="local", CGO_ENABLED="0",
    )
    try:
        result = subprocess.run(
            [go, "build", "-o", os.path.join(tmp_dir, binary_name), source],
            cwd=tmp_dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=timeout, preexec_fn=_all_cpus,
        )
        if result.returncode != 0:
            lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
            detail = "; ".join(line.strip() for line in lines[:3]) or "no output"
            raise GoBuildError("go build exited with code %d: %s" % (result.returncode, detail))
        os.replace(os.path.join(tmp_dir, binary_name), binary)  # atomic: concurrent builds are fine
    except subprocess.TimeoutExpired:
        raise GoBuildError("go build did not finish within %g s" % timeout) from None
    except OSError as exc:
        raise GoBuildError(str(exc)) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return binary
