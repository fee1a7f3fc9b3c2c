"""The result schema (pyconcbench.metrics): every saved benchmark carries its family and the
schema version; a run saved before the stamp existed still loads, reports and gates
(tests/data/run-0.2-before-schema.json was saved by the suite before this change: an echo, two
ceiling, three switch and two ZeroMQ benchmarks)."""
import json
import shutil
from pathlib import Path

import pytest

from pyconcbench import cli, metrics
from pyconcbench.report import results

OLD = Path(__file__).parent / "data" / "run-0.2-before-schema.json"


def _families(path):
    run = json.loads(Path(path).read_text())
    return {b["name"]: results.family(b) for b in run["benchmarks"]}


def test_a_run_saved_before_the_schema_is_read_by_its_keys():
    fams = _families(OLD)
    assert all(metrics.FAMILY_KEY not in b["extra_info"] for b in json.loads(OLD.read_text())["benchmarks"])
    assert fams == {
        "test_loadgen_ceiling[c10-64B]": "ceiling", "test_loadgen_ceiling[c100-64B]": "ceiling",
        "test_echo[native_epoll-c10-64B]": "echo", "test_switch[python-generator_next]": "switch",
        "test_depth[yield_from-d1]": "switch", "test_depth[yield_from-d8]": "switch",
        "test_zmq[pyzmq_process-200B-if1]": "zmq", "test_zmq[aiozmq_rpc-200B-if1-2cpu]": "zmq"}


def test_a_run_saved_before_the_schema_reports(tmp_path, capsys):
    assert cli.main(["report", str(OLD)]) == 0
    out = capsys.readouterr().out
    for name in ("native_epoll", "python-generator_next", "yield_from-d8", "pyzmq_process", "aiozmq_rpc"):
        assert name in out, name
    assert "load generator" in out.lower()


def test_a_run_saved_before_the_schema_gates(tmp_path, capsys):
    same = tmp_path / "same.json"
    shutil.copy(OLD, same)
    rules = "msgs_per_s:-10%,ns_per_op:+10%,requests_per_s:-10%"
    assert cli.main(["compare", str(OLD), str(same), "--fail-on", rules]) == 0
    out = capsys.readouterr().out
    assert "**no regression**" in out and "7 unchanged" in out
    # the same run with the echo server at half the rate: a regression of the old-format run
    run = json.loads(OLD.read_text())
    echo = next(b for b in run["benchmarks"] if b["name"] == "test_echo[native_epoll-c10-64B]")
    echo["extra_info"]["msgs_per_s"] /= 2
    for r in echo["extra_info"]["rounds"]:
        r["msgs_per_s"] /= 2
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(run))
    assert cli.main(["compare", str(OLD), str(slow), "--fail-on", rules, "--fail-correction", "none"]) == 1
    assert "test_echo[native_epoll-c10-64B]` | msgs_per_s" in capsys.readouterr().out
    # under Holm over the run's tests, its few rounds cannot be significant: said, not failed
    assert cli.main(["compare", str(OLD), str(slow), "--fail-on", rules]) == 0
    out = capsys.readouterr().out
    assert "untested (" in out and "under Holm a regression needs p <=" in out


def test_the_stamp_wins_over_the_keys():
    info = {"impl": "x", "msgs_per_s": 1.0, "connections": 1, **metrics.stamp(metrics.CEILING)}
    assert results.family({"extra_info": info}) == "ceiling"
    assert metrics.stamp(metrics.SWITCH) == {"pcb_family": "switch", "pcb_schema": metrics.SCHEMA_VERSION}
    with pytest.raises(ValueError, match="unknown family 'http'"):
        metrics.stamp("http")


def test_a_newer_schema_is_refused_in_one_line(tmp_path, capsys):
    run = json.loads(OLD.read_text())
    run["benchmarks"][0]["extra_info"].update(pcb_family="echo", pcb_schema=metrics.SCHEMA_VERSION + 1)
    path = tmp_path / "future.json"
    path.write_text(json.dumps(run))
    with pytest.raises(results.ResultsError, match="newer than this pyconcbench reads"):
        results.family(run["benchmarks"][0])
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "schema" in err[0]


@pytest.mark.parametrize("stamp", [{"pcb_schema": "1", "pcb_family": "echo"}, {"pcb_schema": 1, "pcb_family": "nope"},
                                   {"pcb_schema": 0, "pcb_family": "echo"}])
def test_a_bad_stamp_is_refused(stamp):
    with pytest.raises(results.ResultsError):
        results.family({"name": "t", "extra_info": dict(stamp, impl="x")})
