"""The Python servers inside the test process: serve() in a thread stopped through its pipe,
and the asyncio protocol / stream handler on pytest-asyncio's loop, default and uvloop."""
import asyncio
import contextlib
import os
import socket
import threading
import time

import pytest
import pytest_asyncio

from brokenservers import connect, exchange
from pyconcbench import servers
from pyconcbench.servers import asyncio_protocol, asyncio_streams

try:
    import uvloop
except ImportError as exc:
    uvloop = None
    UVLOOP_MISSING = "uvloop not importable: %s" % exc
else:
    UVLOOP_MISSING = ""

PYTHON_IMPLS = ["asyncio_protocol", "asyncio_streams", "selectors"]
BIG = 1024 * 1024

pytestmark = pytest.mark.filterwarnings(
    # Recent pytest-asyncio prefers a conftest hook (pytest_asyncio_loop_factories); the
    # event_loop_policy override works from 0.23 on and from a test module alone.
    'ignore:Overriding the "event_loop_policy" fixture is deprecated:DeprecationWarning'
)


@contextlib.contextmanager
def leak_check(ignore=()):
    fds = set(os.listdir("/proc/self/fd"))
    threads = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= threads
    extra = [t for t in fd_targets(set(os.listdir("/proc/self/fd")) - fds)
             if t.split(" -> ")[1] not in ignore]
    assert not extra, "fds left open: %s" % sorted(extra)


@pytest.fixture(autouse=True)
def no_leaks():
    with leak_check():
        yield


@pytest.fixture(params=["tcp", "unix"])
def listener(request, tmp_path):
    if request.param == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(tmp_path / "echo.sock"))
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    with sock:
        yield sock


