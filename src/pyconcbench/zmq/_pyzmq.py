"""Raw pyzmq workloads: DEALER client, ROUTER echo server.

- ``pyzmq_single``: both sockets in one thread, alternating blocking send/recv (with k in
  flight: the client sends k, the server answers k, the client receives k);
- ``pyzmq_poller``: the same driven by one ``zmq.Poller`` over both sockets, non-blocking
  send/recv (with k in flight: a window, a new request per reply);
- ``pyzmq_thread``: the server in its own thread of this process, the client a window;
- ``pyzmq_process``: the server in its own process (``python -m pyconcbench.zmq.server``),
  pinned (with its libzmq threads) to the CPU the session's placement gives it, and
  orphan-proof; the client a window.

Every socket has LINGER 0 and every blocking call a timeout; each workload creates and
terminates its own context (in ``start()``, where the session has placed the calling thread;
see ``_placement``).
"""
from __future__ import annotations

import json
import sys
import threading
from typing import Any, Callable, Optional

import zmq

from .. import procs
from ._common import FaultyEcho, Ledger, RoundError, Spec, bind, new_context

#: How long a server (thread or process) may take to bind and announce itself.
READY_TIMEOUT = 15.0
#: How long a server (thread or process) may take to stop when asked.
STOP_TIMEOUT = 5.0


def _socket(ctx: Any, kind: int) -> Any:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def _close(*socks: Any) -> None:
    for sock in socks:
        if sock is not None and not sock.closed:
            sock.close(linger=0)


def _setup_error(spec: Spec, exc: BaseException) -> RoundError:
    return RoundError("%s: cannot set up the %s sockets: %s" % (spec.mode, spec.transport, exc))


def _window_client(dealer: Any, ledger: Ledger, requests: int, inflight: int,
                   problem: Callable[[], Optional[str]]) -> None:
    """Keeps ``inflight`` requests outstanding until ``requests`` are answered.  The dealer's
    receive timeout is a short slice: each time it runs out the server and the round's time
    bounds are checked."""
    send = dealer.send_multipart
    recv = dealer.recv_multipart
    request = ledger.request
    reply = ledger.reply
    try:
        first = min(inflight, requests)
        for _ in range(first):
            send(request())
        sent = first
        while ledger.answered < requests:
            try:
                frames = recv()
            except zmq.Again:
                ledger.check(problem)
                continue
            reply(frames)
            if sent < requests:
                send(request())
                sent += 1
    except zmq.Again:
        raise RoundError("%s: could not queue a request within %g s" % (ledger.mode, ledger.timeout)) from None


class _OneThread:
    """Both sockets in this thread, one context."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.faulty = FaultyEcho(spec.fault) if spec.fault is not None else None
        self.ctx: Any = None
        self.router: Any = None
        self.dealer: Any = None
        self.server_pid: Optional[int] = None

    def start(self) -> None:
        self.ctx = new_context(self.spec)
        try:
            self.router = _socket(self.ctx, zmq.ROUTER)
            self.router.setsockopt(zmq.RCVTIMEO, self.spec.timeout_ms)
            endpoint = bind(self.router, self.spec)
            self.dealer = _socket(self.ctx, zmq.DEALER)
            self.dealer.setsockopt(zmq.RCVTIMEO, self.spec.timeout_ms)
            self.dealer.setsockopt(zmq.SNDTIMEO, self.spec.timeout_ms)
            self.dealer.connect(endpoint)
        except zmq.ZMQError as exc:
            self.stop()
            raise _setup_error(self.spec, exc) from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _close(self.dealer, self.router)
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()


class Single(_OneThread):
    """``pyzmq_single``: send, server recv, server send, recv -- as the study's raw zmq loop."""

    def run(self, requests: int, ledger: Ledger) -> None:
        inflight = self.spec.inflight
        dsend = self.dealer.send_multipart
        drecv = self.dealer.recv_multipart
        rsend = self.router.send_multipart
        rrecv = self.router.recv_multipart
        request = ledger.request
        reply = ledger.reply
        faulty = self.faulty
        done = 0
        try:
            while done < requests:
                batch = min(inflight, requests - done)
                for _ in range(batch):
                    dsend(request())
                for _ in range(batch):
                    try:
                        frames = rrecv()
                    except zmq.Again:
                        raise RoundError("%s: the server socket received no request within %g s"
                                         % (ledger.mode, ledger.timeout)) from None
                    if faulty is None:
                        rsend(frames)
                    else:
                        out = faulty.frames(frames)
                        if out is not None:
                            rsend(out)
                for _ in range(batch):
                    try:
                        frames = drecv()
                    except zmq.Again:
                        raise RoundError(ledger.stall_message()) from None
                    reply(frames)
                done += batch
        except zmq.Again:
            raise RoundError("%s: could not queue a request within %g s" % (ledger.mode, ledger.timeout)) from None


