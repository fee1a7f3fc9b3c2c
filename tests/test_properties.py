"""Property and boundary tests of the numbers the suite reports: the latency histogram merged
over rounds against the exact sorted samples, fairness within a round and across rounds, the
noise judge, and the statistics of the report and the gate (stats.py).  Hypothesis runs are bounded (``BOUNDED``) so the file stays fast."""
import itertools
import math
import statistics
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from pyconcbench import _native, instruments, loadgen, machine, rounds, stats
from pyconcbench.echo import EchoCase, EchoOutcome, RoundRecord
from pyconcbench.rounds import noise_reason

BOUNDED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: The histogram's stated bound (native/pcb_hist.h): a bucket is never wider than 1/128 of its
#: lower bound, so a reported value is at most this much above the true one.
MAX_RELATIVE_ERROR = 1.0 / (1 << _native.HIST_SUB_BITS)
LOW, HIGH = 100, 10 ** 11  # the trackable range, ns

# ---- the histogram merge against the exact samples ----------------------------------------

#: ns values across the whole range: log-uniform-ish, plus the edges of the exact and the
#: bucketed ranges where off-by-one errors live
values = st.one_of(
    st.integers(LOW, HIGH),
    st.builds(lambda e, m: min(HIGH, max(LOW, int(m * 10 ** e))), st.integers(2, 10), st.floats(1.0, 9.999)),
    st.sampled_from([100, 101, 127, 128, 129, 255, 256, 257, 1000, 1003, 1004, 10 ** 6, HIGH - 1, HIGH]),
)
phases = st.lists(st.lists(values, min_size=0, max_size=40), min_size=1, max_size=4)
percentile_lists = st.lists(st.floats(0.0, 100.0, allow_nan=False), max_size=6).map(sorted)
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def exact_percentile(ordered, p):
    """The smallest sample v with at least p % of the samples <= v (at least the first)."""
    need = max(1.0, p / 100.0 * len(ordered))
    return ordered[math.ceil(need) - 1]


def histogram(values):
    h = _native.Histogram()
    h.record_many(values)
    return h


def merged(phase_values, pcts):
    """What the echo workload does with several rounds: each round's histogram from the
    engine, merged, asked for the percentiles."""
    total = _native.Histogram()
    for v in phase_values:
        total.merge(histogram(v))
    return total.percentiles(pcts)


@BOUNDED
@given(phases, percentile_lists)
@example([[1000]], [99.9])           # one value: its bucket's high (1003) is above it
@example([[1000], [1000, 1001]], [100.0])
@example([[100, 128, 129]], [0.0, 50.0, 100.0])
def test_merged_percentiles_are_within_the_stated_error_and_never_above_the_max(phase_values, pcts):
    pcts = list(pcts) + list(DEFAULT_PERCENTILES) if not pcts else pcts
    pcts = sorted(pcts)
    ordered = sorted(v for phase in phase_values for v in phase)
    got = merged(phase_values, pcts)
    if not ordered:
        assert got == [0] * len(pcts)
        return
    for p, value in zip(pcts, got):
        true = exact_percentile(ordered, p)
        assert true <= value <= true * (1 + MAX_RELATIVE_ERROR), (p, true, value)
        assert value <= ordered[-1]
    assert got == sorted(got)


@BOUNDED
@given(phases, percentile_lists)
def test_merging_rounds_reports_what_one_histogram_of_every_sample_reports(phase_values, pcts):
    everything = [v for phase in phase_values for v in phase]
    assert merged(phase_values, pcts) == histogram(everything).percentiles(pcts)


def test_percentiles_are_clamped_to_the_exact_extremes():
    one = histogram([1000])
    assert one.buckets() == [(1003, 1)] and one.max == 1000
    assert one.percentiles(DEFAULT_PERCENTILES) == [1000] * 5  # not the bucket's high, 1003
    # 0 and 100 are the edges, beyond them an error
    assert histogram([127, 1000]).percentiles([0.0, 100.0]) == [127, 1000]
    for bad in ([100.5], [-1.0], [float("nan")]):
        with pytest.raises(ValueError, match="within 0..100"):
            one.percentiles(bad)


