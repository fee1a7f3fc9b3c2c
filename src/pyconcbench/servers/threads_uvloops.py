"""threads_loops with a uvloop event loop in each thread instead of asyncio's default loop."""
from __future__ import annotations

import socket

import uvloop

from pyconcbench.servers import Stats
from pyconcbench.servers.threads_loops import serve_loops


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    serve_loops(sock, stop_fd, stats, uvloop.new_event_loop)
