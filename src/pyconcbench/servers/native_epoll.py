"""The C baseline: one thread, level-triggered epoll (native/pcb_echo.c), GIL released."""
from __future__ import annotations

import socket

from pyconcbench.servers import Stats, require_native

_echo_epoll = require_native("native_epoll", "echo_epoll")


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    counts = _echo_epoll(sock.fileno(), stop_fd)
    stats.accepted = counts["accepted"]
    stats.bytes = counts["bytes"]
    stats.errors = counts["errors"]
