"""The gate's statistics and decisions, on given per-round samples (no measuring here)."""
import math

import pytest

from pyconcbench import gate, stats

import runfactory as rf


# ---- statistics ---------------------------------------------------------------------------

def test_mann_whitney_exact_values():
    # every x below every y: the one split of 252 that extreme
    assert stats.mann_whitney_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)
    # interleaved: U = 10, P(U <= 10) = 87/252 for n = m = 5 (published tables)
    assert stats.mann_whitney_less([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) == pytest.approx(87 / 252)
    # the other way round is the mirror image
    assert stats.mann_whitney_less([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1.0)
    assert stats.min_p_value(5, 5) == pytest.approx(1 / 252)
    assert stats.min_p_value(2, 2) == pytest.approx(1 / 6)


def test_mann_whitney_ties_and_identical_samples():
    assert stats.mann_whitney_less([5, 5, 5], [5, 5, 5]) == pytest.approx(1.0)
    p = stats.mann_whitney_less([1, 2, 2, 3], [2, 3, 3, 4])
    assert 0.0 < p < 0.5


def test_mann_whitney_normal_approximation_agrees_with_exact(monkeypatch):
    x = [10.0 + 0.37 * i for i in range(9)]
    y = [11.0 + 0.41 * i for i in range(9)]
    exact = stats.mann_whitney_less(x, y)
    monkeypatch.setattr(stats, "EXACT_LIMIT", 0)
    approx = stats.mann_whitney_less(x, y)
    assert approx == pytest.approx(exact, abs=0.02)


def test_mann_whitney_refuses_empty_samples():
    with pytest.raises(ValueError):
        stats.mann_whitney_less([], [1.0])


def test_ci95_halfwidth():
    assert stats.ci95_halfwidth([1.0]) is None
    # mean 2, stdev 1, n 3: t(2) 4.303 * 1 / sqrt(3)
    assert stats.ci95_halfwidth([1.0, 2.0, 3.0]) == pytest.approx(4.303 / math.sqrt(3))
    assert stats.t975(100) == 1.96


# ---- fail-on expressions -----------------------------------------------------------------------

def test_parse_fail_on_reads_metrics_scopes_and_signs():
    rules = gate.parse_fail_on("msgs_per_s:-10%, latency_p99:+25%,echo-c1000-*@latency_p99:50%,"
                               "test_echo[threads-*]@msgs_per_s:off")
    assert [r.text() for r in rules] == ["msgs_per_s:-10%", "latency_p99:+25%", "echo-c1000-*@latency_p99:+50%",
                                         "test_echo[threads-*]@msgs_per_s:off"]
    assert rules[0].threshold == pytest.approx(0.10)


@pytest.mark.parametrize("text, message", [
    ("msgs_per_s:+10%", "msgs_per_s is better higher, so its regression is a drop: write msgs_per_s:-10%"),
    ("latency_p99:-25%", "latency_p99 is better lower, so its regression is a rise: write latency_p99:+25%"),
    ("throughput:-10%", "unknown metric 'throughput'"),
    ("msgs_per_s:-10", "is not a percentage"),
    ("msgs_per_s", "expected [SCOPE@]METRIC:THRESHOLD"),
    ("msgs_per_s:0%", "must be above 0%"),
    ("", "expected METRIC:THRESHOLD items"),
])
def test_parse_fail_on_errors_quote_the_bad_item(text, message):
    with pytest.raises(gate.GateSpecError) as info:
        gate.parse_fail_on(text)
    assert message in str(info.value)


def test_rules_for_precedence_marker_over_scope_over_global():
    rules = gate.parse_fail_on("msgs_per_s:-10%,latency_p99:+25%,echo-c1000-*@latency_p99:+50%,"
                               "*threads*@msgs_per_s:off")
    b1000 = rf.echo("selectors", 1000, [1.0])
    b10 = rf.echo("threads", 10, [1.0])
    assert gate.rules_for(b1000, rules) == {"msgs_per_s": 0.10, "latency_p99": 0.50}
    assert gate.rules_for(b10, rules) == {"msgs_per_s": None, "latency_p99": 0.25}
    marker = gate.parse_fail_on("latency_p99:+80%")
    assert gate.rules_for(b1000, rules, marker)["latency_p99"] == pytest.approx(0.80)


# ---- decisions ----------------------------------------------------------------------------------

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]


def _cmp(base_rates, new_rates, expr="msgs_per_s:-10%", **kw):
    base = rf.echo("selectors", 10, base_rates)
    new = rf.echo("selectors", 10, new_rates)
    (ch,) = gate.check_bench(base, new, gate.parse_fail_on(expr), **kw)
    return ch


def test_a_clear_drop_is_a_regression_with_one_line():
    ch = _cmp(BASE, [80.0, 81.0, 79.0, 80.5, 79.5])
    assert ch.status == "regression" and ch.failed
    assert ch.change == pytest.approx(-0.20)
    assert ch.p_value == pytest.approx(1 / 252)
    line = ch.line()
    assert "\n" not in line
    assert "msgs_per_s regressed 100 msgs/s -> 80 msgs/s (-20.0%, threshold -10%)" in line
    assert "Mann-Whitney U p=0.00397 over 5 vs 5 rounds" in line


def test_a_drop_within_the_threshold_is_unchanged():
    assert _cmp(BASE, [95.0, 96.0, 94.0, 95.5, 94.5]).status == "unchanged"


def test_a_big_but_noisy_change_is_within_noise():
    # the medians differ by 20 %, but the rounds overlap: not significant
    ch = _cmp([100.0, 60.0, 140.0, 100.0, 70.0], [80.0, 150.0, 55.0, 80.0, 120.0])
    assert ch.change == pytest.approx(-0.20)
    assert ch.status == "within noise"
    assert ch.p_value > 0.05


def test_a_clear_rise_is_an_improvement():
    assert _cmp(BASE, [130.0, 131.0, 129.0, 130.5, 129.5]).status == "improved"


def test_lower_is_better_metrics_regress_upwards():
    base = rf.echo("selectors", 10, [1.0] * 5, p99=[100, 101, 99, 100, 102])
    worse = rf.echo("selectors", 10, [1.0] * 5, p99=[140, 141, 139, 142, 140])
    better = rf.echo("selectors", 10, [1.0] * 5, p99=[60, 61, 59, 60, 62])
    rules = gate.parse_fail_on("latency_p99:+25%")
    assert gate.check_bench(base, worse, rules)[0].status == "regression"
    assert gate.check_bench(base, better, rules)[0].status == "improved"


def test_too_few_rounds_for_any_significance_are_untested_not_failed():
    ch = _cmp([100.0, 100.0], [50.0, 50.0])
    assert ch.status == "untested" and not ch.failed
    assert "2 vs 2 rounds cannot reach p <= 0.05 (the smallest possible is 0.167)" in ch.note
    # a tighter alpha than the rounds allow is untested too, never stricter
    ch = _cmp(BASE, [80.0, 81.0, 79.0, 80.5, 79.5], alpha=0.001)
    assert ch.status == "untested"


def test_no_baseline_and_metrics_a_benchmark_does_not_have():
    new = rf.echo("selectors", 10, BASE)
    (ch,) = gate.check_bench(None, new, gate.parse_fail_on("msgs_per_s:-10%"))
    assert ch.status == "no baseline" and not ch.failed
    # ns_per_op is a switch metric: an echo benchmark is not gated on it
    assert gate.check_bench(new, new, gate.parse_fail_on("ns_per_op:+10%")) == []


def test_switch_and_zmq_metrics():
    base = rf.switch("python-generator_next", [25.0, 25.2, 24.9, 25.1, 25.0])
    slow = rf.switch("python-generator_next", [30.0, 30.2, 29.9, 30.1, 30.0])
    (ch,) = gate.check_bench(base, slow, gate.parse_fail_on("ns_per_op:+10%"))
    assert ch.status == "regression" and ch.change == pytest.approx(0.2, abs=0.01)
    zb = rf.zmq("pyzmq_single", [10000, 10100, 9900, 10050, 9950])
    zn = rf.zmq("pyzmq_single", [8000, 8100, 7900, 8050, 7950])
    (ch,) = gate.check_bench(zb, zn, gate.parse_fail_on("requests_per_s:-10%"))
    assert ch.status == "regression"


#: per-round resident KiB per connection of a 1,000-connection echo server
KIB = [10.0, 10.1, 9.9, 10.05, 9.95]


def _memory(per_conn, noisy=()):
    b = rf.echo("threads", 1000, BASE, rss=[10240 + round(k * 1000) for k in per_conn])
    for n in noisy:
        b["extra_info"]["rounds"][n]["noisy"] = "CPU 1 ran a fixed loop 1.50x slower than its best"
    return b


def test_memory_per_connection_is_gated_on_its_rounds():
    rules = gate.parse_fail_on("rss_per_conn_kib:+20%")
    (ch,) = gate.check_bench(_memory(KIB), _memory([k * 1.5 for k in KIB]), rules)
    assert ch.status == "regression" and ch.failed
    assert ch.change == pytest.approx(0.5) and ch.n_base == ch.n_new == 5
    assert ch.p_value == pytest.approx(1 / 252)  # every new round above every baseline round
    assert ("threads-c1000-64B]: rss_per_conn_kib regressed 10.00 KiB -> 15.00 KiB (+50.0%, threshold +20%), "
            "one-sided Mann-Whitney U p=0.00397 over 5 vs 5 rounds") in ch.line()
    (ch,) = gate.check_bench(_memory(KIB), _memory(KIB), rules)
    assert ch.status == "unchanged" and not ch.failed
    (ch,) = gate.check_bench(_memory(KIB), _memory([k * 0.5 for k in KIB]), rules)
    assert ch.status == "improved"
    # a noisy round is left out, as for msgs_per_s
    (ch,) = gate.check_bench(_memory(KIB), _memory([k * 1.5 for k in KIB], noisy=[0]), rules)
    assert ch.n_new == 4 and ch.status == "regression"
    with pytest.raises(gate.GateSpecError, match="rss_per_conn_kib is better lower"):
        gate.parse_fail_on("rss_per_conn_kib:-20%")


def test_memory_per_connection_gate_on_a_run_saved_before_it_was_measured():
    old = rf.echo("threads", 1000, BASE)  # no memory keys
    rules = gate.parse_fail_on("rss_per_conn_kib:+20%")
    assert gate.check_bench(old, old, rules) == []  # not gated: it has no such figure
    assert gate.compare_one(old, old, "rss_per_conn_kib", 0.2).status == "no data"
    (ch,) = gate.check_bench(old, _memory(KIB), rules)
    assert ch.status == "no baseline" and not ch.failed and "the baseline has no rss_per_conn_kib" in ch.note


def test_compare_gates_memory_per_connection(tmp_path, capsys):
    from pyconcbench import cli

    base = rf.save(tmp_path, "base", rf.run([_memory(KIB)]))
    grown = rf.save(tmp_path, "grown", rf.run([_memory([k * 1.5 for k in KIB])]))
    same = rf.save(tmp_path, "same", rf.run([_memory(KIB)]))
    assert cli.main(["compare", str(base), str(same), "--fail-on", "rss_per_conn_kib:+20%"]) == 0
    assert "**no regression**" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(grown), "--fail-on", "rss_per_conn_kib:+20%"]) == 1
    err = capsys.readouterr().err
    assert "test_echo[threads-c1000-64B]: rss_per_conn_kib regressed 10.00 KiB -> 15.00 KiB (+50.0%" in err


