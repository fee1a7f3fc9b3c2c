"""Echo server in Go (``peers/echo.go``): a net.Conn Read/Write loop per goroutine,
GOMAXPROCS=1, serving the socket serve.py bound.  See ``pyconcbench.servers.peers`` for the
start/serve/usage hooks: the CPU and memory measured are the Go process's.

The program is built once per source and toolchain into
``$XDG_CACHE_HOME/pyconcbench/go_net-<key>/echo`` (``~/.cache`` without XDG_CACHE_HOME), with
its own GOCACHE and GOPATH there.  A first build with a cold cache compiles part of the
standard library (~10 s on two CPUs): the harness runs it through the ``prepare`` hook before
it starts the server, so it does not count against the READY timeout;
``python -m pyconcbench.servers.go_net`` builds ahead too.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from pyconcbench.servers import MissingDependency, Stats
from pyconcbench.servers.peers import Peer, source

IMPL = "go_net"
SOURCE = source("echo.go")
BUILD_TIMEOUT = 300.0

_peer = Peer(IMPL)


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyconcbench")


def _unusable(why: str) -> MissingDependency:
    return MissingDependency("implementation %r cannot build its Go peer: %s" % (IMPL, why))


def build() -> str:
    """Returns the path of the built peer, building it first unless a build of this source
    with this Go toolchain is cached.  Raises MissingDependency (one line) when it cannot."""
    go = shutil.which("go")
    if go is None:
        raise MissingDependency("implementation %r needs 'go' on PATH (not found)" % IMPL)
    try:
        with open(SOURCE, "rb") as f:
            code = f.read()
        real_go = os.path.realpath(go)
        st = os.stat(real_go)
    except OSError as exc:
        raise _unusable(str(exc)) from None
    key = hashlib.sha256(
        code + ("\0%s\0%d\0%d" % (real_go, st.st_size, st.st_mtime_ns)).encode()
    ).hexdigest()[:16]
    root = cache_root()
    target_dir = os.path.join(root, "%s-%s" % (IMPL, key))
    binary = os.path.join(target_dir, "echo")
    if os.access(binary, os.X_OK):
        return binary
    try:
        os.makedirs(target_dir, exist_ok=True)
        tmp_dir = tempfile.mkdtemp(prefix="build-", dir=target_dir)
    except OSError as exc:
        raise _unusable(str(exc)) from None
    env = dict(
        os.environ,
        GOCACHE=os.path.join(root, "go-build"),  # shared by every build, kept warm
        GOPATH=os.path.join(root, "gopath"),
        GOFLAGS="", GO111MODULE="", GOTOOLCHAIN="local", CGO_ENABLED="0",
    )
    try:
        result = subprocess.run(
            [go, "build", "-o", os.path.join(tmp_dir, "echo"), SOURCE],
            cwd=tmp_dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT, preexec_fn=_unpin,
        )
        if result.returncode != 0:
            lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
            detail = "; ".join(line.strip() for line in lines[:3]) or "no output"
            raise _unusable("go build exited with code %d: %s" % (result.returncode, detail))
        os.replace(os.path.join(tmp_dir, "echo"), binary)  # atomic: concurrent builds are fine
    except subprocess.TimeoutExpired:
        raise _unusable("go build did not finish within %g s" % BUILD_TIMEOUT) from None
    except OSError as exc:
        raise _unusable(str(exc)) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return binary


def _unpin() -> None:
    """In the build process: every CPU allowed, not just the one serve is pinned to (the
    kernel keeps the mask within the cgroup's cpuset)."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (OSError, ValueError):
        pass


def prepare() -> None:
    build()


def start(sock, stats: Stats) -> int:
    return _peer.start([build()], sock, env={"GOMAXPROCS": "1"})


def serve(sock, stop_fd: int, stats: Stats) -> None:
    _peer.serve(stop_fd, stats)


def usage():
    return _peer.usage()


if __name__ == "__main__":
    try:
        print(build())
    except MissingDependency as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
