"""Echo servers outside Python ("peers"): a Go and a Node.js program that serve the listening
socket ``pyconcbench.serve`` bound, and the launcher that runs one of them in its place.

A peer inherits the listening socket (TCP or UNIX) and takes its descriptor number as its last
argument.  Its stdout carries two lines: ``READY`` once it serves, with its stop handlers in
place, and, after SIGTERM, SIGINT or SIGHUP, its counts as one JSON object
``{"accepted": N, "bytes": N, "errors": N}``, once it has closed every connection; then it exits
0.  Anything else it prints goes on to the launcher's stderr.

The CPU time and memory that matter are the peer's, not the launcher's, so a peer module
(``go_net``, ``node_net``) defines two hooks besides ``serve``, which ``pyconcbench.serve`` calls
when present:

    start(sock, stats) -> int   called before READY: starts the peer, waits for its READY,
                                returns its pid, which serve's READY carries as "worker_pid"
                                (the pid the harness measures)
    serve(sock, stop_fd, stats) waits for stop_fd (or the peer's early exit), stops the peer and
                                fills ``stats`` from the peer's report
    usage() -> dict or None     the peer's own user/system CPU seconds (from wait4) and peak
                                RSS (its VmHWM just before it was told to stop), once
                                ``serve`` has reaped it

and optionally ``prepare()``: one-time work that ``start`` would otherwise do before READY
(building the Go program), which ``pyconcbench.harness`` runs in its own process before it
starts the server so that it does not count against the READY timeout.

A peer asks the kernel for SIGKILL when the launcher dies, so it never outlives it, even when
``serve`` is never reached.

Why not wait4's ru_maxrss: at execve Linux folds the peak RSS of the process being replaced
into the new program's maxrss, and that process is the launcher's fork, as big as the Python
launcher; a small Go peer would report the launcher's size.  The peer's own VmHWM starts from
zero at execve.
"""
from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

from pyconcbench.servers import Stats

PR_SET_PDEATHSIG = 1
READY_LINE = b"READY"
#: How long a peer may take from exec to READY.
READY_TIMEOUT = 10.0
#: After SIGTERM, how long a peer has to report and exit before it is killed.  Shutdown must
#: take well under a second, connections open or not.
STOP_TIMEOUT = 0.75
#: After SIGKILL, how long to wait for the kernel to reap it.
KILL_TIMEOUT = 2.0
POLL_INTERVAL = 0.005
REPORT_FIELDS = ("accepted", "bytes", "errors")

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no parent-death signal
    _prctl = None


class PeerError(RuntimeError):
    """The peer failed: did not start, exited early, or stopped without a usable report."""


def source(name: str) -> str:
    """The path of a peer's source file shipped in this package (``echo.go``, ``echo.js``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def _describe(status: Optional[int]) -> str:
    if status is None:
        return "could not be reaped"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return "was killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "was killed by signal %d" % -code
    return "exited with code %d" % code


def _peak_rss_kib(pid: int) -> Optional[int]:
    """VmHWM of a live process (not yet reaped), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stray(line: bytes) -> None:
    """A line the peer printed outside the protocol: it belongs with its stderr."""
    print(line.decode("utf-8", "replace"), file=sys.stderr)


