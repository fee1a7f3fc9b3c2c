"""Echo server in Go (``peers/echo.go``): a net.Conn Read/Write loop per goroutine,
GOMAXPROCS=1, serving the socket serve.py bound.  See ``pyconcbench.servers.peers`` for the
start/serve/usage hooks: the CPU and memory measured are the Go process's.

The program is built once per source and toolchain into
``$XDG_CACHE_HOME/pyconcbench/go_net-<key>/echo`` (``~/.cache`` without XDG_CACHE_HOME), with
its own GOCACHE and GOPATH there.  A first build with a cold cache compiles part of the
standard library (~10 s on two CPUs): the harness runs it through the ``prepare`` hook before
it starts the server, so it does not count against the READY timeout;
``python -m pyconcbench.servers.go_net`` builds ahead too.

Only ``go`` missing from PATH is a skip (MissingDependency).  With ``go`` there, a build that
fails -- a compile error in ``echo.go``, a toolchain or cache that does not work -- is
``Broken``: a failure in one line (``pyconcbench.serve`` exits with code 4), never a skip.
"""
from __future__ import annotations

import shutil
import sys

from pyconcbench import gobuild
from pyconcbench.servers import Broken, MissingDependency, Stats
from pyconcbench.servers.peers import Peer, source

IMPL = "go_net"
SOURCE = source("echo.go")
BUILD_TIMEOUT = 300.0

_peer = Peer(IMPL)


def build() -> str:
    """Returns the path of the built peer, building it first unless a build of this source
    with this Go toolchain is cached.  Raises MissingDependency when 'go' is not on PATH, Broken
    when the build fails (one line each)."""
    if shutil.which("go") is None:  # decided before any of our Go code is built
        raise MissingDependency("implementation %r needs 'go' on PATH (not found)" % IMPL)
    try:
        return gobuild.build(SOURCE, IMPL, "echo", BUILD_TIMEOUT)
    except gobuild.GoBuildError as exc:
        raise Broken("implementation %r cannot build its Go peer: %s" % (IMPL, exc)) from None


def prepare() -> None:
    build()


def start(sock, stats: Stats) -> int:
    return _peer.start([build()], sock, env={"GOMAXPROCS": "1"})


def serve(sock, stop_fd: int, stats: Stats) -> None:
    _peer.serve(stop_fd, stats)


def usage():
    return _peer.usage()


if __name__ == "__main__":
    from pyconcbench.procs import EXIT_BROKEN, EXIT_MISSING

    try:
        print(build())
    except MissingDependency as exc:
        print(exc, file=sys.stderr)
        sys.exit(EXIT_MISSING)
    except Broken as exc:
        print(exc, file=sys.stderr)
        sys.exit(EXIT_BROKEN)
