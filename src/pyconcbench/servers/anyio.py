"""Echo server on anyio, asyncio backend: one task per connection, receive / send.

The listener is anyio's own, made from the given socket with the public
``anyio.abc.SocketListener.from_socket`` (anyio >= 4.10).  Before anyio 4.14 that wraps a UNIX
socket as a TCP listener whose accept() fails setting TCP_NODELAY (agronholm/anyio#1132); there
UNIX connections are accepted here and wrapped with the public
``anyio.abc.UNIXSocketStream.from_socket``.  TCP connections come with TCP_NODELAY set by
anyio.

Backpressure: ``send`` waits while anything is left in the transport's buffer.  But anyio's TCP
listener leaves an accepted connection's transport reading (its own ``connect_tcp`` pauses it):
reading is paused only after a ``receive`` that found nothing queued, so a client that sends
without reading, while the task waits in ``send``, fills anyio's read queue without bound
(anyio 4.16 still does this).  ``pause_reading`` below does what ``connect_tcp`` does, through
the stream's private transport when it has one; receive() resumes reading when it must wait.
UNIX connections are raw-socket streams with no such queue.
"""
from __future__ import annotations

import errno
import socket

import anyio
import anyio.abc

from pyconcbench.servers import MissingDependency, Stats

READ_SIZE = 65536
ACCEPT_PAUSE = 0.01  # after an accept() error, so a persistent one cannot spin
# accept() errors that mean the server is out of something (counted), not one aborted client.
_RESOURCE_ERRORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


def _version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(part) for part in version("anyio").split(".")[:2])
    except (PackageNotFoundError, ValueError):  # unknown: assume a current release
        return (99, 0)


if not hasattr(anyio.abc.SocketListener, "from_socket"):
    raise MissingDependency(
        "implementation 'anyio' needs anyio >= 4.10 (SocketListener.from_socket): "
        "pip install -U anyio"
    )
UNIX_FROM_SOCKET_WORKS = _version() >= (4, 14)


class UnixAcceptor:
    """Accepts on a UNIX listening socket for anyio releases whose from_socket cannot."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def accept(self) -> anyio.abc.SocketStream:
        while True:
            try:
                client, _ = self.sock.accept()
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            return await anyio.abc.UNIXSocketStream.from_socket(client)

    async def aclose(self) -> None:
        self.sock.close()


def pause_reading(stream: anyio.abc.SocketStream) -> None:
    transport = getattr(stream, "_transport", None)
    if transport is not None and hasattr(transport, "pause_reading"):
        transport.pause_reading()


async def echo(stream: anyio.abc.SocketStream, stats: Stats) -> None:
    try:
        while True:
            try:
                data = await stream.receive(READ_SIZE)
            except anyio.EndOfStream:
                return
            stats.bytes += len(data)
            await stream.send(data)
    except anyio.BrokenResourceError as exc:
        if not isinstance(exc.__cause__, (ConnectionResetError, BrokenPipeError)):
            stats.errors += 1
    except (ConnectionResetError, BrokenPipeError):
        pass
    except OSError:
        stats.errors += 1
    finally:
        # Shielded: an unshielded close in a cancelled task may stop at its first checkpoint
        # and leave the connection open (older anyio releases close, yield, then abort).
        with anyio.CancelScope(shield=True):
            await stream.aclose()


async def accept_loop(listener, tg: anyio.abc.TaskGroup, stats: Stats) -> None:
    while True:
        try:
            stream = await listener.accept()
        except (OSError, anyio.BrokenResourceError) as exc:
            cause = exc if isinstance(exc, OSError) else exc.__cause__
            if getattr(cause, "errno", None) in _RESOURCE_ERRORS:
                stats.errors += 1
            await anyio.sleep(ACCEPT_PAUSE)
            continue
        stats.accepted += 1
        pause_reading(stream)
        tg.start_soon(echo, stream, stats)


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    sock.setblocking(False)  # anyio's UNIX listener calls accept() directly
    if sock.family == socket.AF_UNIX and not UNIX_FROM_SOCKET_WORKS:
        listener = UnixAcceptor(sock)
    else:
        listener = await anyio.abc.SocketListener.from_socket(sock)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(accept_loop, listener, tg, stats)
            await anyio.wait_readable(stop_fd)
            tg.cancel_scope.cancel()  # cancels the accept loop and every connection
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    anyio.run(serve_async, sock, stop_fd, stats, backend="asyncio")