# ---- fairness within one round ------------------------------------------------------------

counts_lists = st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=60)


def starving_reference(counts):
    """Connections below STARVING_SHARE (1/10) of the mean, in exact integer arithmetic:
    c < total / n / 10."""
    assert loadgen.STARVING_SHARE == 0.10
    n, total = len(counts), sum(counts)
    return sum(1 for c in counts if 10 * c * n < total)


@BOUNDED
@given(counts_lists)
def test_jain_is_between_one_over_n_and_one(counts):
    f = loadgen.fairness(counts)
    n = len(counts)
    if not any(counts):
        assert f.jain == 0.0 and f.starving == 0
        return
    assert 0.0 < 1.0 / n <= f.jain <= 1.0
    assert f.min == min(counts) and f.max == max(counts)
    assert f.min <= f.median <= f.max
    assert f.starving == starving_reference(counts)
    assert f.starving < n  # the largest is never below a tenth of the mean


@BOUNDED
@given(st.integers(1, 10 ** 6), st.integers(1, 500))
def test_equal_shares_are_perfectly_fair(count, n):
    f = loadgen.fairness([count] * n)
    assert f.jain == 1.0 and f.starving == 0 and f.min == f.max == count


@BOUNDED
@given(st.integers(1, 10 ** 6), st.integers(2, 500))
def test_one_connection_getting_everything_is_one_over_n(count, n):
    f = loadgen.fairness([count] + [0] * (n - 1))
    assert f.jain == pytest.approx(1.0 / n) and f.starving == n - 1


@BOUNDED
@given(counts_lists, st.randoms(use_true_random=False), st.integers(2, 1000))
def test_fairness_ignores_order_and_scale(counts, rnd, k):
    assume(any(counts))
    f = loadgen.fairness(counts)
    shuffled = list(counts)
    rnd.shuffle(shuffled)
    assert loadgen.fairness(shuffled) == f
    scaled = loadgen.fairness([k * c for c in counts])
    assert scaled.jain == pytest.approx(f.jain, rel=1e-12) and scaled.starving == f.starving


def test_no_connections_is_all_zeros():
    assert loadgen.fairness([]) == loadgen.Fairness(0, 0.0, 0, 0.0, 0)


@pytest.mark.parametrize("counts, starving", [
    ([10, 190], 0),          # mean 100: exactly 10 % of it is not starving
    ([9, 191], 1),           # one fewer is
    ([100] * 9 + [10], 0),   # mean 91: 9.1 is the boundary
    ([100] * 9 + [9], 1),
    ([0, 0, 0], 0),          # nothing completed: no mean to fall below
    ([3, 57], 0),            # mean 30: 3 is exactly 10 % (0.1 x 30.0 == 3.0)
    ([0, 1, 1000], 2),
])
def test_the_starving_boundary_is_strictly_below_a_tenth_of_the_mean(counts, starving):
    assert loadgen.fairness(counts).starving == starving


# ---- fairness and latency across rounds (EchoOutcome) -------------------------------------

def round_result(counts, latency_values):
    hist = histogram(latency_values)
    return loadgen.LoadResult(
        connections=len(counts), size=64, transport="tcp", completed=sum(counts), elapsed=0.1,
        connect_seconds=0.0, latency=hist.summary(), fairness=loadgen.fairness(counts),
        errors={k: 0 for k in loadgen.ERROR_KINDS}, loadgen_cpu_user=0.01, loadgen_cpu_sys=0.01,
        bytes=64 * sum(counts), histogram=hist)


