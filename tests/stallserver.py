"""An echo server that stalls: every STALL_EVERY seconds it stops for STALL seconds (a blocking
sleep in its one loop, as a GC pause or a synchronous call would), then serves what queued.  A
``serve(sock, stop_fd, stats)`` function for ``python -m pyconcbench.serve PATH.py:serve``: the
open loop's test server (tests/test_openloop.py)."""
import os
import selectors
import socket
import time

STALL = 0.050
STALL_EVERY = 1.0


def serve(sock, stop_fd, stats):
    sel = selectors.DefaultSelector()
    sock.setblocking(False)
    sel.register(sock, selectors.EVENT_READ, None)
    sel.register(stop_fd, selectors.EVENT_READ, "stop")
    next_stall = time.monotonic() + STALL_EVERY
    conns = []
    try:
        while True:
            now = time.monotonic()
            if now >= next_stall:
                time.sleep(STALL)
                next_stall += STALL_EVERY
            for key, _ in sel.select(max(0.0, next_stall - time.monotonic())):
                if key.data == "stop":
                    return
                if key.data is None:
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(True)  # echoes are small: a blocking send never waits long
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns.append(conn)
                    stats.accepted += 1
                    sel.register(conn, selectors.EVENT_READ, conn)
                    continue
                conn = key.data
                try:
                    data = conn.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    sel.unregister(conn)
                    conn.close()
                    continue
                conn.sendall(data)
                stats.bytes += len(data)
    finally:
        for conn in conns:
            conn.close()
        sel.close()
