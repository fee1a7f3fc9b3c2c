"""Interleaved A/B runs (pyconcbench.ab) and the statistics under them: the ABBA order, the
pairing, the paired interval against brute force, the family-wise corrections against
hand-worked values, the A/B verdicts of the gate, the report's A/B section, and the errors of a
side that cannot be used (one line each).  The end-to-end run is in test_gate_e2e.py."""
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyconcbench import ab, cli, gate, metrics, options, report, stats
from pyconcbench.report.results import split

# ---- the order and the pairs ----------------------------------------------------------------


def test_the_order_is_abba_blocks():
    assert "".join(ab.order(i) for i in range(8)) == "abbaabbaabbaabba"
    # balanced: A goes first in half the pairs, at every even length
    for n in range(2, 20, 2):
        assert sum(ab.order(i) == "ab" for i in range(n)) == n // 2


def test_each_pair_is_b_over_the_adjacent_a():
    a = [{"msgs_per_s": 100.0, "latency_p99_us": 10.0, "server_cpu_us_per_msg": 5.0},
         {"msgs_per_s": 200.0, "latency_p99_us": 20.0, "server_cpu_us_per_msg": None}]
    b = [{"msgs_per_s": 90.0, "latency_p99_us": 12.0, "server_cpu_us_per_msg": 6.0},
         {"msgs_per_s": 220.0, "latency_p99_us": 0.0, "server_cpu_us_per_msg": 4.0}]
    pairs = ab.pair_ratios(a, b, ["ab", "ba"])
    assert pairs[0] == {"order": "AB", "msgs_per_s": 0.9, "latency_p99": 1.2, "server_cpu_us_per_msg": 1.2}
    # a missing or zero figure on either side gives no ratio for that metric
    assert pairs[1] == {"order": "BA", "msgs_per_s": 1.1}
    with pytest.raises(ValueError, match="as many"):
        ab.pair_ratios(a, b[:1], ["ab", "ba"])


def test_intervals_are_symmetric_in_log_and_cover_the_estimate():
    pairs = [{"msgs_per_s": r} for r in (0.95, 0.97, 0.96, 0.94, 0.98, 0.955, 0.965, 0.945)]
    iv = ab.intervals(pairs)["msgs_per_s"]
    assert iv["low"] <= iv["ratio"] <= iv["high"] < 1.0 and iv["pairs"] == 8
    assert iv["confidence"] >= 0.95
    flipped = ab.intervals([{"msgs_per_s": 1 / p["msgs_per_s"]} for p in pairs])["msgs_per_s"]
    assert flipped["ratio"] == pytest.approx(1 / iv["ratio"], rel=1e-5)
    assert flipped["low"] == pytest.approx(1 / iv["high"], rel=1e-5)


# ---- the statistics against independent references -----------------------------------------

def brute_signed_rank_cdf(n):
    """P(T+ <= t) by enumerating every sign assignment (2^n)."""
    counts = {}
    for signs in itertools.product((0, 1), repeat=n):
        t = sum(rank for rank, s in zip(range(1, n + 1), signs) if s)
        counts[t] = counts.get(t, 0) + 1
    top = n * (n + 1) // 2
    out, seen = [], 0
    for t in range(top + 1):
        seen += counts.get(t, 0)
        out.append(seen / 2 ** n)
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 8, 12])
def test_signed_rank_distribution_matches_enumeration(n):
    assert stats.signed_rank_cdf(n) == pytest.approx(brute_signed_rank_cdf(n))


def test_paired_interval_known_critical_values():
    # Published tables (two-sided 0.05): n=10 -> T = 8, so the interval is the 9th smallest
    # to the 9th largest Walsh average; n=20 -> T = 52 (coverage 95.2 %).
    iv10 = stats.paired_interval(list(range(10)))
    walsh = sorted((i + j) / 2 for i in range(10) for j in range(i, 10))
    assert (iv10.low, iv10.high) == (walsh[8], walsh[-9])
    assert iv10.confidence == pytest.approx(1 - 2 * brute_signed_rank_cdf(10)[8])
    assert stats.paired_interval(list(range(20))).confidence == pytest.approx(0.952, abs=0.001)
    # 5 pairs cannot reach 95 %: the widest interval, and its coverage, 1 - 2/32
    iv5 = stats.paired_interval([1, 2, 3, 4, 5])
    assert (iv5.low, iv5.high, iv5.confidence) == (1, 5, 0.9375)
    with pytest.raises(ValueError):
        stats.paired_interval([])
    with pytest.raises(ValueError):
        stats.paired_interval([1.0, float("nan")])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=14))
def test_paired_interval_is_ordered_and_holds_the_estimate(xs):
    iv = stats.paired_interval(xs)
    assert iv.low <= iv.estimate <= iv.high
    assert min(xs) <= iv.low and iv.high <= max(xs)
    assert 0.0 <= iv.confidence < 1.0


