"""``pyconcbench``: the suite, reports and the offline regression gate over saved runs, and the
conformance suite against any echo server.

    pyconcbench run [--profile quick|full] [--family echo,openloop,switch,zmq,ceiling] [--no-save] [PYTEST ARGS]
    pyconcbench report [RUN ...] [--png DIR] [--html FILE] [--by-python]
    pyconcbench compare BASE NEW [--fail-on EXPR] [--markdown FILE]
    pyconcbench compare AB_RUN [--fail-on EXPR]          (an interleaved A/B run gates itself)
    pyconcbench ab --a PYTHON_OR_VENV --b PYTHON_OR_VENV [--fail-on EXPR] [-- PYTEST ARGS]
    pyconcbench check IMPL [IMPL ...] [--transport tcp,unix] [--only PROPERTY,...] [-v]

Exit status: 0 done (no regression), 1 regression found, 2 usage error or unreadable run.
``check``: 0 every property holds, 1 some failed, 2 usage error, 3 not available here, 4 our
own code broken.  Only ``check`` loads servers, the harness and the load engine, and only when
it runs (imported in ``cmd_check``): the rest reads saved JSON on any machine.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from pyconcbench import gate, options, report
from pyconcbench.report.results import (DEFAULT_STORAGE, ResultsError, Run, load_runs, merged_benchmarks, one_line,
                                        split)

#: What ``pyconcbench compare`` gates when --fail-on is not given.
DEFAULT_FAIL_ON = "msgs_per_s:-10%,requests_per_s:-10%,latency_p99:+25%,ns_per_op:+10%"

RUN_HELP = ("a saved run: a JSON file, or a file-name prefix in the storage folder as "
            "--benchmark-compare takes it (0003, 0003_abc, Linux-CPython-3.11-64bit/0003)")


def add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", "-s", metavar="DIR", default=DEFAULT_STORAGE,
                   help="pytest-benchmark's storage folder (file:// URLs accepted). Default: %(default)r")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pyconcbench",
        description="The benchmark suite (run), the conformance suite against any echo server (check), and "
                    "reports and the regression gate over saved runs (pytest-benchmark JSON, in .benchmarks/ "
                    "by default).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("run", help="run the benchmark suite (pytest) from any folder: pyconcbench run --help",
                   add_help=False)

    r = sub.add_parser("report", help="the studies' tables (Markdown), plots and an HTML page",
                       description="Markdown tables of saved runs on stdout: echo throughput with its "
                                   "spread, relative speed, ratio to native_epoll, latency, server CPU and "
                                   "the model's excess, fairness; message sizes; switch costs; ZeroMQ.")
    r.add_argument("runs", nargs="*", metavar="RUN", help=RUN_HELP + ". Default: the newest saved run")
    add_storage(r)
    r.add_argument("--png", metavar="DIR", help="write the plots as PNG files into DIR (needs matplotlib)")
    r.add_argument("--html", metavar="FILE", help="write one self-contained HTML page (tables, plots inline)")
    r.add_argument("--by-python", action="store_true",
                   help="the runs are of different Python versions: tables of implementation x version")
    r.add_argument("--output", "-o", metavar="FILE", help="write the Markdown to FILE instead of stdout")

    c = sub.add_parser("compare", help="the regression gate: BASE against NEW, direction-aware",
                       description="Gate NEW against BASE: a metric regresses when its median over the "
                                   "rounds is worse than the threshold AND a one-sided Mann-Whitney U test "
                                   "over the per-round samples gives p <= alpha. Prints a Markdown summary; "
                                   "exits 1 on a regression, with one line per regression on stderr.")
    c.add_argument("runs", nargs="+", metavar="BASE [BASE ...] NEW",
                   help=RUN_HELP + ". Every BASE (a prefix or glob may match several runs: '*_main') is "
                   "the baseline: with several, their rounds are pooled and a regression must be worse than "
                   "each of them. NEW must name one run. A single run of interleaved A/B cases "
                   "(pyconcbench ab) is gated alone: B against A, on B/A's interval")
    add_storage(c)
    c.add_argument("--fail-on", metavar="EXPR",
                   help="comma-separated [SCOPE@]METRIC:THRESHOLD items, e.g. 'msgs_per_s:-10%%,latency_p99:+25%%'; "
                        "SCOPE is a glob on the group or test name; a threshold's sign, if given, must point "
                        "the worse way; 'off' ungates. Metrics: " + ", ".join(sorted(gate.METRICS))
                        + ". Default: " + repr(DEFAULT_FAIL_ON).replace("%", "%%"))
    c.add_argument("--alpha", "--fail-alpha", dest="alpha", metavar="P",
                   help="significance level of the one-sided Mann-Whitney U test over the per-round "
                        "samples. Default: %s" % gate.DEFAULT_ALPHA)
    c.add_argument("--markdown", "--gate-markdown", dest="markdown", metavar="FILE",
                   help="also append the Markdown summary to FILE (e.g. \"$GITHUB_STEP_SUMMARY\")")
    c.add_argument("--fail-correction", dest="fail_correction", metavar="holm|bh|none",
                   help="how the run's significance tests are corrected for their number: holm (no false "
                        "alarm anywhere in the run with probability >= 1 - alpha), bh (Benjamini-Hochberg), "
                        "none. Default: holm")
    c.add_argument("--allow-missing", action="store_true",
                   help="pass even when benchmarks of the baseline are missing from NEW (by default that "
                        "fails: a benchmark that errored is not saved)")
    c.add_argument("--allow-machine-change", action="store_const", const="yes",
                   help="compare even when CPU model, CPU count, kernel or Python differ between the runs")
    c.epilog = ("The gate's options are those of the pytest plugin (--pcb-fail-on, --pcb-fail-alpha, "
                "--pcb-fail-correction, --pcb-gate-markdown, --pcb-allow-machine-change): same meanings, and "
                "each not given here is read from its environment variable (PCB_FAIL_ON, PCB_FAIL_ALPHA, "
                "PCB_FAIL_CORRECTION, PCB_GATE_MARKDOWN, PCB_ALLOW_MACHINE_CHANGE).")

    a = sub.add_parser("ab", help="interleaved A/B run: a benchmark suite in A's and B's environments, round by "
                                  "round",
                       description="Runs the echo benchmarks (pytest, in this project's clone; --tests for the "
                                   "switch or ZeroMQ ones) with the servers, or the workloads' workers, of two "
                                   "environments alternated round by round in ABBA order, in one run on "
                                   "the same CPUs: each pair of adjacent rounds gives B/A, summarised as the "
                                   "Hodges-Lehmann ratio with its exact Wilcoxon signed-rank interval. Saves the "
                                   "run (pytest-benchmark's storage) for `pyconcbench report` and `compare`. "
                                   "Exit 0 done, 1 a regression (with --fail-on) or a failed test, 2 usage.")
    a.add_argument("--a", required=True, metavar="PYTHON_OR_VENV",
                   help="side A (the reference): a Python executable, a venv directory or a command on PATH; "
                        "pyconcbench must be installed there")
    a.add_argument("--b", required=True, metavar="PYTHON_OR_VENV", help="side B (the one under test)")
    a.add_argument("--a-env", metavar="NAME=VALUE,...", help="environment variables for A's servers and workers")
    a.add_argument("--b-env", metavar="NAME=VALUE,...", help="environment variables for B's servers and workers")
    a.add_argument("--fail-on", metavar="EXPR",
                   help="gate B against A: e.g. 'msgs_per_s:-5%%,latency_p99:+20%%'; a metric fails when B/A's "
                        "whole interval is beyond its threshold")
    a.add_argument("--tests", default=AB_TESTS, metavar="FAMILY_OR_PATH",
                   help="the benchmarks to run: echo, switch or zmq (the suite's own files; a worker per side "
                        "for the last two), or a path to a test file. Default: %(default)s")
    a.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST ARGS",
                   help="passed to pytest after '--', e.g. -- --pcb-impl uvloop_protocol --pcb-conns 100")

    k = sub.add_parser("check", help="the conformance suite against echo servers: one line per failed property",
                       description="Starts each server and checks what every echo server must do: "
                                   + "; ".join(CHECK_PROPERTIES.values()) + ". Prints one line per failed "
                                   "property (IMPL: PROPERTY: what failed) and a summary line per server. "
                                   "Exit 0 every property holds, 1 some failed (or the server did not start), "
                                   "2 usage error, 3 not available here (a package or tool missing), "
                                   "4 pyconcbench's own code broken.")
    k.add_argument("impls", nargs="+", metavar="IMPL_OR_CMD",
                   help="a server: an implementation id (native_epoll, asyncio_protocol, ...: "
                        "python -m pyconcbench.serve --help lists them), a serve function of your own "
                        "(MODULE:FUNCTION, PATH.py:FUNCTION), or any program's command line with one of "
                        "{port}, {unix}, {fd} (as --pcb-server-cmd takes it; quote it)")
    k.add_argument("--transport", default="tcp", metavar="tcp,unix",
                   help="comma-separated: the transports to check each server over. Default: %(default)s")
    k.add_argument("--only", metavar="PROPERTY,...",
                   help="comma-separated: check only these properties: " + ", ".join(CHECK_PROPERTIES))
    k.add_argument("-v", "--verbose", action="store_true",
                   help="also print a line for each property that holds, with the seconds it took")
    return p


#: `pyconcbench check`'s properties (pyconcbench.conformance.PROPERTIES, which the cli must not
#: import to build its help; tests/test_check.py keeps the two the same).
CHECK_PROPERTIES = {
    "echo": "echo: 1 B .. 1 MiB back byte for byte",
    "partial_io": "partial_io: a message dribbled in small pieces, read back in small pieces",
    "one_connection_load": "one_connection_load: 2000 round trips on one connection",
    "concurrent_connections": "concurrent_connections: 1,000 concurrent connections, each served",
    "client_vanishes": "client_vanishes: clients vanishing mid-message break nothing",
    "idle_connections": "idle_connections: idle connections stay open",
    "backpressure": "backpressure: a client that never reads leaves the server's memory bounded",
    "sigterm": "sigterm: exit status 0 on SIGTERM with connections open (checked last)",
}


#: The benchmarks `pyconcbench ab` runs by default (a family of the suite shipped in the package).
AB_TESTS = "echo"

RUN_USAGE = """usage: pyconcbench run [--profile quick|full] [--family FAMILIES] [--no-save] [PYTEST ARGS ...]

