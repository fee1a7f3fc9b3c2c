"""Plain reference echo servers: one small script per event-loop model, written the way a user
of that library would write it, with no pyconcbench code in the process.

The suite measures each beside the project's own implementation of the same model, in the same
run and under the same load; the two should agree (the project's server adds only what any
server needs: counting, a clean stop, bounded buffers).  A ratio far from 1 means the harness,
not the model, is being measured.  See ``pyconcbench.harness.PlainServer``.

Every script takes ``--host H --port P`` (port 0: the kernel chooses) or ``--unix PATH``, prints
one line ``serving on ADDRESS`` once it listens, and runs until it is killed (SIGTERM, Ctrl-C).
This package is never imported for serving: the harness runs the scripts by path.
"""
from __future__ import annotations

import os
from typing import Dict, NamedTuple, Tuple


class Plain(NamedTuple):
    script: str  # file in this directory
    requires: Tuple[str, ...]  # import names
    description: str


#: implementation id -> its plain counterpart.
PLAIN: Dict[str, Plain] = {
    "asyncio_protocol": Plain("echo_asyncio_protocol.py", (), "asyncio.Protocol, loop.create_server"),
    "asyncio_streams": Plain("echo_asyncio_streams.py", (), "asyncio.start_server, reader.read / drain"),
    "uvloop_protocol": Plain("echo_uvloop_protocol.py", ("uvloop",), "asyncio.Protocol on uvloop.run"),
    "selectors": Plain("echo_selectors.py", (), "selectors.DefaultSelector loop, non-blocking sockets"),
    "threads": Plain("echo_threads.py", (), "socketserver.ThreadingTCPServer, recv / sendall"),
    "gevent": Plain("echo_gevent.py", ("gevent",), "gevent.server.StreamServer, recv / sendall"),
    "trio": Plain("echo_trio.py", ("trio",), "trio.serve_tcp, receive_some / send_all"),
}

#: A plain server's id: its counterpart's with this prefix.
PREFIX = "plain_"


def script_path(impl: str) -> str:
    """The file of ``impl``'s plain counterpart (KeyError when it has none)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), PLAIN[impl].script)