@pytest.fixture
def stop_pipe():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def fd_targets(fds):
    for fd in fds:
        try:
            yield "%s -> %s" % (fd, os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass


def address_of(sock):
    return sock.getsockname()


def payload(size):
    return bytes((i * 13 + 1) & 0xFF for i in range(size))


# -- serve() in a thread, as pyconcbench.serve runs it ---------------------------------------

@pytest.mark.parametrize("impl", PYTHON_IMPLS)
def test_serve_in_a_thread_until_the_pipe_is_readable(impl, listener, stop_pipe):
    serve = servers.load(impl)
    stats = servers.Stats()
    thread = threading.Thread(target=serve, args=(listener, stop_pipe[0], stats))
    thread.start()
    try:
        sent = 0
        clients = [connect(address_of(listener)) for _ in range(3)]
        try:
            for size in (1, 64, 100 * 1024, BIG):
                for client in clients:
                    data = payload(size)
                    assert exchange(client, data) == data
                    sent += size
        finally:
            for client in clients:
                client.close()
        idle = connect(address_of(listener))  # open while stopping
        assert exchange(idle, b"!") == b"!"
        sent += 1
    finally:
        os.write(stop_pipe[1], b"x")
        thread.join(5.0)
    idle.close()
    assert not thread.is_alive()
    assert stats.accepted == 4
    assert stats.bytes == sent
    assert stats.errors == 0


def test_load_rejects_unknown_ids():
    with pytest.raises(servers.UnknownImpl, match="known: native_epoll, native_threads"):
        servers.load("nope")


def test_load_names_the_missing_distribution(monkeypatch):
    monkeypatch.setitem(servers.IMPLS, "needs_missing",
                        servers.Impl("selectors", ("pcb-no-such-dist",), "test"))
    with pytest.raises(servers.MissingDependency,
                       match=r"implementation 'needs_missing' needs pcb-no-such-dist: "
                             r"pip install 'pyconcbench\[pcb-no-such-dist\]'"):
        servers.load("needs_missing")


# -- the asyncio pieces on the test's own loop -----------------------------------------------

async def fill_without_reading(sock, timeout=5.0):
    """Sends until the kernel buffers of both sides are full, reading nothing; returns what
    was sent.  Full means no send progress for a while."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    data = bytearray()
    chunk = payload(65536)
    deadline = loop.time() + timeout
    stalled_since = None
    while loop.time() < deadline:
        try:
            n = sock.send(chunk)
            data += chunk[:n]
            stalled_since = None
        except BlockingIOError:
            stalled_since = stalled_since or loop.time()
            if loop.time() - stalled_since > 0.3:
                return bytes(data)
            await asyncio.sleep(0.01)
    raise AssertionError("the server never stopped reading")


async def read_exactly(sock, size, timeout=10.0):
    loop = asyncio.get_running_loop()
    received = bytearray()
    while len(received) < size:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout)
        assert chunk, "EOF after %d of %d bytes" % (len(received), size)
        received += chunk
    return bytes(received)


class TestOnEachLoop:
    """The same tests on asyncio's default loop and on uvloop (as uvloop's own suite does)."""

    @pytest.fixture(params=[
        pytest.param("asyncio"),
        pytest.param("uvloop", marks=pytest.mark.skipif(uvloop is None, reason=UVLOOP_MISSING)),
    ])
    def event_loop_policy(self, request):
        if request.param == "uvloop":
            return uvloop.EventLoopPolicy()
        return asyncio.DefaultEventLoopPolicy()

    @pytest_asyncio.fixture(autouse=True)
    async def no_leaks(self):
        # Counted on the test's loop, as pytest-asyncio may open loops of its own before it.
        # The loop's fds close with it, after this check; the only one opened after the loop
        # is libuv's reserve fd for EMFILE (/dev/null), opened by its first listen.
        with leak_check(ignore=("/dev/null",)):
            yield

    @pytest.mark.asyncio
    async def test_runs_on_the_loop_asked_for(self, request):
        loop = asyncio.get_running_loop()
        if request.node.callspec.params["event_loop_policy"] == "uvloop":
            assert isinstance(loop, uvloop.Loop)
        else:
            assert not type(loop).__module__.startswith("uvloop")

    @pytest.mark.asyncio
    async def test_protocol_echoes(self, listener):
        stats, conns = servers.Stats(), asyncio_protocol.Connections()
        server = await create_server(listener, lambda: asyncio_protocol.EchoProtocol(stats, conns))
        try:
            reader, writer = await open_connection(address_of(listener))
            for size in (1, 64, 100 * 1024):
                writer.write(payload(size))
                assert await asyncio.wait_for(reader.readexactly(size), 10) == payload(size)
            writer.close()
            await writer.wait_closed()
        finally:
            server.close()
            await server.wait_closed()
        assert stats.accepted == 1
        assert stats.bytes == 1 + 64 + 100 * 1024

    @pytest.mark.asyncio
    async def test_protocol_stops_reading_while_the_client_does_not_read(self, listener):
        stats, conns = servers.Stats(), asyncio_protocol.Connections()
        server = await create_server(listener, lambda: asyncio_protocol.EchoProtocol(stats, conns))
        client = connect(address_of(listener))
        try:
            sent = await fill_without_reading(client)
            (transport,) = conns.transports
            assert not transport.is_reading()
            assert transport.get_write_buffer_size() <= 1024 * 1024
            assert await read_exactly(client, len(sent)) == sent
            # With the backlog flushed, reading resumed: the echo works again.
            await loop_sendall(client, b"after")
            assert await read_exactly(client, 5) == b"after"
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    @pytest.mark.asyncio
    async def test_stream_handler_is_bounded_while_the_client_does_not_read(self, listener):
        echo_server = asyncio_streams.EchoServer(servers.Stats())
        server = await start_server(listener, echo_server.connected)
        client = connect(address_of(listener))
        try:
            sent = await fill_without_reading(client)
            (transport,) = echo_server.connections.transports
            assert transport.get_write_buffer_size() <= 1024 * 1024
            assert await read_exactly(client, len(sent)) == sent
        finally:
            client.close()
            server.close()
            await echo_server.close()
            await server.wait_closed()
        assert echo_server.stats.bytes == len(sent)
        assert not echo_server.tasks and not echo_server.connections.transports

    @pytest.mark.asyncio
    @pytest.mark.parametrize("module", [asyncio_protocol, asyncio_streams], ids=["protocol", "streams"])
    async def test_serve_async_stops_with_connections_open(self, module, listener, stop_pipe):
        stats = servers.Stats()
        task = asyncio.ensure_future(module.serve_async(listener, stop_pipe[0], stats))
        reader, writer = await open_connection(address_of(listener))
        idle_reader, idle_writer = await open_connection(address_of(listener))
        try:
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
            began = time.monotonic()
            os.write(stop_pipe[1], b"x")
            await asyncio.wait_for(task, 2.0)
            assert time.monotonic() - began < 2.0
            # The server closed both connections.
            assert await asyncio.wait_for(reader.read(), 2) == b""
            assert await asyncio.wait_for(idle_reader.read(), 2) == b""
        finally:
            for w in (writer, idle_writer):
                w.close()
            await asyncio.gather(writer.wait_closed(), idle_writer.wait_closed(),
                                 return_exceptions=True)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert stats.accepted == 2
        assert stats.bytes == 4


# -- helpers over TCP or UNIX --------------------------------------------------------------------

async def create_server(sock, factory):
    loop = asyncio.get_running_loop()
    if sock.family == socket.AF_UNIX:
        return await loop.create_unix_server(factory, sock=sock)
    return await loop.create_server(factory, sock=sock)


async def start_server(sock, callback):
    if sock.family == socket.AF_UNIX:
        return await asyncio.start_unix_server(callback, sock=sock)
    return await asyncio.start_server(callback, sock=sock)


async def open_connection(address):
    if isinstance(address, str):
        return await asyncio.open_unix_connection(address)
    return await asyncio.open_connection(*address)


async def loop_sendall(sock, data):
    await asyncio.get_running_loop().sock_sendall(sock, data)