Runs the benchmark suite shipped in the package (echo, switch, ZeroMQ, the load generator's
ceiling) with pytest, from any folder: prints live progress and the tables, saves the run in
./.benchmarks (pytest-benchmark's storage) and compares it with the previous saved run there.

  --profile P       quick (default, about 5-10 minutes) or full (the studies' matrix, about an hour)
  --family F,...    only these families: echo, openloop, switch, zmq, ceiling (default: all)
  --no-save         do not save the run (no --benchmark-autosave)
  PYTEST ARGS       any pytest or plugin option, e.g. -k "native_epoll or asyncio_protocol",
                    --pcb-impl my_server.py:serve, --pcb-conns 100,1k (`pytest --help`: the
                    pyconcbench group lists them all)

Exit status: pytest's (0 passed, 1 a test failed, 2 interrupted, 4 usage error, 5 nothing selected)."""


def suite_args(argv: Sequence[str], cwd: Optional[str] = None) -> list:
    """pytest's arguments for ``pyconcbench run ARGV``: the suite's files, the cache and the
    storage in the current folder, autosave and compare unless asked otherwise.  Raises
    ValueError (one line) on a bad --profile or --family."""
    from pyconcbench import suite

    cwd = cwd or os.getcwd()
    argv = list(argv)
    out: list = []
    families = list(suite.FILES)
    save = True
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--profile", "--family") and not eq:
            if i + 1 >= len(argv):
                raise ValueError(f"{name} needs a value")
            value, i = argv[i + 1], i + 1
        if name == "--profile":
            out += ["--pcb-profile", value]
        elif name == "--family":
            families = [f.strip() for f in value.split(",") if f.strip()]
            unknown = [f for f in families if f not in suite.FILES]
            if unknown or not families:
                raise ValueError(f"--family: unknown family {(unknown or [value])[0]!r}; "
                                 f"known: {', '.join(suite.FILES)}")
        elif arg == "--no-save":
            save = False
        elif arg == "--":
            out += argv[i + 1:]
            break
        else:
            out.append(arg)
        i += 1
    given = {a.split("=", 1)[0] for a in out if a.startswith("--")}
    head = [suite.path(f) for f in families]
    # the run's cache and results belong to the folder it is run from, not to the installed package
    head += ["-o", f"cache_dir={os.path.join(cwd, '.pytest_cache')}"]
    if save and not given & {"--benchmark-autosave", "--benchmark-save", "--benchmark-disable"}:
        head.append("--benchmark-autosave")
    storage = os.path.join(cwd, ".benchmarks")
    if not given & {"--benchmark-compare", "--benchmark-storage", "--benchmark-disable"} \
            and any(Path(storage).glob("*/*.json")):
        head.append("--benchmark-compare")
    return head + out


def cmd_run(argv: Sequence[str]) -> int:
    """Execs pytest on the suite (never returns on success): pytest then owns the process, its
    signals and its exit status, and imports the plugin itself (in this process it could not
    rewrite the asserts of modules already imported)."""
    if any(a in ("-h", "--help") for a in argv[:1]) or list(argv[:1]) == ["help"]:
        print(RUN_USAGE)
        return 0
    try:
        args = suite_args(argv)
    except ValueError as exc:
        return _fail(f"run: {exc}")
    import importlib.util

    if importlib.util.find_spec("pytest_asyncio") is not None and "asyncio_default_fixture_loop_scope" not in argv:
        # pytest-asyncio (a test extra) warns at every run whose ini does not set it
        args = ["-o", "asyncio_default_fixture_loop_scope=function"] + args
    argv_ = [sys.executable, "-m", "pytest"] + args
    print("pyconcbench run: pytest " + " ".join(args), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, argv_)
    return 2  # not reached


#: compare's options that are the plugin's too: argparse dest -> name in pyconcbench.options
SHARED = {"fail_on": "fail-on", "alpha": "fail-alpha", "markdown": "gate-markdown",
          "allow_machine_change": "allow-machine-change", "fail_correction": "fail-correction"}


def _shared_options(args: argparse.Namespace) -> None:
    """Fills compare's shared options from the command line, else PCB_* (options.OptionError,
    one line, on a bad value)."""
    for dest, name in SHARED.items():
        raw = getattr(args, dest)
        source = "--" + dest.replace("_", "-") if dest != "alpha" else "--alpha"
        if raw is None:
            raw, source = options.from_environment(name)
        value = options.parse_option(name, raw, source)
        if dest == "fail_on":
            value = value or DEFAULT_FAIL_ON
        elif dest == "alpha" and value is None:
            value = gate.DEFAULT_ALPHA
        elif dest == "fail_correction" and value is None:
            value = "holm"
        setattr(args, dest, value)


def _fail(msg: str) -> int:
    print(f"pyconcbench: error: {one_line(msg)}", file=sys.stderr)
    return 2


def cmd_report(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs, args.storage)
    if args.by_python and len({r.python_label for r in runs}) < 2:
        print(f"pyconcbench: --by-python: the runs are all of Python {runs[0].python_label}: "
              "printing the plain report", file=sys.stderr)
        args.by_python = False
    if args.by_python:
        head, secs, notes = report.by_python(runs)
        if args.png:
            print("pyconcbench: --by-python draws no plots (they are per run): --png ignored", file=sys.stderr)
        title = "pyconcbench by Python version"
        head = head + [f"- note: {n}" for n in notes]
        fams = None
    else:
        fams = split(merged_benchmarks(runs))
        head, secs = report.header_lines(runs), report.sections(fams)
        title = "pyconcbench report"
    images: list = []
    if (args.png or args.html) and fams is not None:
        from pyconcbench.report import plots

        try:
            images, skipped = plots.plot_all(fams)
        except plots.PlotsUnavailable as exc:
            return _fail(str(exc))
        for why in skipped:
            print(f"pyconcbench: no plot: {why}", file=sys.stderr)
        if args.png:
            out = Path(args.png)
            out.mkdir(parents=True, exist_ok=True)
            for name, data in images:
                # the name holds saved text (the transport): never a path out of DIR
                name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "plot.png"
                (out / name).write_bytes(data)
                print(f"pyconcbench: wrote {out / name}", file=sys.stderr)
    text = report.to_markdown(head, secs, title)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf8")
        print(f"pyconcbench: wrote {args.output}", file=sys.stderr)
    elif not _emit(text):
        return 0  # `pyconcbench report | head`: the reader has gone
    if args.html:
        Path(args.html).write_text(report.to_html(head, secs, images, title), encoding="utf8")
        print(f"pyconcbench: wrote {args.html}", file=sys.stderr)
    return 0


def _one(name: str, storage: str) -> Run:
    runs = load_runs([name], storage)
    if len(runs) > 1:
        raise ResultsError(f"{name}: matches {len(runs)} saved runs ({', '.join(r.name for r in runs[:4])}"
                           f"{', …' if len(runs) > 4 else ''}): name one")
    return runs[0]


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        _shared_options(args)
    except options.OptionError as exc:
        return _fail(str(exc))
    expr = args.fail_on
    rules = gate.parse_fail_on(expr)
    alpha = args.alpha
    new = _one(args.runs[-1], args.storage)
    if len(args.runs) < 2:
        if not any(gate.is_ab(b) for b in new.benchmarks):
            return _fail("compare needs a baseline and a new run: pyconcbench compare BASE [BASE ...] NEW "
                         f"(or one run of interleaved A/B cases; {new.name} has none)")
        return _finish(args, _gated([], new, rules, alpha), new,
                       f"none: interleaved A/B cases in {new.name} (commit {new.commit}), B against A", [])
    seen = {Path(new.path).resolve()}
    bases = []
    for run in load_runs(args.runs[:-1], args.storage):
        where = Path(run.path).resolve()
        if where not in seen:  # never the new run itself, nor one run twice
            seen.add(where)
            bases.append(run)
    if not bases:
        return _fail(f"the baseline {' '.join(args.runs[:-1])} names only the new run itself")
    try:
        diffs = gate.check_facts([(b.name, b.machine) for b in bases], new.machine, args.allow_machine_change,
                                 "pass --allow-machine-change to compare them anyway")
    except gate.MachineChanged as exc:
        return _fail(f"{exc} (new run: {new.name})")
    result = _gated(bases, new, rules, alpha)
    names = ", ".join(b.name for b in bases[:5]) + (" …" if len(bases) > 5 else "")
    baseline = (f"{names} ({len(bases)} run{'s' if len(bases) > 1 else ''}, commit {bases[-1].commit}), "
                f"new {new.name} (commit {new.commit})")
    return _finish(args, result, new, baseline, diffs)


def _gated(bases: Sequence[Run], new: Run, rules: Sequence[gate.Rule], alpha: float) -> gate.GateResult:
    """gate.compare_runs over the runs; a pcb_fail_on marker saved in one of them that is not an
    expression is a ResultsError naming its file."""
    runs = list(bases) + [new]
    for run in runs:
        for bench in run.benchmarks:
            try:
                gate.marker_rules_of(bench)
            except gate.GateSpecError as exc:
                raise ResultsError(f"{run.path}: {exc}") from None
    return gate.compare_runs([b.benchmarks for b in bases], new.benchmarks, rules, alpha)


def _emit(text: str) -> bool:
    """Writes ``text`` and a newline to stdout, flushed; False when the reader has closed the
    pipe (stdout then goes to /dev/null, so nothing fails again at exit)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        _silence_stdout()
        return False


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        sys.stdout = open(os.devnull, "w")


def _finish(args: argparse.Namespace, result: gate.GateResult, new: Run, baseline: str, diffs: Sequence[str]) -> int:
    """Corrects, prints and appends the gate's summary; the exit status."""
    expr = args.fail_on
    try:
        gate.correct(result, args.fail_correction)
    except ValueError as exc:  # a malformed A/B interval in the run
        return _fail(str(exc))
    text = gate.markdown(result, context=gate.context_lines(baseline, expr, diffs))
    _emit(text)  # a closed stdout loses the summary, not the verdict
    if args.markdown:
        problem = gate.append_markdown(args.markdown, text)
        if problem:
            print(f"pyconcbench: cannot write --markdown {args.markdown}: {problem}", file=sys.stderr)
    for ch in result.regressions:
        print(f"{'INVALID' if ch.status == 'invalid' else 'REGRESSION'} {one_line(ch.line())}", file=sys.stderr)
    if not result.changes:
        return _fail(f"nothing to gate: no benchmark in {new.name} has a metric of --fail-on {expr!r}")
    if result.missing and not args.allow_missing:
        # pytest-benchmark leaves a benchmark that raised out of the saved run: a server that
        # crashes must not pass the gate by disappearing
        print(f"MISSING {len(result.missing)} benchmark(s) of the baseline are not in {new.name} (failed, "
              f"skipped or removed; --allow-missing accepts that): " + one_line(", ".join(result.missing[:5]))
              + (" …" if len(result.missing) > 5 else ""), file=sys.stderr)
        return 1
    return 1 if result.regressions else 0


def cmd_ab(args: argparse.Namespace) -> int:
    """Runs pytest on the benchmarks of --tests with --pcb-ab-a/--pcb-ab-b (the plugin resolves and
    checks both environments and refuses a bad one in one line, exit 2)."""
    import subprocess

    extra = list(args.pytest_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    from pyconcbench import suite

    tests = suite.path(args.tests) if args.tests in suite.FILES else args.tests
    if not Path(tests.split("::")[0]).exists():
        return _fail(f"--tests {tests}: no such file (a family: {', '.join(suite.FILES)}, or a path to a test file)")
    argv = [sys.executable, "-m", "pytest", tests, "--pcb-ab-a", args.a, "--pcb-ab-b", args.b,
            "--benchmark-autosave", "-p", "no:cacheprovider"]
    if args.a_env:
        argv += ["--pcb-ab-a-env", args.a_env]
    if args.b_env:
        argv += ["--pcb-ab-b-env", args.b_env]
    if args.fail_on:
        argv += ["--pcb-fail-on", args.fail_on]
    argv += extra
    print("pyconcbench ab: " + " ".join(argv[1:]), file=sys.stderr)
    code = subprocess.call(argv)
    return {0: 0, 1: 1}.get(code, 2)


def _server_for(spec: str, transport: str):
    """The server ``check`` runs for ``spec`` over ``transport``, not started: an implementation
    id of the registry; anything with a ':' (a user's own serve function, ``pkg.module:func`` or
    ``path/to/file.py:func``) is passed to ServerProcess unchanged.  servers.UnknownImpl for
    anything else; ValueError when the server cannot be made as asked."""
    from pyconcbench import conformance, harness, servers

    if any(p in spec for p in harness.COMMAND_PLACEHOLDERS):  # any program: a command line
        return harness.CommandServer(spec, transport=transport, cpu=None, stop_timeout=conformance.STOP_TIMEOUT)
    if ":" in spec:
        servers.check_user_spec(spec)  # its form and file; its code runs in the server process only
    elif spec not in servers.IMPLS and servers.user_spec(spec) is None:
        servers.load(spec)  # raises UnknownImpl, with the known ids, before importing anything
    return harness.ServerProcess(spec, transport=transport, cpu=None, stop_timeout=conformance.STOP_TIMEOUT)


def _csv(text: str) -> list:
    return [item.strip() for item in text.split(",") if item.strip()]


def _say(line: str, err: bool = False) -> None:
    print(one_line(line), file=sys.stderr if err else sys.stdout, flush=True)


def cmd_check(args: argparse.Namespace, server_for=None) -> int:
    """Every server named, over every transport: the properties' verdicts, one line per failure
    and a summary per server.  ``server_for(spec, transport)`` makes a server that is not
    started yet (``_server_for``; tests inject their own)."""
    # here, not at the top: the report side of this module never loads a server or the engine
    from pyconcbench import conformance, servers

    make = server_for or _server_for
    transports = _csv(args.transport)
    if not transports or any(t not in ("tcp", "unix") for t in transports):
        return _fail(f"--transport: expected tcp, unix or tcp,unix, got {args.transport!r}")
    transports = list(dict.fromkeys(transports))
    selected = conformance.names()
    if args.only is not None:
        selected = list(dict.fromkeys(_csv(args.only)))
        unknown = [name for name in selected if name not in conformance.names()]
        if unknown or not selected:
            what = f"unknown property {unknown[0]!r}" if unknown else f"no property named in {args.only!r}"
            return _fail(f"--only: {what}; known: " + ", ".join(conformance.names()))
    plan = []
    for spec in dict.fromkeys(args.impls):  # every name is checked before any server starts
        for transport in transports:
            try:
                plan.append((spec, transport, make(spec, transport)))
            except servers.UnknownImpl as exc:
                return _fail(str(exc))
            except ValueError as exc:
                return _fail(f"{spec}: {exc}")
    codes = []
    try:
        for spec, transport, first in plan:
            label = spec if len(transports) == 1 else f"{spec} ({transport})"
            codes.append(_check_one(label, first, lambda s=spec, t=transport: make(s, t), selected, args.verbose))
    except KeyboardInterrupt:
        _say("pyconcbench check: interrupted", err=True)
        return 130
    return 4 if 4 in codes else 1 if 1 in codes else 3 if 3 in codes else 0


def _check_one(label: str, first, make, selected: Sequence[str], verbose: bool) -> int:
    """Checks one server (``first``, then ``make()`` for each fresh one); its exit status."""
    from pyconcbench import conformance, harness

    pending = [first]

    def start():
        server = pending.pop() if pending else make()
        server.start()
        return server

    counts = {conformance.HOLDS: 0, conformance.FAILED: 0, conformance.UNCHECKED: 0}
    stopped = None
    try:
        for outcome in conformance.run(start, selected):
            counts[outcome.status] += 1
            if outcome.status == conformance.FAILED:
                _say(f"{label}: {outcome.name}: {outcome.message}")
            elif outcome.status == conformance.UNCHECKED:
                _say(f"{label}: {outcome.name}: not checked here: {outcome.message}")
            elif verbose:
                _say(f"{label}: {outcome.name}: holds ({outcome.seconds:.1f} s)")
    except harness.ServerUnavailable as exc:
        _say(f"{label}: not available here: {conformance.one_line(exc)}", err=True)
        return 1 if counts[conformance.FAILED] else 3
    except harness.ServerBroken as exc:
        _say(f"{label}: pyconcbench's own code is broken: {conformance.one_line(exc)}", err=True)
        return 4
    except harness.ServerError as exc:
        stopped = f"the server does not start: {conformance.one_line(exc)}"
    total = len(selected)
    failed, unchecked = counts[conformance.FAILED], counts[conformance.UNCHECKED]
    not_run = total - sum(counts.values())
    if stopped:
        _say(f"{label}: {stopped}")
    if failed or not_run:
        summary = f"{label}: {failed} of {total} failed"
    else:
        summary = f"{label}: {counts[conformance.HOLDS]} of {total} properties hold"
    summary += f", {unchecked} not checked here" if unchecked else ""
    summary += f", {not_run} not run" if not_run else ""
    _say(summary)
    return 1 if failed or stopped else 3 if unchecked else 0


def main(argv: Optional[Sequence[str]] = None, *, server_for=None) -> int:
    """The ``pyconcbench`` command.  ``server_for``: how ``check`` makes a server (tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        # everything after `run` is pytest's: argparse would take its options for ours
        return cmd_run(argv[1:])
    args = parser().parse_args(argv)
    try:
        if args.command == "check":
            return cmd_check(args, server_for)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "ab":
            return cmd_ab(args)
        return cmd_compare(args)
    except (ResultsError, gate.GateSpecError) as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        # `pyconcbench report | head`: stop quietly
        _silence_stdout()
        return 0
    except OSError as exc:
        # an output path that cannot be written (--png into a file, a read-only --html, ...)
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        return _fail(f"cannot write{where}: {exc.strerror or exc}")


if __name__ == "__main__":
    sys.exit(main())
