"""Servers users bring (``--pcb-impl MODULE:FUNCTION``, ``PATH.py:FUNCTION``, the
``pyconcbench.servers`` entry-point group) and the suite shipped in the package
(``pyconcbench run``): what works, and the one line each contract error gives."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from brokenservers import connect, exchange
from pyconcbench import cli, gate, harness, options, servers, suite
from pyconcbench.examples import echo_server

EXAMPLE = Path(echo_server.__file__)


def _serve_once(server, payload=b"x" * 100):
    with connect(server.address) as sock:
        return exchange(sock, payload)


def test_a_users_file_is_served_and_counts_what_it_served():
    with harness.ServerProcess(f"{EXAMPLE}:serve", cpu=None) as server:
        assert _serve_once(server) == b"x" * 100
        usage = server.stop()
    # the preflight connections are left out of the counts, as for a built-in server
    assert usage.accepted == 1 and usage.bytes == 100


def test_a_users_module_is_imported_from_the_folder_the_run_starts_in(tmp_path, monkeypatch):
    (tmp_path / "my_echo_mod.py").write_text(EXAMPLE.read_text())
    monkeypatch.chdir(tmp_path)
    with harness.ServerProcess("my_echo_mod:serve", cpu=None) as server:
        assert _serve_once(server) == b"x" * 100


BAD = {
    "noserve.py": ("x = 1\n", "noserve.py has no 'serve'"),
    "raising.py": ("raise RuntimeError('boom')\n", "importing raising.py raised RuntimeError: boom"),
    "badsig.py": ("def serve(a):\n    pass\n", "badsig.py:serve must take (sock, stop_fd, stats), its signature is (a)"),
    "notfunc.py": ("serve = 3\n", "notfunc.py:serve is not a function"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_broken_users_server_is_one_line_that_says_what_is_wrong(tmp_path, monkeypatch, name):
    source, why = BAD[name]
    (tmp_path / name).write_text(source)
    monkeypatch.chdir(tmp_path)
    server = harness.ServerProcess(f"{name}:serve", cpu=None)
    with pytest.raises(harness.ServerError) as err:  # the user's code: cannot run as asked, never a skip
        server.start()
    assert not isinstance(err.value, (harness.ServerUnavailable, harness.ServerBroken))
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"server '{name}:serve' cannot run as asked (exit code 2): pyconcbench.serve: "
                       f"implementation '{name}:serve': {why}" + (" (%s:1)" % (tmp_path / name) if "raised" in why else ""))


def test_a_module_that_is_not_there_names_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(harness.ServerError, match=r"no module named 'nosuchmodule_pcb' \(it is imported from the "
                                                  r"folder the run starts in; or give a file: "
                                                  r"path/to/nosuchmodule_pcb.py:serve\)$"):
        harness.ServerProcess("nosuchmodule_pcb:serve", cpu=None).start()


@pytest.mark.parametrize("text, why", [
    ("missing_file_pcb.py:serve", "no such file: "),
    ("my_echo.py:1x", "'1x' is not a function name"),
    ("a-b:serve", "'a-b' is not a module name"),
    ("nosuch_impl", "unknown implementation 'nosuch_impl'; known: native_epoll"),
])
def test_an_impl_that_cannot_be_a_server_is_a_usage_error_before_anything_runs(text, why):
    with pytest.raises(ValueError) as err:
        options.parse_impls(text)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_users_server_is_accepted_beside_the_built_in_ones():
    assert options.parse_impls(f"native_epoll,{EXAMPLE}:serve,pyconcbench.examples.echo_server:serve") == (
        "native_epoll", f"{EXAMPLE}:serve", "pyconcbench.examples.echo_server:serve")
    assert options.parse_require("mine.py:serve") == ("mine.py:serve",)


def _dist(root: Path, name: str, entry: str) -> None:
    """A distribution installed in ``root`` whose entry points register ``entry``."""
    info = root / "pcb_user_servers-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pcb-user-servers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{servers.ENTRY_POINT_GROUP}]\n{name} = {entry}\n")
    (root / "pcb_user_servers.py").write_text(EXAMPLE.read_text())


def test_a_package_registers_its_server_by_name(tmp_path, monkeypatch):
    _dist(tmp_path, "my_asyncio", "pcb_user_servers:serve")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert servers.known_impls()[-1] == "my_asyncio"
    assert options.parse_impls("all")[-1] == "my_asyncio"  # `all` includes what is registered
    assert options.parse_impls("my_asyncio") == ("my_asyncio",)
    assert servers.user_spec("my_asyncio") == ("pcb_user_servers", "serve")
    with harness.ServerProcess("my_asyncio", cpu=None, env={"PYTHONPATH": str(tmp_path)}) as server:
        assert _serve_once(server) == b"x" * 100


def test_a_registered_name_that_is_a_built_in_id_is_refused(tmp_path, monkeypatch):
    _dist(tmp_path, "uvloop_protocol", "pcb_user_servers:serve")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^entry point 'uvloop_protocol' in group pyconcbench.servers \(from "
                                         r"pcb-user-servers\) has the name of a built-in implementation; rename it$"):
        options.parse_impls("native_epoll")


def test_the_readme_example_is_the_shipped_one():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert EXAMPLE.read_text().strip() in readme


# ---- the suite shipped in the package ------------------------------------------------------

def test_run_builds_the_suites_pytest_arguments(tmp_path):
    args = cli.suite_args(["--profile", "full", "--family=echo,zmq", "-k", "native_epoll"], cwd=str(tmp_path))
    assert args[:2] == [suite.path("echo"), suite.path("zmq")]
    assert args[2:] == ["-o", f"cache_dir={tmp_path / '.pytest_cache'}", "--benchmark-autosave",
                        "--pcb-profile", "full", "-k", "native_epoll"]
    # a previous saved run in this folder: compared with
    (tmp_path / ".benchmarks" / "Linux").mkdir(parents=True)
    (tmp_path / ".benchmarks" / "Linux" / "0001_x.json").write_text("{}")
    assert "--benchmark-compare" in cli.suite_args([], cwd=str(tmp_path))
    assert "--benchmark-autosave" not in cli.suite_args(["--no-save"], cwd=str(tmp_path))
    assert cli.suite_args(["--", "--profile"], cwd=str(tmp_path))[-1] == "--profile"  # after --: pytest's


@pytest.mark.parametrize("argv, why", [
    (["--family", "http"], "run: --family: unknown family 'http'; known: echo, openloop, switch, zmq, ceiling"),
    (["--profile"], "run: --profile needs a value"),
])
def test_run_refuses_a_bad_argument_in_one_line(capsys, argv, why):
    assert cli.main(["run"] + argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"pyconcbench: error: {why}"]


def test_run_measures_from_any_folder_and_saves_there(tmp_path):
    """`pyconcbench run` outside the repo: the suite from the package, the results in this folder,
    node ids without the folders the package lives in."""
    (tmp_path / "my_echo.py").write_text(EXAMPLE.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCB_")}
    done = subprocess.run(
        [sys.executable, "-m", "pyconcbench.cli", "run", "--family", "echo", "--pcb-impl", "my_echo.py:serve",
         "--pcb-conns", "10", "--pcb-rounds", "1", "--pcb-messages", "2000", "--pcb-reference", "none"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout
    saved = list((tmp_path / ".benchmarks").glob("*/*.json"))
    assert len(saved) == 1
    bench = json.loads(saved[0].read_text())["benchmarks"][0]
    assert bench["fullname"] == "test_echo.py::test_echo[my_echo.py:serve-c10-64B]"
    assert bench["extra_info"]["msgs_per_s"] > 0
    assert (tmp_path / ".pytest_cache").is_dir()  # the run's cache is this folder's, not the package's


def test_a_baseline_saved_from_tests_bench_still_matches_the_packaged_suite():
    old = {"name": "test_echo[x-c10-64B]", "fullname": "tests/bench/test_echo.py::test_echo[x-c10-64B]"}
    new = {"name": "test_echo[x-c10-64B]", "fullname": "test_echo.py::test_echo[x-c10-64B]"}
    assert gate.match_key(old) == gate.match_key(new) == "test_echo.py::test_echo[x-c10-64B]"
    assert gate.compare_runs([old], [new], []).missing == []
    assert gate.compare_runs([old], [], []).missing == [old["fullname"]]


def test_the_example_is_valid_python_of_twenty_odd_lines():
    code = EXAMPLE.read_text()
    compile(code, str(EXAMPLE), "exec")
    assert len(code.strip().splitlines()) <= 36
    assert textwrap.dedent(code) == code


def test_the_example_passes_the_conformance_suite(capsys):
    assert cli.main(["check", f"{EXAMPLE}:serve"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{EXAMPLE}:serve: 8 of 8 properties hold"]


def test_check_names_what_a_users_server_gets_wrong(tmp_path, monkeypatch, capsys):
    """The example without its two flow-control methods buffers without bound."""
    code = EXAMPLE.read_text()
    start = code.index("    def pause_writing")
    (tmp_path / "greedy.py").write_text(code[:start] + code[code.index("\n\n\ndef serve"):])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "greedy.py:serve", "--only", "backpressure,echo"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("greedy.py:serve: backpressure: a client that sends and never reads")
    assert out[1] == "greedy.py:serve: 1 of 2 failed"


def test_check_takes_any_program_by_its_command_line(capsys):
    cmd = f"{sys.executable} -m pyconcbench.serve native_epoll --port {{port}}"
    assert cli.main(["check", cmd, "--only", "echo,partial_io,sigterm"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{cmd}: 3 of 3 properties hold"]
    gone = f"{sys.executable} -c 'import sys; sys.exit(3)' {{port}}"
    assert cli.main(["check", gone, "--only", "echo"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "exited with code 3 before listening on 127.0.0.1:" in out[0]


def test_what_a_users_module_prints_on_import_does_not_break_the_protocol(tmp_path, monkeypatch):
    """stdout is the protocol's until READY: a module that prints (or names a helper `usage` or
    `start`, which are hooks only in pyconcbench's own modules) still serves."""
    code = EXAMPLE.read_text()
    (tmp_path / "chatty.py").write_text('print("loading my server")\nusage = "python chatty.py PORT"\n'
                                        'def start(host, port):\n    raise AssertionError("not a hook")\n' + code)
    monkeypatch.chdir(tmp_path)
    with harness.ServerProcess("chatty.py:serve", cpu=None) as server:
        assert _serve_once(server) == b"x" * 100
        usage = server.stop()
    assert usage.accepted == 1
    assert "loading my server" in server.stderr_text()


