"""A simulated remote server: the echo server and the load generator in a network namespace of
their own, whose loopback delays every packet (netem).

    --pcb-network local                      the default: the machine's own loopback
    --pcb-network netns:delay=200us          a namespace of its own, each packet on its lo 200 us late
    --pcb-network netns:delay=1ms,rate=1gbit  ... and its lo limited to 1 Gbit/s
    --pcb-network netns                      the namespace alone, no qdisc (what the namespace costs)
    --pcb-network local,netns:delay=200us    both, side by side in the tables

Traffic stays on loopback: the namespace has only its own ``lo`` (127.0.0.1), nothing connects
it to another, and ``tc`` is only ever run on that ``lo`` with ``-n NAME``.  netem on ``lo``
delays every packet once, so a round trip (request out, echo back) gains about 2 x delay.

A socket belongs to the namespace of the thread that creates it, for life: the server process
enters the namespace between fork and exec (``procs.Child(netns=...)``), and the load
generator's thread enters it only around the engine's connects (``entered``), then returns.
``Namespace`` creates one (``pcb-PID-N``) and removes it on exit, at interpreter exit too;
``sweep_stale`` removes those of runs that were killed.  Needs root (CAP_SYS_ADMIN and
CAP_NET_ADMIN), ``ip`` and ``tc`` (iproute2), and the kernel's netem qdisc for a delay or a rate:
``unavailable`` says in one line what is missing.  Stdlib only.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

__all__ = ["Network", "LOCAL", "NetworkError", "NetworkUnavailable", "Namespace", "parse_network",
           "parse_networks", "unavailable", "entered", "sweep_stale", "round_trip_us"]

#: Where ``ip netns add`` puts a namespace's handle.
NETNS_DIR = "/run/netns"
#: Our namespaces' names: ``pcb-PID-N`` (the maker's pid, so a later run can tell it was left).
_NAME = re.compile(r"pcb-(\d+)-(\d+)")
#: A namespace of a dead maker younger than this is left alone (its maker may run in another
#: PID namespace sharing /run/netns, as procs.STALE_AGE for temporary directories).
STALE_AGE = 600.0
#: Bounds of what may be asked: delays of 1 us .. 100 ms per packet, rates of 1 kbit/s .. 100 gbit/s.
MAX_DELAY_US = 100_000
RATE_UNITS = {"kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9}
#: Each ip/tc call must finish within this many seconds.
TOOL_TIMEOUT = 10.0
CLONE_NEWNET = 0x40000000
#: Capabilities a namespace and its qdisc need (bits of /proc/self/status CapEff).
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
#: Where ip and tc are looked for besides PATH (a non-login root shell may lack the sbin dirs).
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


class NetworkError(RuntimeError):
    """A namespace that could not be made, entered or removed, in one line."""


class NetworkUnavailable(NetworkError):
    """What a simulated network needs is missing here (root, iproute2, netem): a skip."""


@dataclass(frozen=True)
class Network:
    """Where an echo case's server and load generator talk: ``local`` (the machine's loopback)
    or ``netns`` (a namespace of their own; ``delay_us`` per packet on its lo, ``rate_bit`` a
    rate limit in bit/s, both through netem; neither: the namespace alone)."""

    kind: str = "local"
    delay_us: int = 0
    rate_bit: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("local", "netns"):
            raise ValueError(f"Network.kind: 'local' or 'netns', got {self.kind!r}")
        if self.kind == "local" and (self.delay_us or self.rate_bit):
            raise ValueError("Network: a delay or rate needs kind 'netns'")

    @property
    def local(self) -> bool:
        return self.kind == "local"

    @property
    def qdisc(self) -> bool:
        """Whether its namespace's lo gets a netem qdisc."""
        return bool(self.delay_us or self.rate_bit)

    @property
    def spec(self) -> str:
        """The canonical text, as --pcb-network takes it: ``netns:delay=200us,rate=1gbit``."""
        if self.local:
            return "local"
        parts = ([f"delay={_delay_text(self.delay_us)}"] if self.delay_us else []) + (
            [f"rate={_rate_text(self.rate_bit)}"] if self.rate_bit else [])
        return "netns" + (":" + ",".join(parts) if parts else "")

    @property
    def id_suffix(self) -> str:
        """What an echo case's test id gets: '' for local, ``-netns_d200us[_r1gbit]``."""
        if self.local:
            return ""
        return "-netns" + (f"_d{_delay_text(self.delay_us)}" if self.delay_us else "") + (
            f"_r{_rate_text(self.rate_bit)}" if self.rate_bit else "")

    @property
    def label(self) -> str:
        """What a table row's implementation gets: '' for local, ``+netns(200us)``: each packet
        200 us late, about 400 us more per round trip."""
        if self.local:
            return ""
        inner = ",".join(([_delay_text(self.delay_us)] if self.delay_us else [])
                         + ([_rate_text(self.rate_bit)] if self.rate_bit else []))
        return "+netns" + (f"({inner})" if inner else "")

    def netem_args(self) -> List[str]:
        """tc's netem arguments: ``delay 200us rate 1gbit``."""
        return (["delay", f"{self.delay_us}us"] if self.delay_us else []) + (
            ["rate", _rate_text(self.rate_bit)] if self.rate_bit else [])

    def describe(self) -> str:
        """In words, for the saved run and the docs' note."""
        if self.local:
            return "local loopback"
        if not self.qdisc:
            return "a network namespace of its own, loopback without a qdisc"
        words = []
        if self.delay_us:
            words.append(f"each packet {_delay_text(self.delay_us)} late (about +{_delay_text(2 * self.delay_us)} "
                         "per round trip)")
        if self.rate_bit:
            words.append(f"limited to {_rate_text(self.rate_bit)}/s")
        return "a network namespace of its own, netem on its lo: " + ", ".join(words)

    def as_dict(self) -> Dict[str, object]:
        return {"network": self.spec, "network_delay_us": self.delay_us, "network_rate_bit": self.rate_bit}


