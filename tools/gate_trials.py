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
import random
import shutil
import subprocess
import sys
from pathlib import Path

from pyconcbench import gate
from pyconcbench.report.results import load_runs

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


def verdicts(bases, new, rules):
    res = gate.compare_runs([b.benchmarks for b in bases], new.benchmarks, rules)
    return res.changes


def report(runs, reruns, slowdowns, rules, fail_on) -> None:
    rng = random.Random(1)
    same = [runs[f"same{n:02d}"] for n in range(reruns)]
    print(f"## Gate trials: fail-on `{fail_on}`, alpha {gate.DEFAULT_ALPHA}")
    print()
    print(f"Suite: `pytest {' '.join(SUITE)}` (5 rounds per benchmark), {reruns} runs of unchanged code, "
          f"then one run per slowdown.")
    print()
    print("| baseline | metric checks (unchanged code) | false alarms | not judged (noisy) |")
    print("|---|---:|---:|---:|")
    plans = [("1 run (every other run in turn)", 1), ("5 runs (10 random draws per new run)", 5)]
    for label, k in plans:
        checks = alarms = noisy = 0
        for i, new in enumerate(same):
            others = [r for j, r in enumerate(same) if j != i]
            draws = [[o] for o in others] if k == 1 else [rng.sample(others, min(k, len(others))) for _ in range(10)]
            for bases in draws:
                for c in verdicts(bases, new, rules):
                    checks += 1
                    alarms += c.failed
                    noisy += c.status == "noisy"
        print(f"| {label} | {checks} | **{alarms}** ({alarms / max(checks, 1):.1%}) | {noisy} |")
    print()
    print("Changes between runs of unchanged code (every ordered pair):")
    print()
    print("| test | metric | median abs change | largest |")
    print("|---|---|---:|---:|")
    noise = {}
    for a, b in itertools.permutations(same, 2):
        for c in verdicts([a], b, rules):
            if c.change is not None:
                noise.setdefault((c.test, c.metric), []).append(c.change)
    for (test, metric), changes in sorted(noise.items()):
        absl = sorted(abs(c) for c in changes)
        print(f"| `{test}` | {metric} | {absl[len(absl) // 2] * 100:.1f}% | {max(changes, key=abs) * 100:+.1f}% |")
    print()
    print("Slowdowns (each slowed run against the unchanged runs as baselines):")
    print()
    print("| slowdown per message | test | metric | median change | caught, 1-run baseline | caught, 5-run baseline |")
    print("|---:|---|---|---:|---:|---:|")
    for ns in slowdowns:
        slow = runs[f"slow{ns}"]
        one, five = {}, {}
        for base in same:
            for c in verdicts([base], slow, rules):
                one.setdefault((c.test, c.metric), []).append(c)
        for _ in range(10):
            for c in verdicts(rng.sample(same, min(5, len(same))), slow, rules):
                five.setdefault((c.test, c.metric), []).append(c)
        for key, cs in sorted(one.items()):
            changes = sorted(c.change or 0.0 for c in cs)
            f = five.get(key, [])
            print(f"| {ns / 1000:g} µs | `{key[0]}` | {key[1]} | {changes[len(changes) // 2] * 100:+.1f}% "
                  f"| {sum(c.failed for c in cs)}/{len(cs)} | {sum(c.failed for c in f)}/{len(f)} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reruns", type=int, default=10)
    p.add_argument("--slowdowns", default="250,500,1000,2000,4000", help="ns per received chunk")
    p.add_argument("--fail-on", default="msgs_per_s:-10%,latency_p99:+25%")
    p.add_argument("--storage", default="/tmp/pyconcbench-gate-trials")
    p.add_argument("--report-only", action="store_true", help="gate the runs already in --storage")
    args = p.parse_args()
    if args.report_only:
        runs = {Path(r.path).stem.split("_", 1)[1]: r for r in load_runs(["*/*"], args.storage)}
        slowdowns = sorted(int(k[4:]) for k in runs if k.startswith("slow"))
        reruns = sum(1 for k in runs if k.startswith("same"))
        report(runs, reruns, slowdowns, gate.parse_fail_on(args.fail_on), args.fail_on)
        return 0
    storage = Path(args.storage)
    shutil.rmtree(storage, ignore_errors=True)
    rules = gate.parse_fail_on(args.fail_on)

    for n in range(args.reruns):
        run_suite(storage, f"same{n:02d}", 0)
    slowdowns = [int(s) for s in args.slowdowns.split(",") if s]
    for ns in slowdowns:
        run_suite(storage, f"slow{ns}", ns)

    runs = {Path(r.path).stem.split("_", 1)[1]: r for r in load_runs(["*/*"], str(storage))}
    report(runs, args.reruns, slowdowns, rules, args.fail_on)
    return 0


if __name__ == "__main__":
    sys.exit(main())
