"""One conformance suite over every echo server implementation.

The same test bodies run against every id in the registry (as uvloop runs one TCP test class
on both loops), so a new concurrency model gets all of them for free.  A server that cannot run
here (missing package or toolchain) is a skip with the reason; a model that cannot pass a test
by design is an xfail that says why.  What test_serve.py already covers for every id (echoes of
1 B .. 1 MiB over TCP and UNIX, exact byte counts, SIGTERM with connections open) is not
repeated here.
"""
import random
import socket
import time

import pytest

import backpressure
from brokenservers import connect, exchange
from skipping import start_or_skip
from pyconcbench import harness, loadgen, servers

IMPLS = list(servers.IMPLS)

#: Models that cannot pass a test by design: {test name: {impl: reason}}.
XFAIL = {}


@pytest.fixture(params=IMPLS)
def server(request):
    impl = request.param
    reason = XFAIL.get(request.node.originalname, {}).get(impl)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    proc = harness.ServerProcess(impl, cpu=None)
    start_or_skip(proc)
    try:
        yield proc
    finally:
        proc.stop()


def random_bytes(n, seed):
    return random.Random(seed).randbytes(n) if hasattr(random.Random, "randbytes") else \
        bytes(random.Random(seed).getrandbits(8) for _ in range(n))


def recv_exactly(sock, n, timeout=10.0):
    sock.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def test_partial_reads_and_writes(server):
    """A message dribbled in small pieces, with pauses, comes back whole and in order; so does
    one read back a few bytes at a time."""
    data = random_bytes(3000, 1)
    with connect(server.address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each piece its own segment
        for i in range(0, len(data), 7):
            sock.sendall(data[i:i + 7])
            if i % 700 == 0:
                time.sleep(0.01)
        assert recv_exactly(sock, len(data)) == data
        sock.sendall(data)
        got = bytearray()
        sock.settimeout(10)
        while len(got) < len(data):
            piece = sock.recv(5)
            assert piece, "EOF before the whole echo"
            got += piece
        assert bytes(got) == data


def test_one_connection_under_load(server):
    host, port = server.address
    r = loadgen.run(loadgen.LoadSpec(host=host, port=port, connections=1, messages=2000, warmup_messages=100,
                                     size=1024))
    assert r.completed == 2000 and not any(r.errors.values())


def test_a_thousand_concurrent_connections(server):
    host, port = server.address
    r = loadgen.run(loadgen.LoadSpec(host=host, port=port, connections=1000, messages=10_000,
                                     warmup_messages=2000, stall_timeout=20))
    assert r.completed == 10_000 and not any(r.errors.values())
    assert r.fairness.max > 0


def test_client_disconnecting_mid_message(server):
    """Clients that vanish halfway through a message (FIN, and RST) hurt nobody else."""
    data = random_bytes(100_000, 2)
    with connect(server.address) as keeper:
        assert exchange(keeper, b"before") == b"before"
        for linger in (False, True):
            rude = connect(server.address)
            if linger:
                rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            rude.sendall(data[:50_000])
            rude.close()
        time.sleep(0.2)
        assert exchange(keeper, data) == data
    with connect(server.address) as fresh:
        assert exchange(fresh, b"after") == b"after"
    server.check_alive()


def test_idle_connections_stay_open(server):
    conns = [connect(server.address) for _ in range(50)]
    try:
        time.sleep(1.5)
        for i, sock in enumerate(conns):
            msg = b"idle %d" % i
            assert exchange(sock, msg) == msg
    finally:
        for sock in conns:
            sock.close()


#: How much a server may grow while a client sends without reading: what it holds of that
#: client's data must be bounded; garbage-collected runtimes (Node's V8 heap, measured here
#: +46 MiB for 8 MiB sent) need the headroom.
BACKPRESSURE_RSS_BOUND_KIB = 64 * 1024


def test_backpressure_bounds_memory(server):
    """A client that sends and does not read: once the kernel buffers are full, the server
    must stop reading (its RSS stays bounded) and still serve everybody else."""
    before = server.rss_kib()
    hog = connect(server.address)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        # Until the server is proven to hold back (unread bytes in its end of the connection
        # while all its threads sleep), not until a pause a descheduled server could cause.
        data = backpressure.send_until_backpressure(hog, server.measured_pid, 65536, 256 << 20, timeout=30.0)
        sent = len(data)
        grown = server.rss_kib() - before
        assert sent < 256 << 20, "the server read 256 MiB from a client that never reads"
        assert grown < BACKPRESSURE_RSS_BOUND_KIB, f"server grew {grown} KiB while {sent} bytes were sent"
        with connect(server.address) as other:
            assert exchange(other, b"still serving") == b"still serving"
        # and the hog gets back every byte it sent, in order, once it reads
        hog.setblocking(True)
        hog.settimeout(10)
        received = 0
        while received < sent:
            piece = hog.recv(1 << 20)
            assert piece, "EOF before every byte came back"
            assert piece == data[received:received + len(piece)]
            received += len(piece)
        assert received == sent
    finally:
        hog.close()
