"""Starting and stopping server processes under test (``python -m pyconcbench.serve``).

A server never outlives its test: ``ServerProcess`` stops it on exit from its ``with`` block,
a finalizer kills it when the object is collected or the interpreter exits, and the server asks
the kernel for SIGTERM on its parent's death (and its guard sends SIGKILL to its process group
when it has not stopped ``procs.ORPHAN_GRACE`` seconds after that, removing its socket's
temporary directory: ``procs.start_guard``).  That last one follows the parent *thread* that
started it, so start servers from a thread that lives as long as they should.

Size: the server under test's whole life (allocator states, pinning plan, pre-flight
connections, usage report, the plain reference servers' variant) in one place; spawning,
stopping and reaping are ``pyconcbench.procs``'.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pyconcbench import instruments, loopback, netsim, plain, procs, servers
from pyconcbench.serve import Unusable, implementation_hook

STDERR_TAIL_LINES = 20

#: The allocator states a server is measured in.
#:
#: glibc serves a malloc above its mmap threshold (128 KiB at start) with an mmap of its own,
#: and raises the threshold to a block's size when such a block is freed.  An asyncio transport
#: receives into a new 256 KiB bytes object per read and shrinks it to what arrived (an mremap,
#: which never moves the threshold), so a process that has never freed a big block maps, remaps
#: and unmaps on every read.  The first read that finds end-of-file frees its whole 256 KiB
#: buffer, which moves the threshold for good: any server that has seen one client disconnect
#: keeps those buffers on the heap (4x the round trips per second here).
#:
#: ``representative`` (default): before the measurement, ``PREFLIGHT_CONNECTIONS`` clients each
#: connect, exchange one message and disconnect -- the history every real server has.
#: ``pristine``: none; the server has never seen a connection close (what the suite measured
#: before, and what a benchmark that starts a fresh server per run sees).
#: ``tuned``: representative, with glibc's thresholds fixed by the environment
#: (``MALLOC_TUNED_ENV``; this turns glibc's dynamic threshold off).
MALLOC_STATES = ("representative", "pristine", "tuned")
MALLOC_DEFAULT = "representative"
MALLOC_TUNED_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "8388608"}
PREFLIGHT_CONNECTIONS = 3
PREFLIGHT_MESSAGE = b"pyconcbench preflight".ljust(64, b".")
PREFLIGHT_TIMEOUT = 10.0
#: Pre-flight connections per worker of a server with several (the kernel picks the worker).
PREFLIGHT_PER_WORKER = 8
#: How long check_alive waits for serve to exit after one of its workers died (for its line).
WORKER_FAILURE_WAIT = 3.0
#: The most worker processes a server may run (``pyconcbench.serve --workers``).
MAX_WORKERS = 256


def workers_note(workers: int, cpus: int) -> str:
    """The note of a server whose workers outnumber its CPUs ('' when they do not)."""
    if workers <= 1 or workers <= cpus:
        return ""
    return "%d workers on %d CPU%s: a functional check, not a scaling figure" % (workers, cpus, "" if cpus == 1 else "s")


class ServerError(RuntimeError):
    pass


class ServerUnavailable(ServerError):
    """The implementation is not available here: a tool not on PATH, a package not installed,
    or a release that does not run on this Python (serve's exit code 3).  The only skip."""


class ServerUnsupported(ServerUnavailable):
    """The implementation, as installed, does not do what the case asks (serve's exit code 6:
    a transport its release cannot serve).  A skip even in a strict run: nothing is missing."""


class ServerBroken(ServerError):
    """The project's own code for the implementation does not import or build (serve's exit
    code 4, or the Go peer's build in ``prepare``): a bug, never a skip.  One line."""


@dataclass(frozen=True)
class ServerUsage:
    """A stopped server's own report: CPU seconds, peak RSS and what it counted."""

    impl: str
    user: float
    system: float
    maxrss_kib: int
    accepted: int
    bytes: int
    errors: int
    signal: Optional[str]
    #: with workers: each one's pid, CPU and counts ({"pid", "cpu", "accepted", "bytes", "errors"})
    per_worker: Tuple[Dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name in ("user", "system"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError("ServerUsage.%s: expected seconds >= 0, got %r" % (name, value))
        for name in ("maxrss_kib", "accepted", "bytes", "errors"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("ServerUsage.%s: expected an integer >= 0, got %r" % (name, value))
        if self.signal is not None and not isinstance(self.signal, str):
            raise ValueError("ServerUsage.signal: expected a name or None, got %r" % (self.signal,))

    @classmethod
    def from_dict(cls, data: dict) -> "ServerUsage":
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError("server usage report lacks %s: %r" % (", ".join(missing), data))
        values = {f.name: data[f.name] for f in fields if f.name in data}
        if "per_worker" in values:
            rows = values["per_worker"]
            if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
                raise ValueError("ServerUsage.per_worker: expected a list of objects, got %r" % (rows,))
            values["per_worker"] = tuple(rows)
        return cls(**values)

    def as_dict(self) -> dict:
        """The report as serve printed it (``per_worker`` only for a server with workers)."""
        out = dataclasses.asdict(self)
        if not self.per_worker:
            del out["per_worker"]
        else:
            out["per_worker"] = [dict(row) for row in self.per_worker]
        return out


@dataclass(frozen=True)
class PinningPlan:
    """Which CPU the server and the load generator run on (None: not pinned), and why."""

    server_cpu: Optional[int]
    load_cpu: Optional[int]
    note: str


def cpus_available() -> List[int]:
    return sorted(os.sched_getaffinity(0))


def pinning_plan(server_cpu: int = 0, load_cpu: int = 1) -> PinningPlan:
    """Keeps the requested CPUs when both are available, else takes the first two available
    ones; with a single CPU nothing is pinned."""
    if server_cpu == load_cpu:
        raise ValueError("server and load generator need different CPUs, both are %d" % server_cpu)
    cpus = cpus_available()
    if len(cpus) < 2:
        return PinningPlan(None, None, "pinning off: only one CPU available")
    if server_cpu in cpus and load_cpu in cpus:
        return PinningPlan(
            server_cpu, load_cpu, "server on CPU %d, load generator on CPU %d" % (server_cpu, load_cpu)
        )
    return PinningPlan(
        cpus[0], cpus[1],
        "CPUs %d and %d not both available (allowed: %s): server on CPU %d, load generator on "
        "CPU %d" % (server_cpu, load_cpu, cpus, cpus[0], cpus[1]),
    )


def child_servers() -> List[int]:
    """Pids of this process's children running pyconcbench.serve: empty unless one leaked."""
    me = os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmdline = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == me and b"pyconcbench.serve" in cmdline:
            pids.append(int(name))
    return pids


def prepare(impl: str) -> None:
    """Runs the one-time preparation of an external peer (building the Go program, see
    ``pyconcbench.servers.peers``) in this process, so that it does not count against the
    server's READY timeout.  Only implementations that run tools on PATH have any.  A tool or
    package missing is left for the server to report, in its one line; our own code that does
    not import or build (the Go peer's source) raises ServerBroken here, at once."""
    spec = servers.IMPLS.get(impl)
    if spec is None or not spec.tools:
        return
    broken = None
    try:
        hook = implementation_hook(servers.load(impl), "prepare")
        if hook is not None:
            hook()
    except servers.MissingDependency:
        pass
    except servers.Broken as exc:
        broken = str(exc)
    if broken is not None:
        raise ServerBroken(broken)  # outside the except: no chained traceback


class ServerProcess:
    """One ``python -m pyconcbench.serve IMPL`` child process.

    ``python`` is the interpreter to run it with (another venv, another Python version);
    ``malloc`` the allocator state it is measured in (see ``MALLOC_STATES``): unless
    ``pristine``, ``start()`` ends with the pre-flight connections, and the counts of the usage
    report leave them out.  ``netns``: the path of a network namespace (``pyconcbench.netsim``)
    the server runs in, entered before exec; the harness's own connections to it (pre-flight,
    readiness) are made there too, and so must the load generator's.

    ``cpu``: the server's CPU, or a set of CPUs (a sequence); ``workers``: how many worker
    processes serve (``pyconcbench.serve --workers``), spread over the set one per CPU, round
    robin, all on the one CPU otherwise.  With workers, the CPU time and memory read while it
    runs are summed over the serve process and its workers (``measured_pids``; resident pages
    shared since the fork count in each), and the pre-flight makes ``PREFLIGHT_PER_WORKER``
    connections per worker (the kernel spreads them: a worker is very likely, not certain, to
    have seen one close).
    """

    def __init__(
        self,
        impl: str,
        *,
        transport: str = "tcp",
        host: str = "127.0.0.1",
        unix_path: Optional[str] = None,
        cpu: Union[None, int, Sequence[int]] = 0,
        ready_timeout: float = 15.0,
        stop_timeout: float = 10.0,
        env: Optional[dict] = None,
        python: str = sys.executable,
        malloc: str = MALLOC_DEFAULT,
        netns: Optional[str] = None,
        workers: int = 1,
    ) -> None:
        if transport not in ("tcp", "unix"):
            raise ValueError("transport must be 'tcp' or 'unix', not %r" % (transport,))
        if transport == "tcp":
            loopback.address(host)  # NotLoopback is a ValueError
        cpus: Tuple[int, ...] = () if cpu is None else (cpu,) if isinstance(cpu, int) else tuple(cpu)
        for one in cpus:
            if one not in cpus_available():
                raise ValueError("cannot pin the server to CPU %r: allowed CPUs are %s"
                                 % (one, cpus_available()))
        if cpu is not None and not cpus:
            raise ValueError("the server's CPU set is empty")
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise ValueError("workers must be 1 .. %d, not %r" % (MAX_WORKERS, workers))
        if ready_timeout <= 0 or stop_timeout <= 0:
            raise ValueError("ready_timeout and stop_timeout must be > 0")
        if malloc not in MALLOC_STATES:
            raise ValueError("malloc must be one of %s, not %r" % (", ".join(MALLOC_STATES), malloc))
        self.impl = impl
        self.malloc = malloc
        self.transport = transport
        self.host = host
        self.unix_path = unix_path
        self.cpus = cpus
        self.cpu = cpus[0] if cpus else None  # a program not of ours is pinned to the first
        self.workers = workers
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(env or {})
        if malloc == "tuned":
            self.env.update(MALLOC_TUNED_ENV)
        self.python = python
        self.netns = netns
        self.ready: Optional[dict] = None
        self._child: Optional[procs.Child] = None
        self._tmpdir: Optional[str] = None
        self._stopped = False
        self._usage: Optional[ServerUsage] = None
        self._stop_error: Optional[ServerError] = None
        self._stderr_text: Optional[str] = None
        self.preflight_connections = 0  # made by preflight(), left out of the usage counts

    def __repr__(self) -> str:
        pid = self._child.pid if self._child is not None else None
        return "<ServerProcess %s pid=%s %s>" % (
            self.impl, pid, self.address if self.ready is not None else "not ready")

    # -- life cycle ------------------------------------------------------------------------

    def argv(self) -> List[str]:
        argv = [self.python, "-m", "pyconcbench.serve", self.impl]
        if self.transport == "unix":
            argv += ["--unix", self.unix_path]
        else:
            argv += ["--host", self.host, "--port", "0"]
        if self.cpus:
            argv += ["--cpu", ",".join(map(str, self.cpus))]
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        return argv

    def start(self) -> "ServerProcess":
        """Starts the server (after its one-time preparation, see ``prepare``) and waits for
        its READY line; raises ServerError (killing the process) if it exits or stays silent,
        ServerUnavailable if it is not available here (the only skip), ServerBroken if the
        project's own code for it does not import or build."""
        if self._child is not None:
            raise ServerError("server %r already started" % self.impl)
        prepare(self.impl)
        if self.transport == "unix" and self.unix_path is None:
            self._tmpdir = procs.make_tmpdir("sock")
            self.unix_path = os.path.join(self._tmpdir, "echo.sock")
        env = dict(os.environ)
        env.pop(procs.TMPDIR_ENV, None)
        if self._tmpdir is not None:
            env[procs.TMPDIR_ENV] = self._tmpdir  # serve (and its guard) remove it, even when we die
        if self.malloc != "tuned":
            for name in MALLOC_TUNED_ENV:  # the state is --malloc's, not the caller's environment's
                env.pop(name, None)
        # Without cached bytecode the server compiles its modules at start, and the compiler
        # frees blocks large enough to move glibc's mmap threshold: a "pristine" server would
        # not be (measured: READY's malloc_probe 'heap' instead of 'mmap').  Let it cache them.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(self.env)
        self._child = procs.Child(self.argv(), env=env, cpu=self._exec_cpu(), tmpdir=self._tmpdir,
                                  netns=self.netns)
        try:
            self._child.start()
        except procs.ChildError as exc:
            raise ServerError("cannot start server %r: %s" % (self.impl, exc)) from None
        try:
            self.ready = self._wait_ready()
            if self.malloc != "pristine":
                self.preflight(PREFLIGHT_CONNECTIONS if self.workers == 1 else PREFLIGHT_PER_WORKER * self.workers)
        except BaseException as exc:
            self._abort_start(exc)
            raise
        return self

    @property
    def workers_note(self) -> str:
        """'4 workers on 1 CPU: a functional check, not a scaling figure' when the workers
        outnumber the server's CPUs (its set, or every CPU allowed when it is not pinned); ''
        otherwise."""
        if self.workers == 1:
            return ""
        return workers_note(self.workers, len(self.cpus) if self.cpus else len(cpus_available()))

    def _abort_start(self, exc: BaseException) -> None:
        """After a start that failed past the spawn: the child killed, and every later stop()
        raises what went wrong."""
        self._child.close()
        self._stopped = True
        self._stop_error = exc if isinstance(exc, ServerError) else ServerError(
            "server %r did not start: %r" % (self.impl, exc))

    def _exec_cpu(self) -> Optional[int]:
        """The CPU to pin to before exec: none, serve pins itself (--cpu) and says why it cannot."""
        return None

    def preflight(self, connections: int = PREFLIGHT_CONNECTIONS) -> None:
        """``connections`` clients, one after the other, each connect, send one 64-byte message,
        read its echo back and disconnect: the history of any server that has been in use (see
        MALLOC_STATES).  Raises ServerError when the server does not echo within
        PREFLIGHT_TIMEOUT."""
        address = self.address
        family = socket.AF_UNIX if self.transport == "unix" else (
            socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
        deadline = time.monotonic() + PREFLIGHT_TIMEOUT
        for _ in range(connections):
            try:
                with self.client_socket(family) as sock:
                    sock.settimeout(max(0.1, deadline - time.monotonic()))
                    sock.connect(address)
                    sock.sendall(PREFLIGHT_MESSAGE)
                    got = b""
                    while len(got) < len(PREFLIGHT_MESSAGE):
                        chunk = sock.recv(len(PREFLIGHT_MESSAGE) - len(got))
                        if not chunk:
                            break
                        got += chunk
            except OSError as exc:
                raise ServerError(self._with_stderr("server %r failed the pre-flight connection: %s"
                                                    % (self.impl, exc))) from None
            if got != PREFLIGHT_MESSAGE:
                raise ServerError(self._with_stderr("server %r echoed %r to the pre-flight message"
                                                    % (self.impl, got[:80])))
            self.preflight_connections += 1

    def client_socket(self, family: int) -> socket.socket:
        """A stream socket made in the server's network namespace (``netns``; here without one),
        to connect to it; ServerError (one line) when the namespace cannot be entered."""
        try:
            with netsim.entered(self.netns):
                return socket.socket(family, socket.SOCK_STREAM)
        except netsim.NetworkError as exc:
            raise ServerError("server %r: %s" % (self.impl, exc)) from None

    def _wait_ready(self) -> dict:
        try:
            line = self._child.read_line(self.ready_timeout)
        except TimeoutError:
            self._child.close()
            raise ServerError(self._with_stderr(
                "server %r did not print READY within %g s" % (self.impl, self.ready_timeout)
            )) from None
        if line is None:
            self._raise_exited_before_ready()
        return self._parse_ready(line)

    def _exit_code_before_ready(self) -> Optional[int]:
        code = self._child.wait(self.stop_timeout)
        self._child.close()  # closed its stdout but lived on: killed
        return code if code is not None else self._child.returncode

    def _parse_ready(self, line: bytes) -> dict:
        if not line.startswith(b"READY "):
            self._child.close()
            raise ServerError(self._with_stderr(
                "server %r printed %r instead of READY" % (self.impl, line[:200])
            ))
        try:
            ready = json.loads(line[len(b"READY "):])
        except ValueError:
            ready = None
        if not isinstance(ready, dict):
            self._child.close()
            raise ServerError(self._with_stderr(
                "server %r printed an unreadable READY line: %r" % (self.impl, line[:200])
            ))
        return ready

    def _raise_exited_before_ready(self) -> None:
        code = self._exit_code_before_ready()
        lines = self.stderr_text().strip().splitlines()
        line = lines[-1] if lines else "(stderr empty)"
        if code == procs.EXIT_UNSUPPORTED:
            raise ServerUnsupported(line)
        if code == procs.EXIT_MISSING:
            raise ServerUnavailable(line)
        if code == procs.EXIT_BROKEN:
            raise ServerBroken(line)
        if code == procs.EXIT_UNUSABLE:  # the harness asked for what cannot be: a failure
            raise ServerError("server %r cannot run as asked (exit code %d): %s" % (self.impl, code, line))
        raise ServerError(self._with_stderr(
            "server %r exited with code %s before READY" % (self.impl, code)
        ))

    def stop(self) -> ServerUsage:
        """SIGTERM, then SIGKILL after stop_timeout; returns the server's usage report.
        Idempotent: later calls return the same report (or raise the same error)."""
        if self._child is None:
            raise ServerError("server %r was never started" % self.impl)
        if not self._stopped:
            self._stopped = True
            try:
                self._usage = self._stop()
            except ServerError as exc:
                self._stop_error = exc
            finally:
                self._child.close()
        if self._stop_error is not None:
            raise self._stop_error
        return self._usage

    def _stop(self) -> ServerUsage:
        code = self._child.stop(self.stop_timeout)
        if self._child.killed:
            raise ServerError(self._with_stderr(
                "server %r ignored SIGTERM for %g s and was killed (SIGKILL)"
                % (self.impl, self.stop_timeout)
            ))
        if code != 0:
            raise ServerError(self._with_stderr("server %r exited with code %s" % (self.impl, code)))
        self._stdout = self._child.out
        lines = self._stdout.decode("utf-8", "replace").strip().splitlines()
        try:
            report = json.loads(lines[-1])
            if self.preflight_connections and isinstance(report, dict):
                for key, made in (("accepted", self.preflight_connections),
                                  ("bytes", self.preflight_connections * len(PREFLIGHT_MESSAGE))):
                    if isinstance(report.get(key), int) and not isinstance(report[key], bool):
                        report[key] = max(0, report[key] - made)
            return ServerUsage.from_dict(report)
        except (IndexError, ValueError, TypeError) as exc:
            raise ServerError(self._with_stderr(
                "server %r gave no usable usage report (%s); stdout: %r"
                % (self.impl, exc, self._stdout[-500:])
            )) from None

    def __enter__(self) -> "ServerProcess":
        if self._child is None:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._child is None or self._stopped:
            return
        try:
            self.stop()
        except ServerError:
            if exc_type is None:
                raise  # otherwise the body's own error is the one worth seeing

    # -- while it runs ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self._child is None:
            raise ServerError("server %r was never started" % self.impl)
        return self._child.pid

    @property
    def measured_pid(self) -> int:
        """The process whose CPU and memory are the server's: the worker READY names as
        ``worker_pid`` (an external peer such as go_net, started by serve), else serve itself."""
        worker = (self.ready or {}).get("worker_pid")
        if isinstance(worker, int) and not isinstance(worker, bool) and worker > 0:
            return worker
        return self.pid

    @property
    def worker_pids(self) -> Tuple[int, ...]:
        """The worker processes READY names (``--workers`` N > 1); () otherwise."""
        pids = (self.ready or {}).get("worker_pids") or ()
        return tuple(p for p in pids if isinstance(p, int) and not isinstance(p, bool) and p > 0)

    @property
    def measured_pids(self) -> Tuple[int, ...]:
        """Every process whose CPU and memory are the server's: serve and its workers (with
        ``--workers`` N > 1), else ``measured_pid`` alone."""
        workers = self.worker_pids
        return (self.pid,) + workers if workers else (self.measured_pid,)

    @property
    def address(self) -> Union[Tuple[str, int], str]:
        """(host, port) for TCP, the socket path for UNIX."""
        if self.ready is None:
            raise ServerError("server %r is not ready" % self.impl)
        if self.transport == "unix":
            return self.ready["path"]
        return (self.ready["host"], self.ready["port"])

    def check_alive(self) -> None:
        if self._child is None:
            raise ServerError("server %r was never started" % self.impl)
        code = self._child.poll()
        if code is not None:
            if self.worker_pids:
                raise ServerError(self._worker_failure(code))
            raise ServerError(self._with_stderr(
                "server %r (pid %d) exited with code %s" % (self.impl, self._child.pid, code)
            ))
        for index, pid in enumerate(self.worker_pids):
            state = _process_state(pid)
            if state in (None, "Z", "X"):  # gone, or dead and not yet reaped by serve
                # serve is stopping the others and will exit with the line naming the one that died
                code = self._child.wait(WORKER_FAILURE_WAIT)
                if code is not None:
                    raise ServerError(self._worker_failure(code))
                raise ServerError("server %r: worker %d of %d (pid %d) is %s" % (
                    self.impl, index + 1, len(self.worker_pids), pid, "gone" if state is None else "dead"))

    def _worker_failure(self, code: Optional[int]) -> str:
        """One line: the server with workers exited; serve's own line about the worker when it wrote one."""
        mine = "server %r (pid %d) exited with code %s" % (self.impl, self._child.pid, code)
        lines = [line for line in self.stderr_text().strip().splitlines() if " worker " in line]
        return mine + (": " + lines[-1].split(": ", 1)[-1] if lines else "")

    def cpu_times(self) -> Tuple[float, float]:
        """The server's own (user, system) CPU seconds so far, children excluded (of
        ``measured_pid``: serve, or the worker doing its serving); with workers, summed over
        serve and its workers."""
        if self.worker_pids:
            self.check_alive()
            times = [t for t in map(instruments.process_cpu, self.measured_pids) if t is not None]
            return sum(t[0] for t in times), sum(t[1] for t in times)
        stat = self._read_proc("stat")
        # Fields 14 and 15 (utime, stime), counted after the parenthesised command name.
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / ticks, int(fields[12]) / ticks

    def rss_kib(self) -> int:
        """Resident memory of ``measured_pid`` now."""
        return self._status_kib("VmRSS")

    def peak_rss_kib(self) -> int:
        """Peak resident memory of ``measured_pid`` so far."""
        return self._status_kib("VmHWM")

    def stderr_text(self) -> str:
        """Everything the server wrote to stderr so far."""
        return self._child.stderr_text() if self._child is not None else ""

    # -- helpers ---------------------------------------------------------------------------

    def _status_kib(self, key: str) -> int:
        if self.worker_pids:  # summed over serve and its workers
            self.check_alive()
            return instruments.status_kib_total(self.measured_pids, key) or 0
        for line in self._read_proc("status").splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        self.check_alive()
        raise ServerError("no %s in /proc/%d/status" % (key, self.measured_pid))

    def _read_proc(self, name: str) -> str:
        self.check_alive()
        pid = self.measured_pid
        try:
            with open("/proc/%d/%s" % (pid, name)) as f:
                return f.read()
        except OSError as exc:
            self.check_alive()
            raise ServerError("cannot read /proc/%d/%s: %s" % (pid, name, exc)) from None

    def _with_stderr(self, message: str) -> str:
        tail = self.stderr_text().rstrip().splitlines()[-STDERR_TAIL_LINES:]
        if not tail:
            return message + " (stderr empty)"
        return message + "; stderr:\n" + "\n".join("    " + line for line in tail)


class PlainServer(ServerProcess):
    """A plain reference server (``pyconcbench.plain``): the script is run by path, so no
    pyconcbench code is in its process.  It announces itself with ``serving on ADDRESS``, is
    pinned and tied to this process before it runs (preexec), gets the same pre-flight
    connections as any server (``malloc``), and is stopped with SIGTERM, whose default action
    ends it.  It counts nothing: ``stop()`` returns None, and its CPU and memory are read from /proc while it runs.

    ``impl`` is the implementation it is the counterpart of (``asyncio_protocol``)."""

    def __init__(self, impl: str, **kwargs) -> None:
        if impl not in plain.PLAIN:
            raise ValueError("no plain reference server for %r; there are: %s"
                             % (impl, ", ".join(plain.PLAIN)))
        if kwargs.get("malloc") == "tuned":
            raise ValueError("a plain server is measured representative or pristine, not tuned")
        if kwargs.get("workers", 1) != 1:
            raise ValueError("a plain reference server is one process of its own: it runs with 1 worker, not %r"
                             % (kwargs["workers"],))
        super().__init__(plain.PREFIX + impl, **kwargs)
        self.counterpart = impl

    def argv(self) -> List[str]:
        argv = [self.python, plain.script_path(self.counterpart)]
        if self.transport == "unix":
            return argv + ["--unix", self.unix_path]
        return argv + ["--host", self.host, "--port", "0"]

    def start(self) -> "PlainServer":
        for name in plain.PLAIN[self.counterpart].requires:
            if importlib.util.find_spec(name) is None:
                raise ServerUnavailable("plain %s server needs %s: pip install 'pyconcbench[%s]'"
                                        % (self.counterpart, name, name))
        super().start()
        return self

    def _exec_cpu(self) -> Optional[int]:
        return self.cpu  # pinned before its own code runs: it is a plain script, no --cpu

    def _raise_exited_before_ready(self) -> None:
        # serve's exit codes mean nothing here: any exit before READY of a script of ours is a failure
        code = self._exit_code_before_ready()
        raise ServerError(self._with_stderr("server %r exited with code %s before READY" % (self.impl, code)))

    def _parse_ready(self, line: bytes) -> dict:
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith("serving on "):
            self._child.close()
            raise ServerError(self._with_stderr(
                "plain server %r printed %r instead of 'serving on ADDRESS'" % (self.impl, text[:200])))
        where = text[len("serving on "):].strip()
        ready = {"impl": self.impl, "transport": self.transport, "pid": self._child.pid,
                 "host": None, "port": None, "path": None}
        if self.transport == "unix":
            ready["path"] = where
        else:
            host, _, port = where.rpartition(":")
            if not port.isdigit():
                self._child.close()
                raise ServerError(self._with_stderr(
                    "plain server %r announced an unreadable address: %r" % (self.impl, where)))
            ready["host"], ready["port"] = host.strip("[]"), int(port)
        return ready

    def _stop(self) -> None:  # type: ignore[override]
        code = self._child.stop(self.stop_timeout)
        if self._child.killed:
            raise ServerError(self._with_stderr(
                "plain server %r ignored SIGTERM for %g s and was killed (SIGKILL)"
                % (self.impl, self.stop_timeout)))
        if code not in (0, -signal.SIGTERM):
            raise ServerError(self._with_stderr("plain server %r exited with code %s" % (self.impl, code)))
        return None


# ---- a server the user brings: any program (--pcb-server-cmd) ---------------------------------

#: The placeholders of a server command (exactly one): what the harness hands the program, and
#: the transports each can serve.  ``{port}``: a free loopback TCP port; ``{unix}``: a socket
#: path in a temporary directory of ours; ``{fd}``: the number of an inherited socket the
#: harness already bound and listens on (TCP or UNIX, by the case's transport).
COMMAND_PLACEHOLDERS: Dict[str, Tuple[str, ...]] = {
    "{port}": ("tcp",), "{unix}": ("unix",), "{fd}": ("tcp", "unix")}
#: The prefix of a command server's default name in test ids (``cmd_my-server``).
COMMAND_PREFIX = "cmd_"
#: How often readiness is polled (a connect to where the program should listen).
LISTEN_POLL = 0.02
#: Lines of a command server's stderr quoted in its one-line errors.
COMMAND_STDERR_LINES = 3
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def parse_command(text: str) -> Tuple[List[str], str]:
    """A server command's words (split as a POSIX shell would, no shell run) and its one
    placeholder; ValueError (one line) for no words, unbalanced quotes, or not exactly one of
    ``{port}``, ``{unix}``, ``{fd}``."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a command line: {exc}") from None
    if not argv:
        raise ValueError("the server command is empty")
    found = [(p, sum(word.count(p) for word in argv)) for p in COMMAND_PLACEHOLDERS]
    total = sum(n for _, n in found)
    if total != 1:
        which = ", ".join(COMMAND_PLACEHOLDERS)
        got = "none" if total == 0 else ", ".join(f"{p} x{n}" for p, n in found if n)
        raise ValueError(f"{text!r} needs exactly one of {which} where the program is told where to "
                         f"listen (got {got}), e.g. 'my-server --port {{port}}'")
    if "{" in argv[0] and any(p in argv[0] for p in COMMAND_PLACEHOLDERS):
        raise ValueError(f"{text!r}: the placeholder cannot be the program itself")
    return argv, next(p for p, n in found if n)


def command_transports(text: str) -> Tuple[str, ...]:
    """The transports a server command can serve (by its placeholder)."""
    return COMMAND_PLACEHOLDERS[parse_command(text)[1]]


def command_name(argv: Sequence[str]) -> str:
    """The default name of a command server in test ids: ``cmd_`` and its program's basename
    (past an ``env [-opts] NAME=VALUE ...`` in front), other characters than [A-Za-z0-9_.-]
    made ``_``."""
    words = list(argv)
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if "=" not in w and not w.startswith("-")] or words
    return COMMAND_PREFIX + _NAME_CHARS.sub("_", os.path.basename(words[0]) or "server")


def check_name(name: str) -> str:
    """A name given to a command server (--pcb-server-name): [A-Za-z0-9_.-], not a project
    implementation's.  ValueError (one line) otherwise."""
    if not name or _NAME_CHARS.search(name):
        raise ValueError(f"{name!r} is not a server name: use letters, digits and _ . - only")
    if name in servers.IMPLS or name.startswith(plain.PREFIX):
        raise ValueError(f"{name!r} is the name of one of the project's servers: choose another")
    return name


def _process_state(pid: int) -> Optional[str]:
    """The state letter of /proc/PID/stat (R, S, Z, ...), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_tree(leader: int) -> List[int]:
    """``leader`` and every process descended from it or in its process group (a daemon's
    double fork leaves the tree but not the group), from /proc; [] when the leader is gone."""
    parents: Dict[int, int] = {}
    group: List[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(name)
        parents[pid] = int(fields[1])
        if int(fields[2]) == leader:
            group.append(pid)
    if leader not in parents:
        return []
    tree = {leader} | set(group)
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return sorted(tree)


class CommandServer(ServerProcess):
    """Any program as an echo server, from a command line with one placeholder
    (``COMMAND_PLACEHOLDERS``), run without a shell.  ``name`` is its implementation name in
    test ids.  It prints nothing we read (its stdout and stderr go to one file, quoted in its
    errors); it is ready once a connection to where it should listen succeeds (polled every
    ``LISTEN_POLL`` s within ``ready_timeout``), gets the pre-flight connections of its
    allocator state, is pinned to the server CPU before exec, and stopped like every child
    (SIGTERM to its process group, SIGKILL after ``stop_timeout``: a failure).  Its CPU time
    and memory are those of its whole process tree (``measured_pids``: such programs fork
    workers).  It counts nothing: ``stop()`` returns None."""

    def __init__(self, command: str, name: Optional[str] = None, **kwargs) -> None:
        argv, placeholder = parse_command(command)
        name = check_name(name) if name is not None else command_name(argv)
        transport = kwargs.get("transport", "tcp")
        if transport not in COMMAND_PLACEHOLDERS[placeholder]:
            raise ValueError(f"server command {command!r} cannot serve {transport}: its {placeholder} "
                             f"serves {' and '.join(COMMAND_PLACEHOLDERS[placeholder])} only")
        kwargs.pop("python", None)  # not a Python program of ours
        if kwargs.get("workers", 1) != 1:
            raise ValueError(f"server command {command!r} runs its own processes: it runs with 1 worker, "
                             f"not {kwargs['workers']!r}")
        super().__init__(name, **kwargs)
        self.command = command
        self.template = argv
        self.placeholder = placeholder
        self.where = ""  # where it should listen, in words (for its errors)
        self._listener: Optional[socket.socket] = None

    def argv(self) -> List[str]:
        return list(self.template)  # before start(): still with its placeholder

    def start(self) -> "CommandServer":
        """Starts the program and waits until it listens (connect polled); ServerError (one line,
        the process group killed) when it exits first, never listens within ready_timeout, or
        fails the pre-flight echoes.  A ``{port}`` program that exits before listening is
        started once more on a new port (see ``_free_port``)."""
        if self._child is not None:
            raise ServerError("server %r already started" % self.impl)
        tries = 2 if self.placeholder == "{port}" else 1
        for attempt in range(tries):
            try:
                self._start_once()
                break
            except _ExitedEarly as exc:
                if attempt + 1 < tries:
                    self._child = None  # closed: started again below, on a new port
                    continue
                error = ServerError(str(exc))
            except ServerError as exc:
                error = exc
            self._stopped = True
            self._stop_error = error
            raise error from None
        try:
            if self.malloc != "pristine":
                self._preflight()
        except BaseException as exc:
            self._abort_start(exc)
            raise
        return self

    def _start_once(self) -> None:
        pass_fds: Tuple[int, ...] = ()
        host, port, path = None, None, None
        if self.transport == "unix":
            self._tmpdir = procs.make_tmpdir("cmd")  # removed with the child (procs.Child)
            path = os.path.join(self._tmpdir, "echo.sock")
        if self.placeholder == "{port}":
            host, port = self.host, _in_namespace(self.netns, _free_port, self.host)
            value = str(port)
            self.where = "%s:%d" % (host, port) if ":" not in host else "[%s]:%d" % (host, port)
        elif self.placeholder == "{unix}":
            value = path
            self.where = path
        else:
            try:
                self._listener = _in_namespace(self.netns, _listening_socket, self.transport, self.host, path)
            except OSError as exc:
                raise ServerError("cannot listen on %s for server command %r: %s"
                                  % (path or self.host, self.command, exc)) from None
            if self.transport == "tcp":
                host, port = self._listener.getsockname()[:2]
            pass_fds = (self._listener.fileno(),)
            value = str(self._listener.fileno())
            self.where = "fd %s (%s)" % (value, path if path else "%s:%d" % (host, port))
        argv = [word.replace(self.placeholder, value) for word in self.template]
        self.unix_path = path
        env = dict(os.environ)
        env.pop(procs.TMPDIR_ENV, None)
        if self.malloc != "tuned":
            for name in MALLOC_TUNED_ENV:  # the state is --malloc's, not the caller's environment's
                env.pop(name, None)
        env.update(self.env)
        self.command = shlex.join(argv)
        self._child = procs.Child(argv, env=env, cpu=self._exec_cpu(), tmpdir=self._tmpdir,
                                  pass_fds=pass_fds, stdout_to_stderr=True, netns=self.netns)
        try:
            try:
                self._child.start()
            finally:
                if self._listener is not None:  # the program has its own copy now
                    self._listener.close()
                    self._listener = None
        except procs.ChildError as exc:
            self._child.close()
            raise ServerError("server command %r cannot start: %s" % (self.command, exc)) from None
        self.ready = {"impl": self.impl, "transport": self.transport, "pid": self._child.pid,
                      "host": host, "port": port, "path": path, "command": self.command}
        try:
            self._wait_listening()
        except BaseException:
            self._child.close()
            self.ready = None
            raise

    def _wait_listening(self) -> None:
        family = socket.AF_UNIX if self.transport == "unix" else (
            socket.AF_INET6 if ":" in self.ready["host"] else socket.AF_INET)
        address = self.address
        deadline = time.monotonic() + self.ready_timeout
        while True:
            self._raise_if_exited()
            try:
                with self.client_socket(family) as sock:
                    sock.settimeout(1.0)
                    sock.connect(address)
                self._raise_if_exited()  # {fd}: the socket listens from the start; is it still there?
                return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise ServerError(self._with_stderr("server command %r did not listen on %s within %g s"
                                                    % (self.command, self.where, self.ready_timeout)))
            time.sleep(LISTEN_POLL)

    def _raise_if_exited(self) -> None:
        code = self._child.poll()
        if code is not None:
            raise _ExitedEarly(self._with_stderr("server command %r exited with code %s before listening on %s"
                                                 % (self.command, code, self.where)))

    def _preflight(self) -> None:
        try:
            self.preflight()
        except ServerError:
            self._raise_if_exited_as_error()
            raise

    def _raise_if_exited_as_error(self) -> None:
        self._child.wait(min(1.0, self.stop_timeout))  # its sockets close before it can be reaped
        try:
            self._raise_if_exited()
        except _ExitedEarly as exc:
            raise ServerError(str(exc)) from None

    def _exec_cpu(self) -> Optional[int]:
        return self.cpu  # pinned before exec: not a program of ours, no --cpu

    def _stop(self) -> None:  # type: ignore[override]
        code = self._child.stop(self.stop_timeout)
        if self._child.killed:
            raise ServerError(self._with_stderr("server command %r ignored SIGTERM for %g s and was killed (SIGKILL)"
                                                % (self.command, self.stop_timeout)))
        if code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
            raise ServerError(self._with_stderr("server command %r exited with code %s when stopped"
                                                % (self.command, code)))
        return None

    def check_alive(self) -> None:
        if self._child is None:
            raise ServerError("server %r was never started" % self.impl)
        code = self._child.poll()
        if code is not None:
            raise ServerError(self._with_stderr("server command %r (pid %d) exited with code %s"
                                                % (self.command, self._child.pid, code)))

    @property
    def measured_pids(self) -> Tuple[int, ...]:
        """Its whole process tree now (the workers it forked included)."""
        return tuple(process_tree(self.pid)) or (self.pid,)

    def cpu_times(self) -> Tuple[float, float]:
        """(user, system) CPU seconds so far, summed over its process tree (children that have
        exited and been reaped by it count in its own cumulative times only if it waited for them)."""
        self.check_alive()
        times = [t for t in map(instruments.process_cpu, self.measured_pids) if t is not None]  # None: exited meanwhile
        return sum(t[0] for t in times), sum(t[1] for t in times)

    def rss_kib(self) -> int:
        """Resident memory of its process tree now (shared pages counted in each process)."""
        return self._tree_kib("VmRSS")

    def peak_rss_kib(self) -> int:
        """The sum of its processes' peaks: an upper bound of the tree's peak."""
        return self._tree_kib("VmHWM")

    def _tree_kib(self, key: str) -> int:
        self.check_alive()
        return instruments.status_kib_total(self.measured_pids, key) or 0

    def _with_stderr(self, message: str) -> str:
        """One line: the message and the last lines the program wrote (stdout and stderr)."""
        tail = self.stderr_text().strip().splitlines()[-COMMAND_STDERR_LINES:]
        if not tail:
            return message + " (stderr empty)"
        return message + "; stderr: " + " | ".join(line.strip() for line in tail)


class _ExitedEarly(ServerError):
    """A command server that exited before it listened (started once more when on {port})."""


def _in_namespace(netns: Optional[str], fn, *args):
    """``fn(*args)`` with this thread in the network namespace ``netns`` (None: here); its
    NetworkError as a ServerError."""
    try:
        with netsim.entered(netns):
            return fn(*args)
    except netsim.NetworkError as exc:
        raise ServerError(str(exc)) from None


def _free_port(host: str) -> int:
    """A free loopback TCP port for a ``{port}`` command: bound to port 0, read, closed.  Not
    the house rule (a server binds port 0 and keeps the socket) because the program binds it
    itself; another process may take the port in the moment between (the kernel hands out
    ephemeral ports in a spread-out order, so this is rare), and the program then fails to
    listen: CommandServer.start() starts it once more on a new port.  ``{fd}`` has no race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _listening_socket(transport: str, host: str, path: Optional[str]) -> socket.socket:
    """The listening socket a ``{fd}`` command inherits: loopback TCP port 0 or the UNIX path,
    the kernel's largest backlog (so an accept queue of ours never overflows), inheritable."""
    if transport == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: Union[str, Tuple[str, int]] = path
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        target = (host, 0)
    try:
        sock.bind(target)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
