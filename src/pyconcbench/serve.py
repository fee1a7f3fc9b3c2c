"""The server process under test: bind loopback, announce, serve one implementation, report.

    python -m pyconcbench.serve IMPL [--host H] [--port P] [--unix PATH] [--cpu N] [--backlog N]

stdout carries exactly two lines, each a JSON object: ``READY {...}`` once the socket listens,
and the usage report after the server stops (on SIGTERM, SIGINT, SIGHUP or parent death).
The server raises its soft limit on open files to the hard limit (READY's ``fd_limit``).
Started by a parent of ours (``PCB_PARENT_PID``), it also starts a guard (procs.start_guard):
a server still running ``ORPHAN_GRACE`` seconds after its parent died is killed, with its
process group, and its temporary directory (``PCB_TMPDIR``) removed.
Exit codes: 0 stopped cleanly; 1 the implementation raised; 2 it cannot run as asked (bad
arguments, unknown implementation, non-loopback host, bind failure, CPU not allowed); 3 it is
not available here (a tool not on PATH, a package not installed, a release that does not run on
this Python: the only exit the harness turns into a skip); 4 the project's own code for it does
not import or build (a module of ours raising on import, the Go peer's source not compiling: a
bug).  Every refusal is one line on stderr.

An implementation whose work runs in another process (an external peer: ``go_net``,
``node_net``) defines two optional hooks beside ``serve`` in its module:
``start(sock, stats) -> pid`` is called before READY, which then carries that pid as
``"worker_pid"`` (the process the harness measures); ``usage() -> dict`` is called after
``serve`` returns, and its ``user``, ``system`` and ``maxrss_kib`` replace this process's own
in the usage report.  See ``pyconcbench.servers.peers``.
An implementation that cannot serve one transport with the release installed (rloop's
UNIX sockets) defines ``check_transport("tcp" | "unix")``, which raises servers.Unsupported (exit
6, a skip even in a strict run) before anything is bound.

READY also reads back the state of glibc's allocator at start-up (``malloc_probe``, see
``allocator_probe``): whether a block the size of an asyncio receive buffer gets an ``mmap`` of
its own.  Which state a benchmark measures is the harness's choice (``pyconcbench.harness``).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import platform
import shutil
import stat
import sys

from pyconcbench import loopback, servers
from pyconcbench.procs import (EXIT_BROKEN, EXIT_FAILED, EXIT_MISSING, EXIT_UNSUPPORTED, EXIT_UNUSABLE, TMPDIR_ENV, arm_parent_death,
                               start_guard)

PROG = "pyconcbench.serve"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The block ``allocator_probe`` allocates: what ``sock.recv(256 KiB)`` asks malloc for (a bytes
#: object of 256 KiB plus its header), as an asyncio transport does for every read.
MALLOC_PROBE_BYTES = 256 * 1024 + 64


class Unusable(Exception):
    """The server cannot run as asked; the message is the one line to print."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m " + PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one echo server implementation on a loopback socket until SIGTERM,\n"
        "SIGINT, SIGHUP or the parent's death. Prints 'READY {json}' when listening and\n"
        "a JSON usage report (CPU time, peak RSS, counts) when stopped.",
        epilog="implementations:\n"
        + "\n".join("  %-18s %s" % (name, impl.description) for name, impl in servers.IMPLS.items())
        + "\n  MODULE:FUNCTION     a serve(sock, stop_fd, stats) function of your own (PATH.py:FUNCTION for a"
        "\n                     file), or the name of one registered in the entry-point group "
        + servers.ENTRY_POINT_GROUP,
    )
    parser.add_argument("impl", metavar="IMPL", help="implementation id, see below")
    parser.add_argument(
        "--host", metavar="H", default=None,
        help="loopback address to bind (127.0.0.0/8, ::1 or localhost). Default: '127.0.0.1'",
    )
    parser.add_argument(
        "--port", metavar="P", type=_port, default=None,
        help="TCP port; 0 lets the kernel choose. Default: 0",
    )
    parser.add_argument(
        "--unix", metavar="PATH", default=None,
        help="serve on a UNIX socket at PATH instead of TCP (a stale socket there, nobody listening, is "
        "replaced; a live one is refused)",
    )
    parser.add_argument(
        "--cpu", metavar="N", type=_non_negative, default=None,
        help="pin the server process to CPU N. Default: no pinning",
    )
    parser.add_argument(
        "--backlog", metavar="N", type=_non_negative, default=65535,
        help="listen() backlog; the kernel clamps it to net.core.somaxconn. Default: %(default)r",
    )
    return parser


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text) from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0: %r" % text)
    return value


