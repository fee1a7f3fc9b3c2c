"""The server process under test: bind loopback, announce, serve one implementation, report.

    python -m pyconcbench.serve IMPL [--host H] [--port P] [--unix PATH] [--cpu CPUS] [--backlog N]
                                     [--workers N]

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

``--workers N`` (N > 1) runs N worker processes of the implementation, forked once it is
loaded, each calling ``serve(sock, stop_fd, stats)`` in its own process: over TCP each worker
has a listening socket of its own on the same port (``SO_REUSEPORT``, set before every bind:
the kernel spreads the connections over them), over UNIX they share one inherited listening
socket.  This process then only supervises: READY (with ``workers`` and ``worker_pids``) once
every worker runs, a stop signal passed on to every worker, the report's counts, CPU seconds
and peak RSS summed over the workers and itself.  A worker that dies before the stop makes
the server fail (exit 1) with one line naming it.  External peers (a ``start`` hook: go_net,
node_net) are refused for N > 1 (exit 2): they are programs of their own.

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
import time
from typing import List, Optional, Sequence, Tuple

from pyconcbench import loopback, servers
from pyconcbench.procs import (EXIT_BROKEN, EXIT_FAILED, EXIT_MISSING, EXIT_UNSUPPORTED, EXIT_UNUSABLE, TMPDIR_ENV, arm_parent_death,
                               set_parent_death_signal,
                               cpu_set, start_guard)

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
        "--cpu", metavar="CPUS", type=_cpu_set, default=None,
        help="pin the server to CPU N, or to a set of CPUs (0,2 or 0-3); with --workers, worker i runs on "
        "the set's CPU i modulo its size. Default: no pinning",
    )
    parser.add_argument(
        "--workers", metavar="N", type=_workers, default=1,
        help="worker processes, each serving (SO_REUSEPORT sockets over TCP, one shared socket over "
        "UNIX). Default: %(default)r",
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


#: The most worker processes one server may run.
MAX_WORKERS = 256


def _workers(text: str) -> int:
    value = _non_negative(text)
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError("must be 1 .. %d: %r" % (MAX_WORKERS, text))
    return value


def _cpu_set(text: str) -> Tuple[int, ...]:
    """--cpu: procs.cpu_set, its error argparse's."""
    try:
        return cpu_set(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def pin(cpus: "int | Sequence[int]") -> None:
    cpus = (cpus,) if isinstance(cpus, int) else tuple(cpus)
    try:
        os.sched_setaffinity(0, set(cpus))
    except (OSError, ValueError, OverflowError) as exc:
        raise Unusable(
            "cannot pin to CPU %s (allowed: %s): %s"
            % (",".join(map(str, cpus)), sorted(os.sched_getaffinity(0)), exc)
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


def listen_reuseport(args, count: int) -> List[socket.socket]:
    """``count`` listening TCP sockets on one loopback port, SO_REUSEPORT set on each before its
    bind: the first on ``--port`` (0: the kernel chooses), the others on the port it got."""
    host = loopback_address(args.host or "127.0.0.1")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    port = args.port or 0
    socks: List[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(args.backlog)
            port = sock.getsockname()[1]
    except OSError as exc:
        for sock in socks:
            sock.close()
        where = "[%s]:%d" % (host, port) if family == socket.AF_INET6 else "%s:%d" % (host, port)
        raise Unusable("cannot bind %s with SO_REUSEPORT (socket %d of %d): %s"
                       % (where, len(socks), count, exc)) from None
    return socks


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


#: How long the workers may take to start serving, and to report once told to stop (the
#: harness kills the whole process group after its own stop timeout anyway).
WORKER_START_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 60.0
#: How long a worker whose pipe closed may take to exit before it is killed and reaped.
WORKER_REAP_TIMEOUT = 5.0


def describe_status(status: int) -> str:
    """'exited with code 1', 'killed by SIGKILL': a wait status in words."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return "exited with code %d" % code
    try:
        return "killed by %s" % signal.Signals(-code).name
    except ValueError:
        return "killed by signal %d" % -code


class Workers:
    """The worker processes of ``--workers N``: forked once the implementation is loaded, each
    serving its own socket (TCP, SO_REUSEPORT) or the one shared socket (UNIX); supervised over
    a pipe each (a line ``serving`` once it runs, then its counts as JSON, then EOF when it
    exits); stopped with SIGTERM; reaped with their resource usage."""

    def __init__(self, impl: str, serve, socks: List[socket.socket], count: int,
                 cpus: Optional[Sequence[int]]) -> None:
        self.impl = impl
        self.serve = serve
        self.socks = socks
        self.count = count
        self.cpus = tuple(cpus) if cpus else ()
        self.parent = os.getpid()
        self.pids: List[int] = []
        self.fds: List[int] = []  # the read end of each worker's pipe
        self.buffers: List[bytes] = []
        self.serving: List[bool] = []
        self.results: List[Optional[dict]] = []
        self.statuses: List[Optional[int]] = []
        self.rusages: List[Optional[resource.struct_rusage]] = []
        self.open: List[bool] = []

    def cpu_of(self, index: int) -> Optional[int]:
        return self.cpus[index % len(self.cpus)] if self.cpus else None

    def name(self, index: int) -> str:
        return "worker %d of %d (pid %d)" % (index + 1, self.count, self.pids[index])

    # -- in this process ---------------------------------------------------------------------

    def start(self, close_in_child: Sequence[int]) -> None:
        """Forks the workers.  The stop signals are blocked around each fork, so that none runs
        this process's handler in a child before the child has installed its own (a signal sent
        meanwhile stays pending here, and is passed on to the workers at the stop)."""
        for index in range(self.count):
            read_fd, write_fd = os.pipe()
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                pid = os.fork()
            except OSError as exc:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read_fd)
                os.close(write_fd)
                raise Unusable("cannot start worker %d of %d: fork: %s" % (index + 1, self.count, exc)) from None
            if pid == 0:
                os.close(read_fd)
                self._child(index, write_fd, close_in_child, mask)  # never returns
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(write_fd)
            self.pids.append(pid)
            self.fds.append(read_fd)
            self.buffers.append(b"")
            self.serving.append(False)
            self.results.append(None)
            self.statuses.append(None)
            self.rusages.append(None)
            self.open.append(True)

    def wait_serving(self, stop_fd: int, timeout: float) -> Optional[str]:
        """Until every worker serves: None; the stop pipe firing first: None too (the stop
        follows); else the one line why not (a worker ended, or was too slow)."""
        deadline = time.monotonic() + timeout
        while not all(self.serving):
            if self._pump(stop_fd, deadline):
                return None
            ended = self.first_ended()
            if ended is not None:
                return ended
            if time.monotonic() >= deadline:
                slow = [self.name(i) for i, ok in enumerate(self.serving) if not ok]
                return "%s did not start serving within %g s" % (slow[0], timeout)
        return None

    def supervise(self, stop_fd: int) -> Optional[str]:
        """Until the stop pipe fires (None) or a worker ends before it (the one line naming it)."""
        while True:
            if self._pump(stop_fd, None):
                return None
            ended = self.first_ended()
            if ended is not None:
                return ended

    def first_ended(self) -> Optional[str]:
        for index, is_open in enumerate(self.open):
            if not is_open:
                self._reap(index)
                return "%s %s before the server was stopped" % (self.name(index),
                                                               describe_status(self.statuses[index]))
        return None

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> List[str]:
        """SIGTERM to every worker still running, their reports read until ``timeout``, then
        SIGKILL to any left; every worker reaped.  Returns one line per worker that did not stop
        cleanly."""
        for index, pid in enumerate(self.pids):
            if self.open[index]:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        while any(self.open) and time.monotonic() < deadline:
            self._pump(None, deadline)
        problems = []
        for index, pid in enumerate(self.pids):
            if self.open[index]:
                problems.append("%s did not stop within %g s of SIGTERM: killed" % (self.name(index), timeout))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._reap(index)
            status = self.statuses[index]
            if not any(p.startswith(self.name(index)) for p in problems):
                if status is None or os.waitstatus_to_exitcode(status) != 0:
                    problems.append("%s %s" % (self.name(index), describe_status(status) if status is not None
                                                else "could not be reaped"))
                elif self.results[index] is None:
                    problems.append("%s exited without its report" % self.name(index))
        return problems

    def close(self) -> None:
        for index, fd in enumerate(self.fds):
            if self.open[index]:
                self.open[index] = False
                os.close(fd)

    def usage(self) -> dict:
        """The counts, CPU seconds and peak RSS summed over the workers (those reaped) and this
        process (the peaks summed: pages shared since the fork count in each)."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        out = {"user": own.ru_utime, "system": own.ru_stime, "maxrss_kib": own.ru_maxrss,
               "accepted": 0, "bytes": 0, "errors": 0}
        per_worker = []
        for index, pid in enumerate(self.pids):
            ru = self.rusages[index]
            if ru is not None:
                out["user"] += ru.ru_utime
                out["system"] += ru.ru_stime
                out["maxrss_kib"] += ru.ru_maxrss
            counts = self.results[index] or {}
            row = {"pid": pid, "cpu": self.cpu_of(index)}
            for key in ("accepted", "bytes", "errors"):
                value = counts.get(key, 0)
                out[key] += value
                row[key] = value
            per_worker.append(row)
        out["per_worker"] = per_worker
        return out

    def _pump(self, stop_fd: Optional[int], deadline: Optional[float]) -> bool:
        """Reads what the workers wrote, once there is something (or until ``deadline``);
        True when ``stop_fd`` is readable."""
        import select

        fds = [fd for fd, is_open in zip(self.fds, self.open) if is_open]
        if stop_fd is not None:
            fds.append(stop_fd)
        if not fds:
            return False
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            readable, _, _ = select.select(fds, [], [], wait)
        except InterruptedError:  # a signal: its handler wrote to the stop pipe, look again
            return False
        for fd in readable:
            if fd == stop_fd:
                return True
            index = self.fds.index(fd)
            data = os.read(fd, 65536)
            if not data:
                self.open[index] = False
                os.close(fd)
                continue
            self.buffers[index] += data
            while b"\n" in self.buffers[index]:
                line, _, self.buffers[index] = self.buffers[index].partition(b"\n")
                if line == b"serving":
                    self.serving[index] = True
                else:
                    try:
                        self.results[index] = json.loads(line)
                    except ValueError:
                        pass
        return False

    def _reap(self, index: int) -> None:
        if self.statuses[index] is not None:
            return
        pid = self.pids[index]
        deadline = time.monotonic() + WORKER_REAP_TIMEOUT
        while True:
            try:
                got, status, ru = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                self.statuses[index] = 255 << 8  # not ours to reap (cannot happen: our child)
                return
            if got == pid:
                self.statuses[index], self.rusages[index] = status, ru
                return
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                _, status, ru = os.wait4(pid, 0)
                self.statuses[index], self.rusages[index] = status, ru
                return
            time.sleep(0.005)

    # -- in a worker ---------------------------------------------------------------------------

    def _child(self, index: int, write_fd: int, close_in_child: Sequence[int], mask) -> None:
        status = EXIT_BROKEN
        try:
            set_parent_death_signal(signal.SIGTERM)
            if os.getppid() != self.parent:  # the server died before the signal was armed
                status = EXIT_FAILED
                return
            for fd in list(close_in_child) + self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            sock = self.socks[index] if len(self.socks) > 1 else self.socks[0]
            for other in self.socks:
                if other is not sock:
                    other.close()
            cpu = self.cpu_of(index)
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            stop = StopPipe()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            stats = servers.Stats()
            os.write(write_fd, b"serving\n")
            status = 0
            try:
                self.serve(sock, stop.read_fd, stats)
            except Exception as exc:
                print("%s: %s failed in worker %d of %d: %s: %s"
                      % (PROG, self.impl, index + 1, self.count, type(exc).__name__, exc), file=sys.stderr)
                status = EXIT_FAILED
            stop.ignore_more()
            os.write(write_fd, (json.dumps({**stats.as_dict(), "signal": stop.signal}) + "\n").encode())
        except BaseException as exc:
            try:
                print("%s: worker %d of %d: %s: %s" % (PROG, index + 1, self.count, type(exc).__name__, exc),
                      file=sys.stderr)
            except BaseException:
                pass
            status = status or EXIT_FAILED
        finally:
            try:
                sys.stderr.flush()
            except BaseException:
                pass
            os._exit(status)


def _serve_workers(args, serve, socks: List[socket.socket], ready: dict, channel, stop: StopPipe) -> int:
    """Runs ``--workers N``: forks them, READY once every one serves, the stop passed on, the
    summed report.  Returns the exit status."""
    group = Workers(args.impl, serve, socks, args.workers, args.cpu)
    try:
        group.start([stop.read_fd, stop.write_fd, channel.fileno()])
        for sock in socks:  # the workers hold them now: one that dies takes its socket with it
            sock.close()
        failed = group.wait_serving(stop.read_fd, WORKER_START_TIMEOUT)
        if failed is None:
            ready.update(workers=args.workers, worker_pids=list(group.pids),
                         worker_cpus=[group.cpu_of(i) for i in range(args.workers)])
            if not _emit(channel, "READY " + json.dumps(ready)):
                group.stop(WORKER_REAP_TIMEOUT)
                return EXIT_FAILED
            failed = group.supervise(stop.read_fd)
        stop.ignore_more()
        problems = group.stop()
        if failed is not None:
            print("%s: %s: %s" % (PROG, args.impl, failed), file=sys.stderr)
            return EXIT_FAILED
        if problems:
            print("%s: %s: %s" % (PROG, args.impl, "; ".join(problems)), file=sys.stderr)
            return EXIT_FAILED
        _emit(channel, json.dumps({"impl": args.impl, **group.usage(), "signal": stop.signal}))
        return 0
    finally:
        group.close()
        for pid, status in zip(group.pids, group.statuses):
            if status is None:  # an error of ours on the way: none is left behind
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass


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
        if args.workers > 1 and implementation_hook(serve, "start") is not None:
            raise Unusable("%s runs as a program of its own (an external peer): --workers %d applies to the "
                           "implementations that serve inside %s; give --workers 1"
                           % (args.impl, args.workers, PROG))
        if args.workers > 1 and args.unix is None:
            socks = listen_reuseport(args, args.workers)
        else:
            socks = [listen(args)]
        sock = socks[0]
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
        if args.workers > 1:
            return _serve_workers(args, serve, socks, ready, channel, stop)
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
        for each in socks:
            each.close()
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
