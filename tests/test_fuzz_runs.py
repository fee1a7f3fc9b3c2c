"""Property tests: mutated saved runs never crash `pyconcbench report` or `compare`.

Each example takes a real saved run (tests/data) or one runfactory builds (echo, switch, ZeroMQ,
A/B) and mutates one to three nodes anywhere in its JSON: a wrong type at any level, a deleted
key, NaN, an infinity, a huge or negative number, markup and line breaks in strings, empty lists
and objects.  Then report and compare (the mutated run as the new run, and as the baseline) run
in-process through ``cli.main``: the exit code is 0, 1 or 2; 1 only from compare, with a
REGRESSION or MISSING line for each reason; 2 with exactly one line on stderr, no traceback; and
no markup of the run reaches the Markdown.  Derandomized: CI runs the same examples each time.
"""
import contextlib
import copy
import io
import json
import math
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, strategies as st

from pyconcbench import cli, metrics

import runfactory as rf

OLD = Path(__file__).parent / "data" / "run-0.2-before-schema.json"
FAIL_ON = ("msgs_per_s:-10%,requests_per_s:-10%,latency_p99:+25%,ns_per_op:+10%,time:+50%,"
           "server_cpu_us_per_msg:+20%,cpu_us_per_req:+20%")
MARKUP = "<script>alert(1)</script>"
ERROR = re.compile(r"^pyconcbench: error: \S")

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _ab_bench():
    side = lambda rate: {"environment": {"given": "/venv", "executable": "/venv/bin/python", "python": "3.11.7",
                                         "pyconcbench": "0.3", "libraries": {"uvloop": "0.21"}, "env": {"X": "1"}},
                         "msgs_per_s": rate, "latency_p99_us": 200.0, "server_cpu_us_per_msg": 5.0,
                         "rounds": [{"msgs_per_s": rate, "latency_p99_us": 200.0, "elapsed": 0.1}] * 3}
    iv = {"ratio": 0.9, "low": 0.85, "high": 0.95, "confidence": 0.969, "pairs": 6}
    info = {**metrics.stamp(metrics.AB), "impl": "uvloop_protocol", "label": "uvloop_protocol", "connections": 10,
            "size": 64, "transport": "tcp", "malloc": "representative", "plain": False, "order": "ABBAAB",
            "pairs": [{"order": "AB", "msgs_per_s": 0.9, "latency_p99": 1.1}] * 6,
            "intervals": {"msgs_per_s": iv, "latency_p99": {**iv, "ratio": 1.1, "low": 1.05, "high": 1.15}},
            "a": side(100.0), "b": side(90.0)}
    b = rf.echo("uvloop_protocol", 10, [100.0] * 6)
    b.update(name="test_echo[uvloop_protocol-c10-64B-ab]",
             fullname="tests/bench/test_echo.py::test_echo[uvloop_protocol-c10-64B-ab]", extra_info=info)
    return b


def _seeds():
    old = json.loads(OLD.read_text())
    old["machine_info"]["cpu"]["flags"] = old["machine_info"]["cpu"]["flags"][:3]  # mutate what is read
    built = rf.run([
        rf.echo("native_epoll", 10, [200.0, 201.0, 199.0]),
        rf.echo("selectors", 10, [100.0, 101.0, 99.0], pcb_fail_on="latency_p99:+50%", plain=False,
                malloc="representative", alloc_syscalls_per_msg={"mmap": 0.1, "munmap": 0.1}),
        rf.echo("selectors", 100, [90.0, 91.0, 89.0], plain=True),
        rf.echo("selectors", 10, [50.0, 51.0], size=1024),
        rf.switch("python-generator_next", [50.0, 51.0, 49.0]),
        rf.switch("yield_from-d1", [60.0, 61.0], group="depth-sweep", depth=1),
        rf.switch("yield_from-d8", [90.0, 91.0], group="depth-sweep", depth=8),
        rf.zmq("pyzmq_process", [1000.0, 1010.0, 990.0]),
        _ab_bench(),
    ])
    return [old, built]


SEEDS = _seeds()

HOSTILE = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e19, -1.0, 0, 10 ** 30, 10 ** 400,
           "", MARKUP, "a|b\nc", "| x |\n# y", "&amp;", [], {}, None, True, False, [MARKUP], {"k": MARKUP},
           [float("nan")], "nan", "12", 0.0, 2 ** 63]
VALUES = st.one_of(st.sampled_from(HOSTILE), st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(min_value=-(10 ** 20), max_value=10 ** 20), st.text(max_size=12), st.booleans(),
                   st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=3),
                   st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.floats()), max_size=2))


