"""Echo server in Node.js (``peers/echo.js``): net.createServer, one process, no cluster,
serving the socket serve.py bound.  See ``pyconcbench.servers.peers`` for the start/serve/usage
hooks: the CPU and memory measured are the Node process's."""
from __future__ import annotations

import shutil

from pyconcbench.servers import BACKLOG, MissingDependency, Stats
from pyconcbench.servers.peers import Peer, source

IMPL = "node_net"
SOURCE = source("echo.js")

_peer = Peer(IMPL)


def start(sock, stats: Stats) -> int:
    node = shutil.which("node")
    if node is None:
        raise MissingDependency("implementation %r needs 'node' on PATH (not found)" % IMPL)
    # Node calls listen() again on the descriptor: with BACKLOG, not its default of 511.
    return _peer.start([node, SOURCE, str(BACKLOG)], sock)


def serve(sock, stop_fd: int, stats: Stats) -> None:
    _peer.serve(stop_fd, stats)


def usage():
    return _peer.usage()