def outcome(round_counts, latencies=None, rss=None, idle=None, noisy=None):
    latencies = latencies or [[1000 + i for i in range(50)] for _ in round_counts]
    rss = rss or [None] * len(round_counts)
    noisy = noisy or [""] * len(round_counts)
    recs = [RoundRecord(round_result(c, lat), server_cpu=0.05, server_user=0.0, server_sys=0.0, other_cpu=0.0,
                        probe_before=None, probe_after=None, noisy=why, attempt=0, rss_kib=kib)
            for c, lat, kib, why in zip(round_counts, latencies, rss, noisy)]
    runner = SimpleNamespace(
        records=recs, rejected=[], case=EchoCase("native_epoll", len(round_counts[0]), 64, "tcp"),
        server=SimpleNamespace(ready={}, measured_pid=0, measured_pids=(0,)), messages=sum(round_counts[0]),
        settings=SimpleNamespace(pinning_note="test", noise_retries=2), probe_baseline=None, speed=None,
        plan=rounds.Plan.fixed(len(round_counts)), rss_idle_kib=idle, rss_connected_kib=idle and idle + 8, engines=1)
    with mock.patch.object(instruments, "proc_status_kib", return_value=None):
        return EchoOutcome.from_records(runner, connect_seconds=0.001).extra


def test_fairness_across_rounds_is_the_worst_round():
    # round 1: even; round 2: one connection starving (5 < 10 % of 77.5) and the lowest Jain;
    # round 3: two starving, a higher Jain than round 2's, the most any connection made
    e = outcome([[100, 100, 100, 100], [5, 100, 105, 100], [0, 0, 150, 160]])
    jains = [loadgen.fairness(c).jain for c in ([100] * 4, [5, 100, 105, 100], [0, 0, 150, 160])]
    assert e["fairness_jain"] == round(min(jains), 4) == round(jains[2], 4)
    assert e["fairness_min"] == 0 and e["fairness_max"] == 160
    assert e["starving_connections"] == 2  # the most in one round, not the sum (3) nor the last round's
    e = outcome([[0, 0, 150, 160], [5, 100, 105, 100]])
    assert e["starving_connections"] == 2 and e["fairness_min"] == 0


@BOUNDED
@given(st.lists(st.lists(st.integers(0, 1000), min_size=3, max_size=3).filter(any), min_size=1, max_size=4))
def test_fairness_across_rounds_matches_the_rounds(round_counts):
    e = outcome(round_counts)
    per = [loadgen.fairness(c) for c in round_counts]
    assert e["fairness_jain"] == round(min(f.jain for f in per), 4)
    assert 0.0 < e["fairness_jain"] <= 1.0
    assert e["fairness_min"] == min(min(c) for c in round_counts)
    assert e["fairness_max"] == max(max(c) for c in round_counts)
    assert e["starving_connections"] == max(starving_reference(c) for c in round_counts)


def test_memory_per_connection_is_the_median_of_the_rounds_growth_over_idle():
    # 8 connections, idle 4,000 KiB; after the rounds 4,100, 4,060 (noisy: left out like every
    # headline figure), 4,020 and 3,992 (memory given back: below 0, not clipped)
    e = outcome([[10] * 8] * 4, rss=[4100, 4060, 4020, 3992], idle=4000,
                noisy=["", "CPU 1 ran a fixed loop 1.50x slower than its best", "", ""])
    assert [r["rss_kib"] for r in e["rounds"]] == [4100, 4060, 4020, 3992]
    assert [r["rss_per_conn_kib"] for r in e["rounds"]] == [12.5, 7.5, 2.5, -1.0]
    assert e["server_rss_idle_kib"] == 4000 and e["server_rss_connected_kib"] == 4008
    assert e["server_rss_loaded_kib"] == 4020 and e["rss_per_conn_kib"] == 2.5  # median of 4100, 4020, 3992
    e = outcome([[10] * 3] * 2, rss=[4001, 4002], idle=4000)  # an even count: the middle two's mean
    assert e["server_rss_loaded_kib"] == 4001.5 and e["rss_per_conn_kib"] == 0.5
    assert [r["rss_per_conn_kib"] for r in e["rounds"]] == [0.333, 0.667]


@BOUNDED
@given(st.integers(1, 2000), st.integers(1000, 10 ** 7),
       st.lists(st.integers(-10 ** 5, 10 ** 7), min_size=1, max_size=7))
def test_memory_per_connection_matches_its_definition(connections, idle, growth):
    e = outcome([[1] * connections] * len(growth), rss=[idle + g for g in growth], idle=idle)
    per_round = [r["rss_per_conn_kib"] for r in e["rounds"]]
    assert per_round == [round(g / connections, 3) for g in growth]
    assert e["rss_per_conn_kib"] == round(statistics.median(per_round), 3)
    assert e["server_rss_loaded_kib"] == pytest.approx(idle + statistics.median(growth), abs=0.05)


