"""The round engine's loop (pyconcbench.rounds): how many rounds a case measures (Plan), the
retry loop's wait for quiet and noise budget, and how the measured rounds reach
pytest-benchmark (replay through ROUND_CLOCK)."""
import json
import time

import pytest

from pyconcbench import options, rounds
from pyconcbench.rounds import Plan


# ---- Plan -----------------------------------------------------------------------------------

def test_a_fixed_plan_measures_exactly_its_rounds():
    plan = Plan.fixed(4)
    assert [plan.done(n, [100.0] * n) for n in range(1, 6)] == [False, False, False, True, True]


def test_an_adaptive_plan_stops_once_enough_clean_rounds_agree():
    plan = Plan(3, 5, 0.03)
    assert not plan.done(2, [100.0, 100.0])                    # fewer than least
    assert plan.done(3, [100.0, 101.0, 102.5])                 # range 2.5 % of 101
    assert not plan.done(3, [100.0, 101.0, 104.0])             # range 4 %: one more
    assert not plan.done(4, [100.0, 104.0])                    # two clean of four: not enough
    assert plan.done(5, [100.0, 120.0])                        # most: done whatever they say
    assert not Plan(3, 5, 0.0).done(4, [100.0] * 4)            # agree 0: never early


def test_plan_refuses_what_cannot_be_planned():
    with pytest.raises(ValueError, match="least <= most"):
        Plan(4, 3)
    with pytest.raises(ValueError, match="least <= most"):
        Plan(0, 3)
    with pytest.raises(ValueError, match="tight"):
        Plan(3, 5, 1.5)


def test_settings_make_the_plan():
    base = dict(profile="quick", impls=("native_epoll",), cases=((2, 64, "tcp"),), messages=None,
                duration=None, rounds=None, cpus=None, noise_retries=3, stall_timeout=10.0)
    quick = options.Settings(**base)
    assert quick.plan_for(100) == Plan(3, 5, 0.03)
    assert quick.plan_for(10_000) == Plan(3, 3, 0.03)           # fewer rounds at scale
    assert options.Settings(**dict(base, rounds=7)).plan_for(100) == Plan.fixed(7)
    assert options.Settings(**dict(base, agree=0.0)).plan(7) == Plan(3, 7, 0.0)
    assert options.Settings(**dict(base, profile="full")).plan_for(100) == Plan(3, 7, 0.0)
    assert "3 to 5 rounds" in quick.plan_for(100).describe()


