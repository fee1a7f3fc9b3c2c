"""The plugin's pieces without pytester: option parsers, profiles, the noise judge and retry
loop with fake probes and a fake load, the summary figures, the printed table."""
import dataclasses
import os
import time

import pytest

from pyconcbench import echo, harness, instruments, loadgen, options, rounds
from pyconcbench.report import echo_tables as summary
from pyconcbench.echo import EchoCase, EchoOutcome, EchoRunner, RoundRecord
from pyconcbench.options import Settings


@pytest.mark.parametrize("text, sizes", [
    ("64", (64,)), ("64B,1KiB", (64, 1024)), ("100k, 1MiB", (102400, 1 << 20)), ("1m", (1 << 20,)),
])
def test_parse_sizes(text, sizes):
    assert options.parse_sizes(text) == sizes


@pytest.mark.parametrize("text", ["0", "2MiB", "64X", "", ",", "-1"])
def test_parse_sizes_rejects(text):
    with pytest.raises(ValueError):
        options.parse_sizes(text)


def test_parse_counts_and_max():
    assert options.parse_counts("10,1k,3K") == (10, 1000, 3000)
    assert options.parse_counts("max") == (loadgen.max_connections(),)
    for bad in ("0", "x", "1.5k", ""):
        with pytest.raises(ValueError):
            options.parse_counts(bad)


def test_parse_impls_keeps_order_and_expands_all():
    assert options.parse_impls("selectors,native_epoll,selectors") == ("selectors", "native_epoll")
    assert options.parse_impls("all")[0] == "native_epoll"


def test_parse_cpus():
    assert options.parse_cpus("none") is None
    assert options.parse_cpus("0,1") == ((0,), (1,))  # (the server's CPUs, the load generator's)
    for bad in ("0", "0,0", "a,b", "0,1,2", "0-1,1", "1-0,1", "0-,1"):
        with pytest.raises(ValueError):
            options.parse_cpus(bad)


def test_parse_seconds_and_ints():
    assert options.parse_seconds("2.5") == 2.5 and options.parse_seconds("3s") == 3.0
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(ValueError):
            options.parse_seconds(bad)
    assert options.parse_positive_int("7") == 7
    for bad in ("0", "-3", "2.0", "x"):
        with pytest.raises(ValueError):
            options.parse_positive_int(bad)


def test_profile_round_sizes():
    quick = options.PROFILES["quick"]()
    assert quick.cases == ((10, 64, "tcp"), (100, 64, "tcp"), (1000, 64, "tcp"), (100, 64, "unix"))
    assert quick.messages_for(10, 64) == 20_000
    assert quick.messages_for(2000, 64) == 40_000           # 20 per connection
    assert quick.messages_for(5000, 64) == 25_000           # 5 per connection from 3,000 on
    assert quick.messages_for(19_936, 64) == 39_872         # 2 per connection from 10,000 on
    full = options.PROFILES["full"]()
    assert (full.rounds_for(1000), full.rounds_for(3000), quick.rounds_for(10)) == (7, 3, 5)
    assert quick.messages_for(10, 100 * 1024) == 2621        # ~256 MiB of payload
    assert quick.messages_for(10, 1 << 20) == 256


def test_size_label():
    assert [summary.size_label(s) for s in (1, 64, 1024, 1536, 100 * 1024, 1 << 20)] == \
        ["1B", "64B", "1KiB", "1536B", "100KiB", "1MiB"]


def test_case_ids_and_groups():
    case = EchoCase("asyncio_protocol", 100, 64, "tcp")
    assert case.id == "asyncio_protocol-c100-64B" and case.group == "echo-c100-64B"
    assert EchoCase("selectors", 10, 1024, "unix").id == "selectors-c10-1KiB-unix"
    assert case.malloc == "representative" and case.counterpart is None
    tuned = EchoCase("asyncio_protocol", 100, 64, "tcp", "tuned")
    assert tuned.id == "asyncio_protocol-c100-64B-malloc_tuned"
    assert tuned.group == case.group  # compared side by side with the representative state
    assert tuned.label == "asyncio_protocol+tuned_malloc"
    assert tuned.counterpart == case
    ref = EchoCase("asyncio_protocol", 100, 64, "tcp", plain=True)
    assert ref.id == "plain_asyncio_protocol-c100-64B" and ref.group == case.group
    assert ref.label == "asyncio_protocol+plain" and ref.counterpart == case
    pristine_ref = EchoCase("asyncio_protocol", 100, 64, "tcp", "pristine", plain=True)
    assert pristine_ref.id == "plain_asyncio_protocol-c100-64B-malloc_pristine"
    assert pristine_ref.label == "asyncio_protocol+plain+pristine_malloc"