def test_merged_latency_never_exceeds_the_rounds_maximum():
    # every round's values sit low in their buckets: 1000 ns is in the bucket 1000..1003
    e = outcome([[10, 10], [10, 10]], latencies=[[1000] * 20, [900] * 19 + [1000]])
    assert e["latency_max_us"] == 1.0
    for key in ("latency_p50_us", "latency_p90_us", "latency_p95_us", "latency_p99_us", "latency_p99_9_us"):
        assert e[key] <= e["latency_max_us"], key
    assert e["latency_p99_9_us"] == 1.0 and e["latency_p50_us"] == 1.0
    # below the max, a percentile is its bucket's high: 900 is in 900..903
    e = outcome([[10, 10], [10, 10]], latencies=[[900] * 1000, [1000] * 1000])
    assert e["latency_p50_us"] == 0.903 and e["latency_p99_9_us"] == 1.0


# ---- the noise judge ----------------------------------------------------------------------

TICK = 1.0 / machine.CLK_TCK


def judge(baseline=None, probes=(None, None), other=None, elapsed=1.0, speed=None, speed_probes=()):
    return noise_reason(speed, speed_probes, baseline, tuple(probes), other, elapsed)


@pytest.mark.parametrize("baseline, limit", [
    (100.0, 250.0),   # +150 ns is the larger: 2x (200) alone would flag 201..250
    (150.0, 300.0),   # both rules agree here, so this baseline cannot tell them apart
    (400.0, 800.0),   # 2x is the larger: +150 ns (550) alone would flag 551..800
])
def test_the_probe_limit_is_the_larger_of_twice_and_150_ns_more(baseline, limit):
    assert judge(baseline, (limit, limit)) == ""
    assert judge(baseline, (limit - 1, None)) == ""
    assert judge(baseline, (None, limit + 0.5)) == f"cache-line probe {limit + 0.5:.0f} ns > {limit:.0f} ns"
    assert judge(baseline, (limit + 1, baseline)) != ""  # the worst of the two counts
    assert rounds.PROBE_NOISY_FACTOR == 2.0 and rounds.PROBE_NOISY_MARGIN_NS == 150.0


def test_missing_probes_and_baseline_judge_nothing():
    assert judge(None, (10_000.0, 10_000.0)) == ""   # no baseline (pinning off)
    assert judge(0.0, (10_000.0, 10_000.0)) == ""    # no baseline measured
    assert judge(100.0, (None, None)) == ""          # no probe around the round
    assert judge(100.0, ()) == ""
    assert judge(100.0, (None, 251.0)) != "" and judge(100.0, (251.0, None)) != ""


def test_other_cpu_is_allowed_two_clock_ticks_over_a_quarter_of_the_round():
    # a 1 s round: others may use 25 % of a CPU plus two ticks (the /proc/stat resolution)
    edge = 0.25 + 2 * TICK
    assert judge(other=edge - 1e-6) == ""
    assert judge(other=edge + 1e-6) == f"other processes used {edge + 1e-6:.0%} of a CPU"
    assert judge(other=0.25 + 1.5 * TICK) == ""      # above 25 %, within the allowance
    # a short round: two ticks are a large share of it and still only the tick rounding
    assert judge(other=2 * TICK, elapsed=0.05) == ""
    assert judge(other=2 * TICK + 0.0126, elapsed=0.05) != ""
    assert judge(other=None) == "" and judge(other=5.0, elapsed=0.0) == ""


def test_other_cpu_exactly_at_the_allowance_is_clean(monkeypatch):
    monkeypatch.setattr(machine, "CLK_TCK", 100)
    assert 0.27 - 2 * (1 / 100) == 0.25  # exactly at the limit, in floating point too
    assert judge(other=0.27, elapsed=1.0) == ""
    assert judge(other=0.2701, elapsed=1.0) == "other processes used 27% of a CPU"
    monkeypatch.setattr(machine, "CLK_TCK", 1000)  # a finer clock: a smaller allowance
    assert judge(other=0.2701, elapsed=1.0) != "" and judge(other=0.252, elapsed=1.0) == ""