class Poller(_OneThread):
    """``pyzmq_poller``: one ``zmq.Poller`` over both sockets; whichever is readable is served
    (non-blocking recv and send), as the study's zmq-with-poller loop."""

    def start(self) -> None:
        super().start()
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.dealer, zmq.POLLIN)

    def run(self, requests: int, ledger: Ledger) -> None:
        router, dealer = self.router, self.dealer
        poll = self.poller.poll
        dsend = dealer.send_multipart
        drecv = dealer.recv_multipart
        rsend = router.send_multipart
        rrecv = router.recv_multipart
        request = ledger.request
        reply = ledger.reply
        faulty = self.faulty
        wait_ms = self.spec.timeout_ms
        NOBLOCK = zmq.NOBLOCK
        try:
            first = min(self.spec.inflight, requests)
            for _ in range(first):
                dsend(request(), NOBLOCK)
            sent = first
            while ledger.answered < requests:
                events = poll(wait_ms)
                if not events:
                    raise RoundError(ledger.stall_message())
                for sock, _ in events:
                    if sock is router:
                        try:
                            frames = rrecv(NOBLOCK)
                        except zmq.Again:
                            continue
                        if faulty is None:
                            rsend(frames, NOBLOCK)
                        else:
                            out = faulty.frames(frames)
                            if out is not None:
                                rsend(out, NOBLOCK)
                    else:
                        try:
                            frames = drecv(NOBLOCK)
                        except zmq.Again:
                            continue
                        reply(frames)
                        if sent < requests:
                            dsend(request(), NOBLOCK)
                            sent += 1
        except zmq.Again:
            raise RoundError("%s: a non-blocking send would have blocked (high-water mark reached)"
                             % ledger.mode) from None


