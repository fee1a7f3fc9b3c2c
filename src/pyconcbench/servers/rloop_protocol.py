"""asyncio_protocol's echo server (Protocol callbacks, no coroutine per connection), the
same code, on an rloop event loop (written in Rust) instead of asyncio's default loop.

Two things the three rloop servers share, both about rloop (0.5) rather than the serving code:

- ``new_event_loop``: rloop's run loop never runs Python signal handlers by itself.  A signal
  only reaches its self-pipe, where it calls back what was given to ``loop.add_signal_handler``;
  a handler set with ``signal.signal`` (serve's stop on SIGTERM, SIGINT, SIGHUP) waits for some
  Python code to run, and when the signal lands outside the loop's wait none does: the server
  never stops (about one stop in 150).  So the loop is given those signals, with a callback
  that only runs Python code, so that the interpreter then runs the handlers itself: serve's
  handlers stay the process's, and run in the interpreter's order (rloop calls its callbacks
  for two signals that arrive together in either order: serve would record SIGTERM for a
  SIGINT followed at once by a SIGTERM).
- ``check_transport`` (rloop_protocol, rloop_streams): rloop 0.5 serves TCP only (its
  ``create_unix_server`` raises NotImplementedError), so over a UNIX socket these two are not
  available (a skip naming the release), found by asking the loop rather than by version, so a
  release that serves UNIX sockets is measured over them.  rloop_sockets needs no server from
  the loop and serves both.
"""
from __future__ import annotations

import asyncio
import signal
import socket
import threading

import rloop

from pyconcbench import servers
from pyconcbench.servers import Stats, asyncio_protocol
from pyconcbench.servers.asyncio_protocol import run

IMPL = "rloop_protocol"


#: The signals whose Python handlers the loop is given (serve's stop signals).
HANDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_python_handlers() -> None:
    """rloop's callback for a signal in HANDED_SIGNALS.  Running it is the point: Python code
    running in the main thread is when the interpreter runs its pending signal handlers."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new rloop loop that wakes for each of HANDED_SIGNALS that has a Python handler set (in
    the main thread: signals are handled there only) and lets the interpreter run that handler,
    which stays the signal's handler.  Python's default handlers (SIGINT's KeyboardInterrupt,
    SIG_DFL, SIG_IGN) are left as they are."""
    loop = rloop.new_event_loop()
    if threading.current_thread() is threading.main_thread():
        for signum in HANDED_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler) and handler is not signal.default_int_handler:
                loop.add_signal_handler(signum, run_python_handlers)
                signal.signal(signum, handler)  # rloop set a no-op handler of its own
    return loop


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    run(asyncio_protocol.serve_async(sock, stop_fd, stats), loop_factory=new_event_loop)


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
    """Raises Unsupported when ``transport`` is "unix" and this rloop does not serve UNIX
    sockets (a skip, strict run or not: nothing is missing)."""
    if transport == "unix" and not serves_unix_sockets():
        raise servers.Unsupported(
            "implementation %r cannot serve a UNIX socket with %s (its loop.create_unix_server "
            "raises NotImplementedError): measure it over TCP" % (impl, servers._release("rloop")))


def check_transport(transport: str) -> None:
    unix_refusal(IMPL, transport)