def test_time_metric_uses_pytest_benchmark_rounds():
    base = rf.echo("selectors", 10, BASE)
    slow = rf.echo("selectors", 10, [80.0, 81.0, 79.0, 80.5, 79.5])
    (ch,) = gate.check_bench(base, slow, gate.parse_fail_on("time:+10%"))
    assert ch.status == "regression" and ch.change == pytest.approx(0.25, abs=0.01)


def test_compare_runs_matches_by_test_and_lists_the_missing():
    base = [rf.echo("selectors", 10, BASE), rf.echo("threads", 10, BASE)]
    new = [rf.echo("selectors", 10, [80.0, 81.0, 79.0, 80.5, 79.5]), rf.echo("gevent", 10, BASE)]
    res = gate.compare_runs(base, new, gate.parse_fail_on("msgs_per_s:-10%"))
    assert [c.status for c in res.changes] == ["regression", "no baseline"]
    assert res.missing == ["tests/bench/test_echo.py::test_echo[threads-c10-64B]"]
    md = gate.markdown(res)
    assert "**1 regression**" in md
    assert "| `test_echo[selectors-c10-64B]` | msgs_per_s | -10% | 100 msgs/s | 80 msgs/s | -20.0% | 0.00397 | 5/5 | regression |" in md
    assert "Not in the new run (1)" in md


