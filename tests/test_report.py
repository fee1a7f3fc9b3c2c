"""`pyconcbench report` and `pyconcbench compare` on saved runs built for the purpose."""
import json

import pytest

from pyconcbench import cli, report, results

import runfactory as rf

RATES = {"native_epoll": 200000.0, "uvloop_protocol": 150000.0, "asyncio_protocol": 40000.0}


def suite(scale=1.0, python="3.11.7", when="2026-11-22T10:00:00", **facts):
    benches = []
    for impl, rate in RATES.items():
        for conns in (10, 100, 1000):
            r = rate * scale * (1.0 if conns < 1000 else 0.8)
            benches.append(rf.echo(impl, conns, [r * f for f in (1.0, 1.01, 0.99, 1.005, 0.995)],
                                   cpu_us=1e6 / rate))
    benches.append(rf.echo("asyncio_protocol", 10, [30000.0] * 5, size=1024))
    benches.append(rf.echo("asyncio_protocol", 10, [20000.0] * 5, size=102400))
    benches.append(rf.echo("selectors", 100, [50000.0] * 5, transport="unix", starving_connections=3))
    benches += [rf.switch("python-generator_next", [25.0, 25.5, 24.5]),
                rf.switch("native-swapcontext", [440.0, 445.0, 450.0], group="switch-native"),
                rf.switch("yield_from-d1", [60.0], group="depth-sweep", depth=1),
                rf.switch("yield_from-d8", [220.0], group="depth-sweep", depth=8),
                rf.switch("yield_from-d32", [760.0], group="depth-sweep", depth=32)]
    benches += [rf.zmq("pyzmq_single", [20000.0 * scale] * 5), rf.zmq("aiozmq_rpc-asyncio", [5000.0] * 5)]
    return rf.run(benches, python=python, when=when, **facts)


@pytest.fixture
def storage(tmp_path):
    rf.save(tmp_path, "0001_base", suite())
    rf.save(tmp_path, "0002_same", suite(when="2026-11-22T11:00:00"))
    rf.save(tmp_path, "0003_slow", suite(scale=0.7, when="2026-11-22T12:00:00"))
    return tmp_path


def test_load_runs_by_prefix_file_and_newest(storage):
    assert [r.name for r in results.load_runs([], str(storage))] == ["0003_slow.json"]
    assert [r.name for r in results.load_runs(["0002"], str(storage))] == ["0002_same.json"]
    path = storage / "Linux-CPython-3.11-64bit" / "0001_base.json"
    assert results.load_runs([str(path)], str(storage))[0].name == "0001_base.json"


def test_load_runs_errors_are_one_line(tmp_path, storage):
    with pytest.raises(results.ResultsError, match="no saved runs: .*nowhere does not exist"):
        results.load_runs([], str(tmp_path / "nowhere"))
    with pytest.raises(results.ResultsError, match="no saved run matching '0009'"):
        results.load_runs(["0009"], str(storage))
    with pytest.raises(results.ResultsError, match="missing.json: no such file"):
        results.load_runs([str(tmp_path / "missing.json")], str(storage))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(results.ResultsError, match="not a JSON file"):
        results.load_runs([str(bad)], str(storage))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(results.ResultsError, match="not a pytest-benchmark run"):
        results.load_runs([str(other)], str(storage))


