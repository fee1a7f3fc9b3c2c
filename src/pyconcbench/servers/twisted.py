"""Echo server on Twisted: a Protocol whose dataReceived writes back to its transport, on the
default reactor (epoll on Linux).  Each protocol is registered as its transport's streaming
producer: when the transport's write buffer passes its bufferSize (64 KiB) Twisted pauses it,
and the protocol stops reading from the socket until the buffer drains, so a client that does
not read cannot make the server buffer without bound.

``twisted_epoll`` runs the same code on the epoll reactor, installed explicitly.  A reactor
runs once per process, so ``serve`` can be called once.
"""
from __future__ import annotations

import os
import socket

from twisted.internet import error
from twisted.internet.interfaces import IPushProducer, IReadDescriptor
from twisted.internet.protocol import Factory, Protocol
from zope.interface import implementer

from pyconcbench.servers import BACKLOG, Stats

# How a connection may end without it counting as an error: EOF, a reset or broken pipe from
# the client (Twisted reports every read error as ConnectionLost), or our own abort at stop.
_CLEAN_ENDS = (error.ConnectionDone, error.ConnectionLost, error.ConnectionAborted)


@implementer(IPushProducer)
class EchoProtocol(Protocol):
    def __init__(self, server: "EchoFactory") -> None:
        self.server = server

    def connectionMade(self) -> None:
        self.server.stats.accepted += 1
        if self.server.closing:
            self.transport.abortConnection()
            return
        self.server.connections.add(self)
        if self.server.is_tcp:
            self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        self.server.stats.bytes += len(data)
        self.transport.write(data)

    def connectionLost(self, reason) -> None:
        self.server.connections.discard(self)
        if not reason.check(*_CLEAN_ENDS):
            self.server.stats.errors += 1

    # IPushProducer: the transport calls these as its write buffer fills and drains.
    def pauseProducing(self) -> None:
        self.transport.pauseProducing()  # stops reading

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        pass


class EchoFactory(Factory):
    noisy = False  # no log line per start and stop

    def __init__(self, stats: Stats, is_tcp: bool) -> None:
        self.stats = stats
        self.is_tcp = is_tcp
        self.connections: set = set()
        self.closing = False

    def buildProtocol(self, addr) -> EchoProtocol:
        return EchoProtocol(self)


@implementer(IReadDescriptor)
class StopReader:
    """Stops the server once ``fd`` is readable (without reading it)."""

    def __init__(self, fd: int, on_stop) -> None:
        self.fd = fd
        self.on_stop = on_stop

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> None:
        self.on_stop()

    def connectionLost(self, reason) -> None:
        pass

    def logPrefix(self) -> str:
        return "pyconcbench-stop"


def serve_on(reactor, sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    """Serves ``sock`` on ``reactor`` (not yet running) until stop_fd is readable."""
    is_tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    factory = EchoFactory(stats, is_tcp)
    sock.setblocking(False)  # adoptStreamPort requires it
    path = sock.getsockname() if not is_tcp else None
    mode = _mode(path)
    # Twisted works on a dup of the descriptor.  On UNIX sockets it calls listen(50) on it and
    # makes the socket file world-writable: restore both.
    port = reactor.adoptStreamPort(sock.fileno(), sock.family, factory)
    sock.listen(BACKLOG)
    if mode is not None:
        os.chmod(path, mode)

    def stop() -> None:
        reactor.removeReader(reader)
        factory.closing = True
        port.stopListening()
        for protocol in list(factory.connections):
            protocol.transport.abortConnection()
        reactor.stop()

    reader = StopReader(stop_fd, stop)
    reactor.addReader(reader)
    reactor.run(installSignalHandlers=False)  # serve.py's handlers stay in place


def _mode(path):
    if not path or not isinstance(path, str) or path.startswith("\0"):
        return None
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return None


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    from twisted.internet import reactor  # installs the default reactor on first import

    serve_on(reactor, sock, stop_fd, stats)