LOCAL = Network()


def _delay_text(us: int) -> str:
    return f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


def _rate_text(bit: int) -> str:
    for unit in ("gbit", "mbit", "kbit"):
        if bit % RATE_UNITS[unit] == 0:
            return f"{bit // RATE_UNITS[unit]}{unit}"
    return f"{bit}bit"  # not reached: rates are whole kbit


def _parse_delay(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms)", text.strip().lower())
    if not m:
        raise ValueError(f"delay {text!r} is not a delay (e.g. 200us, 1ms, 1.5ms)")
    us = float(m.group(1)) * (1000 if m.group(2) == "ms" else 1)
    if us != int(us):
        raise ValueError(f"delay {text!r} is not a whole number of microseconds")
    if not 1 <= us <= MAX_DELAY_US:
        raise ValueError(f"delay {text!r} is outside 1us .. {MAX_DELAY_US // 1000}ms")
    return int(us)


def _parse_rate(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", text.strip().lower())
    if not m:
        raise ValueError(f"rate {text!r} is not a rate (e.g. 100mbit, 1gbit, 500kbit)")
    bit = float(m.group(1)) * RATE_UNITS[m.group(2)]
    if bit != int(bit) or int(bit) % 1000:
        raise ValueError(f"rate {text!r} is not a whole number of kbit")
    if not 1000 <= bit <= 100 * 10 ** 9:
        raise ValueError(f"rate {text!r} is outside 1kbit .. 100gbit")
    return int(bit)


def parse_network(text: str) -> Network:
    """``local``, ``netns`` or ``netns:delay=D[,rate=R]`` (D in us or ms, R in kbit, mbit or gbit)
    -> Network; ValueError (one line, quoting the bad part) otherwise."""
    raw = text.strip()
    if raw == "local":
        return LOCAL
    kind, _, rest = raw.partition(":")
    if kind != "netns":
        raise ValueError(f"{text!r} is not a network: local, netns or netns:delay=200us[,rate=1gbit]")
    if ":" in raw and not rest.strip():
        raise ValueError(f"{text!r}: nothing after 'netns:' (e.g. netns:delay=200us)")
    values: Dict[str, int] = {}
    for item in (p.strip() for p in rest.split(",") if rest.strip()):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("delay", "rate"):
            raise ValueError(f"{text!r}: {item!r} is not delay=D or rate=R (e.g. delay=200us, rate=1gbit)")
        if key in values:
            raise ValueError(f"{text!r}: {key} is given twice")
        values[key] = _parse_delay(value) if key == "delay" else _parse_rate(value)
    return Network("netns", values.get("delay", 0), values.get("rate", 0))


def parse_networks(text: str) -> Tuple[Network, ...]:
    """A comma-separated list of networks: ``local,netns:delay=200us,rate=1gbit,netns:delay=1ms``
    (a ``key=value`` item belongs to the ``netns`` before it); duplicates dropped, order kept."""
    items: List[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if "=" in part and not part.startswith(("netns", "local")):
            if not items or not items[-1].startswith("netns:"):
                raise ValueError(f"{text!r}: {part!r} does not follow a netns:... network")
            items[-1] += "," + part
        else:
            items.append(part)
    if not items:
        raise ValueError(f"{text!r} is empty: give local, netns:delay=200us, or both")
    return tuple(dict.fromkeys(parse_network(item) for item in items))


# ---- what it needs ------------------------------------------------------------------------------

def _tool(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _capabilities() -> int:
    """This process's effective capabilities (CapEff), 0 when unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def privileged() -> bool:
    """Whether this process may create and enter network namespaces and set their qdiscs."""
    caps = _capabilities()
    return bool(caps >> CAP_SYS_ADMIN & 1 and caps >> CAP_NET_ADMIN & 1)


#: Set once a qdisc was refused by the kernel: the one-line reason every later case skips with.
_NO_NETEM: List[str] = []
NETEM_MISSING = ("--pcb-network {spec}: the kernel has no netem qdisc (sch_netem: CONFIG_NET_SCH_NETEM "
                 "is not set, or the module is not loaded: modprobe sch_netem)")


def unavailable(network: Network) -> str:
    """Why ``network`` cannot be simulated here, in one line; '' when it can (as far as can be
    told before trying: netem itself is known missing only once a qdisc was refused)."""
    if network.local:
        return ""
    spec = network.spec
    if not privileged():
        return (f"--pcb-network {spec} needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN, to create a network "
                "namespace and its qdisc): run as root, or --pcb-network local")
    missing = [name for name in ("ip", "tc") if _tool(name) is None]
    if missing:
        return f"--pcb-network {spec} needs {' and '.join(missing)} (iproute2) on PATH: apt-get install iproute2"
    if network.qdisc and _NO_NETEM:
        return NETEM_MISSING.format(spec=spec)
    return ""


# ---- entering a namespace ----------------------------------------------------------------------

_libc_setns = None


def setns(fd: int) -> None:
    """This thread into the network namespace ``fd`` refers to (os.setns from Python 3.12, libc's
    setns before); OSError on failure."""
    if hasattr(os, "setns"):
        os.setns(fd, CLONE_NEWNET)
        return
    global _libc_setns
    if _libc_setns is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.setns.restype = ctypes.c_int
        _libc_setns = libc.setns
    if _libc_setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_namespace(path: str) -> int:
    """An fd of the namespace at ``path`` (close-on-exec); NetworkError in one line."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetworkError(f"cannot open network namespace {path}: {exc.strerror}") from None


@contextlib.contextmanager
def entered(path: Optional[str]) -> Iterator[None]:
    """Inside: this thread in the network namespace at ``path`` (None: where it is), so the
    sockets it creates belong there; on the way out, always back where it was."""
    if path is None:
        yield
        return
    home = open_namespace("/proc/thread-self/ns/net")
    try:
        target = open_namespace(path)
        try:
            setns(target)
        except OSError as exc:
            raise NetworkError(f"cannot enter network namespace {path}: {exc.strerror}") from None
        finally:
            os.close(target)
        try:
            yield
        finally:
            try:
                setns(home)
            except OSError as exc:  # not seen; never go on in the wrong namespace unnoticed
                raise NetworkError(f"cannot return from network namespace {path}: {exc.strerror}") from None
    finally:
        os.close(home)


# ---- a namespace of our own ---------------------------------------------------------------------

_COUNTER = itertools.count(1)
_LIVE: Dict[str, "Namespace"] = {}
_LOCK = threading.Lock()


def _run(argv: List[str]) -> None:
    """Runs an ip or tc command; NetworkError naming it and its last stderr line."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)}: no answer within {TOOL_TIMEOUT:g} s") from None
    except OSError as exc:
        raise NetworkError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise NetworkError(f"{' '.join(argv)}: {why}")


class Namespace:
    """A network namespace of this run's (``pcb-PID-N``) for ``network``: its lo up, netem on it
    when the network has a delay or rate.  ``create()`` (or ``with``) makes it; ``remove()``
    (the ``with`` exit, or interpreter exit) removes it.  ``path`` is what ``entered`` and
    ``procs.Child(netns=)`` take."""

    def __init__(self, network: Network) -> None:
        if network.local:
            raise ValueError("Namespace: the local network has none")
        self.network = network
        self.name: Optional[str] = None
        #: the measured round trip of one connection in it (``round_trip_us``), once created
        self.rtt_us: Optional[float] = None

    @property
    def path(self) -> str:
        if self.name is None:
            raise NetworkError("the network namespace was not created")
        return os.path.join(NETNS_DIR, self.name)

    def __repr__(self) -> str:
        return f"<Namespace {self.name or '(not created)'} {self.network.spec}>"

    def create(self) -> "Namespace":
        """NetworkUnavailable when what it needs is missing (root, iproute2, netem), NetworkError
        when a step fails otherwise; nothing is left behind either way."""
        why = unavailable(self.network)
        if why:
            raise NetworkUnavailable(why)
        if self.name is not None:
            raise NetworkError(f"{self.name} already created")
        name = f"pcb-{os.getpid()}-{next(_COUNTER)}"
        ip, tc = _tool("ip"), _tool("tc")
        _run([ip, "netns", "add", name])
        self.name = name
        with _LOCK:
            _LIVE[name] = self
        try:
            _run([ip, "-n", name, "link", "set", "dev", "lo", "up"])
            if self.network.qdisc:
                try:
                    _run([tc, "-n", name, "qdisc", "add", "dev", "lo", "root", "netem"] + self.network.netem_args())
                except NetworkError as exc:
                    if "unknown" in str(exc).lower():  # "Specified qdisc kind is unknown."
                        _NO_NETEM.append(str(exc))
                        raise NetworkUnavailable(NETEM_MISSING.format(spec=self.network.spec)) from None
                    raise
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Removes it (the processes and sockets still in it keep it alive until they end).
        Idempotent; NetworkError when ``ip netns del`` fails for another reason than its being gone."""
        name, self.name = self.name, None
        if name is None:
            return
        with _LOCK:
            _LIVE.pop(name, None)
        if not os.path.exists(os.path.join(NETNS_DIR, name)):
            return
        _run([_tool("ip") or "ip", "netns", "del", name])

    def __enter__(self) -> "Namespace":
        return self.create() if self.name is None else self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@atexit.register
def _remove_live() -> None:
    """At interpreter exit: this process's namespaces still there (a run stopped half way)."""
    with _LOCK:
        live = list(_LIVE.values())
    for ns in live:
        try:
            ns.remove()
        except NetworkError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, ValueError):
        return False
    except OSError:  # alive, another user's
        return True
    return True


def sweep_stale(where: str = NETNS_DIR) -> List[str]:
    """Removes our namespaces (``pcb-PID-N``) whose maker no longer runs and that are at least
    ``STALE_AGE`` seconds old (a run killed before its clean-up); returns their names.  Never
    raises; does nothing without the privileges or ``ip``."""
    try:
        names = os.listdir(where)
    except OSError:
        return []
    stale = []
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if time.time() - os.lstat(os.path.join(where, name)).st_mtime < STALE_AGE:
                continue
        except OSError:
            continue
        stale.append(name)
    if not stale or not privileged() or _tool("ip") is None:
        return []
    removed = []
    for name in stale:
        try:
            _run([_tool("ip"), "netns", "del", name])
            removed.append(name)
        except NetworkError:
            pass
    return removed


# ---- what it adds ------------------------------------------------------------------------------

def round_trip_us(path: Optional[str], trips: int = 10, timeout: float = 5.0) -> float:
    """The median round trip, in microseconds, of one byte over one loopback TCP connection made
    in the namespace at ``path`` (None: here), client and server in this thread: what the
    network adds to every round trip of the echo load (2 x the delay, and the kernel's own)."""
    with entered(path):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    times = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(timeout)
        client.settimeout(timeout)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        with server:
            server.settimeout(timeout)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(trips + 1):  # the first warms up
                started = time.perf_counter()
                client.sendall(b"x")
                server.sendall(server.recv(1))
                if client.recv(1) != b"x":
                    raise NetworkError("the round-trip probe got no echo")
                times.append(time.perf_counter() - started)
    except OSError as exc:
        raise NetworkError(f"the round-trip probe in {path or 'this namespace'} failed: {exc}") from None
    finally:
        client.close()
        listener.close()
    return round(statistics.median(times[1:]) * 1e6, 1)
