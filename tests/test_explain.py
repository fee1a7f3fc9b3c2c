"""Numbers that explain themselves (pyconcbench.explain): the rules from a traced round's counts
to findings, which case of each implementation is traced, the notes in the table and report, and
a real traced round against a real server."""
import json
import pathlib

import pytest

import runfactory
from pyconcbench import echo, explain, options, report, syscalls
from pyconcbench import suite as pcb_suite
from pyconcbench.report.echo_tables import comparison_notes, echo_table, explain_table
from pyconcbench.report.results import split


def keys(per, size=64):
    return [f["key"] for f in explain.findings(per, size)]


def test_an_event_loop_that_batches_gets_its_calls_and_no_note():
    per = {"total": 2.02, "recvfrom": 1.0, "sendto": 1.0, "epoll_wait": 0.02, "context_switches": 0.01}
    found = explain.findings(per, 64)
    assert [f["key"] for f in found] == ["syscalls", "wakeups"]
    assert found[0]["text"] == "2.0 syscalls per round trip (recvfrom 1.00, sendto 1.00, epoll_wait 0.02)"
    assert found[1]["text"].startswith("50.0 round trips per readiness wait")
    assert not any(f["note"] for f in found)  # nothing striking: the table stays quiet


def test_the_allocator_mapping_each_buffer_is_a_note_with_its_remedy():
    per = {"total": 5.0, "recvfrom": 1.0, "sendto": 1.0, "mmap": 1.0, "munmap": 1.0, "mremap": 1.0}
    (alloc,) = [f for f in explain.findings(per, 64) if f["key"] == "allocator"]
    assert alloc["note"] == ("allocator maps each receive buffer (mmap 1.00, munmap 1.00, mremap 1.00 per round "
                             "trip): try --pcb-malloc tuned")
    assert keys({"total": 2.0, "mmap": 0.4, "munmap": 0.4}) == ["syscalls", "allocator"]  # 0.8 maps, no pattern
    assert "allocator" not in keys({"total": 2.0, "mmap": 0.2, "munmap": 0.2})


@pytest.mark.parametrize("per, key, note", [
    ({"total": 2.0, "context_switches": 1.02}, "context_switches", "1.0 context switches per round trip"),
    ({"total": 3.0, "futex": 1.5}, "futex", "futex 1.5 per round trip"),
    ({"total": 3.0, "epoll_ctl": 2.0}, "epoll_ctl", "epoll_ctl 2.0 per round trip"),
    ({"total": 4.0, "recvfrom": 2.0, "sendto": 1.0}, "reads", "2.0 reads per round trip"),
])
def test_what_explains_a_rate_becomes_a_table_note(per, key, note):
    (found,) = [f for f in explain.findings(per, 64) if f["key"] == key]
    assert found["note"] == note


def test_thresholds_hold_below_them_and_big_messages_are_not_extra_reads():
    assert keys({"total": 2.0, "context_switches": 0.49, "futex": 0.49, "epoll_ctl": 0.49}) == ["syscalls"]
    assert "reads" not in keys({"total": 4.0, "recvfrom": 2.0}, size=100 * 1024)  # many reads per message
    assert "wakeups" not in keys({"total": 2.0, "epoll_wait": 0.5})  # neither every message nor batched
    assert explain.findings({}) == []


def test_record_keeps_the_counts_per_round_trip_and_unavailable_says_why():
    counts = {"total": 2000, "recvfrom": 1000, "sendto": 1000, "other": 0}
    rec = explain.record(syscalls.per_message(counts, 1000), 1000, "perf", "x-c100-64B")
    assert rec["per_msg"] == {"total": 2.0, "recvfrom": 1.0, "sendto": 1.0}
    assert rec["round_trips"] == 1000 and rec["tool"] == "perf" and rec["findings"][0]["key"] == "syscalls"
    gone = explain.unavailable("not counted: needs perf (linux-perf) or strace on PATH", "x")
    assert gone["findings"] == [] and gone["note"].startswith("not counted")


def _settings(**raw):
    return options.resolve(lambda name: (raw.get(name), "test") if name in raw else (None, "default"))


def test_one_case_per_implementation_is_traced_preferring_100_connections():
    cases = echo.echo_cases(_settings(impl="native_epoll,asyncio_protocol", conns="10,100,1k"))
    traced = [c.id for c in cases if c.explain]
    assert traced == ["native_epoll-c100-64B", "asyncio_protocol-c100-64B"]
    only = echo.echo_cases(_settings(impl="native_epoll", conns="10,1k"))
    assert [c.id for c in only if c.explain] == ["native_epoll-c10-64B"]  # no c100: the first case
    assert not any(c.explain for c in echo.echo_cases(_settings(impl="native_epoll", explain="no")))
    assert not any(c.explain and (c.plain or c.malloc != "representative")
                   for c in echo.echo_cases(_settings(impl="asyncio_protocol", conns="100")))