@pytest.mark.parametrize("text,value", [("3%", 0.03), ("0.05", 0.05), ("0", 0.0), (" 10% ", 0.1)])
def test_parse_share(text, value):
    assert options.parse_share(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-1%", "60%", "nan"])
def test_parse_share_refuses(text):
    with pytest.raises(ValueError):
        options.parse_share(text)


# ---- the retry loop -------------------------------------------------------------------------

def script(*tries):
    """measure(attempt) answering each try's (value, why_noisy, seconds) in turn."""
    seq = list(tries)
    calls = []

    def measure(attempt):
        calls.append(attempt)
        return seq.pop(0)
    return measure, calls


def test_a_clean_try_is_kept_with_its_own_time():
    measure, calls = script(("v", "", 0.25))
    out = rounds.measure_round(measure, 3, budget=rounds.NoiseBudget())
    assert (out.kept.value, out.timed, out.kept_because, calls) == ("v", 0.25, rounds.CLEAN, [0])


def test_a_noisy_try_waits_for_quiet_then_measures_again():
    waits = []

    def settle(limit):
        waits.append(limit)
        return True
    measure, calls = script(("a", "slow", 0.1), ("b", "slow", 0.1), ("c", "", 0.2))
    budget = rounds.NoiseBudget()
    out = rounds.measure_round(measure, 3, settle=settle, budget=budget)
    assert out.kept.value == "c" and out.timed == 0.2 and [t.value for t in out.rejected] == ["a", "b"]
    assert waits == [rounds.SETTLE_SECONDS] * 2 and calls == [0, 1, 2]
    assert budget.spent == pytest.approx(0.2, abs=0.05)  # the two rejected tries


def test_the_last_retry_is_kept_noisy():
    measure, calls = script(*[(i, "slow", 0.01) for i in range(3)])
    out = rounds.measure_round(measure, 2, settle=lambda limit: True, budget=rounds.NoiseBudget())
    assert out.kept.value == 2 and out.kept.noisy == "slow" and out.kept_because == rounds.RETRIES_SPENT
    assert len(out.rejected) == 2


def test_without_probes_the_pause_is_short():
    measure, _ = script(("a", "busy", 0.0), ("b", "", 0.0))
    started = time.monotonic()
    out = rounds.measure_round(measure, 3, budget=rounds.NoiseBudget())
    assert out.kept.value == "b" and time.monotonic() - started < 0.5


def test_the_budget_bounds_what_noise_may_cost():
    budget = rounds.NoiseBudget(share=0.0, allowance=0.3)
    measure, _ = script(*[(i, "slow", 0.2) for i in range(10)])
    out = rounds.measure_round(measure, 9, settle=lambda limit: True, budget=budget)
    assert out.kept_because == rounds.BUDGET_SPENT and out.kept.value == 2  # 0.2 + 0.2 > 0.3
    assert budget.left() < 0
    budget.reset()
    assert budget.left() == pytest.approx(0.3, abs=0.01)


def test_a_spell_that_outlasts_the_wait_keeps_the_try():
    measure, calls = script(("a", "slow", 0.1), ("b", "", 0.1))
    budget = rounds.NoiseBudget()
    out = rounds.measure_round(measure, 3, settle=lambda limit: False, budget=budget)
    assert (out.kept.value, out.kept_because, out.rejected, calls) == ("a", rounds.SPELL, [], [0])
    assert budget.spent < 0.05  # the wait only: the kept try is not noise spent


def test_the_wait_is_given_what_is_left_of_the_budget():
    waits = []
    budget = rounds.NoiseBudget(share=0.0, allowance=0.4)
    measure, _ = script(("a", "slow", 0.0), ("b", "", 0.0))
    rounds.measure_round(measure, 3, settle=lambda limit: waits.append(limit) or True, budget=budget)
    assert waits[0] == pytest.approx(0.4, abs=0.01)


# ---- rounds to pytest-benchmark -------------------------------------------------------------

def fake_pedantic(seen):
    """pytest-benchmark's pedantic loop as it is: the timer read before and after the target."""
    def pedantic(target, rounds=1, iterations=1, warmup_rounds=0):
        for _ in range(rounds):
            start = ROUND()
            target()
            seen.append(ROUND() - start)
    return pedantic


ROUND = rounds.ROUND_CLOCK


def test_run_rounds_hands_each_round_time_to_pytest_benchmark():
    seen = []
    times = iter([0.5, 0.25, 0.125, 1.0])
    figures = []

    def one_round():
        figures.append(100.0)
        return next(times)
    n = rounds.run_rounds(fake_pedantic(seen), one_round, Plan(3, 5, 0.03), lambda: figures)
    assert n == 3 and seen == [0.5, 0.25, 0.125]  # exact, and in order
    assert ROUND._script == [] and ROUND() > 0   # back to perf_counter


def test_a_pytest_benchmark_that_reads_the_clock_otherwise_is_refused():
    def pedantic(target, rounds=1, iterations=1, warmup_rounds=0):
        for _ in range(rounds):
            ROUND()
            target()
    with pytest.raises(RuntimeError, match="read the round clock 2 times for 2 rounds, not 4"):
        rounds.run_rounds(pedantic, lambda: 0.1, Plan.fixed(2), list)


class Fixture:
    """pytest-benchmark's fixture as far as replay reads it."""
    disabled = False
    has_error = False

    def __init__(self, reads_per_round=2):
        self.reads_per_round = reads_per_round

    def pedantic(self, target, rounds=1, iterations=1, warmup_rounds=0):
        for _ in range(rounds):
            for _ in range(self.reads_per_round // 2):
                ROUND()
            target()
            for _ in range(self.reads_per_round - self.reads_per_round // 2):
                ROUND()


def test_a_benchmark_not_timed_by_the_round_clock_is_refused_and_marked_failed():
    fixture = Fixture(reads_per_round=0)  # its timer is not ROUND_CLOCK: it would save ~0 s rounds
    with pytest.raises(RuntimeError, match=r"read the round clock 0 times for 2 rounds, not 4"):
        rounds.run_rounds(fixture.pedantic, lambda: 0.1, Plan.fixed(2), list)
    assert fixture.has_error and ROUND._script == []
    fixture = Fixture(reads_per_round=3)
    with pytest.raises(RuntimeError, match="read the round clock 6 times for 2 rounds, not 4"):
        rounds.run_rounds(fixture.pedantic, lambda: 0.1, Plan.fixed(2), list)


class DisabledFixture:
    disabled = True

    def __init__(self):
        self.calls = 0

    def pedantic(self, target, rounds=1, iterations=1, warmup_rounds=0):
        self.calls += 1  # pytest-benchmark disabled: the target once, untimed
        target()


def test_a_disabled_benchmark_measures_one_round():
    fixture = DisabledFixture()
    n = rounds.run_rounds(fixture.pedantic, lambda: 0.1, Plan(3, 5, 0.03), list)
    assert n == 1 and fixture.calls == 1 and ROUND._script == []


REPLAY_TEST = '''
import pytest
from pyconcbench import rounds

@pytest.mark.benchmark(timer=rounds.ROUND_CLOCK)
def test_replayed(benchmark):
    times = iter([0.5, 0.25, 0.75, 0.1])
    rounds.run_rounds(benchmark.pedantic, lambda: next(times), rounds.Plan.fixed(3), list)
'''


@pytest.mark.parametrize("extra", [[], ["--benchmark-cprofile=cumtime"]])
def test_pytest_benchmark_saves_the_measured_round_times(pytester, extra):
    pytester.makepyfile(test_replay=REPLAY_TEST)
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-json=out.json", *extra)
    out.assert_outcomes(passed=1)
    stats = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["stats"]
    assert stats["rounds"] == 3
    assert (stats["min"], stats["max"], stats["median"]) == (0.25, 0.75, 0.5)


def test_a_disabled_pytest_benchmark_runs_one_round(pytester):
    pytester.makepyfile(test_replay=REPLAY_TEST.replace("rounds.Plan.fixed(3)", "rounds.Plan(3, 5, 0.03)")
                        + "    assert len(list(times)) == 3  # one of the four measured\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable").assert_outcomes(passed=1)