class Thread:
    """``pyzmq_thread``: the ROUTER in its own thread (which binds it and serves until told to
    stop), the DEALER in the calling thread; one context."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.ctx: Any = None
        self.dealer: Any = None
        self.server_pid: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._endpoint: Optional[str] = None
        self._error: Optional[str] = None

    def start(self) -> None:
        self.ctx = new_context(self.spec)
        try:
            self._thread = threading.Thread(target=self._serve, name="pcb-zmq-server", daemon=True)
            self._thread.start()
            if not self._ready.wait(READY_TIMEOUT):
                raise RoundError("%s: the server thread did not bind within %g s" % (self.spec.mode, READY_TIMEOUT))
            if self._error is not None:
                raise RoundError("%s: the server thread failed: %s" % (self.spec.mode, self._error))
            self.dealer = _socket(self.ctx, zmq.DEALER)
            self.dealer.setsockopt(zmq.RCVTIMEO, self.spec.check_ms)
            self.dealer.setsockopt(zmq.SNDTIMEO, self.spec.timeout_ms)
            self.dealer.connect(self._endpoint)
        except zmq.ZMQError as exc:
            self.stop()
            raise _setup_error(self.spec, exc) from None
        except BaseException:
            self.stop()
            raise

    def _serve(self) -> None:
        router = None
        try:
            router = _socket(self.ctx, zmq.ROUTER)
            router.setsockopt(zmq.RCVTIMEO, self.spec.check_ms)
            self._endpoint = bind(router, self.spec)
        except Exception as exc:
            self._error = "%s: %s" % (type(exc).__name__, exc)
            _close(router)
            return
        finally:
            self._ready.set()
        faulty = FaultyEcho(self.spec.fault) if self.spec.fault is not None else None
        recv = router.recv_multipart
        send = router.send_multipart
        stop = self._stop
        try:
            while not stop.is_set():
                try:
                    frames = recv()
                except zmq.Again:
                    continue
                if faulty is None:
                    send(frames)
                    continue
                out = faulty.frames(frames)
                if faulty.stopped:
                    break
                if out is not None:
                    send(out)
        except Exception as exc:
            self._error = "%s: %s" % (type(exc).__name__, exc)
        finally:
            _close(router)

    def problem(self) -> Optional[str]:
        if self._error is not None:
            return "the server thread failed: " + self._error
        if self._thread is not None and not self._thread.is_alive():
            return "the server thread has stopped"
        return None

    def run(self, requests: int, ledger: Ledger) -> None:
        _window_client(self.dealer, ledger, requests, self.spec.inflight, self.problem)

    def stop(self) -> None:
        self._stop.set()
        _close(self.dealer)
        thread = self._thread
        if thread is not None:
            thread.join(STOP_TIMEOUT)
            if thread.is_alive():
                # Its socket is still open: terminating the context would wait for it forever.
                raise RoundError("%s: the server thread did not stop within %g s" % (self.spec.mode, STOP_TIMEOUT))
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()


class Process:
    """``pyzmq_process``: the ROUTER in a child process (``python -m pyconcbench.zmq.server``)
    pinned to ``spec.server_cpu`` (the client CPU under the ``1cpu`` placement); it dies with this process's thread that started it
    (PR_SET_PDEATHSIG) and is killed on any error here.  The DEALER in the calling thread."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.ctx: Any = None
        self.dealer: Any = None
        self.child: Optional[procs.Child] = None

    @property
    def server_pid(self) -> Optional[int]:
        return self.child.pid if self.child is not None and self.child.proc is not None else None

    def argv(self) -> list:
        spec = self.spec
        argv = [sys.executable, "-m", "pyconcbench.zmq.server", "--transport", spec.transport]
        if spec.transport == "ipc":
            argv += ["--ipc-dir", str(spec.ipc_dir)]
        if spec.server_cpu is not None:
            argv += ["--cpu", str(spec.server_cpu)]
        if spec.fault is not None:
            argv += ["--fault", str(spec.fault)]
        return argv

    def start(self) -> None:
        self.child = procs.Child(self.argv())
        try:
            self.child.start()
        except procs.ChildError as exc:
            raise RoundError("%s: cannot start the server process: %s" % (self.spec.mode, exc)) from None
        try:
            endpoint = self._wait_ready()
            self.ctx = new_context(self.spec)
            self.dealer = _socket(self.ctx, zmq.DEALER)
            self.dealer.setsockopt(zmq.RCVTIMEO, self.spec.check_ms)
            self.dealer.setsockopt(zmq.SNDTIMEO, self.spec.timeout_ms)
            self.dealer.connect(endpoint)
        except zmq.ZMQError as exc:
            self.stop()
            raise _setup_error(self.spec, exc) from None
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> str:
        assert self.child is not None
        try:
            line = self.child.read_line(READY_TIMEOUT)
        except TimeoutError:
            raise RoundError("%s: the server process did not announce itself within %g s%s"
                             % (self.spec.mode, READY_TIMEOUT, self._stderr_tail())) from None
        if line is None:
            code = self.child.wait(STOP_TIMEOUT)
            tail = self._stderr_tail()
            if code == procs.EXIT_UNUSABLE:  # after the mode's check: our arguments or CPUs, a failure
                raise RoundError("%s: the server process cannot run as asked%s"
                                 % (self.spec.mode, tail or " (stderr empty)"))
            raise RoundError("%s: the server process exited with code %s before it was ready%s"
                             % (self.spec.mode, code, tail))
        try:
            ready = json.loads(line[len(b"READY "):]) if line.startswith(b"READY ") else None
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or not isinstance(ready.get("endpoint"), str):
            raise RoundError("%s: the server process printed %r instead of READY {json}"
                             % (self.spec.mode, line[:200]))
        self.ready = ready
        return ready["endpoint"]

    def _stderr_tail(self) -> str:
        lines = self.child.stderr_tail(1) if self.child is not None else []
        return "; stderr: " + lines[-1] if lines else ""

    def problem(self) -> Optional[str]:
        code = self.child.poll() if self.child is not None and self.child.proc is not None else None
        if code is None:
            return None
        return "the server process (pid %d) exited with code %s%s" % (self.child.pid, code, self._stderr_tail())

    def run(self, requests: int, ledger: Ledger) -> None:
        _window_client(self.dealer, ledger, requests, self.spec.inflight, self.problem)

    def stop(self) -> None:
        try:
            _close(self.dealer)
            if self.ctx is not None and not self.ctx.closed:
                self.ctx.term()
            if self.child is not None and self.child.proc is not None:
                self.child.stop(STOP_TIMEOUT)
        finally:
            if self.child is not None:
                self.child.close()