def test_report_markdown_has_the_studies_tables(storage, capsys):
    assert cli.main(["report", "--storage", str(storage), "0001"]) == 0
    out = capsys.readouterr().out
    for title in ("### Echo throughput (msgs/s) — TCP, 64B messages", "### Relative speed — TCP, 64B messages",
                  "### Ratio to native_epoll — TCP, 64B messages", "### Latency p50 (µs)", "### Latency p95 (µs)",
                  "### Latency p99 (µs)", "### Server CPU per round trip (µs) and excess over native_epoll",
                  "### CPU busy: server / load generator", "### Fairness — UNIX sockets, 64B messages",
                  "### Echo by message size — TCP, 10 connections", "### Switch costs (ns per operation)",
                  "### Depth sweep: cost per extra level", "### zmq-200B-if1", "Test CPU, 2 CPUs online"):
        assert title in out, title
    # all round trips over all the time (the harmonic mean of the rounds' rates); the 95 %
    # interval of five rounds at +-1 %: t(4) * stdev / sqrt(5) = 0.99 % of the mean
    assert "| native_epoll | 199,990 ± 1.0% | 199,990 ± 1.0% | 159,992 ± 1.0% |" in out
    # slowest = 1, as the study prints it
    assert "| asyncio_protocol | 1.0 | 1.0 | 1.0 |" in out
    assert "| uvloop_protocol | 3.8 | 3.8 | 3.8 |" in out
    assert "| uvloop_protocol | 0.75 | 0.75 | 0.75 |" in out
    # server CPU and its excess over native_epoll
    assert "| asyncio_protocol | 25.00 (+20.00) | 25.00 (+20.00) | 25.00 (+20.00) |" in out
    assert "⚠ 3 starving" in out
    assert "| asyncio_protocol | 30,000 · 0.0 MiB/s |" not in out  # sizes carry their own MiB/s
    assert "| asyncio_protocol | 40,000 ± 1.0% · 1.0 MiB/s |" not in out
    assert "| aiozmq_rpc-asyncio | 5,000 ± 0.0% | 0.25 |" in out


def test_report_by_python_puts_versions_side_by_side(tmp_path, capsys):
    rf.save(tmp_path, "0001_matrix", suite(python="3.10.13"), "Linux-CPython-3.10-64bit")
    rf.save(tmp_path, "0001_matrix", suite(scale=1.1, python="3.12.1"), "Linux-CPython-3.12-64bit")
    rf.save(tmp_path, "0001_matrix", suite(scale=0.9, python="3.9.18"), "Linux-CPython-3.9-64bit")
    assert cli.main(["report", "--by-python", "--storage", str(tmp_path), "*/*_matrix"]) == 0
    out = capsys.readouterr().out
    assert "| implementation | Python 3.9.18 | Python 3.10.13 | Python 3.12.1 |" in out
    assert "### Echo msgs/s — 100 connections × 64B over TCP" in out
    assert "| asyncio_protocol | 35,998 ± 1.0% | 39,998 ± 1.0% | 43,998 ± 1.0% |" in out
    assert "| python-generator_next | 25.0 | 25.0 | 25.0 |" in out
    assert cli.main(["report", "--by-python", "--storage", str(tmp_path), "*/*_matrix*-nothing"]) == 2
    capsys.readouterr()
    # one Python only (tox -e matrix with one interpreter installed): the plain report, said so
    assert cli.main(["report", "--by-python", str(tmp_path / "Linux-CPython-3.9-64bit" / "0001_matrix.json")]) == 0
    cap = capsys.readouterr()
    assert "the runs are all of Python 3.9.18: printing the plain report" in cap.err
    assert "### Echo throughput (msgs/s)" in cap.out


