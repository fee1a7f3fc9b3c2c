"""Which implementations the allocator state affects: each server (and each plain reference
server) is started pristine and representative in turn, and its allocator calls per round trip
are counted over one round (perf, else strace) at 100 connections x 64 B over TCP.

    python tools/allocator_states.py                     # every implementation and plain server
    python tools/allocator_states.py asyncio_protocol plain:asyncio_protocol

Prints one line per server: its rate (msgs/s, while counted: lower than untraced) and the
calls per round trip in each state.  Unavailable implementations say so.
"""
import argparse
import sys

from pyconcbench import harness, loadgen, plain, servers, syscalls

CALLS = ("mmap", "mremap", "munmap", "brk", "madvise")


def count(server, tool, cpu):
    host, port = server.address
    spec = loadgen.LoadSpec(transport="tcp", host=host, port=port, connections=100, size=64,
                            messages=10000, warmup_messages=2000, cpu=cpu)
    with loadgen.LoadSession(spec) as session:
        counter = syscalls.SyscallCounter(server.measured_pid, tool, names=syscalls.ALLOCATOR).start()
        try:
            result = session.round()
        finally:
            counts = counter.stop()
    per = {k: counts.get(k, 0) / result.completed for k in CALLS}
    return result.msgs_per_s, per


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("impls", nargs="*", metavar="IMPL",
                        help="implementation ids, or plain:IMPL for a plain server (default: all)")
    parser.add_argument("--cpus", default="0,1", help="server CPU,load-generator CPU (default 0,1)")
    args = parser.parse_args(argv)
    tool = syscalls.available_tool()
    if tool is None:
        print("allocator_states: needs perf (linux-perf) or strace on PATH", file=sys.stderr)
        return 2
    server_cpu, load_cpu = (int(c) for c in args.cpus.split(","))
    impls = args.impls or list(servers.IMPLS) + ["plain:" + p for p in plain.PLAIN]
    for impl in impls:
        cells = []
        for malloc in ("pristine", "representative"):
            if impl.startswith("plain:"):
                server = harness.PlainServer(impl[6:], cpu=server_cpu, malloc=malloc)
            else:
                server = harness.ServerProcess(impl, cpu=server_cpu, malloc=malloc)
            try:
                server.start()
            except harness.ServerUnavailable as exc:
                cells.append(f"unavailable: {exc}")
                break
            try:
                rate, per = count(server, tool, load_cpu)
            finally:
                server.stop()
            calls = ", ".join(f"{k} {v:.2f}" for k, v in per.items() if v >= 0.005) or "none"
            cells.append(f"{malloc} {rate:,.0f} msgs/s: {calls}")
        print(f"{impl:<28} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
