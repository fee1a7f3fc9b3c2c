"""python -m pyconcbench.micro: run switch microbenchmarks without pytest and print the table.

    python -m pyconcbench.micro                      # every case
    python -m pyconcbench.micro -k greenlet -k native-call --rounds 3
    python -m pyconcbench.micro --json run1.json     # also save every case's extra_info
    python -m pyconcbench.micro --compare run1.json run2.json   # run-to-run spread per figure
    python -m pyconcbench.micro --list
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import Broken, Runner, Unavailable, cases
from ..report.switch_tables import spread_between, table


def _cpus(text: str):
    parts = [p for p in text.split(",") if p.strip()]
    if not parts or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list like 0,1")
    return tuple(int(p) for p in parts)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyconcbench.micro", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], metavar="SUBSTR",
                    help="run the cases whose id (test:id) holds SUBSTR (repeatable)")
    ap.add_argument("--rounds", type=int, default=None, metavar="N",
                    help="rounds per case (default: each case's own)")
    ap.add_argument("--cpus", type=_cpus, default=None, metavar="A,B",
                    help="CPUs to pin to (default: the first two this process may use)")
    ap.add_argument("--json", metavar="FILE", help="write every case's results to FILE")
    ap.add_argument("--compare", nargs=2, metavar="FILE",
                    help="print the run-to-run spread of two --json files and exit")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)

    if args.compare:
        runs = []
        for path in args.compare:
            with open(path) as f:
                runs.append({k: v["ns_per_op"] for k, v in json.load(f).items()})
        spreads = spread_between(*runs)
        for key in sorted(spreads, key=lambda k: -spreads[k]):
            print(f"{key:<44} {runs[0][key]:>12.3f} {runs[1][key]:>12.3f} {spreads[key]:6.2f}%")
        return 0

    selected = [c for c in cases()
                if not args.k or any(k in f"{c.test}:{c.id}" for k in args.k)]
    if args.list:
        for c in selected:
            print(f"{c.test}:{c.id:<32} {c.group:<14} {c.loops:>11} loops x {c.rounds} rounds  {c.op}")
        return 0
    results = {}
    from .. import rounds
    rounds.BUDGET.reset()
    status = 0
    for c in selected:
        runner = Runner(c, args.cpus)
        try:
            extra = runner.run(rounds=args.rounds)
        except Unavailable as exc:
            print(f"{c.test}:{c.id}: skipped: {exc}", file=sys.stderr)
            continue
        except Broken as exc:  # our own code does not build: a failure, never a skip
            print(f"{c.test}:{c.id}: failed: {exc}", file=sys.stderr)
            status = 1
            continue
        results[f"{c.test}:{c.id}"] = extra
        print(f"{c.test}:{c.id:<34} {extra['ns_per_op']:>12.3f} ns/op  spread "
              f"{extra['spread_pct']:.1f}%", file=sys.stderr, flush=True)
    for line in table(results.values()):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
