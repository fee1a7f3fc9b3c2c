"""Hostile or damaged saved runs (issue 16): `pyconcbench report` and `compare` refuse a run the
schema check finds wrong with one line naming the file, the benchmark and the field (exit 2);
NaN or an infinity never passes the gate; the marker saved in the new run never loosens its own
gate; every Markdown and HTML text is escaped; a closed stdout ends `report` quietly."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyconcbench import cli, gate, metrics

import runfactory as rf

OLD = Path(__file__).parent / "data" / "run-0.2-before-schema.json"
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
SLOW = [80.0, 81.0, 79.0, 80.5, 79.5]
ERROR = re.compile(r"^pyconcbench: error: \S.*$")


def _write(path: Path, data) -> str:
    path.write_text(json.dumps(data), encoding="utf8")  # NaN and Infinity as Python writes them
    return str(path)


def _one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and ERROR.match(lines[0]), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _echo_run(**extra):
    return rf.run([rf.echo("selectors", 10, BASE, **extra)])


# ---- the schema check on load ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["report", "compare"])
def test_nan_in_the_new_run_is_refused_naming_file_benchmark_and_field(tmp_path, capsys, command):
    base = _write(tmp_path / "base.json", _echo_run())
    run = rf.run([rf.echo("selectors", 10, SLOW)])
    run["benchmarks"][0]["extra_info"]["msgs_per_s"] = float("nan")
    new = _write(tmp_path / "new.json", run)
    argv = ["report", new] if command == "report" else ["compare", base, new, "--fail-on", "msgs_per_s:-10%"]
    assert cli.main(argv) == 2
    _one_line_error(capsys, "new.json", "test_echo[selectors-c10-64B]", "extra_info.msgs_per_s")


def test_nan_in_a_round_of_the_new_run_is_refused(tmp_path, capsys):
    base = _write(tmp_path / "base.json", _echo_run())
    run = rf.run([rf.echo("selectors", 10, BASE)])
    for r in run["benchmarks"][0]["extra_info"]["rounds"]:
        r["msgs_per_s"] = float("nan")
    new = _write(tmp_path / "new.json", run)
    assert cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-10%"]) == 2
    _one_line_error(capsys, "new.json", "extra_info.rounds[0].msgs_per_s", "finite")


@pytest.mark.parametrize("value", ["1e400", "-1e400", str(10 ** 400)])
def test_infinite_and_huge_numbers_are_refused(tmp_path, capsys, value):
    run = _echo_run()
    run["benchmarks"][0]["extra_info"]["latency_p99_us"] = 123456.789
    text = json.dumps(run).replace("123456.789", value)
    path = tmp_path / "huge.json"
    path.write_text(text)
    assert cli.main(["report", str(path)]) == 2
    _one_line_error(capsys, "huge.json", "extra_info.latency_p99_us")


@pytest.mark.parametrize("mutate, field", [
    (lambda b: b.__setitem__("extra_info", "a string"), "extra_info"),
    (lambda b: b["extra_info"].__setitem__("connections", "ten"), "extra_info.connections"),
    (lambda b: b["extra_info"].pop("transport"), "extra_info.transport"),
    (lambda b: b["extra_info"].__setitem__("rounds", {"msgs_per_s": 1}), "extra_info.rounds"),
    (lambda b: b["extra_info"]["rounds"].__setitem__(2, ["x"]), "extra_info.rounds[2]"),
    (lambda b: b["extra_info"].__setitem__("fairness_jain", [0.9]), "extra_info.fairness_jain"),
    (lambda b: b["extra_info"].__setitem__("loadgen_bound", "no"), "extra_info.loadgen_bound"),
    (lambda b: b["extra_info"].__setitem__("pcb_schema", "1"), "pcb_schema"),
    (lambda b: b.__setitem__("stats", [1, 2]), "stats"),
    (lambda b: b.__setitem__("name", 7), "name"),
])
def test_wrong_types_and_missing_keys_are_refused_in_one_line(tmp_path, capsys, mutate, field):
    run = _echo_run()
    mutate(run["benchmarks"][0])
    bad = _write(tmp_path / "bad.json", run)
    good = _write(tmp_path / "good.json", _echo_run())
    assert cli.main(["report", bad]) == 2
    _one_line_error(capsys, "bad.json", field)
    assert cli.main(["compare", good, bad, "--fail-on", "msgs_per_s:-10%"]) == 2
    _one_line_error(capsys, "bad.json", field)


def test_memory_keys_are_optional_and_checked(tmp_path, capsys):
    # a run saved before the server's memory was measured: no memory key anywhere, still read
    old = _echo_run()
    assert not any("rss" in k for k in old["benchmarks"][0]["extra_info"])
    assert metrics.check_run(old) is None
    assert metrics.check_run(rf.run([rf.echo("selectors", 10, BASE, rss=[10300] * 5)])) is None
    for where, value in (("rss_per_conn_kib", "12.5"), ("server_rss_idle_kib", -1),
                         ("server_rss_loaded_kib", [1]), ("rounds[1].rss_per_conn_kib", "x"),
                         ("rounds[0].rss_kib", 1.5)):
        run = rf.run([rf.echo("selectors", 10, BASE, rss=[10300] * 5)])
        info = run["benchmarks"][0]["extra_info"]
        if where.startswith("rounds"):
            n, key = int(where[7]), where.split(".")[1]
            info["rounds"][n][key] = value
        else:
            info[where] = value
        assert metrics.check_run(run)[1] == f"extra_info.{where}", where
        bad = _write(tmp_path / "bad.json", run)
        assert cli.main(["report", bad]) == 2
        _one_line_error(capsys, "bad.json", "test_echo[selectors-c10-64B]", f"extra_info.{where}")


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.__setitem__("machine_info", "x"), "machine_info"),
    (lambda r: r["machine_info"].__setitem__("cpu", 3), "machine_info.cpu"),
    (lambda r: r["machine_info"]["pyconcbench"].__setitem__("libraries", ["uvloop"]),
     "machine_info.pyconcbench.libraries"),
    (lambda r: r.__setitem__("commit_info", {"id": 12345}), "commit_info.id"),
    (lambda r: r["benchmarks"].append("not a benchmark"), "benchmark #1"),
])
def test_wrong_types_in_the_run_itself_are_refused(tmp_path, capsys, mutate, field):
    run = _echo_run()
    mutate(run)
    bad = _write(tmp_path / "bad.json", run)
    assert cli.main(["report", bad]) == 2
    _one_line_error(capsys, "bad.json", field)


def test_a_run_nested_too_deeply_is_refused(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"benchmarks": ' + "[" * 100000 + "]" * 100000 + "}")
    assert cli.main(["report", str(path)]) == 2
    _one_line_error(capsys, "deep.json")


def test_a_malformed_ab_interval_is_refused_in_one_line(tmp_path, capsys):
    info = {**metrics.stamp(metrics.AB), "impl": "selectors", "label": "selectors", "connections": 10, "size": 64,
            "transport": "tcp", "pairs": [{"order": "AB", "msgs_per_s": 0.5}],
            "intervals": {"msgs_per_s": {"ratio": 0.5, "low": 0.9, "high": 0.4, "confidence": 0.9, "pairs": 6}},
            "a": {"msgs_per_s": 100.0}, "b": {"msgs_per_s": 50.0}}
    bench = rf.echo("selectors", 10, BASE)
    bench["extra_info"] = info
    path = _write(tmp_path / "ab.json", rf.run([bench]))
    assert cli.main(["compare", path, "--fail-on", "msgs_per_s:-5%"]) == 2
    _one_line_error(capsys, "ab.json", "extra_info.intervals.msgs_per_s", "interval")


def test_a_saved_marker_that_is_no_expression_is_refused_naming_the_file(tmp_path, capsys):
    base = _write(tmp_path / "base.json", _echo_run())
    new = _write(tmp_path / "new.json", rf.run([rf.echo("selectors", 10, BASE, pcb_fail_on="msgs_per_s:+10%")]))
    assert cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-10%"]) == 2
    _one_line_error(capsys, "new.json", "test_echo[selectors-c10-64B]", "pcb_fail_on")


def test_the_real_saved_run_still_passes_the_check():
    assert metrics.check_run(json.loads(OLD.read_text())) is None


# ---- NaN inside the gate (the pytest gate gets live figures, not a checked file) -------------------

def test_the_gate_never_calls_a_nan_unchanged():
    base = rf.echo("selectors", 10, BASE)
    for bad in (float("nan"), float("inf"), "fast"):
        new = rf.echo("selectors", 10, BASE)
        new["extra_info"]["msgs_per_s"] = bad
        ch = gate.compare_one(base, new, "msgs_per_s", 0.10)
        assert ch.status == "invalid" and ch.failed, (bad, ch)
        assert "msgs_per_s cannot be judged" in ch.line()
    new = rf.echo("selectors", 10, BASE)
    for r in new["extra_info"]["rounds"]:
        r["msgs_per_s"] = float("nan")
    assert gate.compare_one(base, new, "msgs_per_s", 0.10).status == "invalid"
    # a NaN baseline is not a pass either
    assert gate.compare_one(new, base, "msgs_per_s", 0.10).status == "invalid"
    # ... but a metric switched off is not gated, NaN or not: it cannot fail the run
    for off in (gate.compare_one(base, new, "msgs_per_s", None), gate.compare_one(new, base, "msgs_per_s", None)):
        assert off.status == "not gated" and not off.failed, off


def test_a_baseline_marker_that_is_no_expression_is_refused_by_both_gates():
    base = rf.echo("selectors", 10, BASE)
    base["extra_info"]["pcb_fail_on"] = "msgs_per_s"  # no threshold
    with pytest.raises(gate.GateSpecError, match="pcb_fail_on marker saved in the run"):
        gate.trusted_marker([base])
    assert gate.trusted_marker([rf.echo("selectors", 10, BASE)]) == []


# ---- the new run's own marker never loosens its gate -----------------------------------------------

@pytest.mark.parametrize("marker", ["msgs_per_s:off", "msgs_per_s:-50%", "*@msgs_per_s:off"])
def test_the_new_runs_marker_cannot_switch_off_or_widen_its_gate(tmp_path, capsys, marker):
    base = _write(tmp_path / "base.json", _echo_run())
    new = _write(tmp_path / "new.json", rf.run([rf.echo("selectors", 10, SLOW, pcb_fail_on=marker)]))
    assert cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-10%", "--fail-correction", "none"]) == 1
    out = capsys.readouterr()
    assert "REGRESSION test_echo[selectors-c10-64B]: msgs_per_s regressed" in out.err
    assert "a run cannot loosen its own gate" in out.out


def test_the_new_runs_marker_may_tighten_its_gate(tmp_path, capsys):
    # a 20 % drop passes -30 % from the command line, but the new run's marker says -5 %
    base = _write(tmp_path / "base.json", _echo_run())
    new = _write(tmp_path / "new.json", rf.run([rf.echo("selectors", 10, SLOW, pcb_fail_on="msgs_per_s:-5%")]))
    assert cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-30%", "--fail-correction", "none"]) == 1
    # and it may gate a metric the command line does not
    new2 = _write(tmp_path / "new2.json", rf.run([rf.echo("selectors", 10, SLOW, pcb_fail_on="msgs_per_s:-5%")]))
    assert cli.main(["compare", base, new2, "--fail-on", "latency_p99:+1000%", "--fail-correction", "none"]) == 1


def test_the_baselines_marker_wins_as_on_the_command_line():
    base = rf.echo("selectors", 10, BASE, pcb_fail_on="msgs_per_s:off")
    new = rf.echo("selectors", 10, SLOW)
    res = gate.compare_runs([base], [new], gate.parse_fail_on("msgs_per_s:-10%"))
    assert [c.status for c in res.changes] == ["not gated"]


def test_rules_for_applies_only_the_stricter_of_the_new_runs_rules():
    bench = rf.echo("selectors", 10, BASE)
    cli_rules = gate.parse_fail_on("msgs_per_s:-10%,latency_p99:off")
    ignored = []
    out = gate.rules_for(bench, cli_rules, (), gate.parse_fail_on("msgs_per_s:-50%,latency_p99:+20%"), ignored)
    assert out == {"msgs_per_s": pytest.approx(0.10), "latency_p99": pytest.approx(0.20)}
    assert [r.text() for r in ignored] == ["msgs_per_s:-50%"]
    assert gate.rules_for(bench, cli_rules, (), gate.parse_fail_on("msgs_per_s:-5%"))["msgs_per_s"] == pytest.approx(0.05)


def test_an_ab_runs_own_marker_cannot_switch_off_its_gate():
    info = {**metrics.stamp(metrics.AB), "pcb_fail_on": "msgs_per_s:off",
            "intervals": {"msgs_per_s": {"ratio": 0.8, "low": 0.78, "high": 0.82, "confidence": 0.96, "pairs": 6}},
            "a": {"msgs_per_s": 100.0}, "b": {"msgs_per_s": 80.0}}
    bench = {"name": "test_echo[x]", "fullname": "t::test_echo[x]", "extra_info": info}
    res = gate.compare_runs([], [bench], gate.parse_fail_on("msgs_per_s:-5%"))
    assert [c.status for c in res.changes] == ["regression"]


# ---- Markdown and HTML escaped ---------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script>|x\n# heading & <img src=x onerror=alert(2)>"


def _table_rows_have(text: str, cells: int) -> None:
    """Every table row of ``text`` has ``cells`` cells (an unescaped '|' would add one)."""
    for line in text.splitlines():
        if line.startswith("| "):
            assert len(re.findall(r"(?<!\\)\|", line)) == cells + 1, line


def _no_markup(text: str) -> None:
    assert "<script" not in text and "<img" not in text and "</script" not in text
    assert "\n# heading" not in text


def test_the_report_escapes_saved_text_in_markdown_and_html(tmp_path, capsys):
    bench = rf.echo("selectors", 10, BASE, label=HOSTILE, malloc=HOSTILE)
    run = rf.run([bench, rf.echo("threads", 10, SLOW)], cpu_model=HOSTILE, kernel=HOSTILE)
    run["commit_info"]["id"] = HOSTILE
    path = _write(tmp_path / "run.json", run)
    html_file = tmp_path / "r.html"
    md_file = tmp_path / "r.md"
    assert cli.main(["report", path, "--output", str(md_file), "--html", str(html_file)]) == 0
    md = md_file.read_text()
    assert "&lt;script>alert(1)&lt;/script>\\|x # heading & &lt;img" in md
    _no_markup(md)
    _table_rows_have(md.split("### Echo throughput", 1)[1].split("###", 1)[0], 2)
    page = html_file.read_text()
    assert "<script" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_gate_markdown_escapes_saved_text(tmp_path, capsys):
    name = "test_echo[" + HOSTILE + "]"
    base_b, new_b = rf.echo("selectors", 10, BASE), rf.echo("selectors", 10, SLOW)
    for b in (base_b, new_b):
        b["name"] = name
        b["fullname"] = "tests/bench/test_echo.py::" + name
    gone = rf.echo("threads", 10, BASE)
    gone["fullname"] = "t::" + HOSTILE
    base = _write(tmp_path / "base.json", rf.run([base_b, gone]))
    new = _write(tmp_path / "new.json", rf.run([new_b], kernel=HOSTILE))
    summary = tmp_path / "summary.md"
    code = cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-10%", "--markdown", str(summary),
                     "--allow-machine-change", "--allow-missing", "--fail-correction", "none"])
    assert code == 1
    md = summary.read_text()
    _no_markup(md)
    assert "&lt;script>" in md and "Machine facts differ" in md and "Not in the new run (1)" in md
    _table_rows_have(md, 9)
    assert capsys.readouterr().out.strip() == md.strip()


def test_md_text_and_md_code():
    assert metrics.md_text("a|b\nc\r\nd") == "a\\|b c  d"
    assert metrics.md_text("<b>&amp; p <= 0.05 -> 1 & 2") == "&lt;b>&amp;amp; p <= 0.05 -> 1 & 2"
    assert metrics.md_text("x\\|y") == "x\\\\\\|y"  # the backslash cannot escape our '|'
    assert metrics.md_code("test_echo[a|b]") == "`test_echo[a\\|b]`"
    assert metrics.md_code("a`b") == "a`b" and metrics.md_code("<i>") == "&lt;i>"
    # no link and no (tracking) image from a saved name
    assert metrics.md_text("![x](https://e/p.png) [go](u) [r][1]") == "![x\\](https://e/p.png) [go\\](u) [r\\][1]"
    assert metrics.md_text("[90–110]") == "[90–110]"


# ---- a closed stdout ------------------------------------------------------------------------------

def _closed_stdout(args):
    # as the `pyconcbench` console script runs it
    code = "import sys; from pyconcbench.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before a byte is written: `| head -0`
    with proc.stderr:
        err = proc.stderr.read().decode()
    return proc.wait(timeout=60), err


def test_report_into_a_closed_pipe_exits_0_quietly(tmp_path):
    code, err = _closed_stdout(["report", str(OLD)])
    assert (code, err) == (0, "")


def test_compare_into_a_closed_pipe_keeps_its_verdict(tmp_path):
    base = _write(tmp_path / "base.json", _echo_run())
    new = _write(tmp_path / "new.json", rf.run([rf.echo("selectors", 10, SLOW)]))
    code, err = _closed_stdout(["compare", base, new, "--fail-on", "msgs_per_s:-10%", "--fail-correction", "none"])
    assert code == 1 and err.startswith("REGRESSION ") and "Traceback" not in err and "Broken pipe" not in err


# ---- one line on stderr, whatever the names hold ------------------------------------------------

def test_regression_and_missing_lines_stay_one_line_each(tmp_path, capsys):
    name = "test_echo[a|b\nc]"
    base_b, new_b = rf.echo("selectors", 10, BASE), rf.echo("selectors", 10, SLOW)
    for b in (base_b, new_b):
        b["name"], b["fullname"] = name, "t::" + name
    gone = rf.echo("threads", 10, BASE)
    gone["fullname"] = "t::gone\nREGRESSION fake"
    base = _write(tmp_path / "base.json", rf.run([base_b, gone]))
    new = _write(tmp_path / "new.json", rf.run([new_b]))
    assert cli.main(["compare", base, new, "--fail-on", "msgs_per_s:-10%", "--fail-correction", "none"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(" ", 1)[0] for ln in lines] == ["REGRESSION", "MISSING"], lines
    assert "gone\\nREGRESSION fake" in lines[1]