def test_marker_thresholds_saved_in_the_baseline_are_honoured():
    # the marker of the reviewed code (saved in the baseline) wins over the command line
    base = rf.echo("selectors", 10, BASE, pcb_fail_on="msgs_per_s:-30%")
    new = rf.echo("selectors", 10, [80.0, 81.0, 79.0, 80.5, 79.5], pcb_fail_on="msgs_per_s:-30%")
    res = gate.compare_runs([base], [new], gate.parse_fail_on("msgs_per_s:-10%"))
    assert res.changes[0].status == "unchanged" and res.changes[0].threshold == pytest.approx(0.30)


def test_fact_differences():
    a = rf.run([])["machine_info"]
    b = rf.run([], python="3.12.1", kernel="6.19.0")["machine_info"]
    assert gate.fact_differences(a, a) == []
    assert gate.fact_differences(a, b) == ["kernel: 6.18.0 -> 6.19.0", "python: 3.11.7 -> 3.12.1"]


def test_several_baseline_runs_pool_rounds_and_bound_the_noise():
    fast = rf.echo("selectors", 10, [120.0, 121.0, 119.0, 120.5, 119.5])
    slow = rf.echo("selectors", 10, [80.0, 81.0, 79.0, 80.5, 79.5])
    rules = gate.parse_fail_on("msgs_per_s:-10%")
    # 84 is 15 % below the pooled median (~100) but inside the range of the two baseline runs
    new = rf.echo("selectors", 10, [84.0, 85.0, 83.0, 84.5, 83.5])
    (ch,) = gate.check_bench([fast, slow], new, rules)
    assert ch.status == "within noise" and ch.n_base == 10
    assert "inside the range of the 2 baseline runs' medians (80 msgs/s .. 120 msgs/s)" in ch.note
    worse = rf.echo("selectors", 10, [70.0, 71.0, 69.0, 70.5, 69.5])
    (ch,) = gate.check_bench([fast, slow], worse, rules)
    assert ch.status == "regression" and "worse than all 2 baseline runs" in ch.line()