def _port(text: str) -> int:
    value = _non_negative(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("not a port number: %r" % text)
    return value


def loopback_address(host: str) -> str:
    """Returns the address to bind for ``host``, or raises Unusable unless it is loopback."""
    try:
        return loopback.address(host)
    except loopback.NotLoopback as exc:
        raise Unusable(str(exc)) from None


def pin(cpu: int) -> None:
    try:
        os.sched_setaffinity(0, {cpu})
    except (OSError, ValueError, OverflowError) as exc:
        raise Unusable(
            "cannot pin to CPU %d (allowed: %s): %s"
            % (cpu, sorted(os.sched_getaffinity(0)), exc)
        ) from None


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def allocator_probe() -> "str | None":
    """Whether glibc would serve an asyncio-sized receive buffer with an mmap of its own
    ("mmap": the process has never freed a block above the 128 KiB initial threshold, or the
    threshold was fixed there) or from the heap ("heap"); None when the C library is not glibc
    2.33+ (no mallinfo2).  The probe block is kept, not freed: freeing a mapped block is exactly
    what would move glibc's threshold, and so change the state being read."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    mapped_before = libc.mallinfo2().hblks
    if not libc.malloc(MALLOC_PROBE_BYTES):
        return None
    return "mmap" if libc.mallinfo2().hblks > mapped_before else "heap"


def _remove_stale_socket(path: str) -> None:
    """Removes a stale socket at ``path`` (nobody listening: a server that died); refuses a
    live one (Unusable), or anything that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise Unusable("cannot bind %s: exists and is not a socket" % path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except ConnectionRefusedError:  # nobody listening: stale
        pass
    except (socket.timeout, BlockingIOError):  # a listener whose queue is full (EAGAIN): alive
        raise Unusable("cannot bind %s: a server is listening there (its queue is full)" % path) from None
    except OSError as exc:
        raise Unusable("cannot bind %s: cannot tell whether a server is listening there: %s" % (path, exc)) from None
    else:
        raise Unusable("cannot bind %s: a server is listening there (stop it, or choose another path)" % path)
    finally:
        probe.close()
    os.unlink(path)


#: When the hard limit is unlimited, the soft limit is raised this far at most (the kernel's
#: fs.nr_open default).
FD_LIMIT_CAP = 1 << 20


def raise_fd_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit (a server's
    connections are its file descriptors; the kernel's default soft limit, 1024, would refuse
    the 1025th client); returns the soft limit now.  A limit it cannot raise stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else FD_LIMIT_CAP
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    return soft


def owned_tmpdir(unix: "str | None") -> "str | None":
    """The temporary directory the harness made for this server's UNIX socket
    (``PCB_TMPDIR``, the directory of ``--unix PATH``), which the server and its guard remove;
    None when there is none."""
    path = os.environ.get(TMPDIR_ENV, "")
    if not path or unix is None or not os.path.basename(path).startswith("pcb-"):
        return None
    path = os.path.abspath(path)
    if os.path.dirname(os.path.abspath(unix)) != path or not os.path.isdir(path):
        return None
    return path


def _remove_own_socket(path: str, inode: int) -> None:
    """Removes the socket file unless something else has replaced it meanwhile."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


def listen(args) -> socket.socket:
    if args.unix is not None:
        _remove_stale_socket(args.unix)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where = args.unix
        address = args.unix
    else:
        host = loopback_address(args.host or "127.0.0.1")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = args.port or 0
        where = "[%s]:%d" % (host, port) if family == socket.AF_INET6 else "%s:%d" % (host, port)
        address = (host, port)
    try:
        sock.bind(address)
        sock.listen(args.backlog)
    except OSError as exc:
        sock.close()
        raise Unusable("cannot bind %s: %s" % (where, exc)) from None
    return sock


class StopPipe:
    """A pipe whose read end becomes readable when a stop signal arrives, even while C code
    runs without the GIL (the signal wake-up fd is written by the C-level handler)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both O_CLOEXEC
        os.set_blocking(self.write_fd, False)
        self.signal = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handler)
        signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)

    def _handler(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name
        # Also write here: an event loop (uvloop, gevent) may have replaced the wake-up fd.
        try:
            os.write(self.write_fd, b"\0")
        except OSError:
            pass

    def ignore_more(self) -> None:
        """Ignores further stop signals: the server is already stopping, and at interpreter
        exit Python would reset its handlers to the default action, which kills."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self.read_fd)
        os.close(self.write_fd)


def implementation_hook(serve, name: str):
    """The optional hook ``name`` (``check_transport``, ``start``, ``usage``) defined in the module of an
    implementation's ``serve`` function, or None."""
    name_ = getattr(serve, "__module__", None) or ""
    if not name_.startswith("pyconcbench.servers."):
        return None  # a user's module: its `start` or `usage` is its own business, not a hook
    return getattr(sys.modules.get(name_), name, None)


def _emit(channel, line: str) -> bool:
    """Writes one line to the protocol channel; False when the reader is gone."""
    try:
        channel.write(line + "\n")
        channel.flush()
        return True
    except (BrokenPipeError, ValueError):
        return False


def _usage(serve) -> dict:
    """CPU seconds and peak RSS of whatever did the serving: the worker process an
    implementation's ``usage`` hook reports on, else this process."""
    hook = implementation_hook(serve, "usage")
    worker = hook() if hook is not None else None
    if worker is not None:
        return {name: worker[name] for name in ("user", "system", "maxrss_kib")}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": usage.ru_utime, "system": usage.ru_stime, "maxrss_kib": usage.ru_maxrss}


def check_slowdown(impl: str) -> int:
    """The test-only slowdown knob, checked: raises Unusable when it is malformed or set for
    a server that does not implement it (so it is never silently ignored)."""
    try:
        ns = servers.slowdown_ns()
    except ValueError as exc:
        raise Unusable(str(exc)) from None
    if ns and impl not in servers.SLOWDOWN_IMPLS:
        raise Unusable("%s (test-only) is set, but only %s implement it, not %s"
                       % (servers.SLOWDOWN_ENV, ", ".join(servers.SLOWDOWN_IMPLS), impl))
    return ns


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.unix is not None and (args.host is not None or args.port is not None):
        parser.error("--unix cannot be combined with --host or --port")

    if not arm_parent_death(signal.SIGTERM):
        return EXIT_FAILED  # the parent died before the death signal was armed
    tmpdir = owned_tmpdir(args.unix)
    try:
        return _main(args, tmpdir)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _main(args, tmpdir: "str | None") -> int:
    # Before any thread starts: a guard that kills this process group if the parent dies and
    # this server does not stop on the parent-death SIGTERM (see procs.start_guard).
    start_guard(remove=[tmpdir] if tmpdir is not None else [])
    fd_limit = raise_fd_limit()
    try:
        if args.cpu is not None:
            pin(args.cpu)
        servers.BACKLOG = args.backlog  # before the module imports it, for frameworks that re-listen
        check_slowdown(args.impl)
        # what a module prints on import goes to stderr: stdout is the protocol's until READY
        with contextlib.redirect_stdout(sys.stderr):
            serve = servers.load(args.impl)
            check_transport = implementation_hook(serve, "check_transport")
            if check_transport is not None:  # before binding: a refused transport leaves nothing behind
                check_transport("unix" if args.unix is not None else "tcp")
        sock = listen(args)
    except servers.MissingDependency as exc:
        print("%s: %s" % (PROG, exc), file=sys.stderr)
        return EXIT_MISSING
    except servers.Unsupported as exc:
        print("%s: %s" % (PROG, exc), file=sys.stderr)
        return EXIT_UNSUPPORTED
    except servers.Broken as exc:
        print("%s: %s" % (PROG, exc), file=sys.stderr)
        return EXIT_BROKEN
    except (Unusable, servers.UnknownImpl, servers.UserServerError) as exc:
        print("%s: %s" % (PROG, exc), file=sys.stderr)
        return EXIT_UNUSABLE

    # The two protocol lines go to a private copy of stdout; fd 1 becomes stderr, so anything
    # an implementation prints cannot corrupt the protocol or block on a full pipe.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    unix_inode = os.stat(args.unix).st_ino if args.unix is not None else None
    stop = StopPipe()
    stats = servers.Stats()
    status = 0
    try:
        if sock.family == socket.AF_UNIX:
            host, port, path, transport = None, None, args.unix, "unix"
        else:
            host, port = sock.getsockname()[:2]
            path, transport = None, "tcp"
        ready = {
            "impl": args.impl,
            "transport": transport,
            "host": host,
            "port": port,
            "path": path,
            "pid": os.getpid(),
            "cpu": sorted(os.sched_getaffinity(0)),
            "python": sys.version.split()[0],
            "malloc_probe": allocator_probe(),
            "fd_limit": fd_limit,
        }
        start = implementation_hook(serve, "start")
        if start is not None:
            try:
                ready["worker_pid"] = start(sock, stats)
            except servers.MissingDependency as exc:
                print("%s: %s" % (PROG, exc), file=sys.stderr)
                return EXIT_MISSING
            except servers.Broken as exc:
                print("%s: %s" % (PROG, exc), file=sys.stderr)
                return EXIT_BROKEN
            except Exception as exc:
                print("%s: %s failed to start: %s: %s" % (PROG, args.impl, type(exc).__name__, exc),
                      file=sys.stderr)
                return EXIT_FAILED
        if not _emit(channel, "READY " + json.dumps(ready)):
            return EXIT_FAILED  # a started worker dies with us (its parent-death signal)
        try:
            serve(sock, stop.read_fd, stats)
        except Exception as exc:
            print("%s: %s failed: %s: %s" % (PROG, args.impl, type(exc).__name__, exc),
                  file=sys.stderr)
            status = EXIT_FAILED
        stop.ignore_more()
        report = {
            "impl": args.impl,
            **_usage(serve),
            "accepted": stats.accepted,
            "bytes": stats.bytes,
            "errors": stats.errors,
            "signal": stop.signal,
        }
        _emit(channel, json.dumps(report))
    finally:
        sock.close()
        stop.close()
        if unix_inode is not None:
            _remove_own_socket(args.unix, unix_inode)
        try:
            channel.close()
        except BrokenPipeError:
            pass
    return status


if __name__ == "__main__":
    sys.exit(main())
