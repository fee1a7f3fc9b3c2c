"""fork timed inside a fresh, small Python process: the Python twin of pcb_forkloop.

Not imported by the package: ``pyconcbench.micro.smallproc`` runs this file by its path as
``python -I -S forkloop.py MODE N [EXTENSION]``, so that the process that forks holds an
interpreter, the modules it starts with, ``os`` and (mode ``native``) the extension, and
nothing else: no pytest, no site-packages, no asyncio.  Modes:

    python  N              N x ``os.fork()`` of a child that ``os._exit(0)``s, ``os.waitpid()``
    native  N EXTENSION    the extension's C loop (``micro_run('fork_waitpid', N)``), the
                           extension loaded from its file without importing the package

It prints one JSON line, as pcb_forkloop does: ops, elapsed_ns, empty_ns, check (children
that exited 0), waited_ns, and this process's rss_kib, vm_kib, pte_kib and maps read just
before the timed loop.  Any failure: one line on stderr, exit status 1 (2: bad arguments).
Keep the imports to what is here: every module loaded grows the process being measured.
"""
import gc
import os
import sys
from time import perf_counter_ns

WARM = 10
#: Seconds the extension's loop may take (mode native); the caller bounds the process too.
NATIVE_TIMEOUT = 600.0


def memory():
    """This process's VmRSS, VmSize and VmPTE in KiB and its number of mappings."""
    out = {"rss_kib": -1, "vm_kib": -1, "pte_kib": -1, "maps": -1}
    keys = {"VmRSS": "rss_kib", "VmSize": "vm_kib", "VmPTE": "pte_kib"}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                out[keys[name]] = int(rest.split()[0])
    with open("/proc/self/maps") as f:
        out["maps"] = sum(1 for _ in f)
    return out


def waited_ns():
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def fork_one():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status == 0


def python_loop(n):
    for _ in range(min(WARM, n)):
        fork_one()
    mem = memory()
    t0 = perf_counter_ns()
    for _ in range(n):
        pass
    empty = perf_counter_ns() - t0
    ok = 0
    w0 = waited_ns()
    t0 = perf_counter_ns()
    for _ in range(n):
        ok += fork_one()
    elapsed = perf_counter_ns() - t0
    w1 = waited_ns()
    return dict(mem, ops=n, elapsed_ns=elapsed, empty_ns=empty, check=ok,
                waited_ns=w1 - w0 if w0 >= 0 and w1 >= w0 else -1)


def native_loop(n, path):
    from importlib.machinery import ExtensionFileLoader, ModuleSpec

    name = "pyconcbench._native"
    loader = ExtensionFileLoader(name, path)
    module = loader.create_module(ModuleSpec(name, loader, origin=path))
    loader.exec_module(module)
    mem = memory()
    d = module.micro_run("fork_waitpid", n, 1, -1, -1, NATIVE_TIMEOUT)
    return dict(mem, ops=d["ops"], elapsed_ns=d["elapsed_ns"], empty_ns=d["empty_ns"],
                check=d["check"], waited_ns=d.get("waited_ns", -1))


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    try:
        n = int(argv[2])
        if n < 1 or (mode == "python") != (len(argv) == 3) or mode not in ("python", "native"):
            raise ValueError
    except (IndexError, ValueError):
        print("usage: forkloop.py python N | forkloop.py native N EXTENSION (N >= 1)",
              file=sys.stderr)
        return 2
    gc.disable()
    try:
        d = python_loop(n) if mode == "python" else native_loop(n, argv[3])
    except Exception as exc:  # one line, no traceback
        print(f"forkloop.py {mode}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    fields = ", ".join(f'"{k}": {int(v)}' for k, v in sorted(d.items()))
    print(f'{{"case": "fork_waitpid", "mode": "{mode}", {fields}}}', flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