def test_parse_mallocs_and_bool():
    assert options.parse_mallocs("representative,tuned") == ("representative", "tuned")
    with pytest.raises(ValueError, match="not an allocator state"):
        options.parse_mallocs("jemalloc")
    with pytest.raises(ValueError, match="'default' is gone: .* the old default is 'pristine'"):
        options.parse_mallocs("default")
    assert options.parse_bool("yes") and options.parse_bool("1") and not options.parse_bool("no")
    with pytest.raises(ValueError):
        options.parse_bool("maybe")
    assert harness.MALLOC_TUNED_ENV["MALLOC_MMAP_THRESHOLD_"] == "1048576"


# ---- the measured round, with fakes ------------------------------------------------------

def result(completed=1000, elapsed=0.1, lg_cpu=0.05, p50=50_000, counts=(500, 500)):
    hist = loadgen.Histogram()
    hist.record(p50, completed // 2)
    hist.record(2 * p50, completed - completed // 2)
    return loadgen.LoadResult(
        connections=len(counts), size=64, transport="tcp", completed=completed, elapsed=elapsed,
        connect_seconds=0.002, latency={"p50": p50, "p90": 1.5 * p50, "p95": 1.8 * p50, "p99": 2 * p50, "max": 3 * p50},
        fairness=loadgen.fairness(list(counts)), errors={k: 0 for k in loadgen.ERROR_KINDS},
        loadgen_cpu_user=lg_cpu / 2, loadgen_cpu_sys=lg_cpu / 2, bytes=completed * 64,
        histogram=hist,
    )


class FakeServer:
    pid = measured_pid = 4242
    measured_pids = (4242,)
    address = ("127.0.0.1", 9)
    ready = {"malloc_probe": "mmap"}

    def check_alive(self):
        pass

    def rss_kib(self):
        return 20480


class FakeSession:
    def __init__(self, results):
        self.results = list(results)

    def round(self):
        return self.results.pop(0)


def settings(**kw):
    base = dict(profile="quick", impls=("native_epoll",), cases=((2, 64, "tcp"),), messages=1000,
                duration=None, rounds=3, cpus=(0, 1), noise_retries=2, stall_timeout=10.0)
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def fakes(monkeypatch):
    """Scripted probes and CPU snapshots: each round reads two of each."""
    state = {"probes": [], "snaps": []}

    def probe(a, b, iterations=20000):
        return state["probes"].pop(0)

    def snap(pid, load_pids=()):
        return state["snaps"].pop(0)

    monkeypatch.setattr(instruments, "cacheline_rtt", probe)
    monkeypatch.setattr(instruments, "snapshot", snap)
    return state


def snaps(machine_busy, server_runtime, other=0.0):
    """A before/after pair: the machine busy `machine_busy` s of which `other` s by others."""
    before = instruments.CpuSnapshot(machine=100.0, own=10.0, server_user=1.0, server_sys=1.0, server_runtime=5.0)
    after = instruments.CpuSnapshot(machine=100.0 + machine_busy, own=10.0 + (machine_busy - server_runtime - other),
                                server_user=1.0 + server_runtime * 0.75, server_sys=1.0 + server_runtime * 0.25,
                                server_runtime=5.0 + server_runtime)
    return [before, after]


class SlowSession(FakeSession):
    def round(self):
        time.sleep(0.05)
        return super().round()


def test_clean_round_is_kept_and_only_its_phase_is_timed(fakes, monkeypatch):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    fakes["probes"] += [150.0, 160.0]
    fakes["snaps"] += snaps(0.2, 0.09)
    slow_probe = instruments.cacheline_rtt

    def probe(a, b, iterations=20000):
        time.sleep(0.5)  # a probe far slower than the round: it must not be in the round's time
        return slow_probe(a, b, iterations)

    monkeypatch.setattr(instruments, "cacheline_rtt", probe)
    timed = runner.one_round(SlowSession([result()]))
    assert len(runner.records) == 1 and runner.rejected == []
    rec = runner.records[0]
    assert rec.noisy == "" and rec.server_cpu == pytest.approx(0.09) and rec.kept == rounds.CLEAN
    assert rec.other_cpu == pytest.approx(0.0)
    assert 0.05 <= timed < 0.5  # the load phase alone: the probes and snapshots are not timed


def test_noisy_probe_round_is_measured_again(fakes):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    # round, noisy after; the wait for quiet: 700 (still noisy), 160 (quiet); the try again
    fakes["probes"] += [150.0, 650.0, 700.0, 160.0, 150.0, 155.0]
    fakes["snaps"] += snaps(0.2, 0.09) + snaps(0.2, 0.09)
    runner.one_round(FakeSession([result(completed=1000), result(completed=1000, elapsed=0.09)]))
    assert len(runner.rejected) == 1 and "cache-line probe 650 ns > 300 ns" in runner.rejected[0].noisy
    assert len(runner.records) == 1 and runner.records[0].attempt == 1
    assert fakes["probes"] == []  # the wait polled the probe until it was quiet


def test_a_spell_longer_than_the_wait_keeps_the_try(fakes, monkeypatch):
    monkeypatch.setattr(rounds, "SETTLE_SECONDS", 0.12)
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    # the round noisy; the wait polls about 3 times (0, 0.05, 0.1 s: fewer if a sleep overshoots
    # on a busy machine), all noisy: the try is kept
    fakes["probes"] += [150.0, 650.0] + [700.0] * 10
    fakes["snaps"] += snaps(0.2, 0.09)
    started = time.monotonic()
    runner.one_round(FakeSession([result()]))
    assert time.monotonic() - started < 0.5
    assert runner.rejected == [] and 7 <= len(fakes["probes"]) <= 9  # 1 to 3 polls, then gave up
    kept = runner.records[0]
    assert kept.attempt == 0 and kept.noisy.startswith("cache-line probe") and kept.kept == rounds.SPELL
    assert echo._round_dict(kept)["kept"] == "still noisy after the wait"


def test_a_spent_noise_budget_keeps_the_first_try(fakes, monkeypatch):
    monkeypatch.setattr(rounds, "BUDGET", rounds.NoiseBudget(share=0.0, allowance=0.0))
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    fakes["probes"] += [150.0, 650.0]
    fakes["snaps"] += snaps(0.2, 0.09)
    runner.one_round(FakeSession([result()]))
    assert runner.rejected == [] and runner.records[0].kept == rounds.BUDGET_SPENT
    assert runner.records[0].noisy.startswith("cache-line probe")


def test_busy_machine_round_is_noisy_and_kept_after_the_retries(fakes):
    runner = EchoRunner(settings(noise_retries=1), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(),
                        probe_baseline=150.0)
    fakes["probes"] += [150.0] * 5  # two per try, one for the wait (quiet)
    fakes["snaps"] += snaps(0.3, 0.09, other=0.08) * 2  # others: 80 % of a CPU over 0.1 s
    runner.one_round(FakeSession([result(), result()]))
    assert len(runner.rejected) == 1
    kept = runner.records[0]
    assert kept.noisy.startswith("other processes used 80% of a CPU") and kept.attempt == 1
    assert kept.kept == rounds.RETRIES_SPENT


def test_outcome_figures(fakes):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    runner.records = [
        RoundRecord(result(completed=1000, elapsed=0.1, lg_cpu=0.095), server_cpu=0.05, server_user=0.3,
                    server_sys=0.1, other_cpu=0.0, probe_before=150.0, probe_after=151.0, noisy="", attempt=0),
        RoundRecord(result(completed=1000, elapsed=0.4, lg_cpu=0.1), server_cpu=0.15, server_user=0.3,
                    server_sys=0.1, other_cpu=0.0, probe_before=150.0, probe_after=151.0, noisy="", attempt=0),
    ]
    out = EchoOutcome.from_records(runner, connect_seconds=0.004)
    e = out.extra
    assert out.completed == 2000 and out.rounds == 2 and out.errors == {}
    assert e["msgs_per_s"] == 4000.0                       # 2000 round trips in 0.5 s
    assert e["msgs_per_s_median"] == pytest.approx(6250.0)  # median of 10000 and 2500
    assert e["server_cpu_us_per_msg"] == pytest.approx(100.0)
    assert e["server_cpu_share"] == pytest.approx(0.4)
    assert e["server_user_share"] == pytest.approx(0.75)   # 60 of 80 ticks
    assert e["server_cpu_user"] == pytest.approx(0.15)
    assert e["loadgen_bound"] is True                      # round 1: 95 % of a core
    assert e["loadgen_cpu_share"] == pytest.approx(0.39)
    assert e["connect_rate"] == 500.0
    # p50 is the high of 50 us's bucket (within 1/128), p99 the exact max
    assert 50.0 <= e["latency_p50_us"] <= 50.0 * (1 + 1 / 128) and e["latency_p99_us"] == 100.0
    assert [r["completed"] for r in e["rounds"]] == [1000, 1000]
    info = {"kept": 1}
    out.fill(info)
    assert info["kept"] == 1 and info["msgs_per_s"] == 4000.0  # filled in place


def test_outcome_figures_come_from_the_clean_rounds(fakes):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    noisy = result(completed=1000, elapsed=1.0)
    noisy.errors["reset"] = 2  # an error in a noisy round still counts
    runner.records = [
        RoundRecord(result(completed=1000, elapsed=0.1), server_cpu=0.05, server_user=0.3, server_sys=0.1,
                    other_cpu=0.0, probe_before=150.0, probe_after=151.0, noisy="", attempt=0),
        RoundRecord(noisy, server_cpu=0.5, server_user=0.3, server_sys=0.1, other_cpu=0.0, probe_before=150.0,
                    probe_after=151.0, noisy="CPU 1 ran a fixed loop 1.80x slower than its best", attempt=1,
                    kept=rounds.SPELL),
    ]
    e = EchoOutcome.from_records(runner, connect_seconds=0.004).extra
    assert e["msgs_per_s"] == 10000.0 and e["server_cpu_us_per_msg"] == pytest.approx(50.0)  # the clean round's
    assert e["errors"] == {"reset": 2} and len(e["rounds"]) == 2 and e["noisy_rounds_kept"] == 1
    assert e["figures_from"] == "the 1 clean of 2 rounds"
    line = next(x for x in summary.echo_table([row("native_epoll", 1000, 5.0, noisy_rounds_kept=1,
                                                   figures_from=e["figures_from"])])
                if x.startswith("native_epoll"))
    assert "figures from the 1 clean of 2 rounds" in line
    runner.records = runner.records[1:]  # none clean: every round's figures, and said so
    e = EchoOutcome.from_records(runner, connect_seconds=0.004).extra
    assert e["msgs_per_s"] == 1000.0 and e["figures_from"] == "all 1 rounds (none was clean)"


def row(impl, rate, cpu_us, bound=False, **kw):
    r = dict(impl=impl, transport="tcp", size=64, connections=10, msgs_per_s=rate, latency_p50_us=50.0,
             latency_p99_us=100.0, server_cpu_us_per_msg=cpu_us, server_user_share=0.5,
             server_cpu_share=0.9, loadgen_cpu_share=0.95 if bound else 0.3, loadgen_bound=bound,
             starving_connections=0, noisy_rounds_kept=0)
    r.update(kw)
    return r


def test_echo_table():
    lines = summary.echo_table([row("asyncio_protocol", 40_000, 25.0, starving_connections=3),
                                row("native_epoll", 200_000, 5.0, bound=True)])
    assert lines[1] == "echo 10 connections x 64B over tcp"
    native = next(line for line in lines if line.startswith("native_epoll"))
    aio = next(line for line in lines if line.startswith("asyncio_protocol"))
    assert lines.index(native) < lines.index(aio)  # fastest first
    assert "≥200,000" in native and "load-generator-bound: rate is a lower bound" in native
    assert " 0.20 " in aio and "+20.00" in aio and "3 starving connections" in aio


def test_a_slow_spell_of_the_host_makes_a_round_noisy(fakes, monkeypatch):
    loops = iter([100.0, 100.0,            # warm-up: the best on CPUs 0 and 1
                  100.0, 160.0, 100.0, 158.0,  # round 1: CPU 1 runs 1.6x slower
                  100.0, 101.0,                # the wait for quiet: back to speed
                  101.0, 100.0, 100.0, 102.0])  # round 2
    monkeypatch.setattr(instruments, "cpu_loop_ns", lambda cpu: next(loops))
    gauge = instruments.SpeedGauge((0, 1)).warm(1)
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0,
                        speed=gauge)
    fakes["probes"] += [150.0] * 5
    fakes["snaps"] += snaps(0.2, 0.09) * 2
    runner.one_round(FakeSession([result(), result()]))
    assert [r.noisy for r in runner.rejected] == ["CPU 1 ran a fixed loop 1.60x slower than its best"]
    kept = runner.records[0]
    assert kept.noisy == "" and kept.attempt == 1
    assert echo._round_dict(kept)["cpu_speed_before"] == {"0": 1.01, "1": 1.0}


def test_speed_gauge_keeps_the_best_and_judges_against_it(monkeypatch):
    loops = iter([200.0, 100.0, 134.0, 136.0])
    monkeypatch.setattr(instruments, "cpu_loop_ns", lambda cpu: next(loops))
    gauge = instruments.SpeedGauge((0,))
    assert gauge.judge(gauge.probe()) == ""          # the first probe is its own best
    assert gauge.best[0] == 200.0 and gauge.probe() == {0: 100.0} and gauge.best[0] == 100.0
    assert gauge.judge(gauge.probe()) == ""          # 1.34x: within the factor
    assert gauge.judge(gauge.probe()) == "CPU 0 ran a fixed loop 1.36x slower than its best"


# ---- /proc unreadable: an error or a visible "unknown", never 0.0 -------------------------

def test_proc_readers_say_unknown_instead_of_zero(monkeypatch):
    monkeypatch.setattr(instruments, "_read", lambda path: None)
    assert instruments.machine_busy_seconds() is None
    assert instruments.process_runtime(os.getpid()) is None  # the task list reads, no schedstat does
    assert instruments.process_runtime(2 ** 22 + 12345) is None  # no such process
    a = instruments.snapshot(os.getpid())
    assert a.machine is None and a.server_runtime is None
    assert a.other_since(a) is None


def test_proc_readers_read_this_process():
    assert instruments.machine_busy_seconds() > 0
    assert instruments.process_runtime(os.getpid()) > 0


def test_unreadable_server_cpu_fails_the_round_in_one_line(fakes):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    fakes["probes"] += [150.0, 150.0]
    before, after = snaps(0.2, 0.09)
    fakes["snaps"] += [before, dataclasses.replace(after, server_runtime=None)]
    with pytest.raises(harness.ServerError, match=r"^cannot read server 'native_epoll'\'s CPU time from /proc/4242/task"):
        runner.one_round(FakeSession([result()]))
    assert runner.records == []


def test_unreadable_machine_cpu_is_an_unknown_other_cpu_check(fakes):
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), FakeServer(), probe_baseline=150.0)
    fakes["probes"] += [150.0, 150.0]
    before, after = snaps(0.2, 0.09)
    fakes["snaps"] += [dataclasses.replace(before, machine=None), dataclasses.replace(after, machine=None)]
    runner.one_round(FakeSession([result()]))
    rec = runner.records[0]
    assert rec.other_cpu is None and rec.server_cpu == pytest.approx(0.09)
    extra = EchoOutcome.from_records(runner, connect_seconds=0.004).extra
    assert extra["other_cpu_check"] == "unknown: /proc/stat was unreadable"
    assert extra["rounds"][0]["other_cpu_share"] is None
    line = next(x for x in summary.echo_table([row("native_epoll", 1000, 5.0, other_cpu_check=extra["other_cpu_check"])])
                if x.startswith("native_epoll"))
    assert "other processes' CPU unknown" in line


