"""``zmq_asyncio``: pyzmq's own asyncio sockets (``zmq.asyncio``), ROUTER server task and
DEALER client on one event loop (asyncio's default loop, or uvloop), one context.

The client keeps ``inflight`` requests outstanding: it sends that many, then one more per
reply.  A watchdog on the loop ends a round that stalls (see ``_common.run_bounded``).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import zmq
import zmq.asyncio

from ._common import FaultyEcho, Ledger, RoundError, Spec, bind, close_loop, new_context, new_loop, run_bounded


class Loop:
    """An event loop of the spec's kind owned by a workload: ``start()`` runs ``_setup()`` on
    it; ``stop()`` runs ``_teardown()``, cancels what is left, closes the loop, then
    ``_release()`` closes the sockets and terminates the contexts (also after a failed setup)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.server_pid: Optional[int] = None
        self.loop: Any = None

    def start(self) -> None:
        self.loop = new_loop(self.spec.loop)
        try:
            self.loop.run_until_complete(self._setup())
        except (OSError, zmq.ZMQError) as exc:
            self.stop()
            raise RoundError("%s: cannot set up the %s sockets: %s" % (self.spec.mode, self.spec.transport, exc)) from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            if self.loop is not None and not self.loop.is_closed():
                try:
                    self.loop.run_until_complete(self._teardown())
                finally:
                    close_loop(self.loop)
        finally:
            self._release()

    async def _setup(self) -> None:
        raise NotImplementedError

    async def _teardown(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError


class ZmqAsyncio(Loop):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.ctx: Any = None
        self.router: Any = None
        self.dealer: Any = None
        self.server: Optional[asyncio.Future] = None

    async def _setup(self) -> None:
        self.ctx = new_context(self.spec, zmq.asyncio.Context)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        endpoint = bind(self.router, self.spec)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(endpoint)
        faulty = FaultyEcho(self.spec.fault) if self.spec.fault is not None else None
        self.server = self.loop.create_task(self._serve(faulty))

    async def _serve(self, faulty: Optional[FaultyEcho]) -> None:
        recv = self.router.recv_multipart
        send = self.router.send_multipart
        if faulty is None:
            while True:
                frames = await recv()
                await send(frames)
        while True:
            frames = await recv()
            out = faulty.frames(frames)
            if faulty.stopped:
                return
            if out is not None:
                await send(out)

    def problem(self) -> Optional[str]:
        server = self.server
        if server is None or not server.done():
            return None
        if server.cancelled():
            return "the server task was cancelled"
        exc = server.exception()
        if exc is not None:
            return "the server task failed: %s: %s" % (type(exc).__name__, exc)
        return "the server task has ended"

    async def _client(self, requests: int, ledger: Ledger) -> None:
        send = self.dealer.send_multipart
        recv = self.dealer.recv_multipart
        request = ledger.request
        reply = ledger.reply
        first = min(self.spec.inflight, requests)
        for _ in range(first):
            await send(request())
        sent = first
        for _ in range(requests):
            reply(await recv())
            if sent < requests:
                await send(request())
                sent += 1

    def run(self, requests: int, ledger: Ledger) -> None:
        run_bounded(self.loop, self._client(requests, ledger), ledger, self.problem)

    def _release(self) -> None:
        for sock in (self.dealer, self.router):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()

    async def _teardown(self) -> None:
        if self.server is not None and not self.server.done():
            self.server.cancel()
            await asyncio.gather(self.server, return_exceptions=True)
        for sock in (self.dealer, self.router):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
