"""``aiozmq_rpc``: ``aiozmq.rpc.serve_rpc`` / ``connect_rpc``, server and client on one event
loop (asyncio's default loop or uvloop), and a method that returns its argument, awaited once
per request (with k in flight: k coroutines calling concurrently).  The argument is the
request: its id, then the payload.

aiozmq.rpc's public API takes its sockets from pyzmq's global ``zmq.Context.instance()``: this
workload terminates that context after closing its sockets, unless other sockets still live on
it.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiozmq.rpc
import zmq

from ._aiozmq import CLOSE_TIMEOUT, Loop
from ._common import IPC_NAME, LOOPBACK, FaultyEcho, Ledger, Spec, run_bounded


class _EchoHandler(aiozmq.rpc.AttrHandler):
    @aiozmq.rpc.method
    def echo(self, data):
        return data


class _FaultyHandler(aiozmq.rpc.AttrHandler):
    def __init__(self, faulty: FaultyEcho) -> None:
        self.faulty = faulty

    @aiozmq.rpc.method
    async def echo(self, data):
        out = self.faulty.value(data)
        if out is None:
            await asyncio.sleep(3600)  # never answers; cancelled when the server closes
        return out


class AiozmqRpc(Loop):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.server: Any = None
        self.client: Any = None

    async def _setup(self) -> None:
        spec = self.spec
        if spec.transport == "tcp":
            where = "tcp://%s:*" % LOOPBACK  # the kernel picks the port, as bind_to_random_port
        else:
            where = "ipc://%s/%s" % (spec.ipc_dir, IPC_NAME)
        handler = _EchoHandler() if spec.fault is None else _FaultyHandler(FaultyEcho(spec.fault))
        self.server = await aiozmq.rpc.serve_rpc(handler, bind=where, loop=self.loop)
        self.server.transport.setsockopt(zmq.LINGER, 0)
        endpoint = next(iter(self.server.transport.bindings()))
        self.client = await aiozmq.rpc.connect_rpc(connect=endpoint, loop=self.loop)
        self.client.transport.setsockopt(zmq.LINGER, 0)

    async def _client(self, requests: int, ledger: Ledger) -> None:
        call = self.client.call.echo
        request = ledger.request_value
        reply = ledger.reply_value

        async def caller() -> None:
            while ledger.sent < requests:
                idb, data = request()
                reply(idb, await call(data))

        inflight = min(self.spec.inflight, requests)
        if inflight == 1:
            await caller()
            return
        callers = [asyncio.ensure_future(caller()) for _ in range(inflight)]
        try:
            await asyncio.gather(*callers)
        finally:
            for task in callers:
                task.cancel()
            await asyncio.gather(*callers, return_exceptions=True)

    def run(self, requests: int, ledger: Ledger) -> None:
        run_bounded(self.loop, self._client(requests, ledger), ledger)

    async def _teardown(self) -> None:
        for service in (self.client, self.server):
            if service is not None:
                service.close()
        for service in (self.client, self.server):
            if service is not None:
                try:
                    await asyncio.wait_for(service.wait_closed(), CLOSE_TIMEOUT)
                except asyncio.TimeoutError:
                    pass

    def _release(self) -> None:
        # The services' sockets came from the global context: terminate it unless something
        # else still has a socket open on it (term() would then wait for that socket forever).
        ctx = zmq.Context.instance()
        live = [s for s in list(getattr(ctx, "_sockets", None) or ()) if not s.closed]
        if not live and not ctx.closed:
            ctx.term()
