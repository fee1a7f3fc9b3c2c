"""Machine facts saved with every result, and the machine-state probes around each round.

Each ``collect_*`` function degrades quietly (returns None) when a /proc file or a package is
missing: facts are context, never a reason to fail a run.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

#: Packages whose versions matter to the numbers (distribution names).
LIBRARIES = ("pytest", "pytest-benchmark", "uvloop", "gevent", "greenlet", "tornado", "twisted",
             "trio", "anyio", "curio", "pyzmq", "aiozmq")

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def collect_cpu_model() -> Optional[str]:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def collect_versions() -> Dict[str, str]:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return {}
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def collect_fd_limit() -> Dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft": soft, "hard": hard}


def collect_sysctl(name: str) -> Optional[str]:
    text = _read("/proc/sys/" + name.replace(".", "/"))
    return text.strip() if text is not None else None


def machine_facts() -> Dict[str, Any]:
    """What a reader needs to judge a saved result: CPU, kernel, limits, library versions."""
    from . import __version__

    return {
        "cpu_model": collect_cpu_model(),
        "cpus_online": os.cpu_count(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "fd_limit": collect_fd_limit(),
        "somaxconn": collect_sysctl("net.core.somaxconn"),
        "ip_local_port_range": collect_sysctl("net.ipv4.ip_local_port_range"),
        "pyconcbench": __version__,
        "libraries": collect_versions(),
    }


# ---- per-round state ------------------------------------------------------------------

@dataclass(frozen=True)
class CpuSnapshot:
    """Busy CPU seconds: of the whole machine, of this process, of the server process.

    ``server_runtime`` is the server's on-CPU time to the nanosecond (the sum of its threads'
    /proc schedstat); ``server_user``/``server_sys`` are the kernel's clock-tick split (10 ms
    resolution), good for the user share over many rounds, too coarse for one short round.
    """

    machine: Optional[float]  # None: /proc/stat unreadable
    own: float
    server_user: float
    server_sys: float
    server_runtime: Optional[float]  # None: the server's /proc/PID/task unreadable

    def other_since(self, earlier: "CpuSnapshot") -> Optional[float]:
        """CPU seconds used by every other process between the two snapshots; None when the
        machine's busy time could not be read (unknown, never a silent 0.0)."""
        if self.machine is None or earlier.machine is None:
            return None
        total = self.machine - earlier.machine
        own = self.own - earlier.own
        server = (self.server_user + self.server_sys) - (earlier.server_user + earlier.server_sys)
        return max(0.0, total - own - server)


def machine_busy_seconds() -> Optional[float]:
    """Non-idle CPU seconds of all CPUs since boot (/proc/stat), None when unreadable."""
    text = _read("/proc/stat")
    if not text:
        return None
    fields = text.split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal guest guest_nice; guests are in user.
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / CLK_TCK


def process_cpu(pid: int) -> Optional[tuple]:
    """(user, system) CPU seconds of a process, all threads, or None if it is gone."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[11]) / CLK_TCK, int(rest[12]) / CLK_TCK


def process_runtime(pid: int) -> Optional[float]:
    """On-CPU seconds of a process's live threads, ns-precise (/proc/PID/task/*/schedstat);
    None when unavailable (the process is gone, or the kernel has no schedstat).  Threads that
    exit between the listing and the read are not counted."""
    total = 0
    read = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if text:
            total += int(text.split()[0])
            read += 1
    return total / 1e9 if read else None


def snapshot(server_pid: Optional[int]) -> CpuSnapshot:
    own = process_cpu(os.getpid()) or (0.0, 0.0)
    server = process_cpu(server_pid) if server_pid else None
    server = server or (0.0, 0.0)
    runtime = process_runtime(server_pid) if server_pid else None
    return CpuSnapshot(machine_busy_seconds(), own[0] + own[1], server[0], server[1], runtime)


def cacheline_rtt(cpu_a: int, cpu_b: int, iterations: int = 20000) -> Optional[float]:
    """ns per cache-line round trip between the two CPUs (None when they are the same)."""
    if cpu_a == cpu_b:
        return None
    from . import _native

    return _native.cacheline_rtt(cpu_a, cpu_b, iterations)


def proc_status_kib(pid: int, key: str) -> Optional[int]:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM), or None."""
    text = _read(f"/proc/{pid}/status")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def loadavg() -> List[float]:
    text = _read("/proc/loadavg")
    return [float(x) for x in text.split()[:3]] if text else []


# ---- CPU speed ----------------------------------------------------------------------------

#: Iterations of the fixed loop one speed probe times (about 1 ms on the reference machine).
SPEED_LOOPS = 12000
#: A probe this much slower than the fastest seen on that CPU means a slow spell.
SPEED_NOISY_FACTOR = 1.15


def cpu_loop_ns(cpu: int, loops: int = SPEED_LOOPS, repeat: int = 3) -> float:
    """The fastest of ``repeat`` timings (ns) of a fixed pure-Python loop, run with the calling
    thread pinned to ``cpu`` (its affinity restored after)."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter_ns()
            x = 0
            for i in range(loops):
                x += i
            best = min(best, time.perf_counter_ns() - started)
    finally:
        os.sched_setaffinity(0, old)
    return float(best)


class SpeedGauge:
    """How fast each pinned CPU runs now, against the fastest it has run this session.

    A virtual CPU can run a fixed loop 1.2-1.7x slower for seconds at a time (another tenant
    on its hyper-thread sibling, host frequency changes): invisible to steal time, to other
    processes' CPU and to the cache-line probe, but it moves every number.  A round with a
    probe before or after it slower than ``SPEED_NOISY_FACTOR`` x the best is noisy."""

    def __init__(self, cpus: Any) -> None:
        self.cpus = tuple(dict.fromkeys(cpus))
        self.best: Dict[int, float] = {}

    def probe(self) -> Dict[int, float]:
        """cpu -> loop ns now (the running best updated)."""
        out = {}
        for cpu in self.cpus:
            ns = cpu_loop_ns(cpu)
            out[cpu] = ns
            self.best[cpu] = min(self.best.get(cpu, ns), ns)
        return out

    def warm(self, times: int = 5) -> "SpeedGauge":
        for _ in range(times):
            self.probe()
        return self

    def slowdown(self, probe: Dict[int, float]) -> Dict[int, float]:
        """cpu -> probe / best (1.0 = as fast as ever seen)."""
        return {cpu: ns / self.best[cpu] for cpu, ns in probe.items() if self.best.get(cpu)}

    def judge(self, *probes: Optional[Dict[int, float]]) -> str:
        """Why these probes show a slow spell, or ''."""
        for probe in probes:
            if not probe:
                continue
            for cpu, ratio in self.slowdown(probe).items():
                if ratio > SPEED_NOISY_FACTOR:
                    return f"CPU {cpu} ran a fixed loop {ratio:.2f}x slower than its best"
        return ""