def test_the_representative_row_carries_what_a_fresh_process_does():
    rep = {"impl": "asyncio_protocol", "msgs_per_s": 100000.0, "malloc": "representative"}
    fresh = {"impl": "asyncio_protocol", "msgs_per_s": 27000.0, "malloc": "pristine",
             "alloc_syscalls_per_msg": {"mmap": 1.0, "munmap": 1.0, "mremap": 1.0}}
    assert comparison_notes(rep, [rep, fresh]) == [
        "a fresh process runs 0.27x this: its allocator maps each receive buffer (mmap 1.00, munmap 1.00, "
        "mremap 1.00 per round trip) until a client disconnects"]
    same = dict(fresh, msgs_per_s=97000.0)
    assert comparison_notes(rep, [rep, same]) == []  # no striking difference, no note


def _explained(impl, per, size=64):
    return explain.record(syscalls.per_message({k: int(v * 1000) for k, v in per.items()}, 1000), 1000, "perf",
                          f"{impl}-c100-64B", size)


def test_the_terminal_table_and_block_and_the_report_show_the_findings():
    row = runfactory.echo("threads", 100, [60000, 61000, 59000])["extra_info"]
    row["explain"] = _explained("threads", {"total": 2.0, "recvfrom": 1.0, "sendto": 1.0, "context_switches": 1.0})
    table = "\n".join(echo_table([row]))
    assert "1.0 context switches per round trip" in table
    block = explain_table([row])
    assert block[1].startswith("what each implementation does per round trip")
    assert block[2].startswith("threads") and "a thread is put to sleep and woken" in block[2]
    run = runfactory.run([{"group": "echo-c100-64B", "name": "test_echo[threads-c100-64B]",
                           "fullname": "test_echo.py::test_echo[threads-c100-64B]", "extra_info": row,
                           "stats": runfactory.echo("threads", 100, [60000])["stats"]}])
    secs = report.sections(split(run["benchmarks"]))
    (tab,) = [t for s in secs for t in s.tables if t.title == "What each implementation does per round trip"]
    assert tab.rows == [["threads", "100 conns × 64B TCP", "2.0", "recvfrom 1.00, sendto 1.00", "1.00",
                         tab.rows[0][5]]]
    assert tab.rows[0][5].startswith("1.0 context switches per round trip")


@pytest.fixture
def echo_suite(pytester):
    pytester.makepyfile(test_echo=(pathlib.Path(pcb_suite.SUITE_DIR) / "test_echo.py").read_text())
    return pytester


def test_a_real_run_traces_one_extra_round_and_saves_what_it_found(echo_suite):
    if echo.syscall_tool() is None:
        pytest.skip("needs perf or strace")
    result = echo_suite.runpytest_subprocess(
        "--pcb-impl", "native_epoll", "--pcb-conns", "100", "--pcb-rounds", "2", "--pcb-messages", "4000",
        "--pcb-reference", "none", "-p", "no:cacheprovider", "--benchmark-json", "out.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["what each implementation does per round trip*",
                                 "native_epoll * c100-64B * syscalls per round trip (*"])
    info = json.loads((echo_suite.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    ex = info["explain"]
    assert ex["tool"] == syscalls.available_tool() and ex["round_trips"] == 4000  # fewer than TRACED_MESSAGES
    # native_epoll: one read and one write per round trip, whatever the tool; its epoll_wait calls
    # per round trip depend on how fast it is against the load generator (0.01 .. 0.6 seen here)
    per = ex["per_msg"]
    assert per.get("recvfrom", 0) + per.get("read", 0) == pytest.approx(1.0, abs=0.05)
    assert per.get("sendto", 0) + per.get("write", 0) == pytest.approx(1.0, abs=0.05)
    assert 2.0 <= per["total"] <= 3.2
    assert len(info["rounds"]) == 2  # the traced round is not a measured one


def test_a_traced_round_that_fails_leaves_the_measured_rounds_standing(monkeypatch):
    from pyconcbench import loadgen

    class Counter:
        def __init__(self, pid, tool, names):
            pass

        def start(self):
            return self

        def stop(self):
            return {"total": 10}

    class Session:
        def round(self, messages=None, duration=None):
            raise loadgen.LoadError("stall", "no round trip completed for 10.0 s")

    runner = echo.EchoRunner.__new__(echo.EchoRunner)
    runner.spec = loadgen.LoadSpec(port=1, messages=20000)
    runner.server = type("S", (), {"measured_pid": 1})()
    monkeypatch.setattr(echo, "syscall_tool", lambda: "perf")
    monkeypatch.setattr(syscalls, "SyscallCounter", Counter)
    counts, done, why = runner.traced_round(Session(), syscalls.EXPLAIN)
    assert counts is None and done == 0
    assert why == "not counted: the traced round failed (load stall: no round trip completed for 10.0 s)"
    assert explain.unavailable(why, "x")["note"] == why