def test_ceiling_table_flags_an_engine_below_the_floor():
    lines = summary.ceiling_table([
        {"connections": 100, "msgs_per_s": 200000.0, "engine_msgs_per_s": 180000.0, "engine_to_ceiling": 0.9,
         "engine_to_ceiling_paired_median": 0.91},
        {"connections": 10, "msgs_per_s": 200000.0, "engine_msgs_per_s": 198000.0, "engine_to_ceiling": 0.99,
         "engine_to_ceiling_paired_median": 0.99}])
    c10, c100 = (next(x for x in lines if x.split()[:1] == [str(n)]) for n in (10, 100))
    assert "⚠ engine below 95% of the ceiling" in c100 and "0.910" in c100
    assert "⚠" not in c10 and "0.990" in c10
    assert summary.ceiling_table([]) == []


def test_jain_is_saved_with_significant_digits_not_decimals():
    assert echo._sig(1 / 20000) == 5e-05
    assert echo._sig(0.987654) == 0.9877


# ---- the server's memory (issue 14) -------------------------------------------------------------

class MemoryServer(FakeServer):
    """A server whose resident memory is scripted, each reading logged in ``events``."""

    def __init__(self, readings, events):
        self.readings, self.events = list(readings), events

    def rss_kib(self):
        if not self.readings:
            raise harness.ServerError("server 'native_epoll' (pid 4242) exited with code -9")
        self.events.append("rss")
        return self.readings.pop(0)