def test_holm_and_benjamini_hochberg_against_worked_values():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made monotone
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted times 4/1, 4/2, 4/3, 4/4, monotone from the top
    assert stats.benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert stats.holm([]) == [] and stats.benjamini_hochberg([0.5]) == [0.5]


# ---- the gate's correction and A/B verdicts ---------------------------------------------------

def _change(p, status="regression", n=10):
    return gate.Change(test=f"t{p}", group="g", metric="msgs_per_s", threshold=0.1, base=100.0, new=80.0,
                       change=-0.2, p_value=p, n_base=n, n_new=n, status=status)


def test_correction_keeps_strong_regressions_and_demotes_weak_ones():
    # Holm: 0.0001 x 3 and 0.03 x 2 = 0.06 > 0.05 (alone, 0.03 would have failed)
    res = gate.GateResult(changes=[_change(0.0001), _change(0.03), _change(0.5, "unchanged")], alpha=0.05)
    gate.correct(res, "holm")
    assert res.checks == 3 and res.correction == "holm"
    assert [c.status for c in res.changes] == ["regression", "within noise", "unchanged"]
    assert "after Holm over 3 checks" in res.changes[1].note
    none = gate.correct(gate.GateResult(changes=[_change(0.02)]), "none")
    assert none.changes[0].status == "regression" and none.changes[0].p_adjusted is None
    with pytest.raises(ValueError, match="unknown correction"):
        gate.correct(gate.GateResult(), "bonferroni")


def test_too_few_rounds_under_the_correction_is_untested_and_says_what_would_do():
    changes = [_change(1 / 252, n=5)] + [_change(0.6, "unchanged", n=5) for _ in range(99)]
    res = gate.correct(gate.GateResult(changes=changes, alpha=0.05), "holm")
    first = res.changes[0]
    assert first.status == "untested"
    assert "100 checks in this run" in first.note and "pyconcbench ab" in first.note
    assert "run 7+ rounds" in first.note  # C(14,7) = 3432 > 2000 = 1 / (0.05/100)


@pytest.mark.parametrize("higher, low, high, threshold, want", [
    (True, 0.80, 0.88, 0.10, "regression"),     # B 12-20 % slower, all beyond -10 %
    (True, 0.85, 0.95, 0.10, "unchanged"),      # slower, but not all beyond
    (True, 1.12, 1.30, 0.10, "improved"),
    (True, 0.97, 1.02, 0.10, "unchanged"),
    (False, 1.30, 1.50, 0.25, "regression"),    # latency: higher is worse
    (False, 0.60, 0.70, 0.25, "improved"),
    (True, 0.50, 0.60, None, "not gated"),
])
def test_ab_verdicts(higher, low, high, threshold, want):
    assert gate.ab_verdict(higher, low, high, threshold) == want


def ab_bench(ratio=0.8, low=0.75, high=0.85, name="test_echo[uvloop_protocol-c100-64B]"):
    iv = {"ratio": ratio, "low": low, "high": high, "confidence": 0.98, "pairs": 10}
    return {"name": name, "fullname": "tests/bench/test_echo.py::" + name, "group": "echo-c100-64B",
            "stats": {"median": 0.5, "data": [0.5] * 10},
            "extra_info": {**metrics.stamp(metrics.AB), "impl": "uvloop_protocol", "label": "uvloop_protocol",
                           "connections": 100, "size": 64, "transport": "tcp", "order": "AB" * 5,
                           "pairs": [{"order": "AB", "msgs_per_s": ratio}] * 10,
                           "intervals": {"msgs_per_s": iv, "latency_p99": {**iv, "ratio": 1.0, "low": 0.9,
                                                                             "high": 1.1}},
                           "a": {"msgs_per_s": 100000.0, "latency_p99_us": 900.0,
                                 "environment": {"given": "venv-a", "python": "3.11.7", "env": {}}},
                           "b": {"msgs_per_s": 80000.0, "latency_p99_us": 905.0,
                                 "environment": {"given": "venv-b", "python": "3.12.1", "env": {"X": "1"}}}}}


def test_an_echo_record_saved_before_ab_family_is_an_echo_one():
    # the pairs of an echo case compare what they always did; a record without ab_family reads as echo
    assert metrics.AB_PAIR_KEYS["echo"] == {
        "msgs_per_s": "msgs_per_s", "latency_p50": "latency_p50_us", "latency_p90": "latency_p90_us",
        "latency_p95": "latency_p95_us", "latency_p99": "latency_p99_us",
        "server_cpu_us_per_msg": "server_cpu_us_per_msg", "rss_per_conn_kib": "rss_per_conn_kib"}
    old = ab_bench()
    assert "ab_family" not in old["extra_info"] and metrics.ab_family(old["extra_info"]) == "echo"
    assert metrics.check_benchmark(old) is None
    assert {c.metric for c in gate.check_ab(old, gate.parse_fail_on("msgs_per_s:-10%,ns_per_op:+5%"))} == {"msgs_per_s"}


