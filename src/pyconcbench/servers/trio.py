"""Echo server on trio: trio.serve_listeners over a SocketListener wrapping the given socket,
one task per connection running receive_some / send_all (send_all returns once the kernel took
every byte, so a client that does not read stalls its own task and nothing more).  trio's
SocketStream sets TCP_NODELAY on TCP connections itself."""
from __future__ import annotations

import functools
import signal
import socket
import threading

import trio

from pyconcbench.servers import Stats

READ_SIZE = 65536


async def echo(stream: trio.SocketStream, stats: Stats) -> None:
    """Echoes one connection until EOF; serve_listeners closes the stream afterwards, and on
    cancellation."""
    stats.accepted += 1
    try:
        while True:
            data = await stream.receive_some(READ_SIZE)
            if not data:
                return
            stats.bytes += len(data)
            await stream.send_all(data)
    except trio.BrokenResourceError as exc:
        if not isinstance(exc.__cause__, (ConnectionResetError, BrokenPipeError)):
            stats.errors += 1


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, functools.partial(echo, stats=stats), [listener])
        await trio.lowlevel.wait_readable(stop_fd)
        nursery.cancel_scope.cancel()  # cancels every connection task, closes their streams


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    # trio.run takes the signal wake-up fd for itself and warns when one is already set (as
    # serve.py's is).  serve.py's stop handlers write stop_fd themselves, so trio may have it
    # for the run; the previous one is restored afterwards.  trio leaves SIGINT alone when a
    # handler other than the default is installed, as serve.py's is.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.set_wakeup_fd(-1) if main_thread else -1
    try:
        trio.run(serve_async, sock, stop_fd, stats)
    finally:
        if main_thread:
            signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
