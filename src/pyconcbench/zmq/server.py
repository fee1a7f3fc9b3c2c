"""``python -m pyconcbench.zmq.server``: the ROUTER echo server of the ``pyzmq_process`` mode.

Binds 127.0.0.1 on a port the kernel chooses (or an ipc:// path in the given directory),
prints ``READY {json}`` with the endpoint, then echoes every request's frames back until
SIGTERM, SIGINT, SIGHUP or the death of the thread that started it (PR_SET_PDEATHSIG).
Exit codes: 0 stopped when asked, 1 failed, 2 cannot run as asked (bad arguments, CPU not
allowed, missing pyzmq: the mode checked pyzmq before starting it, so the parent reports this as
a failure, not a skip), 5 stopped by an ``exit`` fault (tests); see pyconcbench.procs.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from pyconcbench.procs import EXIT_FAILED, EXIT_FAULT, EXIT_UNUSABLE, arm_parent_death, start_guard

PROG = "pyconcbench.zmq.server"
#: The receive timeout: how promptly a stop signal is noticed while idle.
POLL_MS = 100


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m " + PROG, description=__doc__.split("\n\n")[1])
    parser.add_argument("--transport", choices=("tcp", "ipc"), default="tcp",
                        help="tcp on 127.0.0.1, or ipc in --ipc-dir. Default: %(default)r")
    parser.add_argument("--ipc-dir", metavar="DIR", default=None,
                        help="directory for the ipc:// socket (required with --transport ipc)")
    parser.add_argument("--cpu", metavar="N", type=int, default=None,
                        help="pin the process, and with it libzmq's I/O and reaper threads, to CPU N "
                             "before creating the context. Default: no pinning")
    parser.add_argument("--fault", metavar="KIND[@AFTER]", default=None,
                        help="misbehave after AFTER good replies (tests): wrong_id, wrong_payload, silent, exit")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.transport == "ipc" and not args.ipc_dir:
        parser.error("--transport ipc needs --ipc-dir")
    if not arm_parent_death(signal.SIGTERM):
        return EXIT_FAILED
    # before libzmq starts its threads: SIGKILL to this group if it outlives a dead parent
    start_guard()

    from pyconcbench.zmq._common import Fault, FaultyEcho, Spec, bind, new_context

    try:
        fault = Fault.parse(args.fault) if args.fault else None
    except ValueError as exc:
        parser.error("--fault: %s" % exc)
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, ValueError, OverflowError) as exc:
            print("%s: cannot pin to CPU %d (allowed: %s): %s"
                  % (PROG, args.cpu, sorted(os.sched_getaffinity(0)), exc), file=sys.stderr)
            return EXIT_UNUSABLE
    try:
        import zmq
    except ImportError as exc:
        print("%s: needs pyzmq (pip install 'pyconcbench[zmq]'): %s" % (PROG, exc), file=sys.stderr)
        return EXIT_UNUSABLE

    stop = [False]

    def on_signal(signum, frame) -> None:
        stop[0] = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    spec = Spec(mode="pyzmq_process", workload="pyzmq_process", loop=None, size=1, inflight=1,
                transport=args.transport, timeout=1.0, ipc_dir=args.ipc_dir, io_cpu=args.cpu)
    # After pinning: its I/O and reaper threads start on that CPU (and libzmq pins them there).
    ctx = new_context(spec)
    router = None
    try:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVTIMEO, POLL_MS)
        endpoint = bind(router, spec)
        ready = {"endpoint": endpoint, "pid": os.getpid(), "cpu": sorted(os.sched_getaffinity(0)),
                 "python": sys.version.split()[0], "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}
        print("READY " + json.dumps(ready), flush=True)
        return serve(zmq, router, FaultyEcho(fault) if fault is not None else None, stop)
    except zmq.ZMQError as exc:
        print("%s: %s" % (PROG, exc), file=sys.stderr)
        return EXIT_FAILED
    finally:
        if router is not None:
            router.close(linger=0)
        ctx.term()


def serve(zmq, router, faulty, stop) -> int:
    recv = router.recv_multipart
    send = router.send_multipart
    Again = zmq.Again
    while not stop[0]:
        try:
            frames = recv()
        except Again:
            continue
        if faulty is None:
            send(frames)
            continue
        out = faulty.frames(frames)
        if faulty.stopped:
            return EXIT_FAULT
        if out is not None:
            send(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
