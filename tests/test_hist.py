"""The latency histogram (native/pcb_hist.c) as the Python object ``_native.Histogram``: the
engine hands each phase's histogram over as one, echo merges rounds with it, ZeroMQ records its
latencies in it.  The property tests against exact samples are in test_properties.py."""
import copy
import random

import pytest

from pyconcbench import _native, loadgen

MAX_RELATIVE_ERROR = 1.0 / (1 << _native.HIST_SUB_BITS)


def hist(values=()):
    h = _native.Histogram()
    h.record_many(values)
    return h


def test_single_values_keep_relative_error_below_one_percent():
    rng = random.Random(7)
    values = [int(10 ** rng.uniform(2, 11)) for _ in range(3000)]
    values += [100, 127, 128, 129, 255, 256, 1000, 10 ** 9, 10 ** 11]
    for v in values:
        # the reported value is the highest of v's bucket, clamped to the exact max (= v here)
        assert hist([v]).percentiles([50.0]) == [v]


def test_bucket_width_bounds_the_error():
    rng = random.Random(3)
    for _ in range(2000):
        v = int(10 ** rng.uniform(2, 11))
        # two values: the p50 query reports the smaller one's bucket high
        got = hist([v, 10 ** 11]).percentiles([50.0])[0]
        assert v <= got <= v * (1 + MAX_RELATIVE_ERROR)
    assert MAX_RELATIVE_ERROR < 0.01


def test_percentiles_of_a_known_distribution():
    values = list(range(1000, 10_000_001, 1000))  # 1 us .. 10 ms, 10,000 values
    h = hist(values)
    got = h.percentiles([50.0, 90.0, 99.0, 99.9, 100.0])
    for (p, want), value in zip([(50, 5_000_000), (90, 9_000_000), (99, 9_900_000), (99.9, 9_990_000),
                                 (100, 10_000_000)], got):
        assert want <= value <= want * (1 + MAX_RELATIVE_ERROR), p
    s = h.summary()
    assert s["count"] == h.count == 10_000
    assert s["min"] == h.min == 1000 and s["max"] == h.max == 10_000_000
    assert s["mean"] == pytest.approx(sum(values) / len(values)) == h.mean
    assert s["p50"] == got[0] and s["p99"] == got[2] and s["p99_9"] == got[3]


def test_out_of_range_values_are_counted_not_recorded():
    h = _native.Histogram()
    assert h.record_many([50, 99, 100, 10 ** 11, 10 ** 11 + 1, -5]) == 2
    assert h.record(2 ** 80) is False          # beyond int64: out of range, not an error
    assert h.record(1000, count=3) is True
    assert h.count == 5 and h.out_of_range == 5
    assert h.max == 10 ** 11 and h.min == 100
    assert h.percentiles([100.0]) == [10 ** 11]


def test_record_with_a_count_is_the_same_as_recording_each():
    a, b = _native.Histogram(), hist([1234] * 7 + [99_999] * 3)
    a.record(1234, count=7)
    a.record(99_999, 3)
    assert a.buckets() == b.buckets() and a.summary() == b.summary()
    for bad in (0, -1):
        with pytest.raises((ValueError, OverflowError)):
            a.record(1000, count=bad)


def test_empty_histogram_reports_zeros():
    h = _native.Histogram()
    assert h.percentiles([50.0, 99.0]) == [0, 0]
    assert h.count == 0 and h.min == 0 and h.max == 0 and h.mean == 0.0
    assert h.summary()["p99"] == 0 and h.buckets() == []


@pytest.mark.parametrize("pcts", [[99.0, 50.0], [-1.0], [100.5], [float("nan")]])
def test_bad_percentile_lists_are_refused(pcts):
    with pytest.raises(ValueError, match="ascending"):
        hist([1000]).percentiles(pcts)


def test_bad_arguments_are_type_errors():
    with pytest.raises(TypeError):
        _native.Histogram(10)
    with pytest.raises(TypeError):
        hist().merge([1, 2])
    with pytest.raises(TypeError):
        hist().record_many([1000, "x"])
    with pytest.raises(TypeError):
        hist().percentiles(50)


def test_merging_phases_gives_one_histogram_of_every_value():
    a, b = hist(range(1000, 2001)), hist(range(3000, 4001))
    both = hist(list(range(1000, 2001)) + list(range(3000, 4001)))
    pcts = [50.0, 90.0, 95.0, 99.0, 99.9, 100.0]
    m = _native.Histogram()
    m.merge(a)
    m.merge(b)
    assert m.percentiles(pcts) == both.percentiles(pcts)
    assert m.buckets() == both.buckets() and m.summary() == both.summary()
    assert a.count == 1001  # merge leaves its argument alone


def test_merged_percentiles_are_clamped_to_the_exact_maximum():
    # 4000 is in the bucket 4000..4015: the top percentiles of these rounds are in it
    one = hist([1000] * 10 + [4000] * 10)
    assert one.max == 4000 and one.percentiles([50.0, 99.0, 99.9, 100.0]) == [1003, 4000, 4000, 4000]
    high = hist([4000] * 10)
    assert high.buckets() == [(4015, 10)]  # the bucket reaches past the value
    m = hist([1000] * 10)
    m.merge(high)
    assert m.percentiles([50.0, 99.0, 99.9, 100.0]) == [1003, 4000, 4000, 4000]


def test_copies_are_independent():
    a = hist([1000, 2000])
    for b in (a.copy(), copy.copy(a), copy.deepcopy(a)):
        b.record(5000)
        assert a.count == 2 and b.count == 3 and a.max == 2000


def test_loadgen_merges_rounds_through_the_engine_histogram():
    def result(values):
        h = hist(values)
        return loadgen.LoadResult(
            connections=1, size=64, transport="tcp", completed=len(values), elapsed=0.1,
            connect_seconds=0.0, latency=h.summary(), fairness=loadgen.fairness([len(values)]),
            errors={}, loadgen_cpu_user=0.0, loadgen_cpu_sys=0.0, bytes=0, histogram=h)

    rounds = [result([1000] * 10), result([4000] * 10)]
    assert loadgen.merged(rounds).percentiles([50.0, 100.0]) == [1003, 4000]
    assert "histogram" not in rounds[0].as_dict()
    with pytest.raises(ValueError, match="without its histogram"):
        loadgen.merged([loadgen.LoadResult(**{**rounds[0].__dict__, "histogram": None})])