class Peer:
    """One external echo server process, started once, stopped once."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self.proc: Optional[subprocess.Popen] = None
        self._out = b""  # read from the peer's stdout, not yet consumed
        self._rusage = None
        self._peak_rss_kib: Optional[int] = None
        self._status: Optional[int] = None

    # -- the three hooks -------------------------------------------------------------------

    def start(self, argv: List[str], sock, env: Optional[Dict[str, str]] = None) -> int:
        """Starts ``argv`` + [listening fd] with the socket inherited and waits for its READY
        line; returns the peer's pid.  Its stderr is the launcher's.  Raises PeerError (the
        peer killed and reaped) when it exits or stays silent instead."""
        if self.proc is not None:
            raise PeerError("%s: peer already started" % self.impl)
        parent = os.getpid()

        def child_setup() -> None:  # runs in the child between fork and exec
            if _prctl is not None:
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the launcher died before the death signal was armed
                os._exit(1)

        self.proc = subprocess.Popen(
            argv + [str(sock.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None,
            pass_fds=(sock.fileno(),), env=dict(os.environ, **(env or {})),
            preexec_fn=child_setup,
        )
        why = self._wait_ready()
        if why is not None:
            self._stop()
            raise PeerError("%s peer (pid %d) %s" % (self.impl, self.proc.pid, why % {
                "status": _describe(self._status)}))
        return self.proc.pid

    def serve(self, stop_fd: int, stats: Stats) -> None:
        """Waits for ``stop_fd``, then stops the peer and copies its counts into ``stats``.
        Raises PeerError when the peer exits on its own or gives no usable report."""
        if self.proc is None:
            raise PeerError("%s: serve() called before start()" % self.impl)
        try:
            exited_early = not self._wait_stop(stop_fd)
        finally:
            self._stop()
        if exited_early:
            raise PeerError("%s peer (pid %d) %s before it was told to stop"
                            % (self.impl, self.proc.pid, _describe(self._status)))
        report = self._report()
        stats.accepted = report["accepted"]
        stats.bytes = report["bytes"]
        stats.errors = report["errors"]

    def usage(self) -> Optional[dict]:
        """The reaped peer's CPU seconds and peak RSS (KiB); None until it is reaped.  When
        the peer died before its VmHWM could be read, ru_maxrss stands in: an upper bound that
        may be the launcher's size (see the module docstring)."""
        if self._rusage is None:
            return None
        peak = self._peak_rss_kib if self._peak_rss_kib is not None else self._rusage.ru_maxrss
        return {
            "user": self._rusage.ru_utime,
            "system": self._rusage.ru_stime,
            "maxrss_kib": peak,
        }

    # -- helpers ---------------------------------------------------------------------------

    def _wait_ready(self) -> Optional[str]:
        """None once the READY line came; else why not (``%(status)s``: how it ended)."""
        deadline = time.monotonic() + READY_TIMEOUT
        out = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while True:
                line, newline, rest = self._out.partition(b"\n")
                if newline:
                    self._out = rest
                    if line.strip() == READY_LINE:
                        return None
                    _stray(line)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return "did not report READY within %g s (then %%(status)s)" % READY_TIMEOUT
                if sel.select(left):
                    chunk = os.read(out, 65536)
                    if not chunk:
                        return "%(status)s before it was ready"
                    self._out += chunk

    def _wait_stop(self, stop_fd: int) -> bool:
        """Returns True once stop_fd is readable, False if the peer exits first (or both at
        once: its death is the news)."""
        out = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(stop_fd, selectors.EVENT_READ, "stop")
            sel.register(out, selectors.EVENT_READ, "peer")
            while True:
                ready = {key.data for key, _ in sel.select()}
                if "peer" in ready:
                    chunk = os.read(out, 65536)
                    if not chunk:
                        return False  # the peer closed its stdout: it is gone
                    self._out += chunk  # its report, or stray lines: _report sorts them
                if "stop" in ready:
                    return True

    def _stop(self) -> None:
        """SIGTERM, read the report until EOF, reap with wait4 (bounded), SIGKILL if needed.
        Never uses Popen's wait/poll/send_signal: they would reap the peer without its rusage."""
        proc = self.proc
        self._peak_rss_kib = _peak_rss_kib(proc.pid)  # before it exits, and before reaping
        if not self._reap(os.WNOHANG):
            try:
                os.kill(proc.pid, signal.SIGTERM)  # not yet reaped: the pid is still ours
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT
        out = proc.stdout.fileno()
        os.set_blocking(out, False)
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    continue
                try:
                    chunk = os.read(out, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                self._out += chunk
        proc.stdout.close()
        while not self._reap(os.WNOHANG) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        if self._status is None:
            os.kill(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + KILL_TIMEOUT
            while not self._reap(os.WNOHANG) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL)

    def _reap(self, options: int) -> bool:
        """wait4 on the peer; True once it has been reaped (its status and rusage kept)."""
        if self._status is not None:
            return True
        try:
            pid, status, rusage = os.wait4(self.proc.pid, options)
        except ChildProcessError:  # reaped elsewhere: no rusage to be had
            self._status = 0
            self.proc.returncode = 0
            return True
        if pid == 0:
            return False
        self._status = status
        self._rusage = rusage
        self.proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits on it
        return True

    def _report(self) -> Dict[str, int]:
        lines = self._out.strip().splitlines()
        if self._status is None or os.waitstatus_to_exitcode(self._status) != 0:
            raise PeerError("%s peer (pid %d) %s when told to stop; stdout: %r"
                            % (self.impl, self.proc.pid, _describe(self._status), self._out[-300:]))
        try:
            report = json.loads(lines[-1])
            if not isinstance(report, dict):
                raise ValueError("not an object")
            for name in REPORT_FIELDS:
                value = report[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError("%s is %r" % (name, value))
        except (IndexError, KeyError, ValueError) as exc:
            raise PeerError("%s peer (pid %d) gave no usable report (%s); stdout: %r"
                            % (self.impl, self.proc.pid, exc, self._out[-300:])) from None
        for line in lines[:-1]:
            _stray(line)
        return report
