"""Echo server on asyncio's Protocol/Transport callbacks: no coroutine per connection."""
from __future__ import annotations

import asyncio
import socket
from typing import Awaitable, Callable

from pyconcbench.servers import BACKLOG, Stats

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


class EchoProtocol(asyncio.Protocol):
    """Writes back whatever it receives.  While the transport's write buffer is above its
    high-water mark, reading is paused, so a client that does not read cannot make the server
    buffer without bound."""

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

    def data_received(self, data: bytes) -> None:
        self._transport.write(data)
        self._stats.bytes += len(data)

    def eof_received(self) -> bool:
        return False  # close once the pending echo is flushed

    def pause_writing(self) -> None:
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._transport.resume_reading()


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


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    """Serves on the running loop (any asyncio loop, uvloop included) until stop_fd is readable."""
    loop = asyncio.get_running_loop()
    connections = Connections()

    def factory() -> EchoProtocol:
        return EchoProtocol(stats, connections)

    if sock.family == socket.AF_UNIX:
        server = await loop.create_unix_server(factory, sock=sock, backlog=BACKLOG)
    else:
        server = await loop.create_server(factory, sock=sock, backlog=BACKLOG)
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


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    asyncio.run(serve_async(sock, stop_fd, stats))