def test_memory_per_connection_is_compared_pair_by_pair():
    kib = (10.0, 10.1, 10.0, 9.9, 10.0, 10.1)
    a = [{"msgs_per_s": 100.0, "rss_per_conn_kib": k} for k in kib]
    b = [{"msgs_per_s": 100.0, "rss_per_conn_kib": k * 1.5} for k in kib]
    pairs = ab.pair_ratios(a, b, [ab.order(i) for i in range(len(kib))])
    assert [p["rss_per_conn_kib"] for p in pairs] == [1.5] * 6
    # no growth over idle (native_epoll at 10 connections can show none), or memory given back: no ratio
    for none in (0.0, -0.4):
        assert "rss_per_conn_kib" not in ab.pair_ratios([{"rss_per_conn_kib": none}], [{"rss_per_conn_kib": 3.0}],
                                                        ["ab"])[0]
    iv = ab.intervals(pairs)["rss_per_conn_kib"]
    assert (iv["ratio"], iv["low"], iv["high"], iv["pairs"]) == (1.5, 1.5, 1.5, 6)
    bench = ab_bench()
    info = bench["extra_info"]
    info["pairs"], info["intervals"]["rss_per_conn_kib"] = pairs, iv
    info["a"]["rss_per_conn_kib"], info["b"]["rss_per_conn_kib"] = 10.0, 15.0
    assert metrics.check_benchmark(bench) is None
    (ch,) = gate.check_ab(bench, gate.parse_fail_on("rss_per_conn_kib:+20%"))
    assert ch.status == "regression" and "A 10.00 KiB, B 15.00 KiB" in ch.line()
    text = report.to_markdown([], report.sections(split([bench])))
    assert "B/A KiB/conn [interval]" in text and "| 1.500 [1.500, 1.500] 97% |" in text  # 6 pairs: 96.9 % coverage


def test_check_ab_gates_on_the_interval():
    rules = gate.parse_fail_on("msgs_per_s:-10%,latency_p99:+20%")
    changes = {c.metric: c for c in gate.check_ab(ab_bench(), rules)}
    assert changes["msgs_per_s"].status == "regression"
    assert changes["latency_p99"].status == "unchanged"
    line = changes["msgs_per_s"].line()
    assert "msgs_per_s B/A 0.800 [0.750, 0.850] (98.0 % interval over 10 interleaved pairs" in line
    assert "A 100,000 msgs/s, B 80,000 msgs/s" in line
    bad = ab_bench(ratio=0.8, low=0.9, high=0.85)
    with pytest.raises(ValueError, match="not an interval"):
        gate.check_ab(bad, rules)


def run_file(tmp_path, benches, name="ab.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"machine_info": {"pyconcbench": {}}, "commit_info": {}, "benchmarks": benches,
                                "datetime": "2026-11-25T00:00:00", "version": "5.3.1"}))
    return str(path)


def test_compare_gates_a_single_ab_run(tmp_path, capsys):
    slow = run_file(tmp_path, [ab_bench()])
    assert cli.main(["compare", slow, "--fail-on", "msgs_per_s:-10%"]) == 1
    captured = capsys.readouterr()
    assert "REGRESSION test_echo[uvloop_protocol-c100-64B]: msgs_per_s B/A 0.800" in captured.err
    same = run_file(tmp_path, [ab_bench(1.0, 0.97, 1.03)], "same.json")
    assert cli.main(["compare", same, "--fail-on", "msgs_per_s:-10%"]) == 0
    capsys.readouterr()
    plain = run_file(tmp_path, [{"name": "t", "fullname": "t", "extra_info": {}, "stats": {}}], "plain.json")
    assert cli.main(["compare", plain]) == 2
    assert "needs a baseline and a new run" in capsys.readouterr().err


def test_the_report_has_an_ab_section():
    fams = split([ab_bench()])
    assert len(fams.ab) == 1 and not fams.echo
    text = report.to_markdown([], report.sections(fams))
    assert "## Interleaved A/B (echo)" in text
    assert "| uvloop_protocol c100-64B | 100,000 | 80,000 | 0.800 [0.750, 0.850] 98% |" in text
    assert "B slower by 20.0 %" in text
    assert "A: venv-a" in text and "X=1" in text


# ---- a side that cannot be used: one line ---------------------------------------------------

