"""The C thread-per-connection baseline (native/pcb_echo.c), GIL released."""
from __future__ import annotations

import socket

from pyconcbench.servers import Stats, require_native

_echo_threads = require_native("native_threads", "echo_threads")

STACK_SIZE = 0  # 0: the C default (64 KiB per thread, so 10k connections fit)


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    counts = _echo_threads(sock.fileno(), stop_fd, STACK_SIZE)
    stats.accepted = counts["accepted"]
    stats.bytes = counts["bytes"]
    stats.errors = counts["errors"]
