"""tools/get_pythons.sh without the network: its usage errors, the second run that only checks
what is there, and the tox matrix that runs on what it installs (tox.ini and pyproject.toml
agree on the Pythons)."""
import configparser
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "get_pythons.sh"


def run(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, message", [
    (["3.x"], "'3.x' is not a Python to install: give X.Y or X.Yt"),
    (["--jobs", "0", "3.14t"], "--jobs wants a positive number, got '0'"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
    (["--source", "3.14t=/no/such/Python-3.14.0.tar.xz", "3.14t"], "no such file or folder"),
    (["--source", "3.14=x", "3.14"], "--source wants NAME=SRC with NAME like 3.14t"),
    (["--dir"], "--dir needs a folder"),
])
def test_usage_error_is_one_line_and_exit_2(args, message, tmp_path):
    out = run("--dir", str(tmp_path / "p"), *args) if args != ["--dir"] else run(*args)
    assert out.returncode == 2, out
    assert out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "p" / ".apt").exists()


def test_source_for_a_python_not_asked_for(tmp_path):
    src = tmp_path / "Python-3.15.0.tar.xz"
    src.write_bytes(b"")
    out = run("--dir", str(tmp_path / "p"), "--source", f"3.15t={src}", "3.14t")
    assert out.returncode == 2
    assert "3.15t is not among the Pythons to install (3.14t)" in out.stderr


def test_help_names_the_default_folder_and_the_options():
    out = run("--help", env={"PCB_PYTHONS_DIR": "/opt/pys"})
    assert out.returncode == 0
    for text in ("--dir DIR", "--source NAME=SRC", "--jobs N", "--force", "now: /opt/pys",
                 "3.14, 3.15, 3.14t and 3.15t"):
        assert text in out.stdout


def _fake_install(d: pathlib.Path, name: str, exe_name: str):
    """DIR/NAME as the script leaves it, with this interpreter standing in for the real one."""
    (d / name / "bin").mkdir(parents=True)
    (d / name / "bin" / exe_name).symlink_to(sys.executable)
    (d / name / ".complete").write_text("fake\n")


def test_second_run_only_checks_what_is_there(tmp_path):
    d = tmp_path / "pythons"
    _fake_install(d, "3.14", "python3.14")
    _fake_install(d, "3.14t", "python3.14t")
    # No network needed: an installed Python that works is not downloaded or built again.
    out = run("3.14", "3.14t", env={"PCB_PYTHONS_DIR": str(d), "PCB_DEBIAN_MIRROR": "http://127.0.0.1:9"})
    version = "%d.%d.%d" % sys.version_info[:3]
    assert out.returncode == 0, out
    assert f"3.14: already installed: Python {version} ({d}/3.14/bin/python3.14)" in out.stdout
    assert f"3.14t: already installed: Python {version} free-threaded ({d}/3.14t/bin/python3.14t)" in out.stdout
    assert not (d / ".apt").exists()


def test_an_install_without_its_marker_is_redone_and_a_failure_is_one_line(tmp_path):
    d = tmp_path / "pythons"
    _fake_install(d, "3.14", "python3.14")
    (d / "3.14" / ".complete").unlink()  # an interrupted install
    # The mirror is a closed loopback port: the update fails, the line says so, exit 1.
    out = run("3.14", env={"PCB_PYTHONS_DIR": str(d), "PCB_DEBIAN_MIRROR": "http://127.0.0.1:9"},
              timeout=120)
    assert out.returncode == 1, out
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("3.14:")]
    assert lines == [f"3.14: cannot be had: apt-get update of Debian unstable failed (see {d}/.apt/update.log)"]
    assert out.stdout.splitlines()[-1] == "not installed: 3.14"


def _tox():
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(ROOT / "tox.ini")
    return cp


def test_tox_matrix_covers_the_supported_pythons():
    cp = _tox()
    envlist = [e.strip() for e in cp["tox"]["envlist"].split(",")]
    assert {"py314", "py315", "py314t", "py315t"} <= set(envlist)
    bench = next(s for s in cp.sections() if s.startswith("testenv:bench-py{"))
    factors = bench[len("testenv:bench-py{"):-1].split(",")
    assert ["py" + f for f in factors] == envlist
    matrix_run = re.search(r"-e (bench-py\S+)", cp["testenv:matrix"]["commands"]).group(1)
    assert matrix_run.split(",") == ["bench-" + e for e in envlist]
    pyproject = (ROOT / "pyproject.toml").read_text()
    low = re.search(r'requires-python = ">=3\.(\d+)"', pyproject).group(1)
    assert envlist[0] == "py3" + low
    listed = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', pyproject)
    assert sorted({e[3:].rstrip("t") for e in envlist}, key=int) == listed