def _paths(node, prefix=()):
    """Every node's path (keys and indices), the root's children first."""
    out = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))[:4]  # a few of each list: the rest are alike
    else:
        return out
    for key, child in items:
        out.append(prefix + (key,))
        out += _paths(child, prefix + (key,))
    return out


def _mutate(run, data):
    """One to three mutations of ``run`` (a deep copy), drawn from ``data``."""
    run = copy.deepcopy(run)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(run)
        # the benchmarks are what the tables read: drawn more often than the machine facts
        bench_paths = [p for p in paths if p[0] == "benchmarks"]
        path = data.draw(st.sampled_from(bench_paths) if bench_paths and data.draw(st.integers(0, 3)) else
                         st.sampled_from(paths), label="path")
        parent = run
        for key in path[:-1]:
            parent = parent[key]
        op = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "empty"]), label="op")
        if op == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "empty":
            parent[path[-1]] = [] if isinstance(parent[path[-1]], list) else {}
        else:
            parent[path[-1]] = data.draw(VALUES, label="value")
    return run


def _write(folder, name, run):
    path = Path(folder) / name
    path.write_text(json.dumps(run), encoding="utf8")
    return str(path)


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def _check(code, out, err, compare):
    event(f"exit {code}")
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    if code == 2:
        assert len(lines) == 1 and ERROR.match(lines[0]), err
    elif code == 1:
        assert compare, err  # the report never says "regression"
        reasons = [ln for ln in lines if ln.startswith(("REGRESSION ", "MISSING "))]
        assert reasons and len(reasons) == len(lines), err
    assert "<script" not in out and "</script" not in out, out


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), data=st.data())
def test_report_accepts_or_refuses_a_mutated_run_in_one_line(seed, data):
    run = _mutate(SEEDS[seed], data)
    with tempfile.TemporaryDirectory() as folder:
        _check(*_run(["report", _write(folder, "mutated.json", run)]), compare=False)


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), data=st.data(), mutated_is_new=st.booleans())
def test_compare_accepts_or_refuses_a_mutated_run_in_one_line(seed, data, mutated_is_new):
    base, new = SEEDS[seed], _mutate(SEEDS[seed], data)
    if not mutated_is_new:
        base, new = new, base
    with tempfile.TemporaryDirectory() as folder:
        argv = ["compare", _write(folder, "base.json", base), _write(folder, "new.json", new),
                "--fail-on", FAIL_ON, "--allow-machine-change", "--markdown", str(Path(folder) / "summary.md")]
        code, out, err = _run(argv)
        _check(code, out, err, compare=True)
        if code != 2:
            summary = (Path(folder) / "summary.md").read_text()
            assert "<script" not in summary


@FUZZ
@given(data=st.data())
def test_an_ab_run_gated_alone_accepts_or_refuses_in_one_line(data):
    run = _mutate(rf.run([_ab_bench()]), data)
    with tempfile.TemporaryDirectory() as folder:
        _check(*_run(["compare", _write(folder, "ab.json", run), "--fail-on", "msgs_per_s:-5%,latency_p99:+5%"]),
               compare=True)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(text=st.one_of(st.text(max_size=200), st.sampled_from(['{"benchmarks": [1]}', "[]", "null", "NaN",
                                                              '{"benchmarks": {}}', json.dumps(SEEDS[1])[:500]])))
def test_any_file_content_is_read_or_refused_in_one_line(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.json"
        path.write_text(text, encoding="utf8")
        _check(*_run(["report", str(path)]), compare=False)


def test_the_seeds_themselves_report_and_gate():
    """The fuzzing starts from runs that pass: a mutation is what is refused, not the seed."""
    for seed in SEEDS:
        assert metrics.check_run(seed) is None
        with tempfile.TemporaryDirectory() as folder:
            path = _write(folder, "seed.json", seed)
            assert _run(["report", path])[0] == 0
            code, out, err = _run(["compare", path, path, "--fail-on", FAIL_ON, "--allow-machine-change"])
            assert (code, err) == (2, "pyconcbench: error: the baseline " + path + " names only the new run itself\n")
            other = _write(folder, "other.json", seed)
            code, out, err = _run(["compare", path, other, "--fail-on", FAIL_ON])
            assert code == 0 and "**no regression**" in out, err
    assert math.isfinite(SEEDS[1]["benchmarks"][0]["extra_info"]["msgs_per_s"])
