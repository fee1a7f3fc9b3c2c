"""--pcb-network: the simulated remote server (pyconcbench.netsim) -- its parser, the namespace
made and removed (after an exception and at interpreter exit too), a thread entering it and
always coming back, the server and the load generator meeting there, the skip (a failure in a
strict run) when root, iproute2 or netem is missing, and a delay of 1 ms showing as about 2 ms
more per round trip (where the kernel has netem)."""
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from pyconcbench import echo, harness, loadgen, netsim, options
from pyconcbench import suite as pcb_suite

BENCH_DIR = pathlib.Path(pcb_suite.SUITE_DIR)


def _needs_namespaces():
    why = netsim.unavailable(netsim.parse_network("netns"))
    if why:
        pytest.skip(why)


def _netem_namespace(spec):
    """A created namespace with netem, or a skip naming what is missing here."""
    try:
        return netsim.Namespace(netsim.parse_network(spec)).create()
    except netsim.NetworkUnavailable as exc:
        pytest.skip(str(exc))


def _our_namespaces():
    try:
        return sorted(n for n in os.listdir(netsim.NETNS_DIR) if n.startswith(f"pcb-{os.getpid()}-"))
    except FileNotFoundError:
        return []


def _here():
    return os.readlink("/proc/thread-self/ns/net")


# ---- the option ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, specs, ids, labels", [
    ("local", ["local"], [""], [""]),
    ("netns", ["netns"], ["-netns"], ["+netns"]),
    ("netns:delay=200us", ["netns:delay=200us"], ["-netns_d200us"], ["+netns(200us)"]),
    ("netns:delay=1ms,rate=1gbit", ["netns:delay=1ms,rate=1gbit"], ["-netns_d1ms_r1gbit"], ["+netns(1ms,1gbit)"]),
    ("netns:delay=0.5ms", ["netns:delay=500us"], ["-netns_d500us"], ["+netns(500us)"]),
    ("local, netns:delay=200us,rate=100mbit, netns:delay=1ms,local",
     ["local", "netns:delay=200us,rate=100mbit", "netns:delay=1ms"], ["", "-netns_d200us_r100mbit", "-netns_d1ms"],
     ["", "+netns(200us,100mbit)", "+netns(1ms)"]),
])
def test_networks_parse(text, specs, ids, labels):
    nets = netsim.parse_networks(text)
    assert [n.spec for n in nets] == specs
    assert [n.id_suffix for n in nets] == ids
    assert [n.label for n in nets] == labels
    assert [netsim.parse_network(s) for s in specs] == list(nets)  # the canonical text parses back


def test_netem_arguments():
    net = netsim.parse_network("netns:delay=200us,rate=1gbit")
    assert net.netem_args() == ["delay", "200us", "rate", "1gbit"]
    assert net.as_dict() == {"network": "netns:delay=200us,rate=1gbit", "network_delay_us": 200,
                             "network_rate_bit": 10 ** 9}
    assert "about +400us per round trip" in net.describe()


