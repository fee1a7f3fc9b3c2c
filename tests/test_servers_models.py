"""The models beside asyncio_protocol, asyncio_streams and selectors: asyncio_sockets,
asyncio_buffered, the uvloop and rloop variants, threads and gevent.  What test_serve.py's conformance
test does not check: backpressure (a client that does not read is stalled, then gets back every
byte it sent, unaltered), SIGINT, a stop with many connections open, and serve() in a thread
without leaks."""
import importlib.util
import os
import socket
import threading
import time

import pytest

from brokenservers import connect, exchange
from skipping import start_or_skip
from pyconcbench import conformance, servers
from pyconcbench.harness import ServerProcess

MODELS = [
    "asyncio_sockets", "asyncio_buffered", "uvloop_protocol", "uvloop_streams",
    "uvloop_sockets", "uvloop_buffered", "rloop_protocol", "rloop_streams", "rloop_sockets",
    "threads", "gevent",
]
STOP_BOUND = 15.0  # s: stop()'s SIGTERM-to-SIGKILL bound in the stop test
CHUNK = 65536
# More than every kernel buffer on the path can hold (loopback TCP autotunes to a few MiB per
# socket): a client that gets this far without being stalled meets a server buffering freely.
UNBOUNDED = 64 * 1024 * 1024


def started(impl, **kwargs):
    server = ServerProcess(impl, cpu=None, **kwargs)
    return start_or_skip(server)


def send_until_stalled(sock, server, timeout=30.0):
    """Sends distinct random chunks, reading nothing, until the server is proven to hold back
    (unread bytes in its end of the connection while all its threads sleep: see
    pyconcbench.conformance, not a timer a descheduled server could trip); returns what was sent."""
    return conformance.send_until_backpressure(sock, server.measured_pid, CHUNK, UNBOUNDED, timeout)


def read_exactly(sock, size, timeout=20.0):
    sock.settimeout(timeout)
    received = bytearray()
    while len(received) < size:
        data = sock.recv(min(CHUNK * 4, size - len(received)))
        assert data, "EOF after %d of %d bytes" % (len(received), size)
        received += data
    return bytes(received)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", MODELS)
def test_a_client_that_does_not_read_is_stalled_then_gets_every_byte_back(impl, transport):
    server = started(impl, transport=transport)
    with server:
        with connect(server.address) as client:
            sent = send_until_stalled(client, server)
            assert sent, "not even one chunk was accepted"
            # Read back while the server resumes: a reused read buffer would show up here.
            assert read_exactly(client, len(sent)) == sent
            assert exchange(client, b"after") == b"after"
        usage = server.stop()
    assert usage.accepted == 1
    assert usage.bytes == len(sent) + 5
    assert usage.errors == 0


@pytest.mark.parametrize("impl", MODELS)
def test_sigint_is_a_clean_stop(impl):
    server = started(impl)
    with server:
        with connect(server.address) as client:
            assert exchange(client, b"ping") == b"ping"
            os.kill(server.pid, 2)  # SIGINT
            usage = server.stop()
    assert usage.signal == "SIGINT"
    assert usage.accepted == 1 and usage.bytes == 4


@pytest.mark.parametrize("impl", MODELS)
def test_stops_promptly_with_many_connections_open(impl):
    # "Promptly" is stop()'s own bound: a server still running STOP_BOUND s after SIGTERM is
    # killed and stop() raises.  Generous, so a descheduled server cannot fail it; one that
    # waits for its connections to end (they never do here) always does.
    server = started(impl, stop_timeout=STOP_BOUND)
    with server:
        idle = []
        try:
            for _ in range(300):
                idle.append(connect(server.address))
            stuck = connect(server.address)
            idle.append(stuck)
            send_until_stalled(stuck, server)
            busy = connect(server.address)
            idle.append(busy)
            assert exchange(busy, b"ping") == b"ping"
            usage = server.stop()
            # Every connection was closed by the server: EOF (or a reset) on each.
            for sock in idle[:10]:
                sock.settimeout(2.0)
                try:
                    while sock.recv(CHUNK):
                        pass
                except ConnectionResetError:
                    pass
        finally:
            for sock in idle:
                sock.close()
    assert usage.accepted == 302
    assert usage.signal == "SIGTERM"


# -- serve() in a thread of this process ------------------------------------------------------

IN_PROCESS = [impl for impl in MODELS
              if all(importlib.util.find_spec(d) for d in servers.IMPLS[impl].requires)]
#: Run in a thread of the test process, rloop (0.5.0) leaves descriptors behind and closes one
#: it does not own: its closed loop keeps its epoll and eventfd, the listening socket and the
#: connections aborted at the stop stay open, and the next test's new listening socket fails
#: with EBADF.  Not run (it would break the tests after it); each serve() runs in its own process
#: when measured, where the conformance tests pass (test_serve.py, test_conformance.py).
RLOOP_IN_PROCESS = pytest.mark.xfail(
    run=False, reason="rloop 0.5.0 in the test process: its closed loop keeps fds (epoll, eventfd, the "
                      "listening socket, aborted connections) and a later socket's fd is closed under it")
IN_PROCESS = [pytest.param(impl, marks=RLOOP_IN_PROCESS) if impl.startswith("rloop_") else impl
              for impl in IN_PROCESS]


@pytest.fixture(scope="module", autouse=True)
def uvloop_reserve_fd():
    """libuv opens one fd (/dev/null, kept for the EMFILE trick) at its first listen in a
    process and never closes it: open it before the per-test fd leak check looks."""
    if importlib.util.find_spec("uvloop") is None:
        yield
        return
    import asyncio

    import uvloop

    async def listen_once():
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        server.close()
        await server.wait_closed()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(listen_once())
    finally:
        loop.close()
    yield


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("impl", IN_PROCESS)
def test_serve_in_a_thread_leaves_nothing_behind(impl, transport, tmp_path):
    serve = servers.load(impl)
    if transport == "unix":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "echo.sock"))
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    read_fd, write_fd = os.pipe()
    threads_before = set(threading.enumerate())
    stack_size = threading.stack_size()
    stats = servers.Stats()
    thread = threading.Thread(target=serve, args=(listener, read_fd, stats))
    thread.start()
    try:
        address = listener.getsockname()
        clients = [connect(address) for _ in range(3)]
        try:
            for size in (1, 64, 300 * 1024):
                data = os.urandom(size)
                for client in clients:
                    assert exchange(client, data) == data
        finally:
            os.write(write_fd, b"x")  # stop with the connections open
            thread.join(5.0)
            for client in clients:
                client.close()
    finally:
        os.write(write_fd, b"x")
        thread.join(5.0)
        listener.close()
        os.close(read_fd)
        os.close(write_fd)
    assert not thread.is_alive()
    assert stats.accepted == 3
    assert stats.bytes == 3 * (1 + 64 + 300 * 1024)
    assert stats.errors == 0
    assert threading.stack_size() == stack_size
    deadline = time.monotonic() + 30.0  # an event wait: a bound only to fail instead of hang
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - threads_before