class Gauge:
    def __init__(self, reason):
        self.reason = reason
        self.seen = None

    def judge(self, *probes):
        self.seen = probes
        return self.reason


def test_the_slow_spell_is_judged_first_then_the_probe_then_other_cpu():
    g = Gauge("CPU 1 ran a fixed loop 1.30x slower than its best")
    assert judge(100.0, (900.0, None), other=0.9, speed=g, speed_probes=("a", "b")) == g.reason
    assert g.seen == ("a", "b")
    assert judge(100.0, (900.0, None), other=0.9, speed=Gauge("")).startswith("cache-line probe 900 ns")
    assert judge(100.0, (200.0, None), other=0.9, speed=Gauge("")).startswith("other processes used 90%")


def reference_noisy(baseline, probes, other, elapsed):
    present = [p for p in probes if p is not None]
    probe = bool(baseline) and bool(present) and max(present) > max(2 * baseline, baseline + 150)
    busy = other is not None and elapsed > 0 and other - 2 * TICK > 0.25 * elapsed
    return probe, busy


maybe_ns = st.one_of(st.none(), st.floats(1.0, 5000.0))


@BOUNDED
@given(st.one_of(st.none(), st.floats(1.0, 1000.0)), st.tuples(maybe_ns, maybe_ns),
       st.one_of(st.none(), st.floats(0.0, 4.0)), st.floats(0.0, 4.0))
def test_the_noise_judge_matches_its_rule(baseline, probes, other, elapsed):
    reason = judge(baseline, probes, other, elapsed)
    probe, busy = reference_noisy(baseline, probes, other, elapsed)
    assert bool(reason) == (probe or busy)
    if probe:
        assert reason.startswith("cache-line probe ")
    elif busy:
        assert reason.startswith("other processes used ")


@BOUNDED
@given(st.floats(1.0, 1000.0), st.floats(1.0, 5000.0), st.floats(0.0, 2000.0),
       st.floats(0.0, 2.0), st.floats(0.0, 2.0), st.floats(0.01, 4.0))
def test_more_noise_never_makes_a_noisy_round_clean(baseline, probe, more_ns, other, more_cpu, elapsed):
    if judge(baseline, (probe, None), other, elapsed):
        assert judge(baseline, (probe + more_ns, None), other + more_cpu, elapsed)


# ---- stats.py: the report's interval and the gate's test ----------------------------------

def test_t975_table_edges():
    assert stats.t975(1) == 12.706 and stats.t975(2) == 4.303
    assert stats.t975(29) == 2.045 and stats.t975(30) == 2.042 and stats.t975(31) == 1.96
    for df in (0, -1):
        with pytest.raises(ValueError, match="^t975: need at least 1 degree of freedom$"):
            stats.t975(df)


def test_ci95_halfwidth_from_two_samples_on():
    assert stats.ci95_halfwidth([]) is None and stats.ci95_halfwidth([5.0]) is None
    # two samples 10 and 14: stdev 2 sqrt 2, t(1) 12.706: 12.706 x 2.828 / 1.414 = 25.412
    assert stats.ci95_halfwidth([10.0, 14.0]) == pytest.approx(25.412)
    # four samples 2, 4, 4, 6: stdev sqrt(8/3), t(3) 3.182, / sqrt(4)
    assert stats.ci95_halfwidth([2.0, 4.0, 4.0, 6.0]) == pytest.approx(3.182 * math.sqrt(8 / 3) / 2)
    assert stats.ci95_halfwidth([7.0, 7.0, 7.0]) == 0.0


@BOUNDED
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=40))
def test_ci95_halfwidth_is_t_times_the_standard_error(samples):
    n = len(samples)
    want = stats.t975(n - 1) * statistics.stdev(samples) / math.sqrt(n)
    assert stats.ci95_halfwidth(samples) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_u_statistic_counts_pairs_ties_as_halves():
    assert stats._u_statistic([1, 2], [3, 4]) == 0.0
    assert stats._u_statistic([3, 4], [1, 2]) == 4.0
    assert stats._u_statistic([2, 5], [2, 3, 6]) == 0.5 + 2.0   # 2 ties 2; 5 beats 2 and 3
    assert stats._u_statistic([5, 5], [5]) == 1.0


