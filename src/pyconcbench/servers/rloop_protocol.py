"""asyncio_protocol's echo server (Protocol callbacks, no coroutine per connection), the
same code, on an rloop event loop (written in Rust) instead of asyncio's default loop.

Also ``check_transport``, shared with rloop_streams: rloop 0.5 serves TCP only (its
``create_unix_server`` raises NotImplementedError), so over a UNIX socket these two are not
available (a skip naming the release), found by asking the loop rather than by version, so a
release that serves UNIX sockets is measured over them.  rloop_sockets needs no server from the
loop and serves both."""
from __future__ import annotations

import asyncio
import socket

import rloop

from pyconcbench import servers
from pyconcbench.servers import Stats, asyncio_protocol
from pyconcbench.servers.asyncio_protocol import run

IMPL = "rloop_protocol"


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(asyncio_protocol.serve_async(sock, stop_fd, stats), loop_factory=rloop.new_event_loop)


def serves_unix_sockets() -> bool:
    """Whether this rloop's loop.create_unix_server works: rloop 0.5 raises NotImplementedError
    at once; one that works refuses a call without path or socket (ValueError, as asyncio's
    does) or, at worst, makes a server that is closed here."""
    loop = rloop.new_event_loop()
    try:
        server = loop.run_until_complete(loop.create_unix_server(asyncio.Protocol))
    except NotImplementedError:
        return False
    except Exception:  # the call was checked, so the method is there
        return True
    else:
        server.close()
        return True
    finally:
        loop.close()


def unix_refusal(impl: str, transport: str) -> None:
    """Raises MissingDependency when ``transport`` is "unix" and this rloop does not serve
    UNIX sockets."""
    if transport == "unix" and not serves_unix_sockets():
        raise servers.MissingDependency(
            "implementation %r cannot serve a UNIX socket with %s (its loop.create_unix_server "
            "raises NotImplementedError): measure it over TCP" % (impl, servers._release("rloop")))


def check_transport(transport: str) -> None:
    unix_refusal(IMPL, transport)
