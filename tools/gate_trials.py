"""How often does the regression gate cry wolf, and what is the smallest slowdown it catches?

    python tools/gate_trials.py [--reruns 10] [--slowdowns 250,500,1000,2000,4000] [--fail-on EXPR]
    python tools/gate_trials.py --ab [--trials 20] [--pairs 10] [--base-ns 1] [--slowdowns 300,500,1000]
                                [--fail-on msgs_per_s:-2%]

1. Runs a small echo suite ``--reruns`` times on unchanged code, saving each run, and gates
   every pair of runs against each other (both ways): any regression there is a false alarm.
2. Runs it again with the test-only knob ``PCB_TEST_SLOWDOWN_NS`` (busy-wait per received
   chunk in asyncio_protocol and uvloop_protocol) at each slowdown, and gates each against
   every unchanged run: the share of comparisons that flag the slowed servers is the power.

With ``--ab``: interleaved A/B runs instead (``--pcb-ab-a``/``--pcb-ab-b``, both this Python):
``--trials`` A/A runs (B = A: any regression is a false alarm; the count of *runs* with one is
the figure), then ``--trials`` runs per slowdown with the knob on B only (the count of runs that
catch it is the power), each gated on B/A's interval with ``--fail-on``.

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

from pyconcbench import gate, suite
from pyconcbench.report.results import load_runs

SUITE = [suite.path("echo"), "--pcb-impl", "asyncio_protocol,uvloop_protocol",
         "--pcb-conns", "10,100", "--pcb-messages", "20000", "-q", "-p", "no:cacheprovider",
         "--benchmark-disable-gc"]


DEFAULT_FAIL_ON = "msgs_per_s:-10%,latency_p99:+25%"


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


def verdicts(bases, new, rules, correction="none"):
    res = gate.compare_runs([b.benchmarks for b in bases], new.benchmarks, rules)
    return gate.correct(res, correction).changes


AB_SUITE = [suite.path("echo"), "--pcb-impl", "asyncio_protocol,uvloop_protocol", "--pcb-conns", "100",
            "--pcb-messages", "20000", "--pcb-reference", "none", "--pcb-malloc",
            "representative", "-q", "-p", "no:cacheprovider", "--benchmark-disable-gc"]


def ab_run(storage: Path, name: str, slowdown: int, base: int, pairs: int) -> list:
    """One interleaved A/B run of AB_SUITE with ``pairs`` pairs per case: both sides' servers
    busy-wait ``base`` ns per received chunk, B ``slowdown`` ns more (the knob's own fixed cost,
    a method call and two clock reads, is then on both sides, and B/A is the slowdown alone);
    its benchmarks as saved."""
    storage.mkdir(parents=True, exist_ok=True)
    out = storage / f"{name}.json"
    env = dict(os.environ)
    env.pop("PCB_TEST_SLOWDOWN_NS", None)
    cmd = [sys.executable, "-m", "pytest", *AB_SUITE, "--pcb-rounds", str(pairs), "--pcb-ab-a", sys.executable,
           "--pcb-ab-b", sys.executable, f"--benchmark-json={out}"]
    if base:
        cmd += ["--pcb-ab-a-env", f"PCB_TEST_SLOWDOWN_NS={base}"]
    if base or slowdown:
        cmd += ["--pcb-ab-b-env", f"PCB_TEST_SLOWDOWN_NS={base + slowdown}"]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"A/B run {name} failed:\n{done.stdout[-3000:]}")
    import json
    return json.loads(out.read_text())["benchmarks"]


def ab_trials(trials: int, slowdowns, fail_on: str, storage: Path, base: int = 0, pairs: int = 10) -> None:
    rules = gate.parse_fail_on(fail_on)
    rows = []
    for ns in [0] + list(slowdowns):
        flagged_runs = 0
        per_case = {}
        for t in range(trials):
            benches = ab_run(storage, f"ab{ns}_{t:02d}", ns, base, pairs)
            flagged = False
            for b in benches:
                for c in gate.check_ab(b, rules):
                    per_case.setdefault(c.test, []).append(c)
                    flagged |= c.failed
            flagged_runs += flagged
            print(f"  {'A/A' if not ns else f'B +{ns} ns'} run {t + 1}/{trials}: "
                  f"{'flagged' if flagged else 'not flagged'}", file=sys.stderr, flush=True)
        rows.append((ns, flagged_runs, per_case))
    print(f"## A/B trials: fail-on `{fail_on}` on B/A's interval, {trials} runs per line")
    print()
    knob = f"PCB_TEST_SLOWDOWN_NS={base}" if base else "nothing"
    print(f"Suite: `pytest {' '.join(AB_SUITE)} --pcb-rounds {pairs} --pcb-ab-a PY --pcb-ab-b PY` ({pairs} "
          f"interleaved pairs per case, both sides this Python; A runs with {knob}, B with the same knob "
          "plus the slowdown).")
    print()
    print("| B slowed by | case | median B/A msgs/s | median interval width | runs flagged (case) | runs flagged (any case) |")
    print("|---:|---|---:|---:|---:|---:|")
    for ns, flagged_runs, per_case in rows:
        for test, cs in sorted(per_case.items()):
            ratios = sorted(c.change + 1 for c in cs)
            widths = sorted(c.high - c.low for c in cs)
            what = "nothing (A/A)" if ns == 0 else f"{ns} ns/chunk"
            print(f"| {what} | `{test}` | {ratios[len(ratios) // 2]:.3f} | {widths[len(widths) // 2]:.3f} "
                  f"| {sum(c.failed for c in cs)}/{len(cs)} | {flagged_runs}/{trials} |")


def report(runs, reruns, slowdowns, rules, fail_on) -> None:
    rng = random.Random(1)
    same = [runs[f"same{n:02d}"] for n in range(reruns)]
    print(f"## Gate trials: fail-on `{fail_on}`, alpha {gate.DEFAULT_ALPHA}")
    print()
    print(f"Suite: `pytest {' '.join(SUITE)}` (5 rounds per benchmark), {reruns} runs of unchanged code, "
          f"then one run per slowdown.")
    print()
    print("| baseline | metric checks (unchanged code) | false alarms | not judged (noisy) | false alarms after Holm (per run) |")
    print("|---|---:|---:|---:|---:|")
    plans = [("1 run (every other run in turn)", 1), ("5 runs (10 random draws per new run)", 5)]
    for label, k in plans:
        checks = alarms = noisy = holm_alarms = 0
        for i, new in enumerate(same):
            others = [r for j, r in enumerate(same) if j != i]
            draws = [[o] for o in others] if k == 1 else [rng.sample(others, min(k, len(others))) for _ in range(10)]
            for bases in draws:
                for c in verdicts(bases, new, rules):
                    checks += 1
                    alarms += c.failed
                    noisy += c.status == "noisy"
                holm_alarms += sum(c.failed for c in verdicts(bases, new, rules, "holm"))
        print(f"| {label} | {checks} | **{alarms}** ({alarms / max(checks, 1):.1%}) | {noisy} | {holm_alarms} |")
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
    p.add_argument("--fail-on", default=DEFAULT_FAIL_ON)
    p.add_argument("--storage", default="/tmp/pyconcbench-gate-trials")
    p.add_argument("--report-only", action="store_true", help="gate the runs already in --storage")
    p.add_argument("--ab", action="store_true", help="interleaved A/B trials (A/A and slowed B) instead")
    p.add_argument("--trials", type=int, default=20, help="--ab: runs per line")
    p.add_argument("--pairs", type=int, default=10, help="--ab: interleaved pairs per case")
    p.add_argument("--base-ns", type=int, default=0,
                   help="--ab: the knob on both sides (B gets it plus each slowdown), so that B/A is the "
                        "slowdown alone, without the knob's own fixed cost")
    args = p.parse_args()
    if args.ab:
        fail_on = args.fail_on if args.fail_on != DEFAULT_FAIL_ON else "msgs_per_s:-2%"
        ab_trials(args.trials, [int(s) for s in args.slowdowns.split(",") if s], fail_on, Path(args.storage),
                  args.base_ns, args.pairs)
        return 0
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
