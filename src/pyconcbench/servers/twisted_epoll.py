"""Echo server on Twisted's epoll reactor, installed explicitly: the same Protocol as
``twisted`` (which runs on whatever reactor Twisted picks by default)."""
from __future__ import annotations

import socket
import sys

from pyconcbench.servers import Stats
from pyconcbench.servers.twisted import serve_on


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    from twisted.internet import epollreactor

    # The reactor is chosen by the first import of twisted.internet.reactor; serve.py runs one
    # implementation per process, so normally none is installed yet.
    if "twisted.internet.reactor" not in sys.modules:
        epollreactor.install()
    from twisted.internet import reactor

    if not isinstance(reactor, epollreactor.EPollReactor):
        raise RuntimeError("another Twisted reactor is already installed: %s"
                           % type(reactor).__name__)
    serve_on(reactor, sock, stop_fd, stats)
