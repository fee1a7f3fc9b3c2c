"""Child processes, one way for the whole suite: the server under test (harness), the plain
reference servers, the ZeroMQ server process, the Go/Node/C peers, the A/B workers.

``Child`` starts a program with its stdout piped (its stdin too for a line protocol:
``write_line``) and stderr to a temporary file (or inherited),
in a process group of its own, with the parent-death signal armed between fork and exec (and a
check that the parent is still there), optionally pinned to a CPU.  ``read_line`` waits for the
``READY`` line with a deadline; ``stop`` sends SIGTERM to the group, reads what the child prints
until it exits, and sends SIGKILL to the group after the timeout; every child is reaped with
``wait4`` (so its resource usage is known) and nothing of it is left open.  A child the caller
forgets is killed and reaped when the ``Child`` is collected.

A child of ours (``pyconcbench.serve``) also starts a guard (``start_guard``): if the parent
dies, even by SIGKILL, and the child has not stopped on the parent-death SIGTERM within
``ORPHAN_GRACE`` seconds, the guard removes the child's temporary directory and sends SIGKILL
to its process group.  Temporary directories are made by ``make_tmpdir`` with their maker's
pid in the name; ``sweep_stale_tmpdirs`` removes those of makers that are gone.

The exit codes a child of ours reports, and what each means to the parent, are here too.
No pytest; stdlib only, and ``netsim`` to enter a network namespace.
"""
from __future__ import annotations

import ctypes
import os
import re
import select
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence

from . import netsim

#: Exit codes of our children (``pyconcbench.serve``, ``pyconcbench.zmq.server``).
EXIT_OK = 0
EXIT_FAILED = 1      #: failed while running (or the parent died before the death signal was armed)
EXIT_UNUSABLE = 2    #: cannot run as asked (bad arguments, a CPU it may not use, bind failed): a failure
EXIT_MISSING = 3     #: not available here (a package or tool missing): the only skip
EXIT_BROKEN = 4      #: our own code does not import or build: a failure
EXIT_FAULT = 5       #: stopped by a fault injected on purpose (the ZeroMQ server's --fault, in tests)
EXIT_UNSUPPORTED = 6  #: the implementation, as installed, does not do what was asked (a transport): a skip, strict or not
MEANINGS = {EXIT_OK: "ok", EXIT_FAILED: "failed", EXIT_UNUSABLE: "cannot run as asked",
            EXIT_MISSING: "not available here", EXIT_BROKEN: "our own code is broken",
            EXIT_FAULT: "stopped by an injected fault", EXIT_UNSUPPORTED: "not supported by the implementation"}

#: The environment variable a child reads to check its parent is still the one that started it.
PARENT_ENV = "PCB_PARENT_PID"
PR_SET_PDEATHSIG = 1
STDERR_TAIL_LINES = 20
#: After SIGKILL, how long to wait for the kernel to reap a child.
KILL_TIMEOUT = 5.0

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no parent-death signal
    _prctl = None


def meaning(code: Optional[int]) -> str:
    """What a child's exit code (or -signal) means, in a few words."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return MEANINGS.get(code, f"exit code {code}")


def set_parent_death_signal(signum: int) -> None:
    """Asks the kernel to send ``signum`` when the parent dies (Linux; a no-op elsewhere).  The
    kernel ties this to the parent *thread* that forked us, not the whole process."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signum)


def arm_parent_death(signum: int = signal.SIGTERM) -> bool:
    """In a child of ours: the parent-death signal armed; False when the parent that started us
    (``PCB_PARENT_PID``) is already gone, so the child should exit (EXIT_FAILED)."""
    set_parent_death_signal(signum)
    parent = os.environ.get(PARENT_ENV, "")
    return not (parent.isdigit() and os.getppid() != int(parent))


# ---- the backstop when the parent dies --------------------------------------------------------

#: How long a child of ours may take to stop cleanly after its parent died (the parent-death
#: SIGTERM), before its guard sends SIGKILL to its whole process group.
ORPHAN_GRACE = 5.0
#: The environment variable naming a temporary directory a child owns (its UNIX socket's):
#: removed by the child's guard after a SIGKILL, and by the child itself when it stops.
TMPDIR_ENV = "PCB_TMPDIR"


