"""The echo server implementations, one module per concurrency model, and their registry.

Each module defines ``serve(sock, stop_fd, stats)``: serve the bound, listening socket ``sock``
(TCP or UNIX) until the file descriptor ``stop_fd`` becomes readable, then return.  Servers never
print; they count into ``stats``.  Adding a model is one ``IMPLS`` line plus one module.

``load`` decides whether an implementation can run here before any of its module runs: a tool
not on PATH, a package not installed, or installed but not importing on this Python, is
``MissingDependency`` (a skip reason), and so is what a module raises as such itself (a release
too old, or one that does not run on this Python).  Anything else its module raises on import
is ``Broken``: a bug of ours, reported in one line, never a skip.
"""
from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import shutil
import sys
import time
from typing import Callable, NamedTuple, Tuple

from pyconcbench.broken import Broken, describe


class Impl(NamedTuple):
    module: str  # relative to this package
    requires: Tuple[str, ...]  # distributions (pip names) the module imports
    description: str
    tools: Tuple[str, ...] = ()  # programs that must be on PATH (peers outside Python)


IMPLS = {
    "native_epoll": Impl("native_epoll", (), "C, one thread, level-triggered epoll"),
    "native_threads": Impl("native_threads", (), "C, one OS thread per connection, blocking I/O"),
    "asyncio_protocol": Impl("asyncio_protocol", (), "asyncio default loop, Protocol callbacks"),
    "asyncio_streams": Impl("asyncio_streams", (), "asyncio default loop, StreamReader/Writer"),
    "asyncio_sockets": Impl("asyncio_sockets", (), "asyncio default loop, loop.sock_recv/sock_sendall"),
    "asyncio_buffered": Impl("asyncio_buffered", (), "asyncio default loop, BufferedProtocol"),
    "uvloop_protocol": Impl("uvloop_protocol", ("uvloop",), "uvloop, Protocol callbacks"),
    "uvloop_streams": Impl("uvloop_streams", ("uvloop",), "uvloop, StreamReader/Writer"),
    "uvloop_sockets": Impl("uvloop_sockets", ("uvloop",), "uvloop, loop.sock_recv/sock_sendall"),
    "uvloop_buffered": Impl("uvloop_buffered", ("uvloop",), "uvloop, BufferedProtocol"),
    "rloop_protocol": Impl("rloop_protocol", ("rloop",), "rloop (Rust event loop), Protocol callbacks"),
    "rloop_streams": Impl("rloop_streams", ("rloop",), "rloop (Rust event loop), StreamReader/Writer"),
    "rloop_sockets": Impl("rloop_sockets", ("rloop",), "rloop (Rust event loop), loop.sock_recv/sock_sendall"),
    "selectors": Impl("selectors", (), "one thread, selectors.DefaultSelector, non-blocking"),
    "threads": Impl("threads", (), "one OS thread per connection, blocking sockets"),
    "threads_loops": Impl("threads_loops", (), "an asyncio loop per thread, one shared listening socket"),
    "threads_uvloops": Impl("threads_uvloops", ("uvloop",), "a uvloop loop per thread, one shared listening socket"),
    "gevent": Impl("gevent", ("gevent",), "gevent StreamServer, one greenlet per connection"),
    "tornado": Impl("tornado", ("tornado",), "Tornado 6 TCPServer and IOStream"),
    "twisted": Impl("twisted", ("twisted",), "Twisted Protocol on the default reactor"),
    "twisted_epoll": Impl("twisted_epoll", ("twisted",), "Twisted Protocol on the epoll reactor"),
    "trio": Impl("trio", ("trio",), "trio.serve_listeners, one task per connection"),
    "anyio": Impl("anyio", ("anyio",), "anyio on asyncio, one task per connection"),
    "curio": Impl("curio", ("curio",), "curio, one task per connection"),
    "go_net": Impl("go_net", (), "Go net.Conn Read/Write loop, GOMAXPROCS=1", ("go",)),
    "node_net": Impl("node_net", (), "Node.js net.createServer", ("node",)),
}

#: Test-only knob: ``PCB_TEST_SLOWDOWN_NS=N`` makes the servers below busy-wait N ns of CPU for
#: every chunk they receive (one per message in a closed-loop echo of small messages), so the
#: regression gate can be shown to catch a slowdown of a known size.  Other servers refuse to
#: start while it is set; results carry ``test_slowdown_ns``.  Never set it for real runs.
SLOWDOWN_ENV = "PCB_TEST_SLOWDOWN_NS"
SLOWDOWN_IMPLS = ("asyncio_protocol", "uvloop_protocol")


def slowdown_ns() -> int:
    """The test-only slowdown in ns per received chunk (0 when unset); ValueError if malformed."""
    text = os.environ.get(SLOWDOWN_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) > 10_000_000_000:
        raise ValueError(f"{SLOWDOWN_ENV} must be a whole number of nanoseconds (0 .. 1e10), got {text!r}")
    return int(text)


