"""Echo server on asyncio's BufferedProtocol: the transport reads straight into one
preallocated buffer per connection (no bytes object per read), and the echo is written from it.

transport.write() may keep a reference to the memoryview it is given when it cannot send it all
at once (3.12+ queues the view itself, uvloop hands it to libuv), and the next read would then
overwrite bytes not yet sent.  So the echo is written without a copy, and whenever the transport
is left holding unsent data afterwards, the connection reads into a new buffer from then on.
"""
from __future__ import annotations

import asyncio
import socket

from pyconcbench.servers import Stats
from pyconcbench.servers.asyncio_protocol import Connections, EchoBase, run
from pyconcbench.servers.asyncio_protocol import serve_async as _serve_protocol

BUFFER_SIZE = 65536  # one read's worth, as the other servers read; RSS grows by this per connection


class EchoBufferedProtocol(EchoBase, asyncio.BufferedProtocol):
    """Echoes from its own buffer; pauses reading while the write buffer is above the
    high-water mark, as EchoProtocol does."""

    def __init__(self, stats: Stats, connections: Connections) -> None:
        super().__init__(stats, connections)
        self._view = memoryview(bytearray(BUFFER_SIZE))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self._stats.bytes += nbytes
        transport = self._transport
        transport.write(self._view[:nbytes])
        if transport.get_write_buffer_size():
            # The transport may still read the old buffer: leave it to it.
            self._view = memoryview(bytearray(BUFFER_SIZE))


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    """Serves on the running loop (any asyncio loop, uvloop included) until stop_fd is readable."""
    await _serve_protocol(sock, stop_fd, stats, EchoBufferedProtocol)


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(serve_async(sock, stop_fd, stats))