@pytest.fixture(scope="module")
def matplotlib_fonts(tmp_path_factory):
    """matplotlib keeps the font files it has used open for the life of the process: draw
    every plot once before the per-test fd leak check starts counting."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from pyconcbench import plots

    plots.plot_all(results.split(suite()["benchmarks"]))


def test_report_png_and_html(storage, tmp_path, capsys, matplotlib_fonts):
    png = tmp_path / "png"
    page = tmp_path / "report.html"
    assert cli.main(["report", "--storage", str(storage), "--png", str(png), "--html", str(page)]) == 0
    names = sorted(p.name for p in png.iterdir())
    assert names == ["echo-msgs-vs-connections-tcp-64B.png", "echo-msgs-vs-size-tcp-c10.png",
                     "echo-p95-vs-connections-tcp-64B.png", "switch-costs.png", "switch-depth.png"]
    for p in png.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10000
    text = page.read_text()
    assert text.count("src='data:image/png;base64,") == 5
    assert "http://" not in text and "https://" not in text  # self-contained: no CDN, no links out
    assert "<h3>Echo throughput (msgs/s) — TCP, 64B messages</h3>" in text


def test_report_without_matplotlib_says_how_to_get_it(storage, tmp_path, capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert cli.main(["report", "--storage", str(storage), "--png", str(tmp_path / "p")]) == 2
    assert "need matplotlib: pip install 'pyconcbench[report]'" in capsys.readouterr().err


def test_compare_exit_codes_and_one_line_per_regression(storage, capsys):
    assert cli.main(["compare", "--storage", str(storage), "0001", "0002"]) == 0
    out = capsys.readouterr().out
    assert "**no regression**" in out
    assert cli.main(["compare", "--storage", str(storage), "0001", "0003", "--fail-on", "msgs_per_s:-10%"]) == 1
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.startswith("REGRESSION ")]
    assert len(lines) == 9  # the TCP echo cases slowed by 30 %; requests_per_s is not gated here
    assert any("test_echo[native_epoll-c10-64B]: msgs_per_s regressed" in line and "(-30.0%, threshold -10%)" in line
               for line in lines)
    assert "| regression |" in cap.out


def test_compare_against_several_baseline_runs(storage, capsys):
    # 0001 and 0002 pooled: the 30 % slower 0003 is worse than both, and significant
    assert cli.main(["compare", "--storage", str(storage), "0001", "0002", "0003", "--fail-on", "msgs_per_s:-10%"]) == 1
    out = capsys.readouterr().out
    assert "(2 runs, commit" in out and "worse than all 2 baseline runs" in out
    # a glob matching several runs works as the baseline too
    assert cli.main(["compare", "--storage", str(storage), "000[12]", "0003", "--fail-on", "msgs_per_s:-10%"]) == 1


def test_compare_fails_when_benchmarks_went_missing(storage, tmp_path, capsys):
    data = suite(when="2026-11-22T13:00:00")
    data["benchmarks"] = [b for b in data["benchmarks"] if "native_epoll" not in b["name"]]
    rf.save(storage, "0004_crashed", data)
    assert cli.main(["compare", "--storage", str(storage), "0001", "0004"]) == 1
    err = capsys.readouterr().err
    assert "MISSING 3 benchmark(s) of the baseline are not in 0004_crashed.json" in err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0004", "--allow-missing"]) == 0


def test_compare_new_run_named_by_path_is_never_its_own_baseline(storage, capsys):
    new = storage / "Linux-CPython-3.11-64bit" / "0003_slow.json"
    assert cli.main(["compare", "--storage", str(storage), "0", str(new), "--fail-on", "msgs_per_s:-10%"]) == 1
    assert "(2 runs, commit" in capsys.readouterr().out


def test_cli_output_errors_are_one_line(storage, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["report", "--storage", str(storage), "-o", str(blocker / "out.md")]) == 2
    assert "pyconcbench: error: cannot write" in capsys.readouterr().err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0002", "--markdown", str(blocker / "x.md")]) == 0
    assert "cannot write --markdown" in capsys.readouterr().err


def test_compare_errors(storage, tmp_path, capsys):
    assert cli.main(["compare", "--storage", str(storage), "0001", "0009"]) == 2
    assert "no saved run matching '0009'" in capsys.readouterr().err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0002", "--fail-on", "msgs_per_s:+10%"]) == 2
    assert "write msgs_per_s:-10%" in capsys.readouterr().err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0"]) == 2
    assert "matches 3 saved runs" in capsys.readouterr().err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0001"]) == 2
    assert "names only the new run itself" in capsys.readouterr().err
    rf.save(storage, "0004_newkernel", suite(kernel="6.19.1"))
    assert cli.main(["compare", "--storage", str(storage), "0001", "0004"]) == 2
    assert "kernel: 6.18.0 -> 6.19.1" in capsys.readouterr().err
    assert cli.main(["compare", "--storage", str(storage), "0001", "0004", "--allow-machine-change"]) == 0
    md = tmp_path / "summary.md"
    assert cli.main(["compare", "--storage", str(storage), "0001", "0002", "--markdown", str(md)]) == 0
    assert "## pyconcbench regression gate" in md.read_text()


def test_table_renders_markdown_and_escapes_html():
    t = report.Table("T <x>", ["a", "b"], [["x|y", "<b>"]], note="n & m")
    md = "\n".join(t.markdown())
    assert "| x\\|y | <b> |" in md and "|---|---:|" in md
    h = t.html()
    assert "&lt;b&gt;" in h and "T &lt;x&gt;" in h and "n &amp; m" in h