class LoggedSession(FakeSession):
    """loadgen.LoadSession's stand-in: logs when it connects (and warms up) and each round."""

    def __init__(self, spec, events, results):
        super().__init__(results)
        self.events, self.connect_seconds = events, 0.004

    def __enter__(self):
        self.events.append("connect+warm-up")
        return self

    def __exit__(self, *exc):
        self.events.append("close")

    def round(self):
        self.events.append("round")
        return super().round()


def test_memory_is_read_idle_before_connecting_open_after_warm_up_and_after_each_round(fakes, monkeypatch):
    events = []
    # idle 10,000 KiB; 10,100 with 4 connections open; then 10,160, 10,200, 10,180 after the rounds
    server = MemoryServer([10_000, 10_100, 10_160, 10_200, 10_180], events)
    monkeypatch.setattr(loadgen, "LoadSession", lambda spec: LoggedSession(spec, events, [result()] * 3))
    runner = EchoRunner(settings(rounds=3), EchoCase("native_epoll", 4, 64, "tcp"), server, probe_baseline=150.0)
    fakes["probes"] += [150.0] * 6
    fakes["snaps"] += snaps(0.2, 0.09) * 3
    bench = type("Bench", (), {"pedantic": None, "extra_info": {}})()
    runner.run(bench)
    assert events == ["rss", "connect+warm-up", "rss"] + ["round", "rss"] * 3 + ["close"]
    e = bench.extra_info
    assert e["server_rss_idle_kib"] == 10_000 and e["server_rss_connected_kib"] == 10_100
    assert [r["rss_kib"] for r in e["rounds"]] == [10_160, 10_200, 10_180]
    assert [r["rss_per_conn_kib"] for r in e["rounds"]] == [40.0, 50.0, 45.0]  # (rss - idle) / 4
    assert e["server_rss_loaded_kib"] == 10_180 and e["rss_per_conn_kib"] == 45.0  # the rounds' medians


