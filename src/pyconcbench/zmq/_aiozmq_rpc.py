"""``aiozmq_rpc``: ``aiozmq.rpc.serve_rpc`` / ``connect_rpc``, server and client on one event
loop (asyncio's default loop or uvloop), and a method that returns its argument, awaited once
per request (with k in flight: k coroutines calling concurrently).  The argument is the
request: its id, then the payload.

aiozmq.rpc's public API takes its sockets from pyzmq's global ``zmq.Context.instance()``.  A
global context made earlier (by anything in the process) would have started its I/O threads
wherever its first socket was made, outside the session's placement; so this workload makes
its own context (in ``start()``, where the session has placed the calling thread) and installs
it as ``zmq.Context.instance()`` only while ``serve_rpc`` and ``connect_rpc`` make their
sockets, then puts back whatever instance there was.  It terminates its own context at the
end and leaves the global one alone.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, Iterator

import aiozmq.rpc
import zmq

from ._aiozmq import CLOSE_TIMEOUT, Loop
from ._common import IPC_NAME, LOOPBACK, FaultyEcho, Ledger, Spec, new_context, run_bounded


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


@contextlib.contextmanager
def _as_global_instance(ctx: Any) -> Iterator[None]:
    """``zmq.Context.instance()`` returns ``ctx`` inside the block (pyzmq keeps the instance
    and the pid it was made in as class attributes); the earlier instance is put back after."""
    cls = zmq.Context
    saved = cls.__dict__.get("_instance"), cls.__dict__.get("_instance_pid")
    with cls._instance_lock:
        cls._instance, cls._instance_pid = ctx, os.getpid()
    try:
        yield
    finally:
        with cls._instance_lock:
            cls._instance, cls._instance_pid = saved


class AiozmqRpc(Loop):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.ctx: Any = None
        self.server: Any = None
        self.client: Any = None

    async def _setup(self) -> None:
        self.ctx = new_context(self.spec)
        with _as_global_instance(self.ctx):
            await self._serve_and_connect()

    async def _serve_and_connect(self) -> None:
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
        # The services' sockets are closed (by _teardown, or below after a failed setup).
        ctx = self.ctx
        if ctx is None or ctx.closed:
            return
        for sock in list(getattr(ctx, "_sockets", None) or ()):
            if not sock.closed:
                sock.close(linger=0)
        ctx.term()
