"""Echo server on curio: a tight sock.recv() / sock.sendall() loop per connection task, the
"curio" entry of uvloop's echo study.  The accept loop is curio.network.run_server's, on the
given socket, plus a pause after accept() errors and the shutdown serve.py needs.  sendall
returns once the kernel took every byte, so a client that does not read stalls its own task and
nothing more.

curio 1.6 (the last release) does not import on Python 3.12 and later: it reads
multiprocessing.connection.CHALLENGE, which 3.12 removed.  There this module raises
MissingDependency, which serve.py turns into exit code 2 and the harness into a skip.
"""
from __future__ import annotations

import errno
import socket
import sys

from pyconcbench.servers import MissingDependency, Stats

try:
    import curio
    import curio.io
    from curio.traps import _read_wait  # the documented low-level trap behind every curio read
except Exception as exc:  # an installed curio that cannot run on this Python
    from importlib.metadata import PackageNotFoundError, version

    try:
        _curio_version = "curio %s" % version("curio")
    except PackageNotFoundError:
        _curio_version = "curio"
    raise MissingDependency(
        "implementation 'curio' does not run on Python %d.%d: %s fails to import (%s: %s)"
        % (sys.version_info[0], sys.version_info[1], _curio_version, type(exc).__name__, exc)
    ) from None

READ_SIZE = 65536
ACCEPT_PAUSE = 0.01  # after an accept() error, so a persistent one cannot spin
# accept() errors that mean the server is out of something (counted), not one aborted client.
_RESOURCE_ERRORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


async def echo(client: curio.io.Socket, clients: set, stats: Stats) -> None:
    task = await curio.current_task()
    clients.add(task)
    try:
        while True:
            data = await client.recv(READ_SIZE)
            if not data:
                return
            stats.bytes += len(data)
            await client.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass
    except OSError:
        stats.errors += 1
    finally:
        clients.discard(task)
        await client.close()


async def accept_loop(listener: curio.io.Socket, clients: set, stats: Stats, is_tcp: bool) -> None:
    while True:
        try:
            client, _ = await listener.accept()
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRORS:
                stats.errors += 1
            await curio.sleep(ACCEPT_PAUSE)
            continue
        if is_tcp:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stats.accepted += 1
        await curio.spawn(echo, client, clients, stats, daemon=True)


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    is_tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    listener = curio.io.Socket(sock)  # non-blocking from here on
    clients: set = set()
    acceptor = await curio.spawn(accept_loop, listener, clients, stats, is_tcp, daemon=True)
    try:
        await _read_wait(stop_fd)
    finally:
        await acceptor.cancel()
        running = list(clients)
        for task in running:
            await task.cancel(blocking=False)
        for task in running:
            await task.wait()  # each closes its socket, at once
        await listener.close()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    curio.run(serve_async, sock, stop_fd, stats)
