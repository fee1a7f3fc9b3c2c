"""The echo server implementations, one module per concurrency model, and their registry.

Each module defines ``serve(sock, stop_fd, stats)``: serve the bound, listening socket ``sock``
(TCP or UNIX) until the file descriptor ``stop_fd`` becomes readable, then return.  Servers never
print; they count into ``stats``.  Adding a model is one ``IMPLS`` line plus one module.

``load`` decides whether an implementation can run here before any of its module runs: a tool
not on PATH, a package not installed, or installed but not importing on this Python, is
``MissingDependency`` (a skip reason), and so is what a module raises as such itself (a release
too old, or one that does not run on this Python).  Anything else its module raises on import
is ``Broken``: a bug of ours, reported in one line, never a skip.

Servers users bring follow the same contract and are named in two more ways (``user_spec``):
``module:function`` or ``path/to/file.py:function`` (loaded in the server process, from its
working directory), and the name of an entry point in the ``pyconcbench.servers`` group (a
package registering its servers, ``name = "pkg.mod:serve"``).  Their code is the user's, so
what goes wrong with it is ``UserServerError`` (cannot run as asked), never ``Broken``.
"""
from __future__ import annotations

import errno
import importlib
import importlib.util
import inspect
import os
import re
import shutil
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Tuple

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

def one_process(impl: str) -> str:
    """Why ``impl`` serves from one process only, never with workers (``pyconcbench.serve
    --workers``): '' when it can.  The peers run a program of their own (Go, Node)."""
    spec = IMPLS.get(impl)
    if spec is not None and spec.tools:
        return "%s runs a program of its own (an external peer)" % impl
    return ""


#: Test-only knob: ``PCB_TEST_SLOWDOWN_NS=N`` makes the servers below busy-wait N ns of CPU for
#: every chunk they receive (one per message in a closed-loop echo of small messages), so the
#: regression gate can be shown to catch a slowdown of a known size.  Other servers refuse to
#: start while it is set; results carry ``test_slowdown_ns``.  Never set it for real runs.
SLOWDOWN_ENV = "PCB_TEST_SLOWDOWN_NS"
SLOWDOWN_IMPLS = ("asyncio_protocol", "uvloop_protocol")
#: The models that start an OS thread per connection: each is a task the kernel numbers
#: (kernel.pid_max bounds them with every other task of the machine).
THREAD_PER_CONNECTION = ("threads", "native_threads")


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


class UserServerError(ValueError):
    """A user's server (``module:function``, a file, an entry point) cannot be loaded as given:
    its module is not found or raises on import, the function is missing or does not take
    ``(sock, stop_fd, stats)``.  One line; the server process exits 2 (cannot run as asked)."""


#: The entry-point group through which a package registers its servers by name.
ENTRY_POINT_GROUP = "pyconcbench.servers"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def entry_points() -> Dict[str, str]:
    """The servers registered in the ``pyconcbench.servers`` entry-point group: name -> its
    ``module:function``.  A name that is a built-in id is refused (it would be ambiguous)."""
    from importlib.metadata import entry_points as _entry_points

    out: Dict[str, str] = {}
    for ep in _entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in IMPLS:
            dist = getattr(getattr(ep, "dist", None), "name", None) or "a package"
            raise UserServerError(
                "entry point %r in group %s (from %s) has the name of a built-in implementation; "
                "rename it" % (ep.name, ENTRY_POINT_GROUP, dist))
        out[ep.name] = ep.value
    return out


