"""Machine facts saved with every result: CPU, kernel, limits, library versions.

Each ``collect_*`` function degrades quietly (returns None) when a /proc file or a package is
missing: facts are context, never a reason to fail a run.  What is measured around each round
(CPU time, the cache-line and CPU-speed probes) is in ``pyconcbench.instruments``.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any, Dict, Optional

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


def python_build() -> Dict[str, Any]:
    """This interpreter's build and GIL: ``python_build`` "free-threaded" (compiled with
    Py_GIL_DISABLED, PEP 703) or "default", and ``gil_enabled`` now (a free-threaded build turns
    the GIL back on for an extension that does not declare it can run without it, or under
    PYTHON_GIL=1)."""
    import sysconfig
    free = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil = getattr(sys, "_is_gil_enabled", None)
    return {"python_build": "free-threaded" if free else "default",
            "gil_enabled": bool(gil()) if gil is not None else True}


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
        **python_build(),
        "fd_limit": collect_fd_limit(),
        "somaxconn": collect_sysctl("net.core.somaxconn"),
        "ip_local_port_range": collect_sysctl("net.ipv4.ip_local_port_range"),
        "pyconcbench": __version__,
        "libraries": collect_versions(),
    }
