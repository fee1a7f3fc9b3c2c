"""Backpressure proven from the kernel's side, not by a timeout.

A client that stops reading and finds its sends blocked cannot tell a server that stopped
reading on purpose (backpressure) from one that was merely descheduled for a moment.  The kernel
can: the server-side socket of that connection holds unread bytes, and every thread of the
server is asleep (not runnable), twice in a row and with the same unread count.  A descheduled
server is runnable; a server that keeps reading drains its receive queue.
"""
import os
import socket
import subprocess
import time
from typing import List, Optional


def server_side_recv_q(client: socket.socket) -> Optional[int]:
    """Unread bytes in the receive queue of the server's end of ``client``'s connection (``ss``),
    None when that socket is not listed."""
    if client.family == socket.AF_UNIX:
        args, peer = ["ss", "-Hxn"], str(os.fstat(client.fileno()).st_ino)
    else:
        host, port = client.getsockname()[:2]
        args, peer = ["ss", "-Htn"], (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    out = subprocess.run(args, capture_output=True, text=True, timeout=10, check=True).stdout
    for line in out.splitlines():
        tokens = line.split()
        if tokens and tokens[-1] == peer and "ESTAB" in tokens:
            return int(tokens[tokens.index("ESTAB") + 1])
    return None


def thread_states(pid: int) -> List[str]:
    """The scheduler state letter of each thread of ``pid`` (R runnable, S/D asleep, ...)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass  # the thread exited
    return states


def send_until_backpressure(sock: socket.socket, pid: int, chunk_size: int = 65536,
                            limit: int = 64 << 20, timeout: float = 30.0) -> bytes:
    """Sends distinct random chunks on ``sock``, reading nothing, until the server (process
    ``pid``) is proven to hold back (see wait_for_backpressure's rule; while it is not, sending
    goes on); returns every byte sent.  AssertionError when it reads ``limit`` bytes without
    holding back (unbounded buffering) or after ``timeout`` seconds."""
    sock.setblocking(False)
    sent = bytearray()
    chunk = os.urandom(chunk_size)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline and len(sent) < limit:
        try:
            n = sock.send(chunk)
        except BlockingIOError:
            queued = server_side_recv_q(sock)
            asleep = all(state in "SDI" for state in thread_states(pid))
            if queued and asleep and queued == last:
                sock.setblocking(True)
                return bytes(sent)
            last = queued if queued and asleep else None
            time.sleep(0.1)
            continue
        sent += chunk[:n]
        chunk = chunk[n:] or os.urandom(chunk_size)
        last = None
    sock.setblocking(True)
    if len(sent) >= limit:
        raise AssertionError(f"sent {len(sent)} bytes and the server still reads: unbounded buffering")
    raise AssertionError(f"no backpressure within {timeout:g} s after {len(sent)} bytes: the server's end holds "
                         f"{server_side_recv_q(sock)} unread bytes, its threads are {thread_states(pid)}")


def wait_for_backpressure(client: socket.socket, pid: int, timeout: float = 30.0) -> int:
    """Waits until the server (process ``pid``) has stopped reading ``client``'s connection by
    choice: unread bytes in its end's receive queue, every thread asleep, the same on two looks
    0.2 s apart.  Returns the unread byte count; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        queued = server_side_recv_q(client)
        asleep = all(state in "SDI" for state in thread_states(pid))
        if queued and asleep and queued == last:
            return queued
        last = queued if queued and asleep else None
        time.sleep(0.2)
    raise AssertionError(f"no backpressure within {timeout:g} s: the server's end of the connection holds "
                         f"{server_side_recv_q(client)} unread bytes, its threads are {thread_states(pid)}")