@pytest.mark.parametrize("text, message", [
    ("remote", "'remote' is not a network: local, netns or netns:delay=200us[,rate=1gbit]"),
    ("netns:delay=2s", "delay '2s' is not a delay (e.g. 200us, 1ms, 1.5ms)"),
    ("netns:delay=200", "delay '200' is not a delay"),
    ("netns:delay=0us", "delay '0us' is outside 1us .. 100ms"),
    ("netns:delay=101ms", "delay '101ms' is outside 1us .. 100ms"),
    ("netns:delay=0.5us", "delay '0.5us' is not a whole number of microseconds"),
    ("netns:rate=1gb", "rate '1gb' is not a rate (e.g. 100mbit, 1gbit, 500kbit)"),
    ("netns:rate=200gbit", "rate '200gbit' is outside 1kbit .. 100gbit"),
    ("netns:delay=1ms,delay=2ms", "'netns:delay=1ms,delay=2ms': delay is given twice"),
    ("netns:jitter=1ms", "'netns:jitter=1ms': 'jitter=1ms' is not delay=D or rate=R"),
    ("netns:", "'netns:': nothing after 'netns:'"),
    ("delay=1ms", "'delay=1ms': 'delay=1ms' does not follow a netns:... network"),
    (" , ", "' , ' is empty"),
])
def test_bad_networks_are_one_line_quoting_the_value(text, message):
    with pytest.raises(ValueError) as info:
        netsim.parse_networks(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def _settings(**given):
    given = {k.replace("_", "-"): v for k, v in given.items()}
    return options.resolve(lambda name: (given[name], f"--pcb-{name}") if name in given else (None, "default"))


def test_the_option_names_its_source():
    with pytest.raises(options.OptionError, match=r"^--pcb-network: 'lan' is not a network"):
        _settings(network="lan")
    with pytest.raises(options.OptionError, match=r"^--pcb-network: netns:delay=1ms needs a TCP case .*"
                                                  r"add --pcb-transport tcp$"):
        _settings(network="netns:delay=1ms", transport="unix")
    assert _settings().networks == (netsim.LOCAL,)


def test_echo_cases_side_by_side_and_local_ids_unchanged():
    plain_run = [c.id for c in echo.echo_cases(_settings(impl="native_epoll,asyncio_protocol", conns="10,100"))]
    both = echo.echo_cases(_settings(impl="native_epoll,asyncio_protocol", conns="10,100",
                                     network="local,netns:delay=200us"))
    assert [c.id for c in both if c.network.local] == plain_run
    ids = [c.id for c in both]
    # each remote case right after its local one, the plain references and variants local only
    at = ids.index("asyncio_protocol-c100-64B")
    assert ids[at + 1] == "asyncio_protocol-c100-64B-netns_d200us"
    assert "plain_asyncio_protocol-c100-64B-netns_d200us" not in ids
    assert "asyncio_protocol-c100-64B-malloc_pristine-netns_d200us" not in ids
    remote = both[at + 1]
    assert remote.label == "asyncio_protocol+netns(200us)"
    assert remote.counterpart == both[at]
    assert not remote.explain and both[at].explain  # traced where it is local
    only = echo.echo_cases(_settings(impl="native_epoll", conns="10", network="netns:delay=1ms"))
    assert [c.id for c in only] == ["native_epoll-c10-64B-netns_d1ms"]


# ---- what it needs ---------------------------------------------------------------------------

def test_unavailable_without_root(monkeypatch):
    monkeypatch.setattr(netsim, "_capabilities", lambda: 0)
    why = netsim.unavailable(netsim.parse_network("netns:delay=200us"))
    assert why.startswith("--pcb-network netns:delay=200us needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN")
    with pytest.raises(netsim.NetworkUnavailable, match="needs root"):
        netsim.Namespace(netsim.parse_network("netns")).create()
    assert netsim.unavailable(netsim.LOCAL) == ""


def test_unavailable_without_tc(monkeypatch):
    monkeypatch.setattr(netsim, "_capabilities", lambda: 1 << netsim.CAP_SYS_ADMIN | 1 << netsim.CAP_NET_ADMIN)
    monkeypatch.setattr(netsim, "_tool", lambda name: None if name == "tc" else "/usr/sbin/ip")
    assert netsim.unavailable(netsim.parse_network("netns:delay=1ms")) == (
        "--pcb-network netns:delay=1ms needs tc (iproute2) on PATH: apt-get install iproute2")


def test_netem_missing_is_remembered(monkeypatch):
    monkeypatch.setattr(netsim, "_capabilities", lambda: 1 << netsim.CAP_SYS_ADMIN | 1 << netsim.CAP_NET_ADMIN)
    monkeypatch.setattr(netsim, "_tool", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(netsim, "_NO_NETEM", ["tc ...: Error: Specified qdisc kind is unknown."])
    assert "the kernel has no netem qdisc" in netsim.unavailable(netsim.parse_network("netns:delay=1ms"))
    assert netsim.unavailable(netsim.parse_network("netns")) == ""  # the namespace alone needs no qdisc


SKIPPING_CONFTEST = """
import pyconcbench.netsim as netsim
netsim._capabilities = lambda: 0  # as if not root
"""


@pytest.mark.parametrize("strict", ["no", "yes"])
def test_the_suite_skips_or_fails_in_one_line_without_root(pytester, strict):
    pytester.makepyfile(test_echo=(BENCH_DIR / "test_echo.py").read_text())
    pytester.makeconftest(SKIPPING_CONFTEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--benchmark-disable", "-rsf", "--pcb-impl", "native_epoll", "--pcb-conns", "10",
        "--pcb-transport", "tcp", "--pcb-network", "netns:delay=1ms", "--pcb-strict", strict)
    line = "--pcb-network netns:delay=1ms needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN, to create a network " \
           "namespace and its qdisc): run as root, or --pcb-network local"
    if strict == "no":
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines([f"SKIPPED*{line}"])
    else:
        result.assert_outcomes(errors=1)  # in the fixture, before any server starts
        result.stdout.fnmatch_lines([f"{line} [[]not skipped: strict run, --pcb-strict; --pcb-strict no allows the skip]"])
    assert "Traceback" not in result.stdout.str()


# ---- a namespace of its own ------------------------------------------------------------------

def test_a_namespace_is_made_and_removed():
    _needs_namespaces()
    before = _our_namespaces()
    with netsim.Namespace(netsim.parse_network("netns")) as ns:
        assert os.path.exists(ns.path) and ns.name.startswith(f"pcb-{os.getpid()}-")
        assert _our_namespaces() == sorted(before + [ns.name])
        up = subprocess.run(["ip", "-n", ns.name, "-o", "link", "show", "lo"], capture_output=True, text=True)
        assert "UP" in up.stdout
        name = ns.name
    assert not os.path.exists(os.path.join(netsim.NETNS_DIR, name))
    with pytest.raises(ZeroDivisionError):
        with netsim.Namespace(netsim.parse_network("netns")) as ns:
            name = ns.name
            1 / 0
    assert not os.path.exists(os.path.join(netsim.NETNS_DIR, name))
    assert _our_namespaces() == before
    ns.remove()  # idempotent


def test_a_namespace_is_removed_at_exit_after_ctrl_c():
    _needs_namespaces()
    code = ("import pyconcbench.netsim as n; ns = n.Namespace(n.parse_network('netns')).create(); "
            "print(ns.name, flush=True); raise KeyboardInterrupt")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    name = done.stdout.strip()
    assert name.startswith("pcb-") and "KeyboardInterrupt" in done.stderr
    assert not os.path.exists(os.path.join(netsim.NETNS_DIR, name))


def test_a_dead_runs_namespace_is_swept(monkeypatch):
    _needs_namespaces()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    name = f"pcb-{gone.pid}-1"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        assert name not in netsim.sweep_stale()  # too young: its maker may run in another PID namespace
        monkeypatch.setattr(netsim, "STALE_AGE", 0.0)
        assert name in netsim.sweep_stale()
        assert not os.path.exists(os.path.join(netsim.NETNS_DIR, name))
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_entering_is_per_thread_and_always_comes_back():
    _needs_namespaces()
    home = _here()
    seen = {}
    with netsim.Namespace(netsim.parse_network("netns")) as ns:
        with netsim.entered(ns.path):
            inside = _here()
            other = threading.Thread(target=lambda: seen.update(other=_here()))
            other.start()
            other.join()
        assert inside != home and _here() == home
        assert seen["other"] == inside  # a thread started inside starts there
        with pytest.raises(RuntimeError, match="boom"):
            with netsim.entered(ns.path):
                raise RuntimeError("boom")
        assert _here() == home
    with pytest.raises(netsim.NetworkError, match="^cannot open network namespace /run/netns/pcb-none"):
        with netsim.entered("/run/netns/pcb-none"):
            pass
    assert _here() == home


def test_server_and_load_generator_meet_in_the_namespace():
    _needs_namespaces()
    with netsim.Namespace(netsim.parse_network("netns")) as ns:
        with harness.ServerProcess("native_epoll", cpu=None, netns=ns.path) as server:
            assert os.readlink(f"/proc/{server.pid}/ns/net") != _here()  # its pid is the server's own
            assert server.preflight_connections == harness.PREFLIGHT_CONNECTIONS
            host, port = server.address
            spec = loadgen.LoadSpec(host=host, port=port, connections=4, messages=400, warmup_messages=40)
            with pytest.raises(loadgen.LoadError, match="connect"):  # not listening out here
                loadgen.run(spec.with_(connect_timeout=2.0))
            session = loadgen.LoadSession(spec)
            with netsim.entered(ns.path):
                session.open()
            try:
                assert session.round().completed == 400
            finally:
                session.close()
    assert _our_namespaces() == []


def test_a_1ms_delay_adds_about_2ms_per_round_trip():
    _needs_namespaces()
    local_rtt = netsim.round_trip_us(None)
    ns = _netem_namespace("netns:delay=1ms")
    try:
        assert netsim.round_trip_us(ns.path) >= local_rtt + 1800
        p50 = {}
        for where in (None, ns.path):
            with harness.ServerProcess("native_epoll", cpu=None, netns=where) as server:
                host, port = server.address
                session = loadgen.LoadSession(loadgen.LoadSpec(host=host, port=port, connections=2, messages=200,
                                                               warmup_messages=10))
                with netsim.entered(where):
                    session.open()
                try:
                    p50[where] = session.round().latency["p50"]
                finally:
                    session.close()
        assert p50[ns.path] >= 1.8e6 and p50[ns.path] >= 2 * p50[None] + 1.5e6, p50
    finally:
        ns.remove()


def test_the_suite_runs_a_case_in_a_namespace(pytester):
    _needs_namespaces()
    pytester.makepyfile(test_echo=(BENCH_DIR / "test_echo.py").read_text())
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--benchmark-disable", "-v", "--pcb-impl", "native_epoll", "--pcb-conns", "10",
        "--pcb-transport", "tcp", "--pcb-network", "local,netns", "--pcb-messages", "500", "--pcb-rounds", "1",
        "--pcb-explain", "no")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_echo*native_epoll-c10-64B-netns*PASSED*",
                                 "native_epoll+netns *netns: the namespace alone (no qdisc); probe round trip*x local*"])
    leftovers = [n for n in os.listdir(netsim.NETNS_DIR) if n.startswith("pcb-")] if os.path.isdir(
        netsim.NETNS_DIR) else []
    assert not [n for n in leftovers if not netsim._alive(int(n.split("-")[1]))]


