"""Counting a server's system calls and context switches over a measured interval.

``perf stat`` with syscall tracepoints is the tool (cheap per event; it works with software
events and tracepoints on VMs where hardware counters do not).  Enabling ~370 tracepoints
takes perf over ten seconds, so it counts a fixed list of the calls an echo server makes plus
``raw_syscalls:sys_enter`` (every call, unnamed): whatever is not on the list shows as
``other``.  Counting starts and stops exactly around the measured rounds through perf's
control FIFOs.  ``strace -c -f`` is the fallback: complete, but it slows the server many times.

Tracing perturbs the server: rates measured with it on are lower than without.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from . import procs

#: The calls an echo server, its event loop and its allocator make (perf counts these by name).
NAMED = (
    "read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg", "recvmmsg",
    "sendmmsg", "epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "poll", "ppoll",
    "select", "pselect6", "accept", "accept4", "close", "shutdown", "getsockopt", "setsockopt",
    "getsockname", "getpeername", "ioctl", "fcntl", "mmap", "munmap", "mremap", "brk",
    "madvise", "futex", "sched_yield", "nanosleep", "clock_nanosleep", "rt_sigreturn",
    "rt_sigprocmask", "getpid", "gettid", "io_uring_enter",
)
#: What the explanation pass names (pyconcbench.explain): the calls its findings read.  Fewer
#: than NAMED because perf's set-up and tear-down grow with the tracepoints (measured: 0.6 s for
#: 5, 1.1 s for 20, 2.0 s for 45), and this runs once per implementation in every run.
EXPLAIN = (
    "read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg", "epoll_wait",
    "epoll_pwait", "epoll_ctl", "poll", "ppoll", "select", "futex", "mmap", "munmap", "mremap", "brk",
    "madvise", "sched_yield", "io_uring_enter",
)
#: The allocator's calls: what a server in the pristine state makes per read (see
#: pyconcbench.harness.MALLOC_STATES).
ALLOCATOR = ("mmap", "munmap", "mremap", "brk", "madvise")
SETUP_TIMEOUT = 30.0
FINISH_TIMEOUT = 30.0


class SyscallCountError(RuntimeError):
    """The counter could not start or gave no usable output."""


def available_tool() -> Optional[str]:
    """'perf' or 'strace' (the first that is on PATH and works here), or None."""
    if shutil.which("perf"):
        probe = subprocess.run(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "--", "true"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and "raw_syscalls:sys_enter" in probe.stderr:
            return "perf"
    if shutil.which("strace"):
        return "strace"
    return None


class SyscallCounter:
    """Counts the syscalls of process ``pid`` (all its threads) between start() and stop();
    with perf, by name those of ``names`` (default: ``NAMED``), the rest as ``other``."""

    def __init__(self, pid: int, tool: Optional[str] = None, names: Sequence[str] = NAMED):
        self.pid = pid
        self.names = tuple(names)
        self.tool = tool or available_tool()
        if self.tool is None:
            raise SyscallCountError("counting syscalls needs perf (linux-perf) or strace on PATH")
        self._dir = procs.make_tmpdir("sys")  # its maker's pid in the name: a later run sweeps it
        self._out = os.path.join(self._dir, "out.txt")
        self._proc: Optional[subprocess.Popen] = None
        self._ctl: Optional[int] = None
        self._ack: Optional[int] = None

    # -- perf ----------------------------------------------------------------------------

    def _perf_argv(self) -> List[str]:
        events: List[str] = []
        for name in self.names:
            events += ["-e", f"syscalls:sys_enter_{name}"]
        ctl, ack = os.path.join(self._dir, "ctl"), os.path.join(self._dir, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        return ["perf", "stat", "-x,", "-o", self._out, "-D", "-1",
                "--control", f"fifo:{ctl},{ack}", *events, "-e", "raw_syscalls:sys_enter",
                "-e", "context-switches", "-e", "cpu-migrations", "-p", str(self.pid)]

    def _perf_command(self, word: str) -> None:
        assert self._ctl is not None and self._ack is not None
        os.write(self._ctl, word.encode() + b"\n")
        deadline = time.monotonic() + SETUP_TIMEOUT
        got = b""
        while b"ack" not in got:  # perf answers "ack\n\0"
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise SyscallCountError(f"perf did not acknowledge {word!r}: {self._stderr()}")
            try:
                chunk = os.read(self._ack, 64)
            except BlockingIOError:
                chunk = b""
            if not chunk:  # nothing yet (or perf has not opened its end)
                time.sleep(0.01)
            got += chunk

    def _stderr(self) -> str:
        """What the tool said, once it has exited (reading a live one's pipe could block)."""
        if self._proc is None or self._proc.stderr is None or self._proc.poll() is None:
            return ""
        try:
            return self._proc.stderr.read().decode(errors="replace").strip()[-300:]
        except (OSError, ValueError):
            return ""

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> "SyscallCounter":
        """Attaches, and returns once counting has begun."""
        if self.tool == "perf":
            argv = self._perf_argv()
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
            # Opening the FIFOs blocks until perf opens its ends; bound it with the process.
            ctl_path, ack_path = argv[argv.index("--control") + 1][5:].split(",")
            self._ctl = self._open_fifo(ctl_path, os.O_WRONLY)
            self._ack = self._open_fifo(ack_path, os.O_RDONLY | os.O_NONBLOCK)
            self._perf_command("enable")
        else:
            self._proc = subprocess.Popen(
                ["strace", "-c", "-f", "-q", "-o", self._out, "-p", str(self.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)  # strace has no "attached" signal; it attaches in milliseconds
            if self._proc.poll() is not None:
                raise SyscallCountError(f"strace exited at once: {self._stderr()}")
        return self

    def _open_fifo(self, path: str, flags: int) -> int:
        deadline = time.monotonic() + SETUP_TIMEOUT
        while True:
            try:
                return os.open(path, flags | (os.O_NONBLOCK if flags & os.O_WRONLY else 0))
            except OSError:  # ENXIO: no reader yet (a non-blocking writer cannot wait)
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise SyscallCountError(f"perf did not start: {self._stderr()}") from None
                time.sleep(0.01)

    def stop(self) -> Dict[str, int]:
        """Stops counting and returns {syscall name: count, 'total': n, 'context_switches': n,
        'cpu_migrations': n} (strace gives no context switches)."""
        if self._proc is None:
            raise SyscallCountError("counter was not started")
        try:
            if self.tool == "perf":
                self._perf_command("disable")
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(FINISH_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                raise SyscallCountError(f"{self.tool} did not finish within {FINISH_TIMEOUT:g} s") from None
            with open(self._out, encoding="utf-8", errors="replace") as f:
                text = f.read()
            return parse_perf(text) if self.tool == "perf" else parse_strace(text)
        finally:
            self.close()

    def close(self) -> None:
        for fd in (self._ctl, self._ack):
            if fd is not None:
                os.close(fd)
        self._ctl = self._ack = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def parse_perf(text: str) -> Dict[str, int]:
    """Counts from ``perf stat -x,`` output; '<not counted>' is 0."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        if len(fields) < 3:
            continue
        value, event = fields[0], fields[2]
        count = int(value) if value.isdigit() else 0
        if event.startswith("syscalls:sys_enter_"):
            if count:
                out[event[len("syscalls:sys_enter_"):]] = count
        elif event == "raw_syscalls:sys_enter":
            out["total"] = count
        elif event in ("context-switches", "cpu-migrations"):
            out[event.replace("-", "_")] = count
    if "total" not in out:
        raise SyscallCountError("perf output has no raw_syscalls:sys_enter count")
    named = sum(v for k, v in out.items() if k not in ("total", "context_switches", "cpu_migrations"))
    out["other"] = max(0, out["total"] - named)
    return out


def parse_strace(text: str) -> Dict[str, int]:
    """Counts from ``strace -c`` 's summary table."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(fields) >= 5 and fields[0].replace(".", "", 1).isdigit() and fields[-1] != "total":
            try:
                out[fields[-1]] = int(fields[3])
            except ValueError:
                continue
        elif fields[-1:] == ["total"] and len(fields) >= 4:
            try:
                out["total"] = int(fields[3])
            except ValueError:
                pass
    if "total" not in out:
        raise SyscallCountError("strace output has no total line")
    out["other"] = 0
    return out


def per_message(counts: Dict[str, int], messages: int) -> Dict[str, float]:
    """Counts divided by round trips, largest first, rounded to 3 decimals."""
    if messages <= 0:
        return {}
    items = sorted(counts.items(), key=lambda kv: -kv[1])
    return {k: round(v / messages, 3) for k, v in items if v}
