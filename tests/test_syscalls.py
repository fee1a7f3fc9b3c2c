"""Counting a server's syscalls: the output parsers, and real counts against a real server."""
import shutil

import pytest

from pyconcbench import harness, loadgen, syscalls

PERF_OUTPUT = """# started on Sun Nov 22 18:05:59 2026

2000,,syscalls:sys_enter_recvfrom,35276302,100.00,,
2000,,syscalls:sys_enter_sendto,35276302,100.00,,
<not counted>,,syscalls:sys_enter_mremap,0,100.00,,
40,,syscalls:sys_enter_epoll_wait,35276302,100.00,,
4050,,raw_syscalls:sys_enter,35276302,100.00,,
12,,context-switches,35276302,100.00,,
1,,cpu-migrations,35276302,100.00,,
"""

STRACE_OUTPUT = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 52.10    0.010000           5      2000           sendto
 47.00    0.009000           4      2000           recvfrom
  0.90    0.000100           2        40         3 epoll_wait
------ ----------- ----------- --------- --------- ----------------
100.00    0.019100           4      4040         3 total
"""


def test_parse_perf():
    counts = syscalls.parse_perf(PERF_OUTPUT)
    assert counts == {"recvfrom": 2000, "sendto": 2000, "epoll_wait": 40, "total": 4050,
                      "context_switches": 12, "cpu_migrations": 1, "other": 10}


def test_parse_strace():
    assert syscalls.parse_strace(STRACE_OUTPUT) == {"sendto": 2000, "recvfrom": 2000, "epoll_wait": 40,
                                                     "total": 4040, "other": 0}


@pytest.mark.parametrize("parse, text", [(syscalls.parse_perf, "# nothing\n"),
                                         (syscalls.parse_strace, "garbage\n")])
def test_unusable_output_is_an_error(parse, text):
    with pytest.raises(syscalls.SyscallCountError):
        parse(text)


def test_per_message():
    per = syscalls.per_message({"recvfrom": 2000, "sendto": 1000, "mmap": 0, "total": 3000}, 1000)
    assert per == {"total": 3.0, "recvfrom": 2.0, "sendto": 1.0}
    assert list(per) == ["total", "recvfrom", "sendto"]  # largest first
    assert syscalls.per_message({"total": 5}, 0) == {}


def working_tools():
    tools = ["perf"] if syscalls.available_tool() == "perf" else []
    return tools + (["strace"] if shutil.which("strace") else [])


TOOLS = working_tools()


@pytest.mark.skipif(not TOOLS, reason="neither perf nor strace works here")
@pytest.mark.parametrize("tool", TOOLS)
def test_counts_a_real_servers_round_trips(tool):
    with harness.ServerProcess("native_epoll", cpu=None) as server:
        host, port = server.address
        spec = loadgen.LoadSpec(host=host, port=port, connections=4, messages=2000, warmup_messages=100)
        with loadgen.LoadSession(spec) as session:
            counter = syscalls.SyscallCounter(server.measured_pid, tool).start()
            try:
                result = session.round()
            finally:
                counts = counter.stop()
    # the C server makes one recv and one send per 64-byte round trip
    assert counts["recvfrom"] == pytest.approx(2000, abs=8)
    assert counts["sendto"] == pytest.approx(2000, abs=8)
    assert counts["total"] >= counts["recvfrom"] + counts["sendto"]
    assert result.completed == 2000


def test_missing_tools_are_one_clear_error(monkeypatch):
    monkeypatch.setattr(syscalls.shutil, "which", lambda name: None)
    assert syscalls.available_tool() is None
    with pytest.raises(syscalls.SyscallCountError, match="needs perf .* or strace"):
        syscalls.SyscallCounter(1)
