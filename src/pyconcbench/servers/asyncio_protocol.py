"""Echo server on asyncio's Protocol/Transport callbacks: no coroutine per connection.

Also the pieces the other asyncio and uvloop servers share: the shutdown helpers and ``run``,
which runs a server coroutine on asyncio's default loop or on one a factory makes (uvloop).
"""
from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, Awaitable, Callable, Coroutine, Optional

from pyconcbench import servers
from pyconcbench.servers import Stats

# Bounds the wait for connections to finish closing at shutdown (asyncio.Server.wait_closed
# waits for every connection on 3.12+).
CLOSE_TIMEOUT = 2.0
# Loop iterations a connection accepted just before Server.close() needs to reach
# connection_made (asyncio accepts in a task: make the transport, then connection_made).
SETTLE_ITERATIONS = 8


class Connections:
    """A server's live transports.  Once closing, a connection that arrives is aborted at once,
    so none outlives the server, not even one accepted while it was being closed."""

    def __init__(self) -> None:
        self.transports: set = set()
        self.closing = False

    def add(self, transport) -> None:
        if self.closing:
            transport.abort()
        else:
            self.transports.add(transport)

    def discard(self, transport) -> None:
        self.transports.discard(transport)

    async def abort_all(self) -> None:
        self.closing = True
        for _ in range(SETTLE_ITERATIONS):
            for transport in list(self.transports):
                transport.abort()
            await asyncio.sleep(0)  # lets connection_lost callbacks and late accepts run


class EchoBase:
    """What every echo protocol does besides echoing: count, track its transport, and pause
    reading while the transport's write buffer is above its high-water mark, so a client that
    does not read cannot make the server buffer without bound."""

    def __init__(self, stats: Stats, connections: Connections) -> None:
        self._stats = stats
        self._connections = connections
        self._transport = None

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._stats.accepted += 1
        self._connections.add(transport)

    def connection_lost(self, exc) -> None:
        self._connections.discard(self._transport)
        if exc is not None and not isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            self._stats.errors += 1

    def eof_received(self) -> bool:
        return False  # close once the pending echo is flushed

    def pause_writing(self) -> None:
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._transport.resume_reading()


class EchoProtocol(EchoBase, asyncio.Protocol):
    """Writes back whatever it receives."""

    def data_received(self, data: bytes) -> None:
        self._stats.bytes += len(data)
        self._transport.write(data)


async def wait_readable(fd: int) -> None:
    """Returns once ``fd`` is readable, without reading it."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class SlowEchoProtocol(EchoProtocol):
    """EchoProtocol plus the test-only slowdown (``servers.SLOWDOWN_ENV``) per chunk received."""

    slowdown_ns = 0

    def data_received(self, data: bytes) -> None:
        servers.spin(self.slowdown_ns)
        super().data_received(data)


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats,
                      protocol: Callable[[Stats, Connections], EchoBase] = EchoProtocol) -> None:
    """Serves on the running loop (any asyncio loop, uvloop included) until stop_fd is readable,
    one ``protocol(stats, connections)`` per connection."""
    loop = asyncio.get_running_loop()
    connections = Connections()
    slow = servers.slowdown_ns()
    if slow and protocol is EchoProtocol:
        SlowEchoProtocol.slowdown_ns = slow
        protocol = SlowEchoProtocol

    def factory() -> EchoBase:
        return protocol(stats, connections)

    if sock.family == socket.AF_UNIX:
        server = await loop.create_unix_server(factory, sock=sock, backlog=servers.asyncio_backlog())
    else:
        server = await loop.create_server(factory, sock=sock, backlog=servers.asyncio_backlog())
    await serve_until_stopped(server, stop_fd, connections.abort_all)


async def serve_until_stopped(server: asyncio.AbstractServer, stop_fd: int,
                              close_connections: Callable[[], Awaitable[None]]) -> None:
    """Waits for stop_fd, then closes the server and its connections (bounded)."""
    try:
        await wait_readable(stop_fd)
    finally:
        server.close()
        await close_connections()
        try:
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT)
        except asyncio.TimeoutError:
            pass


def run(main: Coroutine[Any, Any, None],
        loop_factory: Optional[Callable[[], asyncio.AbstractEventLoop]] = None) -> None:
    """Runs ``main`` to completion as asyncio.run does, on a new loop from ``loop_factory``
    (asyncio's default loop when None), then cancels what is left and closes the loop."""
    if loop_factory is None:
        asyncio.run(main)
    elif sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(main)
    else:
        loop = loop_factory()
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(main)
        finally:
            try:
                _cancel_all_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(serve_async(sock, stop_fd, stats))