def spin(ns: int) -> None:
    """Busy-waits ``ns`` nanoseconds (CPU work, not a sleep)."""
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


#: accept() errors about one aborted incoming connection (Linux passes pending network errors
#: to accept): a server skips it and goes on accepting.
TRANSIENT_ACCEPT_ERRORS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED", "EPROTO", "EPERM", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET",
        "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "ETIMEDOUT",
    )
    if hasattr(errno, name)
)

#: listen() backlog for servers whose framework calls listen() again on the socket it is given
#: (asyncio's create_server does, with 100 unless told otherwise: at 10k connections the
#: overflowing accept queue silently drops handshakes).  The kernel clamps it to somaxconn.
BACKLOG = 65535


def asyncio_backlog() -> int:
    """The backlog to give asyncio's create_server/start_server.  asyncio uses it twice: for
    listen(), and as how many accept() calls one readiness event may make -- and when accept()
    fails with EMFILE it logs a traceback for every remaining one of them (CPython 3.9-3.13)
    before backing off.  1024 keeps that storm small and is still twice the load generator's
    connects in flight (512), so 10k connections are accepted without dropped handshakes."""
    return min(BACKLOG, 1024)

# How a required distribution is imported and which pyconcbench extra installs it, where either
# differs from the distribution's own name.
_IMPORT_NAMES = {"pyzmq": "zmq"}
_EXTRAS = {}


class UnknownImpl(ValueError):
    pass


class MissingDependency(ImportError):
    """The implementation cannot run here: a tool not on PATH, a package not installed, or a
    release that does not run on this Python.  The only skip reason; the message says what to
    install."""


class Stats:
    """What a server counts while it serves: connections accepted, bytes echoed, and
    connections ended by an I/O error other than EOF or a reset by the peer."""

    __slots__ = ("accepted", "bytes", "errors")

    def __init__(self) -> None:
        self.accepted = 0
        self.bytes = 0
        self.errors = 0

    def as_dict(self) -> dict:
        return {"accepted": self.accepted, "bytes": self.bytes, "errors": self.errors}

    def __repr__(self) -> str:
        return "Stats(accepted=%d, bytes=%d, errors=%d)" % (self.accepted, self.bytes, self.errors)


ServeFunc = Callable[..., None]


def load(impl: str) -> ServeFunc:
    """Returns the ``serve`` function of implementation ``impl``."""
    try:
        spec = IMPLS[impl]
    except KeyError:
        raise UnknownImpl(
            "unknown implementation %r; known: %s" % (impl, ", ".join(IMPLS))
        ) from None
    for tool in spec.tools:
        if shutil.which(tool) is None:
            raise MissingDependency(
                "implementation %r needs %r on PATH (not found)" % (impl, tool)
            )
    for dist in spec.requires:
        name = _IMPORT_NAMES.get(dist, dist)
        if importlib.util.find_spec(name) is None:
            raise MissingDependency(
                "implementation %r needs %s: pip install 'pyconcbench[%s]'"
                % (impl, dist, _EXTRAS.get(dist, dist))
            )
        try:
            importlib.import_module(name)
        except Exception as exc:  # installed, but this release does not import on this Python
            raise MissingDependency(
                "implementation %r: %s does not import on Python %d.%d.%d: %s: %s"
                % (impl, _release(dist), *sys.version_info[:3], type(exc).__name__, exc)
            ) from None
    try:
        module = importlib.import_module("%s.%s" % (__name__, spec.module))
    except (MissingDependency, Broken):  # the module's own verdict (curio, anyio, _native)
        raise
    except Exception as exc:  # our own code
        raise Broken("implementation %r: its module pyconcbench.servers.%s does not import: %s"
                     % (impl, spec.module, describe(exc))) from None
    return module.serve


def _release(dist: str) -> str:
    """'curio 1.6', or the distribution's name when its version cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "%s %s" % (dist, version(dist))
    except (PackageNotFoundError, ValueError):
        return dist


def require_native(impl: str, name: str) -> Callable:
    """Returns function ``name`` of the C extension.  Raises MissingDependency when the
    extension is not built (like a package not installed), Broken when it is there but does
    not import or lacks that function (a stale or broken build of our own code)."""
    if importlib.util.find_spec("pyconcbench._native") is None:
        raise MissingDependency(
            "implementation %r needs the C extension pyconcbench._native, which is not built: "
            "pip install -e . --no-build-isolation" % impl
        )
    try:
        from pyconcbench import _native
    except ImportError as exc:
        raise Broken(
            "implementation %r: the C extension pyconcbench._native does not import (%s): "
            "rebuild with pip install -e . --no-build-isolation" % (impl, describe(exc))
        ) from None
    try:
        return getattr(_native, name)
    except AttributeError:
        raise Broken(
            "implementation %r needs pyconcbench._native.%s, which this build lacks: "
            "rebuild with pip install -e . --no-build-isolation" % (impl, name)
        ) from None