def test_a_server_whose_memory_cannot_be_read_fails_the_round(fakes):
    # the server died after its round: its memory per connection would be unknown, never 0
    runner = EchoRunner(settings(), EchoCase("native_epoll", 2, 64, "tcp"), MemoryServer([], []), probe_baseline=150.0)
    fakes["probes"] += [150.0, 150.0]
    fakes["snaps"] += snaps(0.2, 0.09)
    with pytest.raises(harness.ServerError, match=r"^server 'native_epoll' \(pid 4242\) exited with code -9$"):
        runner.one_round(FakeSession([result()]))
    assert runner.records == []
    with pytest.raises(harness.ServerError, match="exited with code -9"):
        runner.read_idle_rss()


def test_echo_table_shows_kib_per_connection():
    lines = summary.echo_table([row("threads", 20_000, 30.0, rss_per_conn_kib=66.4567),
                                row("native_epoll", 200_000, 5.0, rss_per_conn_kib=-0.25),
                                row("selectors", 50_000, 9.0)])  # a run saved before memory was measured
    head = next(line for line in lines if line.startswith("implementation"))
    assert " KiB/conn  notes" in head
    at = head.index("KiB/conn") + len("KiB/conn")  # right-aligned under its head
    cells = {line.split()[0]: line[at - 8:at] for line in lines if line.split() and line.split()[0] in
             ("threads", "native_epoll", "selectors")}
    assert cells == {"threads": "    66.5", "native_epoll": "    -0.2", "selectors": "       -"}
