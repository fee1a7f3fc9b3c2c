"""Echo server on asyncio streams: one coroutine per connection, read / write / drain."""
from __future__ import annotations

import asyncio
import socket

from pyconcbench import servers
from pyconcbench.servers import Stats
from pyconcbench.servers.asyncio_protocol import (
    CLOSE_TIMEOUT, Connections, run, serve_until_stopped,
)

READ_SIZE = 65536


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: Stats) -> None:
    """Echoes one connection until EOF; drain() is the backpressure."""
    try:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                break
            stats.bytes += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionResetError, BrokenPipeError):
        pass
    except OSError:
        stats.errors += 1
    finally:
        # Until the close completes the connection stays tracked, so a stop can abort it.
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


class EchoServer:
    """Starts one echo task per connection and tracks its transport from the moment the
    connection is made, so close() aborts every connection, even one whose task has not run."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.connections = Connections()
        self.tasks: set = set()

    def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        transport = writer.transport
        self.connections.add(transport)
        if self.connections.closing:
            return
        task = asyncio.get_running_loop().create_task(echo(reader, writer, self.stats))
        self.tasks.add(task)
        task.add_done_callback(lambda t: (self.tasks.discard(t), self.connections.discard(transport)))

    async def close(self) -> None:
        await self.connections.abort_all()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=CLOSE_TIMEOUT)


async def serve_async(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    """Serves on the running loop (any asyncio loop, uvloop included) until stop_fd is readable."""
    echo_server = EchoServer(stats)
    backlog = servers.asyncio_backlog()
    if sock.family == socket.AF_UNIX:
        server = await asyncio.start_unix_server(echo_server.connected, sock=sock, backlog=backlog)
    else:
        server = await asyncio.start_server(echo_server.connected, sock=sock, backlog=backlog)
    await serve_until_stopped(server, stop_fd, echo_server.close)


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(serve_async(sock, stop_fd, stats))
