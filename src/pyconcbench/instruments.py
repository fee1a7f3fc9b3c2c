"""The instruments read around each measured round: CPU time from /proc (the machine's, a
process's, a thread's wait for its CPU), memory figures, the cache-line probe between two CPUs
and the CPU-speed gauge.  The noise judges in ``pyconcbench.rounds`` and the workloads (echo,
ZeroMQ, switch) read the machine only through these.

Every reader returns None when its /proc file is unreadable: an unknown is never a silent 0.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .machine import CLK_TCK, _read


# ---- CPU time ----------------------------------------------------------------------------

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


def machine_busy_seconds(cpus: Optional[Sequence[int]] = None) -> Optional[float]:
    """Non-idle CPU seconds since boot (/proc/stat) of all CPUs, or of ``cpus`` only; None
    when unreadable."""
    text = _read("/proc/stat")
    if not text:
        return None
    wanted = ("cpu",) if cpus is None else tuple(f"cpu{c}" for c in cpus)
    busy = 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] not in wanted:
            continue
        try:
            ticks = [int(x) for x in fields[1:]]
        except ValueError:
            return None
        # user nice system idle iowait irq softirq steal guest guest_nice; guests are in user.
        busy += sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / CLK_TCK


def own_cpu(children: bool = False) -> Optional[float]:
    """This process's CPU seconds (all threads); with ``children``, its reaped children's too
    (a Go run, a fork)."""
    text = _read("/proc/self/stat")
    if not text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return sum(int(x) for x in rest[11:15 if children else 13]) / CLK_TCK


def thread_waited_ns() -> Optional[int]:
    """Nanoseconds the calling thread has been runnable but waiting for a CPU (schedstat),
    None when /proc does not say."""
    text = _read("/proc/thread-self/schedstat")
    try:
        return int(text.split()[1]) if text else None
    except (ValueError, IndexError):
        return None


class OtherCpu:
    """CPU seconds that processes other than this one (and its reaped children) used on a set
    of CPUs (None: all) between ``start()`` and ``stop()``; None when /proc/stat is
    unreadable.  The echo and ZeroMQ rounds use ``CpuSnapshot.other_since`` instead, which
    also leaves the server process out."""

    def __init__(self, cpus: Optional[Sequence[int]] = None) -> None:
        self.cpus = cpus
        self._start: Tuple[Optional[float], Optional[float]] = (None, None)

    def start(self) -> "OtherCpu":
        self._start = (machine_busy_seconds(self.cpus), own_cpu(children=True))
        return self

    def stop(self) -> Optional[float]:
        busy0, own0 = self._start
        busy1, own1 = machine_busy_seconds(self.cpus), own_cpu(children=True)
        if None in (busy0, busy1, own0, own1):
            return None
        return max(0.0, (busy1 - busy0) - (own1 - own0))


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


def snapshot(server_pid: Union[None, int, Sequence[int]], load_pids: Sequence[int] = ()) -> CpuSnapshot:
    """The machine's, this process's and the server's CPU time now; ``server_pid`` may be
    several processes (a server that forks workers), summed (those that are gone count 0;
    ``server_runtime`` is None when none could be read); ``load_pids``: the load generator's
    engine processes (pyconcbench.engines), counted as this process's own, not as others'."""
    own = process_cpu(os.getpid()) or (0.0, 0.0)
    for pid in load_pids:
        cpu = process_cpu(pid)
        if cpu is not None:
            own = (own[0] + cpu[0], own[1] + cpu[1])
    pids = () if not server_pid else (server_pid,) if isinstance(server_pid, int) else tuple(server_pid)
    user = system = 0.0
    runtime: Optional[float] = None
    for pid in pids:
        cpu = process_cpu(pid)
        if cpu is not None:
            user, system = user + cpu[0], system + cpu[1]
        ran = process_runtime(pid)
        if ran is not None:
            runtime = (runtime or 0.0) + ran
    return CpuSnapshot(machine_busy_seconds(), own[0] + own[1], user, system, runtime)


def cacheline_rtt(cpu_a: int, cpu_b: int, iterations: int = 20000) -> Optional[float]:
    """ns per cache-line round trip between the two CPUs (None when they are the same)."""
    if cpu_a == cpu_b:
        return None
    from . import _native

    return _native.cacheline_rtt(cpu_a, cpu_b, iterations)


def proc_status_kib(pid: Any, key: str) -> Optional[int]:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM, VmSize, VmPTE; PID may be "self"),
    or None."""
    text = _read(f"/proc/{pid}/status")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def status_kib_total(pids: Sequence[int], key: str) -> Optional[int]:
    """``proc_status_kib`` summed over several processes (a server and its workers), or None
    when none could be read."""
    values = [v for v in (proc_status_kib(pid, key) for pid in pids) if v is not None]
    return sum(values) if values else None


def mappings(pid: Any = "self") -> Optional[int]:
    """How many mappings the process has (/proc/PID/maps), None when unreadable."""
    text = _read(f"/proc/{pid}/maps")
    return None if text is None else len(text.splitlines())


def loadavg() -> List[float]:
    text = _read("/proc/loadavg")
    return [float(x) for x in text.split()[:3]] if text else []


# ---- CPU speed ----------------------------------------------------------------------------

#: Iterations of the fixed loop one speed probe times (about 1 ms on the reference machine).
SPEED_LOOPS = 12000
#: A probe this much slower than the fastest seen on that CPU means a slow spell.  On the 2-vCPU
#: VM this was tuned on the probes fall in two groups (1,282 probes of a 23-minute run): 1.00 to
#: ~1.25x the best (the median 1.11 and 1.19 on the two CPUs: the best is the session's rarest
#: fast moment), and slow spells at 1.55 to 2.5x; the factor sits between them.  At 1.15 the
#: judge rejected half the normal group, and measuring those rounds again found more of the same.
SPEED_NOISY_FACTOR = 1.35


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
