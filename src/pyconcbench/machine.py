"""Machine facts saved with every result: CPU, kernel, limits, the versions of the event loops,
libraries and peer toolchains (go, node), "not installed" for those that are not.

Each ``collect_*`` function degrades quietly (returns None) when a /proc file or a package is
missing: facts are context, never a reason to fail a run.  What is measured around each round
(CPU time, the cache-line and CPU-speed probes) is in ``pyconcbench.instruments``.
"""
from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional

from . import metrics

#: Packages whose versions matter to the numbers (distribution names): the event loops and
#: concurrency libraries, each listed whether installed or not (NOT_INSTALLED).
LIBRARIES = ("pytest", "pytest-benchmark", "uvloop", "rloop", "uringcore", "gevent", "greenlet",
             "tornado", "twisted", "trio", "anyio", "curio", "pyzmq", "aiozmq")
#: Programs the peer servers run (go_net, node_net) and how each tells its version.
TOOLS = {"go": ("version",), "node": ("--version",)}
NOT_INSTALLED = metrics.NOT_INSTALLED
TOOL_TIMEOUT = 10.0  # s, for `go version` / `node --version`

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
    """Each of LIBRARIES: its version, or NOT_INSTALLED; after uvloop, the libuv it was built
    with (when uvloop imports and tells it)."""
    from importlib import metadata

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = NOT_INSTALLED
        if name == "uvloop":
            libuv = collect_libuv_version() if out[name] != NOT_INSTALLED else NOT_INSTALLED
            if libuv is not None:
                out["libuv"] = libuv
    return out


def collect_libuv_version() -> Optional[str]:
    """libuv's version inside uvloop ('1.48.0'), or None when uvloop does not import or does
    not expose it (uvloop.loop.libuv_get_version, an integer 0xMMmmpp)."""
    try:
        from uvloop import loop as uvloop_loop

        number = int(uvloop_loop.libuv_get_version())
    except Exception:
        return None
    return "%d.%d.%d" % (number >> 16, (number >> 8) & 0xFF, number & 0xFF)


def collect_tool_versions() -> Dict[str, str]:
    """``go`` and ``node``: the version of the one on PATH ('1.26.8', '20.20.2'), NOT_INSTALLED
    when there is none; left out when it does not answer (in TOOL_TIMEOUT) with a version."""
    out = {}
    for tool, args in TOOLS.items():
        path = shutil.which(tool)
        if path is None:
            out[tool] = NOT_INSTALLED
            continue
        version = _tool_version(path, args)
        if version is not None:
            out[tool] = version
    return out


def _tool_version(path: str, args: tuple) -> Optional[str]:
    # GOTOOLCHAIN=local: go must not fetch another toolchain that a go.mod around asks for.
    env = dict(os.environ, GOTOOLCHAIN="local")
    try:
        done = subprocess.run([path, *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                              env=env, cwd="/", stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\b(?:go|v)?(\d+\.\d+(?:\.\d+)?\S*)", done.stdout) if done.returncode == 0 else None
    return found.group(1) if found else None


def libraries_line() -> str:
    """'uvloop 0.21.0, libuv 1.48.0, rloop 0.5.0, ... (not installed: curio)': the loops,
    libraries and tools of this machine as the pytest header shows them (pytest and
    pytest-benchmark print their own)."""
    return metrics.libraries_text({**collect_versions(), **collect_tool_versions()},
                                  leave_out=("pytest", "pytest-benchmark"))


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
        "libraries": {**collect_versions(), **collect_tool_versions()},
    }