def user_spec(impl: str) -> "Tuple[str, str] | None":
    """``(module_or_file, function)`` when ``impl`` names a user's server (``mod:func``,
    ``path/file.py:func``, or a registered entry point); None for a built-in id or an unknown
    name.  Raises UserServerError when it has a colon but is not of that form."""
    if impl in IMPLS:
        return None
    if ":" not in impl:
        target = entry_points().get(impl)
        if target is None:
            return None
        impl = target
    where, _, func = impl.rpartition(":")
    if not _IDENTIFIER.fullmatch(func):
        raise UserServerError("implementation %r: expected MODULE:FUNCTION or PATH.py:FUNCTION, and %r is not "
                              "a function name" % (impl, func))
    if where.endswith(".py") or "/" in where:
        if not where.endswith(".py"):
            raise UserServerError("implementation %r: a file must end in .py" % impl)
        return where, func
    if not _MODULE.fullmatch(where):
        raise UserServerError("implementation %r: expected MODULE:FUNCTION or PATH.py:FUNCTION, and %r is not "
                              "a module name" % (impl, where))
    return where, func


def check_user_spec(impl: str) -> None:
    """What can be checked of a user's server without running its code (in the pytest process,
    where importing it could have side effects such as monkey-patching): the form, and that a
    file exists.  Raises UserServerError."""
    spec = user_spec(impl)
    if spec is not None and spec[0].endswith(".py") and not os.path.isfile(spec[0]):
        raise UserServerError("implementation %r: no such file: %s" % (impl, os.path.abspath(spec[0])))


def known_impls() -> List[str]:
    """Every implementation name a run can use: the built-in ids, then the registered entry points."""
    return list(IMPLS) + [name for name in entry_points() if name not in IMPLS]


def _load_user(impl: str, where: str, func: str) -> ServeFunc:
    """A user's serve function, imported (in the server process).  UserServerError when it
    cannot be: the user's code, so 'cannot run as asked', never a bug of ours."""
    if where.endswith(".py"):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise UserServerError("implementation %r: no such file: %s" % (impl, path))
        name = "pyconcbench_user_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module

        def loader():
            spec.loader.exec_module(module)
            return module
    else:
        try:
            found = importlib.util.find_spec(where)  # imports the parent packages
        except (ImportError, ValueError) as exc:
            found, why = None, describe(exc)
        except BaseException as exc:  # a parent package of the user's raised on import
            raise UserServerError("implementation %r: importing %s raised %s" % (impl, where, describe(exc))) from None
        else:
            why = ""
        if found is None:
            raise UserServerError("implementation %r: no module named %r%s (it is imported from the folder the "
                                  "run starts in; or give a file: path/to/%s.py:%s)"
                                  % (impl, where, ": " + why if why else "", where.rsplit(".", 1)[-1], func))
        def loader():
            return importlib.import_module(where)
    try:
        module = loader()
    except BaseException as exc:  # the user's module ran and raised (SystemExit included)
        raise UserServerError("implementation %r: importing %s raised %s" % (impl, where, describe(exc))) from None
    serve = getattr(module, func, None)
    if serve is None:
        raise UserServerError("implementation %r: %s has no %r" % (impl, where, func))
    if not callable(serve):
        raise UserServerError("implementation %r: %s:%s is not a function" % (impl, where, func))
    try:
        inspect.signature(serve).bind(None, 0, None)
    except TypeError:
        raise UserServerError("implementation %r: %s:%s must take (sock, stop_fd, stats), its signature is %s"
                              % (impl, where, func, inspect.signature(serve))) from None
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return serve


class Unsupported(Exception):
    """The implementation, as installed, does not do what the case asks (rloop 0.5's loop
    serves no UNIX socket).  Nothing missing here would change that, so it is a skip even in a
    strict run (which fails skips so that a CI job cannot pass by missing packages); the message
    names the release."""


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
    """Returns the ``serve`` function of implementation ``impl``: a built-in id, a user's
    ``module:function`` / ``file.py:function``, or a registered entry point's name."""
    user = user_spec(impl)
    if user is not None:
        return _load_user(impl, *user)
    try:
        spec = IMPLS[impl]
    except KeyError:
        raise UnknownImpl(
            "unknown implementation %r; known: %s (or a server of your own: MODULE:FUNCTION, "
            "PATH.py:FUNCTION)" % (impl, ", ".join(known_impls()))
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