def rank_u(x, y):
    """U of x from the rank sum (mid-ranks for ties): independent of _u_statistic's pairs."""
    pooled = sorted(list(x) + list(y))
    rank = {}
    for value, group in itertools.groupby(enumerate(pooled, 1), key=lambda iv: iv[1]):
        ranks = [i for i, _ in group]
        rank[value] = sum(ranks) / len(ranks)
    return sum(rank[v] for v in x) - len(x) * (len(x) + 1) / 2


def exact_reference(x, y):
    """P(U <= observed) over every way to split the pooled samples, by rank sums."""
    pooled = list(x) + list(y)
    observed = rank_u(x, y)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += rank_u(xs, ys) <= observed + 1e-9
    return hits / total


def normal_reference(x, y):
    """The normal approximation with the tie and continuity corrections, from the rank sum."""
    n1, n2 = len(x), len(y)
    n = n1 + n2
    ties = sum(t ** 3 - t for t in (len(list(g)) for _, g in itertools.groupby(sorted(list(x) + list(y)))))
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    return statistics.NormalDist().cdf((rank_u(x, y) - n1 * n2 / 2.0 + 0.5) / math.sqrt(var))


small_samples = st.lists(st.integers(0, 8), min_size=1, max_size=6)


@BOUNDED
@given(small_samples, small_samples)
def test_mann_whitney_exact_matches_the_rank_sum_reference(x, y):
    p = stats.mann_whitney_less(x, y)
    assert p == pytest.approx(exact_reference(x, y), abs=1e-12)
    assert stats.min_p_value(len(x), len(y)) <= p <= 1.0
    # one direction or the other: P(U <= u) + P(U >= u) = 1 + P(U = u)
    assert p + stats.mann_whitney_less(y, x) >= 1.0 - 1e-12


@BOUNDED
@given(st.lists(st.integers(0, 30), min_size=1, max_size=25), st.lists(st.integers(0, 30), min_size=1, max_size=25))
def test_mann_whitney_normal_approximation_matches_its_formula(x, y):
    with mock.patch.object(stats, "EXACT_LIMIT", 0):
        p = stats.mann_whitney_less(x, y)
    assert p == pytest.approx(normal_reference(x, y), abs=1e-12)
    assert 0.0 <= p <= 1.0


def test_mann_whitney_normal_approximation_by_hand():
    with mock.patch.object(stats, "EXACT_LIMIT", 0):
        # U = 0, n1 = n2 = 3, no ties: var = 9/12 x 7 = 5.25; z = (0 - 4.5 + 0.5) / 2.2913 = -1.7457
        assert stats.mann_whitney_less([1, 2, 3], [4, 5, 6]) == pytest.approx(0.040428, abs=1e-6)
        # one tie (the 3s): U = 0.5, ties 2^3 - 2 = 6: var = 9/12 x (7 - 6/30) = 5.1, z = -1.5499
        assert stats.mann_whitney_less([1, 2, 3], [3, 5, 6]) == pytest.approx(0.060592, abs=1e-6)
        assert stats.mann_whitney_less([4, 4], [4, 4, 4]) == 1.0  # all tied: no spread at all
    assert math.comb(6, 3) <= stats.EXACT_LIMIT  # by default these are exact
    assert stats.mann_whitney_less([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)


def test_mann_whitney_uses_the_exact_test_up_to_the_limit():
    with mock.patch.object(stats, "EXACT_LIMIT", 20):
        assert stats.mann_whitney_less([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)   # C(6,3) = 20
    with mock.patch.object(stats, "EXACT_LIMIT", 19):
        assert stats.mann_whitney_less([1, 2, 3], [4, 5, 6]) == pytest.approx(0.040428, abs=1e-6)
    for x, y in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="^mann_whitney_less: both samples must be non-empty$"):
            stats.mann_whitney_less(x, y)
