"""Context-switch microbenchmarks: Python switch costs beside native C and Go baselines.

The cases are ``pyconcbench.micro.cases()``; each test runs one through
``benchmark.pedantic(rounds=R, iterations=1)``.  A round times N operations inside the
workload and subtracts an empty loop of the same length; the median ns/op, the per-round
samples, what one op is, the pinning and the study's figure go into ``extra_info``.
pytest-benchmark's own round time is the wall time of the whole round.

    test_switch[python-generator_next]   groups switch-python, switch-native, switch-go
    test_create[native-fork_waitpid]     group create
    test_handoff[python-condition-2cpu]  group handoff
    test_depth[yield_from-d8]            group depth-sweep: each also carries the slope
                                         (ns per extra level) and intercept fitted over
                                         every depth measured so far

``pytest tests/bench -k switch`` runs them all; a table is printed at the end.  Cases whose
module (greenlet, gevent, uvloop) or toolchain (go) is missing are skipped with the reason;
Go baselines that do not build (``go`` on PATH) fail, in one line.
"""
import pytest



def _check(info):
    """A normal run's figures; in an interleaved A/B run (--pcb-ab-a/--pcb-ab-b: a worker per
    side) each side's as a normal run's, as many rounds a side as pairs in ABBA order, and each
    pair's ns_per_op B's round over A's adjacent one.  Returns A's figures (a normal run's own)."""
    if info.get("pcb_family") == "ab":
        a, b, pairs = info["a"], info["b"], info["pairs"]
        _check(a)
        _check(b)
        assert info["ab_family"] == "switch" and len(pairs) == a["rounds"] == b["rounds"]
        assert info["order"] == "".join(("AB", "BA")[i % 2] for i in range(len(pairs)))
        for pair, ra, rb in zip(pairs, a["samples"], b["samples"]):
            assert pair["ns_per_op"] == pytest.approx(rb["ns_per_op"] / ra["ns_per_op"], rel=1e-4)
        return a
    assert info["rounds"] >= 1 and len(info["samples"]) == info["rounds"]
    assert all(s["ops"] >= 1 and s["elapsed_ns"] > 0 for s in info["samples"])
    assert info["ns_per_op_min"] <= info["ns_per_op"] <= info["ns_per_op_max"]
    return info


def test_switch(switch_case, switch_bench):
    _check(switch_bench())


def test_create(switch_case, switch_bench):
    _check(switch_bench())


def test_handoff(switch_case, switch_bench):
    _check(switch_bench())


def test_depth(switch_case, switch_bench):
    info = _check(switch_bench())
    assert info["depth"] == switch_case.depth