def test_interpreter_resolution_errors(tmp_path):
    assert ab.interpreter("a", sys.executable) == os.path.abspath(sys.executable)
    venv = os.path.dirname(os.path.dirname(sys.executable))
    if os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        assert ab.interpreter("a", venv).startswith(os.path.abspath(venv))
    with pytest.raises(ab.ABError, match="side B: '/nonexistent/python' is not an executable file"):
        ab.interpreter("b", "/nonexistent/python")
    with pytest.raises(ab.ABError, match="is a directory without bin/python"):
        ab.interpreter("a", str(tmp_path))
    with pytest.raises(ab.ABError, match="neither a venv directory"):
        ab.interpreter("a", "no-such-python-anywhere")
    with pytest.raises(ab.ABError, match="empty"):
        ab.interpreter("a", " ")


def test_env_parsing():
    assert ab.parse_env("A=1, B_2=x=y,") == {"A": "1", "B_2": "x=y"}
    assert ab.parse_env("") == {}
    for bad in ("A", "=1", "1A=2", "A-B=1"):
        with pytest.raises(ValueError, match="NAME=VALUE"):
            ab.parse_env(bad)


def test_an_environment_without_pyconcbench_is_refused_in_one_line(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    with pytest.raises(ab.ABError) as info:
        ab.environment("b", str(venv))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("A/B side B: ") and "cannot import pyconcbench.serve" in message
    assert "pip install" in message


def test_options_need_both_sides_and_name_the_bad_one(monkeypatch):
    def raw(values):
        return lambda name: (values.get(name), f"--pcb-{name}" if name in values else "default")

    with pytest.raises(options.OptionError, match=r"--pcb-ab-b: an A/B run needs both sides: add --pcb-ab-a"):
        options.resolve(raw({"ab-b": sys.executable}))
    with pytest.raises(options.OptionError, match=r"^--pcb-ab-a: A/B side A: '/nope' is not an executable file"):
        options.resolve(raw({"ab-a": "/nope", "ab-b": sys.executable}))
    with pytest.raises(options.OptionError, match="--pcb-ab-b-env: 'oops' is not NAME=VALUE"):
        options.resolve(raw({"ab-a": sys.executable, "ab-b": sys.executable, "ab-b-env": "oops"}))
    s = options.resolve(raw({"ab-a": sys.executable, "ab-b": sys.executable, "ab-b-env": "K=v"}))
    assert set(s.ab) == {"a", "b"} and s.ab["b"].env == {"K": "v"}
    assert s.ab["a"].described["pyconcbench"]
    assert math.isfinite(s.fail_alpha) and s.fail_correction == "holm"


def test_the_ab_command_refuses_a_missing_test_file_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["ab", "--a", sys.executable, "--b", sys.executable, "--tests", "nosuch/test_x.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pyconcbench: error: --tests nosuch/test_x.py: no such file (a family: echo, openloop, switch, zmq, "
                   "ceiling, or a path to a test file)"]


def test_the_interval_is_taken_over_the_pairs_outside_slow_spells_when_there_are_enough():
    clean = [{"order": "AB", "msgs_per_s": 0.95}] * 6
    spell = [{"order": "BA", "msgs_per_s": 0.5, "noisy": True, "spell": True}] * 3
    busy = [{"order": "AB", "msgs_per_s": 0.95, "noisy": True}]  # other processes: kept in
    used, words = ab.interval_pairs(clean + busy + spell)
    assert used == clean + busy and words == "the 7 pairs of 10 outside slow spells"
    assert ab.intervals(clean + spell)["msgs_per_s"]["ratio"] == pytest.approx(0.95)  # the spells' 0.5 left out
    assert ab.intervals(clean + spell, every=True)["msgs_per_s"]["pairs"] == 9
    used, words = ab.interval_pairs(clean[:5] + spell)  # too few: every pair, said so
    assert len(used) == 8 and words == "all 8 pairs (only 5 outside slow spells, fewer than 6)"
    assert ab.interval_pairs(clean)[1] == "all 6 pairs (none in a slow spell)"


def test_a_pair_is_in_a_slow_spell_by_the_machine_judges_only():
    a = [{"msgs_per_s": 100.0, "noisy": "CPU 1 ran a fixed loop 1.80x slower than its best"},
         {"msgs_per_s": 100.0, "noisy": "other processes used 40% of a CPU"},
         {"msgs_per_s": 100.0, "noisy": None}]
    b = [{"msgs_per_s": 95.0}, {"msgs_per_s": 95.0}, {"msgs_per_s": 95.0, "noisy": "cache-line probe 700 ns > 300 ns"}]
    pairs = ab.pair_ratios(a, b, ["ab", "ba", "ab"])
    assert [(p.get("noisy"), p.get("spell")) for p in pairs] == [(True, True), (True, None), (True, True)]
