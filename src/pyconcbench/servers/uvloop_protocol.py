"""asyncio_protocol's echo server (Protocol callbacks, no coroutine per connection), the
same code, on a uvloop event loop (libuv) instead of asyncio's default loop."""
from __future__ import annotations

import socket

import uvloop

from pyconcbench.servers import Stats, asyncio_protocol
from pyconcbench.servers.asyncio_protocol import run


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(asyncio_protocol.serve_async(sock, stop_fd, stats), loop_factory=uvloop.new_event_loop)
