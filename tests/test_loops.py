"""The event loops beside asyncio's and uvloop (rloop), and the versions of every loop, library
and peer toolchain that a run records: in its machine facts, in the pytest header and in the
report's header, "not installed" for those that are not.  Whether the rloop servers echo is
test_serve.py's and test_conformance.py's (they run every id in servers.IMPLS)."""
import asyncio
import importlib
import importlib.util
import json
import pathlib
import subprocess
import sys
import types
from importlib import metadata

import pytest

import runfactory as rf
from pyconcbench import suite as pcb_suite
from pyconcbench import machine, metrics, servers
from pyconcbench.report import header_lines, results

RLOOP_IMPLS = ("rloop_protocol", "rloop_streams", "rloop_sockets")


# -- rloop, installed or not ------------------------------------------------------------------

def test_the_rloop_servers_are_registered_and_need_rloop():
    for impl in RLOOP_IMPLS:
        assert servers.IMPLS[impl].requires == ("rloop",)
        assert servers.IMPLS[impl].module == impl


@pytest.mark.parametrize("impl", RLOOP_IMPLS)
def test_without_rloop_each_rloop_server_is_missing_and_names_the_extra(impl, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rloop" else real(name, *a))
    with pytest.raises(servers.MissingDependency) as info:
        servers.load(impl)
    assert str(info.value) == f"implementation {impl!r} needs rloop: pip install 'pyconcbench[rloop]'"


def test_serve_without_rloop_exits_3_in_one_line_before_binding(tmp_path):
    """As a Python without rloop's wheel sees it: the server's skip (exit 3), one line."""
    path = tmp_path / "echo.sock"
    code = ("import sys; sys.modules['rloop'] = None\n"  # find_spec then finds nothing
            "from pyconcbench.serve import main\n"
            f"sys.exit(main(['rloop_streams', '--unix', {str(path)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr == ("pyconcbench.serve: implementation 'rloop_streams' needs rloop: "
                           "pip install 'pyconcbench[rloop]'\n")
    assert not path.exists()


def test_every_required_distribution_is_in_the_extra_its_message_names_and_in_all():
    """The skip message says `pip install 'pyconcbench[EXTRA]'`: that extra must install the
    distribution, and so must `all` (read from the installed package's metadata)."""
    requires = metadata.requires("pyconcbench") or []
    for impl, spec in servers.IMPLS.items():
        for dist in spec.requires:
            extra = servers._EXTRAS.get(dist, dist)
            for wanted in (extra, "all"):
                assert any(r.startswith(dist) and f'extra == "{wanted}"' in r for r in requires), \
                    f"{impl}: {dist} is not in the extra {wanted!r} (reinstall after editing pyproject.toml?)"


# -- rloop over UNIX sockets ------------------------------------------------------------------

class _LoopWithoutUnixServers(asyncio.SelectorEventLoop):
    """Stands for rloop 0.5.0, whose create_unix_server raises NotImplementedError."""

    async def create_unix_server(self, *args, **kwargs):
        raise NotImplementedError


@pytest.fixture
def fake_rloop(monkeypatch):
    """The rloop server modules, imported afresh on a stand-in rloop module (runs whether or not
    rloop is installed); returns (the modules, the stand-in)."""
    fake = types.ModuleType("rloop")
    fake.new_event_loop = asyncio.SelectorEventLoop  # serves UNIX sockets, as asyncio's does
    monkeypatch.setitem(sys.modules, "rloop", fake)
    monkeypatch.setattr(servers, "_release", lambda dist: f"{dist} 9.9")
    mods = {}
    for impl in ("rloop_protocol", "rloop_streams"):
        name = f"pyconcbench.servers.{impl}"
        monkeypatch.delitem(sys.modules, name, raising=False)
        mods[impl] = importlib.import_module(name)
    yield mods, fake
    for impl in mods:
        sys.modules.pop(f"pyconcbench.servers.{impl}", None)  # not left bound to the stand-in


@pytest.mark.parametrize("impl", ["rloop_protocol", "rloop_streams"])
def test_a_loop_without_unix_servers_refuses_unix_as_unsupported_and_tcp_is_served(impl, fake_rloop):
    mods, fake = fake_rloop
    fake.new_event_loop = _LoopWithoutUnixServers
    with pytest.raises(servers.Unsupported) as info:
        mods[impl].check_transport("unix")
    assert str(info.value) == (f"implementation {impl!r} cannot serve a UNIX socket with rloop 9.9 "
                               "(its loop.create_unix_server raises NotImplementedError): measure it over TCP")
    mods[impl].check_transport("tcp")  # not refused


@pytest.mark.parametrize("impl", ["rloop_protocol", "rloop_streams"])
def test_a_loop_with_unix_servers_is_not_refused(impl, fake_rloop):
    mods, _ = fake_rloop
    assert mods["rloop_protocol"].serves_unix_sockets()
    mods[impl].check_transport("unix")


def test_serve_over_unix_follows_what_the_installed_rloop_can_do(tmp_path):
    """With the real rloop: refused before binding (exit 6, unsupported: one line) when its loop
    has no UNIX servers, served otherwise; without rloop, missing (exit 3)."""
    path = tmp_path / "echo.sock"
    proc = subprocess.Popen([sys.executable, "-m", "pyconcbench.serve", "rloop_protocol", "--unix", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        if first.startswith("READY "):
            from pyconcbench.servers import rloop_protocol
            assert rloop_protocol.serves_unix_sockets()
            assert json.loads(first.split(" ", 1)[1])["transport"] == "unix"
            proc.terminate()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if first.startswith("READY "):
        assert proc.returncode == 0
        return
    assert proc.returncode == (3 if importlib.util.find_spec("rloop") is None else 6)
    assert not path.exists()
    assert len(err.splitlines()) == 1, err
    if importlib.util.find_spec("rloop") is None:
        assert "needs rloop: pip install 'pyconcbench[rloop]'" in err
    else:
        assert err.startswith("pyconcbench.serve: implementation 'rloop_protocol' cannot serve a UNIX socket with "
                              f"rloop {metadata.version('rloop')} (its loop.create_unix_server raises NotImplementedError)")


# -- rloop and serve's stop signals --------------------------------------------------------

def test_the_rloop_loop_wakes_for_the_stop_signals_and_keeps_their_python_handlers(fake_rloop, monkeypatch):
    """rloop runs Python code for a signal only when it was given to loop.add_signal_handler
    (which also sets a no-op Python handler of its own): new_event_loop gives it the signals
    serve handles, then sets serve's handlers back (a stand-in loop records what it is given)."""
    import signal

    mods, fake = fake_rloop
    given, installed = {}, {}

    class Recording(asyncio.SelectorEventLoop):
        def add_signal_handler(self, sig, callback, *args):
            given[sig] = (callback, args)
            installed[sig] = "rloop's no-op"

    fake.new_event_loop = Recording

    def handler(signum, frame):
        pass
    monkeypatch.setattr(signal, "getsignal", lambda signum: {
        signal.SIGTERM: handler, signal.SIGINT: signal.default_int_handler, signal.SIGHUP: signal.SIG_DFL}[signum])
    monkeypatch.setattr(signal, "signal", lambda signum, h: installed.__setitem__(signum, h))
    mod = mods["rloop_protocol"]
    loop = mod.new_event_loop()
    loop.close()
    # SIGINT's KeyboardInterrupt and SIGHUP's default are Python's own: left alone
    assert given == {signal.SIGTERM: (mod.run_python_handlers, ())}
    assert installed == {signal.SIGTERM: handler}


@pytest.mark.skipif(importlib.util.find_spec("rloop") is None, reason="rloop is not installed")
def test_the_real_rloop_loop_wakes_for_a_stop_signal_and_its_handler_runs():
    """In a fresh interpreter: the loop has SIGHUP registered (asked through rloop's private
    _sig_rem: its remove_signal_handler raises AttributeError in 0.5.0), SIGHUP's handler is still ours, and a SIGHUP from another process runs it while the loop
    waits."""
    code = """
import asyncio, os, signal, subprocess
from pyconcbench.servers.rloop_protocol import new_event_loop
def ours(signum, frame):
    if not stopped.done():
        stopped.set_result(signum)
signal.signal(signal.SIGHUP, ours)
loop = new_event_loop()
print(signal.getsignal(signal.SIGHUP) is ours)
stopped = loop.create_future()
async def main():
    subprocess.Popen(["sh", "-c", "sleep 0.2; kill -HUP %d" % os.getpid()])
    return await asyncio.wait_for(stopped, 10)
print(loop.run_until_complete(main()))
print(loop._sig_rem(signal.SIGHUP))
loop.close()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["True", str(int(__import__("signal").SIGHUP)), "True"]


# -- versions in the machine facts ------------------------------------------------------------

EXPECTED = ("uvloop", "rloop", "uringcore", "gevent", "greenlet", "tornado", "twisted", "trio", "anyio",
            "curio", "pyzmq", "aiozmq")


def test_the_facts_list_every_loop_and_library_installed_or_not(monkeypatch):
    real = metadata.version

    def version(name):
        if name in ("curio", "uringcore"):
            raise metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(metadata, "version", version)
    libs = machine.machine_facts()["libraries"]
    for name in EXPECTED + ("go", "node"):
        assert name in libs, name
    assert libs["curio"] == libs["uringcore"] == "not installed"
    for name in EXPECTED:
        if name not in ("curio", "uringcore"):
            try:
                assert libs[name] == real(name)
            except metadata.PackageNotFoundError:
                assert libs[name] == "not installed"


def test_libuv_is_the_version_uvloop_reports(monkeypatch):
    fake_loop = types.ModuleType("uvloop.loop")
    fake_loop.libuv_get_version = lambda: (1 << 16) | (48 << 8) | 2
    monkeypatch.setitem(sys.modules, "uvloop", types.ModuleType("uvloop"))
    monkeypatch.setitem(sys.modules, "uvloop.loop", fake_loop)
    sys.modules["uvloop"].loop = fake_loop
    assert machine.collect_libuv_version() == "1.48.2"
    del fake_loop.libuv_get_version  # an uvloop that does not tell: left out, not made up
    assert machine.collect_libuv_version() is None


def _tool(folder, name, script):
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


def test_go_and_node_versions_from_path(tmp_path, monkeypatch):
    _tool(tmp_path, "go", 'echo "go version go1.22.3 linux/amd64"')
    _tool(tmp_path, "node", "echo v20.11.1")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine.collect_tool_versions() == {"go": "1.22.3", "node": "20.11.1"}


def test_a_tool_missing_is_not_installed_and_one_that_fails_is_left_out(tmp_path, monkeypatch):
    _tool(tmp_path, "go", "echo 'go: cannot find GOROOT' >&2; exit 2")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine.collect_tool_versions() == {"node": "not installed"}


def test_go_is_asked_without_fetching_another_toolchain(tmp_path, monkeypatch):
    _tool(tmp_path, "go", 'echo "go version go1.22.3-$GOTOOLCHAIN linux/amd64"')
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("GOTOOLCHAIN", "auto")
    assert machine.collect_tool_versions()["go"] == "1.22.3-local"


# -- where the versions are shown -------------------------------------------------------------

def test_libraries_text_names_the_missing_last():
    libs = {"uvloop": "0.21.0", "libuv": "1.48.0", "curio": "not installed", "rloop": "0.5.0",
            "go": "not installed"}
    assert metrics.libraries_text(libs) == "uvloop 0.21.0, libuv 1.48.0, rloop 0.5.0 (not installed: curio, go)"
    assert metrics.libraries_text({"a": "1"}) == "a 1"
    assert metrics.libraries_text({"a": "not installed"}, ) == "none installed (not installed: a)"
    assert metrics.libraries_text({"pytest": "9", "a": "1"}, leave_out=("pytest",)) == "a 1"


def test_the_pytest_header_lists_the_loops_and_libraries(pytester):
    pytester.makeconftest("""
        from importlib import metadata
        _real = metadata.version
        def version(name):
            if name == "curio":
                raise metadata.PackageNotFoundError(name)
            return _real(name)
        metadata.version = version
    """)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable")
    lines = [line for line in result.outlines if line.startswith("pyconcbench: loops and libraries: ")]
    assert len(lines) == 1, result.outlines[:12]
    line = lines[0]
    assert "curio" in line.split("(not installed: ", 1)[1]
    assert "pytest " not in line and "pytest-benchmark" not in line
    for name in ("uvloop", "rloop", "gevent", "greenlet", "tornado", "twisted", "trio", "anyio", "pyzmq",
                 "aiozmq", "go", "node", "uringcore"):
        assert name in line, name
    try:
        assert f"rloop {metadata.version('rloop')}" in line
    except metadata.PackageNotFoundError:
        assert "rloop" in line.split("(not installed: ", 1)[1]


def test_the_report_header_shows_every_library_and_the_missing_ones():
    data = rf.run([rf.echo("asyncio_protocol", 100, [40000.0] * 3)],
                  libraries={"pytest-benchmark": "5.3.1", "uvloop": "0.21.0", "libuv": "1.48.0",
                             "rloop": "0.5.0", "uringcore": "not installed", "go": "1.22.3"})
    run = results.Run("0001.json", data)
    lines = header_lines([run])
    assert "  - libraries: pytest-benchmark 5.3.1, uvloop 0.21.0, libuv 1.48.0, rloop 0.5.0, go 1.22.3 " \
           "(not installed: uringcore)" in lines


def test_an_older_run_without_missing_entries_still_lists_its_libraries():
    data = rf.run([rf.echo("asyncio_protocol", 100, [40000.0] * 3)], libraries={"uvloop": "0.19.0"})
    assert "  - libraries: uvloop 0.19.0" in header_lines([results.Run("old.json", data)])


def test_an_unsupported_transport_is_a_skip_even_in_a_strict_run(pytester):
    """rloop_protocol over UNIX: nothing is missing (the release cannot), so the strict run that
    fails a missing package's skip skips it, saying why."""
    pytester.makepyfile(test_echo=(pathlib.Path(pcb_suite.SUITE_DIR) / "test_echo.py").read_text())
    result = pytester.runpytest_subprocess("--pcb-impl", "rloop_protocol", "--pcb-conns", "10", "--pcb-transport",
                                           "unix", "--pcb-strict", "yes", "--benchmark-disable", "-rs",
                                           "-p", "no:cacheprovider")
    if importlib.util.find_spec("rloop") is None:
        pytest.skip("rloop not installed: the strict run fails its missing package, as it should")
    if result.parseoutcomes().get("passed"):  # a release that serves UNIX sockets (not asked here:
        result.assert_outcomes(passed=1)        # an rloop loop in this process leaves fds behind)
        return
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*implementation 'rloop_protocol' cannot serve a UNIX socket with rloop *"])
