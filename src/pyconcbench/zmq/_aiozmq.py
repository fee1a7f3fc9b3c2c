"""``aiozmq_core``: aiozmq's transport/protocol layer (``aiozmq.create_zmq_connection``, the
loop-independent transport), server and client on one event loop (asyncio's default loop or
uvloop): a ROUTER protocol that writes back what it receives and a DEALER protocol that sends
the next request from ``msg_received`` -- as the study's core aiozmq benchmark.  The sockets
come from this workload's own context.
"""
from __future__ import annotations

import asyncio
from typing import Any, List, Optional

import aiozmq
import zmq

from ._asyncio import Loop
from ._common import FaultyEcho, Ledger, RoundError, Spec, bind, new_context, run_bounded

#: How long closing the transports may take before the sockets are closed by force.
CLOSE_TIMEOUT = 5.0

class _Closing(aiozmq.ZmqProtocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.closed: Optional[asyncio.Future] = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.closed = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(exc)


class _EchoServer(_Closing):
    def msg_received(self, msg: List[bytes]) -> None:
        self.transport.write(msg)


class _FaultyServer(_Closing):
    def __init__(self, faulty: FaultyEcho) -> None:
        super().__init__()
        self.faulty = faulty

    def msg_received(self, msg: List[bytes]) -> None:
        out = self.faulty.frames(msg)
        if self.faulty.stopped:
            self.transport.close()
        elif out is not None:
            self.transport.write(out)


class _Client(_Closing):
    """Sends the next request from msg_received until the round's requests are answered."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger: Optional[Ledger] = None
        self.requests = 0
        self.sent = 0
        self.done: Optional[asyncio.Future] = None

    def begin(self, requests: int, inflight: int, ledger: Ledger) -> asyncio.Future:
        self.ledger = ledger
        self.requests = requests
        self.done = asyncio.get_running_loop().create_future()
        first = min(inflight, requests)
        self.sent = first
        write = self.transport.write
        for _ in range(first):
            write(ledger.request())
        return self.done

    def msg_received(self, msg: List[bytes]) -> None:
        done = self.done
        if done is None or done.done():
            return  # outside a round: the next round's ledger reports the unanswered ones
        ledger = self.ledger
        try:
            ledger.reply(msg)
        except RoundError as exc:
            done.set_exception(exc)
            return
        if self.sent < self.requests:
            self.sent += 1
            self.transport.write(ledger.request())
        elif ledger.answered == self.requests:
            done.set_result(None)


class AiozmqCore(Loop):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.ctx: Any = None
        self.socks: List[Any] = []
        self.server: Any = None
        self.client: Any = None

    async def _setup(self) -> None:
        self.ctx = new_context(self.spec)
        rsock = self.ctx.socket(zmq.ROUTER)
        self.socks.append(rsock)
        rsock.setsockopt(zmq.LINGER, 0)
        endpoint = bind(rsock, self.spec)
        dsock = self.ctx.socket(zmq.DEALER)
        self.socks.append(dsock)
        dsock.setsockopt(zmq.LINGER, 0)
        faulty = FaultyEcho(self.spec.fault) if self.spec.fault is not None else None
        factory = _EchoServer if faulty is None else (lambda: _FaultyServer(faulty))
        _, self.server = await aiozmq.create_zmq_connection(factory, zmq.ROUTER, zmq_sock=rsock, loop=self.loop)
        _, self.client = await aiozmq.create_zmq_connection(_Client, zmq.DEALER, zmq_sock=dsock,
                                                            connect=endpoint, loop=self.loop)

    def problem(self) -> Optional[str]:
        if self.server is not None and self.server.closed is not None and self.server.closed.done():
            return "the server transport has closed"
        return None

    async def _client(self, requests: int, ledger: Ledger) -> None:
        await self.client.begin(requests, self.spec.inflight, ledger)

    def run(self, requests: int, ledger: Ledger) -> None:
        run_bounded(self.loop, self._client(requests, ledger), ledger, self.problem)

    async def _teardown(self) -> None:
        waits = []
        for proto in (self.client, self.server):
            if proto is not None and proto.transport is not None:
                proto.transport.close()
                waits.append(proto.closed)
        if waits:
            await asyncio.wait(waits, timeout=CLOSE_TIMEOUT)

    def _release(self) -> None:
        for sock in self.socks:
            if not sock.closed:
                sock.close(linger=0)
        if self.ctx is not None and not self.ctx.closed:
            self.ctx.term()
