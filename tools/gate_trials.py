"""How often does the regression gate cry wolf, and what is the smallest slowdown it catches?

    python tools/gate_trials.py [--reruns 10] [--slowdowns 250,500,1000,2000,4000] [--fail-on EXPR]

1. Runs a small echo suite ``--reruns`` times on unchanged code, saving each run, and gates
   every pair of runs against each other (both ways): any regression there is a false alarm.
2. Runs it again with the test-only knob ``PCB_TEST_SLOWDOWN_NS`` (busy-wait per received
   chunk in asyncio_protocol and uvloop_protocol) at each slowdown, and gates each against
   every unchanged run: the share of comparisons that flag the slowed servers is the power.

Everything is measured for real (servers, sockets, load generator); it takes a few minutes.
Prints a Markdown summary.  Run it on a quiet machine: the point is what noise does.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pyconcbench import gate
from pyconcbench.results import load_runs

SUITE = ["tests/bench/test_echo.py", "--pcb-impl", "asyncio_protocol,uvloop_protocol",
         "--pcb-conns", "10,100", "--pcb-messages", "20000", "-q", "-p", "no:cacheprovider",
         "--benchmark-disable-gc"]


def run_suite(storage: Path, name: str, slowdown: int) -> None:
    env = dict(os.environ)
    env.pop("PCB_TEST_SLOWDOWN_NS", None)
    if slowdown:
        env["PCB_TEST_SLOWDOWN_NS"] = str(slowdown)
    cmd = [sys.executable, "-m", "pytest", *SUITE, f"--benchmark-storage=file://{storage}",
           f"--benchmark-save={name}"]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"suite run {name} failed:\n{done.stdout[-3000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reruns", type=int, default=10)
    p.add_argument("--slowdowns", default="250,500,1000,2000,4000", help="ns per received chunk")
    p.add_argument("--fail-on", default="msgs_per_s:-10%,latency_p99:+25%")
    p.add_argument("--storage", default="/tmp/pyconcbench-gate-trials")
    args = p.parse_args()
    storage = Path(args.storage)
    shutil.rmtree(storage, ignore_errors=True)
    rules = gate.parse_fail_on(args.fail_on)

    for n in range(args.reruns):
        run_suite(storage, f"same{n:02d}", 0)
    slowdowns = [int(s) for s in args.slowdowns.split(",") if s]
    for ns in slowdowns:
        run_suite(storage, f"slow{ns}", ns)

    runs = {Path(r.path).stem.split("_", 1)[1]: r for r in load_runs(["*/*"], str(storage))}
    same = [runs[f"same{n:02d}"] for n in range(args.reruns)]

    checks = alarms = 0
    alarm_lines = []
    for a, b in itertools.permutations(same, 2):
        res = gate.compare_runs(a.benchmarks, b.benchmarks, rules)
        checks += len(res.changes)
        for c in res.regressions:
            alarms += 1
            alarm_lines.append(f"{Path(a.path).stem[:9]} -> {Path(b.path).stem[:9]}: {c.line()}")
    noise = {}
    for c in itertools.chain.from_iterable(
            gate.compare_runs(a.benchmarks, b.benchmarks, rules).changes for a, b in itertools.permutations(same, 2)):
        noise.setdefault((c.test, c.metric), []).append(c.change or 0.0)

    print(f"## Gate trials: fail-on `{args.fail_on}`, alpha {gate.DEFAULT_ALPHA}")
    print()
    print(f"Suite: `pytest {' '.join(SUITE)}` (5 rounds per benchmark)")
    print()
    print(f"### Unchanged code: {args.reruns} runs, every ordered pair gated")
    print()
    print(f"{checks} metric checks, **{alarms} false alarms**")
    for line in alarm_lines:
        print(f"- {line}")
    print()
    print("| test | metric | largest change between two same-code runs | share beyond threshold |")
    print("|---|---|---:|---:|")
    thr = {r.metric: r.threshold for r in rules}
    for (test, metric), changes in sorted(noise.items()):
        worst = max(changes, key=abs)
        t = thr.get(metric) or 0
        beyond = sum(1 for c in changes if (c < -t if gate.METRICS[metric].higher_is_better else c > t))
        print(f"| `{test}` | {metric} | {worst * 100:+.1f}% | {beyond}/{len(changes)} |")
    print()
    print("### Slowdowns: each slowed run gated against every unchanged run")
    print()
    print("| slowdown per message | test | metric | median change | caught |")
    print("|---:|---|---|---:|---:|")
    for ns in slowdowns:
        slow = runs[f"slow{ns}"]
        per = {}
        for base in same:
            for c in gate.compare_runs(base.benchmarks, slow.benchmarks, rules).changes:
                per.setdefault((c.test, c.metric), []).append(c)
        for (test, metric), cs in sorted(per.items()):
            changes = sorted(c.change or 0.0 for c in cs)
            caught = sum(1 for c in cs if c.failed)
            print(f"| {ns / 1000:g} µs | `{test}` | {metric} | {changes[len(changes) // 2] * 100:+.1f}% "
                  f"| {caught}/{len(cs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