def test_a_package_that_raises_on_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "brokenpkg_pcb").mkdir()
    (tmp_path / "brokenpkg_pcb" / "__init__.py").write_text("raise RuntimeError('package boom')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(harness.ServerError) as err:
        harness.ServerProcess("brokenpkg_pcb.mod:serve", cpu=None).start()
    assert "\n" not in str(err.value)
    assert str(err.value).endswith("importing brokenpkg_pcb.mod raised RuntimeError: package boom "
                                   f"({tmp_path / 'brokenpkg_pcb' / '__init__.py'}:1)")


def test_check_refuses_a_missing_file_as_usage_without_running_anything(capsys):
    assert cli.main(["check", "missing_pcb_file.py:serve"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no such file" in err[0]


def test_run_reads_option_names_exactly(tmp_path):
    (tmp_path / ".benchmarks" / "m").mkdir(parents=True)
    (tmp_path / ".benchmarks" / "m" / "0001.json").write_text("{}")
    args = cli.suite_args(["--benchmark-disable-gc", "--benchmark-compare-fail=mean:10%"], cwd=str(tmp_path))
    assert "--benchmark-autosave" in args and "--benchmark-compare" in args
    assert "--benchmark-autosave" not in cli.suite_args(["--benchmark-save=x"], cwd=str(tmp_path))