def _parent_pidfd(parent: int) -> Optional[int]:
    """A pidfd of ``parent`` (readable once it exits), or None where the kernel or Python has
    none (before Linux 5.3 / Python 3.9): then the guard polls."""
    try:
        return os.pidfd_open(parent)
    except (AttributeError, OSError):
        return None


def _guard(leader: int, parent: int, pidfd: Optional[int], grace: float, remove: Sequence[str]) -> None:
    """The guard process (never returns): waits for ``parent`` to exit, gives the process
    group ``grace`` seconds to stop on the parent-death signal, removes ``remove``, then sends
    SIGKILL to the group (itself included).  It dies with ``leader`` (its parent-death signal
    SIGKILL), so a child that stops in time takes its guard along."""
    try:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != leader:
            os._exit(0)
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the protocol pipe above all: the parent must see it close
            os.dup2(devnull, fd)
        keep = sorted({devnull} | ({pidfd} if pidfd is not None else set()))
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 65536)
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while _pid_alive(parent):
                time.sleep(1.0)
        time.sleep(grace)  # the leader stopping in time ends this process (its death signal)
        for path in remove:
            shutil.rmtree(path, ignore_errors=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(0)


def start_guard(grace: float = ORPHAN_GRACE, remove: Sequence[str] = ()) -> Optional[int]:
    """In a child of ours, early and before any thread starts: forks a small guard process into
    this process group that outlives the parent that started us (``PCB_PARENT_PID``) by at most
    ``grace`` seconds -- then it removes ``remove`` (directories) and sends SIGKILL to the whole
    group, so a child that ignores or hangs on the parent-death SIGTERM, with its threads and
    the processes it started in its group, is still gone.  Returns the guard's pid, or None
    when there is no parent of ours to watch (started by hand), or when this process does not
    lead its own process group (then the group is someone else's)."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or os.getppid() != int(parent):
        return None
    if os.getpgrp() != os.getpid():  # not our own group (not started by Child): never kill another's
        return None
    parent_pid = int(parent)
    pidfd = _parent_pidfd(parent_pid)
    if os.getppid() != parent_pid:  # it died while the pidfd was opened: it may be another process's
        if pidfd is not None:
            os.close(pidfd)
        return None
    leader = os.getpid()
    pid = os.fork()
    if pid == 0:
        _guard(leader, parent_pid, pidfd, grace, tuple(remove))
    if pidfd is not None:
        os.close(pidfd)
    return pid


# ---- temporary directories -----------------------------------------------------------------------

#: ``pcb-KIND-PID-XXXXXXXX``: a temporary directory of ours, and the process that made it.
_TMPDIR_NAME = re.compile(r"pcb-[a-z]+-(\d+)-[A-Za-z0-9_]+")


def make_tmpdir(kind: str) -> str:
    """A new private temporary directory ``pcb-KIND-PID-*`` (its maker's pid in its name, so a
    later run can tell it was left behind: ``sweep_stale_tmpdirs``)."""
    return tempfile.mkdtemp(prefix=f"pcb-{kind}-{os.getpid()}-")


#: A directory of a dead maker younger than this is left alone: its server may still be in the
#: guard's grace, or its maker may run in another PID namespace sharing /tmp (a container).
STALE_AGE = 600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, ValueError):  # no such pid can exist: a name made up by someone
        return False
    except OSError:  # alive, another user's
        return True
    return True


def sweep_stale_tmpdirs(where: Optional[str] = None) -> List[str]:
    """Removes this user's ``make_tmpdir`` directories whose maker no longer runs (a run killed
    before its clean-up: SIGKILL, OOM) and that were last touched ``STALE_AGE`` seconds ago or
    more; returns what it removed.  Never raises."""
    where = where or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        m = _TMPDIR_NAME.fullmatch(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(where, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and time.time() - st.st_mtime >= STALE_AGE:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class ChildError(RuntimeError):
    """A child that could not be started, or that did something the parent did not expect."""


def _reap(pid: int, proc: subprocess.Popen, stderr: Any, tmpdir: Optional[str]) -> None:
    """Kills the child's group if it still runs and releases what it held; safe to call twice."""
    if proc.returncode is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            _, status, _ = os.wait4(pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            proc.returncode = -signal.SIGKILL
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None and not pipe.closed:
            try:
                pipe.close()
            except OSError:  # stdin: a last line it never read (BrokenPipeError on the flush)
                pass
    if stderr is not None and not stderr.closed:
        stderr.close()
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)