def test_netem_goes_on_the_namespaces_lo_only(monkeypatch):
    """The commands a namespace with netem runs (ip and tc faked): tc always with -n on that
    namespace's lo; a kernel without netem: the namespace removed, the skip's line remembered."""
    calls = []

    def fake_run(argv):
        calls.append(argv)
        if argv[1:3] == ["-n", calls[0][3]] and argv[3] == "qdisc" and refuse:
            raise netsim.NetworkError(" ".join(argv) + ": Error: Specified qdisc kind is unknown.")

    monkeypatch.setattr(netsim, "_capabilities", lambda: 1 << netsim.CAP_SYS_ADMIN | 1 << netsim.CAP_NET_ADMIN)
    monkeypatch.setattr(netsim, "_tool", lambda name: name)
    monkeypatch.setattr(netsim, "_run", fake_run)
    monkeypatch.setattr(netsim.os.path, "exists", lambda path: True)
    monkeypatch.setattr(netsim, "_NO_NETEM", [])
    refuse = False
    ns = netsim.Namespace(netsim.parse_network("netns:delay=200us,rate=1gbit")).create()
    name = ns.name
    ns.remove()
    assert calls == [["ip", "netns", "add", name], ["ip", "-n", name, "link", "set", "dev", "lo", "up"],
                     ["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "200us", "rate", "1gbit"],
                     ["ip", "netns", "del", name]]
    calls.clear()
    refuse = True
    with pytest.raises(netsim.NetworkUnavailable, match="the kernel has no netem qdisc"):
        netsim.Namespace(netsim.parse_network("netns:delay=1ms")).create()
    assert calls[-1] == ["ip", "netns", "del", calls[0][3]]
    assert netsim.unavailable(netsim.parse_network("netns:delay=2ms")).endswith("modprobe sch_netem)")


def _row(impl, rate, p50, network="local", delay=0, **more):
    return {"impl": impl, "label": impl + netsim.parse_network(network).label, "connections": 10, "size": 64,
            "transport": "tcp", "msgs_per_s": rate, "latency_p50_us": p50, "latency_p99_us": 2 * p50,
            "server_cpu_us_per_msg": 5.0, "server_cpu_share": 0.5, "loadgen_cpu_share": 0.5,
            "network": network, "network_delay_us": delay, **more}


def test_the_table_shows_local_and_remote_side_by_side():
    from pyconcbench.report.echo_tables import echo_table
    net = "netns:delay=200us"
    lines = echo_table([_row("native_epoll", 150_000, 60.0), _row("asyncio_protocol", 100_000, 80.0),
                        _row("native_epoll", 20_000, 480.0, net, 200, network_rtt_us=431.0),
                        _row("asyncio_protocol", 19_000, 500.0, net, 200, network_rtt_us=433.0)])
    rows = {line[:38].strip(): line for line in lines if line[:38].strip() and not line.startswith(("echo", "impl"))}
    assert set(rows) == {"native_epoll", "asyncio_protocol", "native_epoll+netns(200us)",
                         "asyncio_protocol+netns(200us)"}
    assert rows["asyncio_protocol"].split()[2] == "0.67"  # x native: against native_epoll over the same network
    assert rows["asyncio_protocol+netns(200us)"].split()[2] == "0.95"
    assert ("netns: +400 us per round trip by netem (2 x 200 us); probe round trip 433 us; 0.19x local, p50 +420 us"
            in rows["asyncio_protocol+netns(200us)"])
    assert "netns" not in rows["asyncio_protocol"]
