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

import json
import os
import selectors
import signal
import sys
import time
from typing import Dict, List, Optional

from pyconcbench import procs
from pyconcbench.servers import Stats

READY_LINE = b"READY"
#: How long a peer may take from exec to READY.
READY_TIMEOUT = 10.0
#: After SIGTERM, how long a peer has to report and exit before it is killed.  Shutdown must
#: take well under a second, connections open or not.
STOP_TIMEOUT = 0.75
REPORT_FIELDS = ("accepted", "bytes", "errors")


class PeerError(RuntimeError):
    """The peer failed: did not start, exited early, or stopped without a usable report."""


def source(name: str) -> str:
    """The path of a peer's source file shipped in this package (``echo.go``, ``echo.js``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def _describe(code: Optional[int]) -> str:
    if code is None:
        return "could not be reaped"
    if code < 0:
        return "was " + procs.meaning(code)
    return "exited with code %d" % code


def _stray(line: bytes) -> None:
    """A line the peer printed outside the protocol: it belongs with its stderr."""
    print(line.decode("utf-8", "replace"), file=sys.stderr)


class Peer:
    """One external echo server process, started once, stopped once (pyconcbench.procs.Child:
    its own process group, SIGKILL when the launcher dies, reaped with wait4 for its usage)."""

    def __init__(self, impl: str) -> None:
        self.impl = impl
        self.child: Optional[procs.Child] = None
        self._peak_rss_kib: Optional[int] = None

    @property
    def proc(self):
        return self.child.proc if self.child is not None else None

    @property
    def _code(self) -> Optional[int]:
        return self.child.returncode if self.child is not None else None

    # -- the three hooks -------------------------------------------------------------------

    def start(self, argv: List[str], sock, env: Optional[Dict[str, str]] = None) -> int:
        """Starts ``argv`` + [listening fd] with the socket inherited and waits for its READY
        line; returns the peer's pid.  Its stderr is the launcher's.  Raises PeerError (the
        peer killed and reaped) when it exits or stays silent instead."""
        if self.child is not None:
            raise PeerError("%s: peer already started" % self.impl)
        self.child = procs.Child(argv + [str(sock.fileno())], env=dict(os.environ, **(env or {})),
                                 pass_fds=(sock.fileno(),), death_signal=signal.SIGKILL,
                                 capture_stderr=False)
        try:
            self.child.start()
        except procs.ChildError as exc:
            raise PeerError("%s peer: %s" % (self.impl, exc)) from None
        why = self._wait_ready()
        if why is not None:
            self._stop()
            raise PeerError("%s peer (pid %d) %s" % (self.impl, self.child.pid, why % {
                "status": _describe(self._code)}))
        return self.child.pid

    def serve(self, stop_fd: int, stats: Stats) -> None:
        """Waits for ``stop_fd``, then stops the peer and copies its counts into ``stats``.
        Raises PeerError when the peer exits on its own or gives no usable report."""
        if self.child is None:
            raise PeerError("%s: serve() called before start()" % self.impl)
        try:
            exited_early = not self._wait_stop(stop_fd)
        finally:
            self._stop()
        if exited_early:
            raise PeerError("%s peer (pid %d) %s before it was told to stop"
                            % (self.impl, self.child.pid, _describe(self._code)))
        report = self._report()
        stats.accepted = report["accepted"]
        stats.bytes = report["bytes"]
        stats.errors = report["errors"]

    def usage(self) -> Optional[dict]:
        """The reaped peer's CPU seconds and peak RSS (KiB); None until it is reaped.  When
        the peer died before its VmHWM could be read, ru_maxrss stands in: an upper bound that
        may be the launcher's size (see the module docstring)."""
        rusage = self.child.rusage if self.child is not None else None
        if rusage is None:
            return None
        peak = self._peak_rss_kib if self._peak_rss_kib is not None else rusage.ru_maxrss
        return {
            "user": rusage.ru_utime,
            "system": rusage.ru_stime,
            "maxrss_kib": peak,
        }

    # -- helpers ---------------------------------------------------------------------------

    def _wait_ready(self) -> Optional[str]:
        """None once the READY line came; else why not (``%(status)s``: how it ended)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                line = self.child.read_line(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return "did not report READY within %g s (then %%(status)s)" % READY_TIMEOUT
            if line is None:
                return "%(status)s before it was ready"
            if line.strip() == READY_LINE:
                return None
            _stray(line)

    def _wait_stop(self, stop_fd: int) -> bool:
        """Returns True once stop_fd is readable, False if the peer exits first (or both at
        once: its death is the news)."""
        out = self.child.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(stop_fd, selectors.EVENT_READ, "stop")
            sel.register(out, selectors.EVENT_READ, "peer")
            while True:
                ready = {key.data for key, _ in sel.select()}
                if "peer" in ready:
                    chunk = os.read(out, 65536)
                    if not chunk:
                        return False  # the peer closed its stdout: it is gone
                    self.child.out += chunk  # its report, or stray lines: _report sorts them
                if "stop" in ready:
                    return True

    def _stop(self) -> None:
        """SIGTERM, its report read until it exits, reaped with wait4 (bounded), SIGKILL if
        needed (procs.Child.stop)."""
        if self.child.returncode is None:
            self._peak_rss_kib = self.child.peak_rss_kib()  # before it exits, and before reaping
        self.child.stop(STOP_TIMEOUT)

    def _report(self) -> Dict[str, int]:
        out = self.child.out
        lines = out.strip().splitlines()
        if self._code != 0:
            raise PeerError("%s peer (pid %d) %s when told to stop; stdout: %r"
                            % (self.impl, self.child.pid, _describe(self._code), out[-300:]))
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
                            % (self.impl, self.child.pid, exc, out[-300:])) from None
        for line in lines[:-1]:
            _stray(line)
        return report
