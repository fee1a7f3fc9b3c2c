"""asyncio_sockets' echo server (loop.sock_recv/sock_sendall, one task per connection), the
same code, on an rloop event loop (written in Rust) instead of asyncio's default loop; the
loop is given serve's signal handlers (see rloop_protocol)."""
from __future__ import annotations

import socket

from pyconcbench.servers import Stats, asyncio_sockets
from pyconcbench.servers.asyncio_protocol import run
from pyconcbench.servers.rloop_protocol import new_event_loop


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(asyncio_sockets.serve_async(sock, stop_fd, stats), loop_factory=new_event_loop)
