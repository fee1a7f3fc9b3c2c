"""Echo server on gevent: a StreamServer over the given socket and one greenlet per connection
doing recv/sendall on a gevent socket, in one thread on gevent's hub (libev by default).

No monkey-patching: the connections are gevent sockets made by the StreamServer, and stop_fd
is watched with a hub I/O watcher.  A stop signal still gets through because serve.py's stop
pipe is written by the signal wake-up fd from C, whatever the hub is doing.  sendall blocks its
greenlet until everything is sent, and the greenlet reads nothing meanwhile: at most one read's
worth is buffered per connection.  To stop: close the listener, kill every handler greenlet
(GreenletExit wakes one blocked in recv or sendall), close every connection.
"""
from __future__ import annotations

import socket
import threading

import gevent
import gevent.pool
import gevent.server

from pyconcbench.servers import Stats, TRANSIENT_ACCEPT_ERRORS

READ_SIZE = 65536
ACCEPT_PAUSE = 0.01  # seconds without accepting after EMFILE and the like
KILL_TIMEOUT = 0.5  # for killing every handler greenlet at stop



class EchoServer(gevent.server.StreamServer):
    """A StreamServer that counts and tracks every connection it accepts (so none outlives
    the server, not even one whose greenlet never ran), and pauses accepting on EMFILE and
    the like instead of printing a traceback as StreamServer would."""

    def __init__(self, sock: socket.socket, stats: Stats) -> None:
        super().__init__(sock, self.echo, spawn=gevent.pool.Pool())
        self.stats = stats
        self.is_tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self.conns: set = set()

    def do_read(self):
        try:
            accepted = super().do_read()
        except OSError as exc:
            if exc.errno not in TRANSIENT_ACCEPT_ERRORS:
                self.stats.errors += 1
                # As StreamServer's own retry after an error: stop_accepting() (and so
                # close()) cancels this timer.
                self.stop_accepting()
                self._timer = self.loop.timer(ACCEPT_PAUSE)
                self._timer.start(self.start_accepting)
            return None
        if accepted is not None:
            conn = accepted[0]
            if self.is_tcp:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats.accepted += 1
            self.conns.add(conn)
        return accepted

    def echo(self, conn, address) -> None:
        """Echoes one connection until EOF; StreamServer closes it afterwards."""
        stats = self.stats
        try:
            while True:
                data = conn.recv(READ_SIZE)
                if not data:
                    break
                stats.bytes += len(data)
                conn.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            pass
        except OSError:
            stats.errors += 1
        finally:
            self.conns.discard(conn)

    def shut(self) -> None:
        """Closes the listener, kills every handler and closes every connection."""
        self.close()
        self.pool.kill(block=True, timeout=KILL_TIMEOUT)
        for conn in list(self.conns):
            conn.close()
        self.conns.clear()


def serve(sock: socket.socket, stop_fd: int, stats: Stats) -> None:
    hub = gevent.get_hub()
    sock.setblocking(False)  # StreamServer accepts on it until it would block
    server = EchoServer(sock, stats)
    watcher = hub.loop.io(stop_fd, 1)
    try:
        server.start()
        hub.wait(watcher)
    finally:
        watcher.close()
        server.shut()
        if threading.current_thread() is not threading.main_thread():
            hub.destroy(destroy_loop=True)  # a thread's own hub and loop, with their fds