class Child:
    """One child process.  ``cpu``: pinned there before exec (every thread inherits it);
    ``death_signal``: what it gets when this thread dies; ``capture_stderr``: to a temporary
    file (``stderr_text``), else inherited; ``tmpdir``: a directory removed with the child;
    ``stdin_pipe``: its stdin a pipe for ``write_line`` (a line protocol), else /dev/null;
    ``stdout_to_stderr``: its stdout goes where its stderr goes (a program that is not ours and
    may log freely: a pipe nobody reads would block it once full), no ``read_line``;
    ``netns``: the path of a network namespace (``pyconcbench.netsim``) it enters before exec,
    so every socket it makes is there (its pid stays its own: no ``ip netns exec`` in between)."""

    def __init__(self, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None,
                 pass_fds: Sequence[int] = (), cpu: Optional[int] = None,
                 death_signal: int = signal.SIGTERM, capture_stderr: bool = True,
                 tmpdir: Optional[str] = None, stdin_pipe: bool = False,
                 stdout_to_stderr: bool = False, netns: Optional[str] = None) -> None:
        self.argv: List[str] = list(argv)
        self.env = dict(os.environ if env is None else env)
        self.env[PARENT_ENV] = str(os.getpid())
        self.env["PYTHONUNBUFFERED"] = "1"
        self.pass_fds = tuple(pass_fds)
        self.cpu = cpu
        self.death_signal = death_signal
        self.capture_stderr = capture_stderr
        self.tmpdir = tmpdir
        self.stdin_pipe = stdin_pipe
        self.stdout_to_stderr = stdout_to_stderr
        self.netns = netns
        self.proc: Optional[subprocess.Popen] = None
        self.out = b""  # read from its stdout, not yet consumed
        self.rusage: Any = None
        self.killed = False  # it ignored SIGTERM and was killed
        self._stderr: Any = None
        self._stderr_text: Optional[str] = None
        self._finalizer: Any = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ChildError("not started")
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.returncode

    def start(self) -> "Child":
        """Starts it; ChildError (one line) when it cannot be executed."""
        parent, cpu, signum = os.getpid(), self.cpu, self.death_signal
        netns_fd = None
        if self.netns is not None:
            try:
                netns_fd = netsim.open_namespace(self.netns)  # close-on-exec: gone once it runs
            except netsim.NetworkError as exc:
                raise ChildError(f"cannot start {self.argv[0]}: {exc}") from None

        def setup() -> None:  # in the child, between fork and exec
            if netns_fd is not None:
                try:
                    netsim.setns(netns_fd)
                except OSError as exc:  # said on its stderr (a file of ours by now), one line
                    os.write(2, f"cannot enter network namespace {self.netns}: {exc.strerror}\n".encode())
                    os._exit(EXIT_UNUSABLE)
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            set_parent_death_signal(signum)
            if os.getppid() != parent:  # the parent died before the death signal was armed
                os._exit(EXIT_FAILED)

        self._stderr = tempfile.TemporaryFile() if self.capture_stderr else None
        try:
            stdin = subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL
            stdout = subprocess.PIPE
            if self.stdout_to_stderr:
                stdout = self._stderr if self._stderr is not None else None
            self.proc = subprocess.Popen(self.argv, stdin=stdin, stdout=stdout,
                                         stderr=self._stderr, env=self.env, pass_fds=self.pass_fds,
                                         preexec_fn=setup, start_new_session=True)
        except (OSError, subprocess.SubprocessError) as exc:
            if self._stderr is not None:
                self._stderr.close()
            raise ChildError(f"cannot start {self.argv[0]}: {exc}") from None
        finally:
            if netns_fd is not None:
                os.close(netns_fd)
        self._finalizer = weakref.finalize(self, _reap, self.proc.pid, self.proc, self._stderr, self.tmpdir)
        return self

    # -- while it runs -------------------------------------------------------------------------

    def read_line(self, timeout: float) -> Optional[bytes]:
        """The next line it prints (without the newline); None when its stdout closed first (it
        exited); TimeoutError when nothing complete came within ``timeout`` seconds."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.out:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line within {timeout:g} s")
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self.out += chunk
        line, _, self.out = self.out.partition(b"\n")
        return line

    def write_line(self, line: bytes) -> None:
        """Sends ``line`` and a newline to its stdin (``stdin_pipe``); ChildError (one line) when
        it closed its end (it exited).  The caller writes a line only after the answer to the
        previous one (a line protocol), so the pipe never fills and this never blocks."""
        if self.proc is None or self.proc.stdin is None:
            raise ChildError("no stdin pipe: started without stdin_pipe")
        try:
            self.proc.stdin.write(line + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError; ValueError: closed here already
            raise ChildError(f"cannot write to {self.argv[0]}: {exc}") from None

    def poll(self) -> Optional[int]:
        """Its exit code once it has exited (reaped here), else None."""
        if self.proc is None or self.proc.returncode is not None:
            return self.returncode
        self._wait4(os.WNOHANG)
        return self.proc.returncode

    def wait(self, timeout: float) -> Optional[int]:
        """Waits up to ``timeout`` for it to exit (reaping it); its exit code, or None."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.returncode

    def stderr_text(self) -> str:
        if self._stderr_text is not None:
            return self._stderr_text
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> List[str]:
        return self.stderr_text().strip().splitlines()[-lines:]

    def peak_rss_kib(self) -> Optional[int]:
        """VmHWM while it lives (not yet reaped), or None."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return None

    # -- the end ---------------------------------------------------------------------------

    def send_signal(self, signum: int) -> None:
        """``signum`` to its whole process group, while it is not yet reaped."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signum)
            except OSError:
                pass

    def stop(self, timeout: float, signum: int = signal.SIGTERM) -> int:
        """``signum`` to its group, its output read until it exits (``out``), SIGKILL to the group
        after ``timeout`` (``killed``), reaped; returns its exit code.  Idempotent."""
        if self.proc is None:
            raise ChildError("not started")
        self.send_signal(signum)  # nothing when it has been reaped already
        # what it printed is read to the end either way (exited and reaped by poll(), its
        # last lines may still wait in the pipe)
        if not self._drain_until_exit(timeout):
            self.killed = True
            self.send_signal(signal.SIGKILL)
            self._drain_until_exit(KILL_TIMEOUT)
        self.close()
        return self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL

    def run_to_end(self, timeout: float) -> Optional[int]:
        """Reads its stdout (``out``) until it exits, for at most ``timeout`` s; its exit code
        (reaped), or None when it still runs (the caller stops it)."""
        if self.proc is None:
            raise ChildError("not started")
        return self.proc.returncode if self._drain_until_exit(timeout) else None

    def close(self) -> None:
        """Kills it if it still runs, reaps it, releases its pipes and files."""
        if self._finalizer is not None and self._finalizer.alive:
            self._stderr_text = self.stderr_text()
            self._finalizer()

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _wait4(self, options: int) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            return True
        try:
            pid, status, rusage = os.wait4(self.proc.pid, options)
        except ChildProcessError:  # reaped elsewhere
            self.proc.returncode = self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL
            return True
        if pid == 0:
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.rusage = rusage
        return True

    def _drain_until_exit(self, timeout: float) -> bool:
        """Reads its stdout until EOF and reaps it, for at most ``timeout`` s; True once reaped."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            fd = self.proc.stdout.fileno()
            os.set_blocking(fd, False)
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if not sel.select(min(left, 0.05)):
                        if self._wait4(os.WNOHANG):
                            break  # exited; a grandchild may hold the pipe open
                        continue
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        break
                    self.out += chunk
        while True:
            if self.proc.returncode is not None or self._wait4(os.WNOHANG):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)


def cpu_set(text: str) -> Tuple[int, ...]:
    """'2' -> (2,); '0,2' -> (0, 2); '0-3' -> (0, 1, 2, 3): CPUs in the order given, no repeats
    (a child's pinning: ``serve --cpu``, and each half of ``--pcb-cpus``).  ValueError saying
    what is wrong."""
    out: List[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError("not a CPU, list or range (2, 0,2, 0-3): %r" % text)
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError("empty CPU range: %r" % part.strip())
        out.extend(range(first, last + 1))
    return tuple(dict.fromkeys(out))
