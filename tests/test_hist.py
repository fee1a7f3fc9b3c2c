"""The engine's latency histogram (native/pcb_hist.c), through _native.hist_query."""
import random

import pytest

from pyconcbench import _native
from pyconcbench.loadgen import merge_percentiles

MAX_RELATIVE_ERROR = 1.0 / (1 << _native.HIST_SUB_BITS)


def test_single_values_keep_relative_error_below_one_percent():
    rng = random.Random(7)
    values = [int(10 ** rng.uniform(2, 11)) for _ in range(3000)]
    values += [100, 127, 128, 129, 255, 256, 1000, 10 ** 9, 10 ** 11]
    for v in values:
        got = _native.hist_query([v], [50.0])["query"][0]
        # the reported value is the highest of v's bucket, clamped to the exact max (= v here)
        assert got == v


def test_bucket_width_bounds_the_error():
    rng = random.Random(3)
    for _ in range(2000):
        v = int(10 ** rng.uniform(2, 11))
        # two values: the p50 query reports the smaller one's bucket high
        got = _native.hist_query([v, 10 ** 11], [50.0])["query"][0]
        assert v <= got <= v * (1 + MAX_RELATIVE_ERROR)
    assert MAX_RELATIVE_ERROR < 0.01


def test_percentiles_of_a_known_distribution():
    values = list(range(1000, 10_000_001, 1000))  # 1 us .. 10 ms, 10,000 values
    r = _native.hist_query(values, [50.0, 90.0, 99.0, 99.9, 100.0])
    for (p, want), got in zip([(50, 5_000_000), (90, 9_000_000), (99, 9_900_000), (99.9, 9_990_000),
                               (100, 10_000_000)], r["query"]):
        assert want <= got <= want * (1 + MAX_RELATIVE_ERROR), p
    assert r["count"] == 10_000
    assert r["min"] == 1000 and r["max"] == 10_000_000
    assert r["mean"] == pytest.approx(sum(values) / len(values))
    assert r["p50"] == r["query"][0] and r["max"] == 10_000_000


def test_out_of_range_values_are_counted_not_recorded():
    r = _native.hist_query([50, 99, 100, 10 ** 11, 10 ** 11 + 1], [100.0])
    assert r["count"] == 2
    assert r["out_of_range"] == 3
    assert r["max"] == 10 ** 11 and r["min"] == 100


def test_empty_histogram_reports_zeros():
    r = _native.hist_query([], [50.0, 99.0])
    assert r["query"] == [0, 0]
    assert r["count"] == 0 and r["p99"] == 0 and r["buckets"] == []


@pytest.mark.parametrize("pcts", [[99.0, 50.0], [-1.0], [100.5]])
def test_bad_percentile_lists_are_refused(pcts):
    with pytest.raises(ValueError, match="ascending"):
        _native.hist_query([1000], pcts)


def test_buckets_merge_across_phases():
    a = _native.hist_query(list(range(1000, 2001)), [])["buckets"]
    b = _native.hist_query(list(range(3000, 4001)), [])["buckets"]
    pcts = [50.0, 90.0, 95.0, 99.0, 99.9, 100.0]
    both = _native.hist_query(list(range(1000, 2001)) + list(range(3000, 4001)), pcts)
    assert merge_percentiles([a, b], pcts, maximum=4000) == both["query"]
    assert merge_percentiles([], (50.0,), maximum=None) == [0]


def test_merged_percentiles_are_clamped_to_the_exact_maximum_as_the_engine_does():
    # 4000 is in the bucket 4000..4015: the top percentiles of these rounds are in it
    one = _native.hist_query([1000] * 10 + [4000] * 10, [50.0, 99.0, 99.9, 100.0])
    assert one["max"] == 4000 and one["query"] == [1003, 4000, 4000, 4000]
    phases = [_native.hist_query([1000] * 10, [])["buckets"], _native.hist_query([4000] * 10, [])["buckets"]]
    assert phases[1] == [(4015, 10)]  # the bucket reaches past the value
    assert merge_percentiles(phases, [50.0, 99.0, 99.9, 100.0], maximum=4000) == [1003, 4000, 4000, 4000]
