"""asyncio_streams' echo server (StreamReader/StreamWriter, one task per connection), the
same code, on an rloop event loop (written in Rust) instead of asyncio's default loop.  Over a
UNIX socket it needs an rloop that serves them, and its loop is given serve's signal handlers
(see rloop_protocol)."""
from __future__ import annotations

import socket

from pyconcbench.servers import Stats, asyncio_streams
from pyconcbench.servers.asyncio_protocol import run
from pyconcbench.servers.rloop_protocol import new_event_loop, unix_refusal


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(asyncio_streams.serve_async(sock, stop_fd, stats), loop_factory=new_event_loop)


def check_transport(transport: str) -> None:
    unix_refusal("rloop_streams", transport)