def test_noisy_rounds_are_left_out_and_too_few_clean_ones_are_not_judged():
    base = rf.echo("selectors", 10, BASE)
    new = rf.echo("selectors", 10, [60.0, 61.0, 59.0, 60.5, 59.5])
    for r in new["extra_info"]["rounds"][:3]:
        r["noisy"] = "CPU 1 ran a fixed loop 1.40x slower than its best"
    (ch,) = gate.check_bench(base, new, gate.parse_fail_on("msgs_per_s:-10%"))
    assert ch.status == "noisy" and not ch.failed
    assert "new: 3 noisy, 2 clean" in ch.note
    new["extra_info"]["rounds"][0]["noisy"] = None
    (ch,) = gate.check_bench(base, new, gate.parse_fail_on("msgs_per_s:-10%"))
    assert ch.status == "regression" and ch.n_new == 3


def test_memory_per_connection_near_zero_is_not_judged():
    """At 10 connections one 4 KiB page is 0.4 KiB per connection, and a server that gave memory
    back is below 0 (the ratio would flip its sign): below 1 KiB the gate does not judge."""
    rules = gate.parse_fail_on("rss_per_conn_kib:+20%")
    for low in ([0.4] * 5, [-0.4] * 5):
        (ch,) = gate.check_bench(_memory(low), _memory([2.0] * 5), rules)
        assert ch.status == "no baseline" and not ch.failed
        assert "is below 1.00 KiB, where a relative change means nothing: not judged" in ch.note
