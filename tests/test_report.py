"""`pyconcbench report` and `pyconcbench compare` on saved runs built for the purpose."""
import json

import pytest

from pyconcbench import cli, report
from pyconcbench.report import results

import runfactory as rf

RATES = {"native_epoll": 200000.0, "uvloop_protocol": 150000.0, "asyncio_protocol": 40000.0}


def suite(scale=1.0, python="3.11.7", when="2026-11-22T10:00:00", **facts):
    benches = []
    for impl, rate in RATES.items():
        for conns in (10, 100, 1000):
            r = rate * scale * (1.0 if conns < 1000 else 0.8)
            benches.append(rf.echo(impl, conns, [r * f for f in (1.0, 1.01, 0.99, 1.005, 0.995)],
                                   cpu_us=1e6 / rate))
    # MiB/s as the plugin saves it: msgs/s x size / 2^20
    benches.append(rf.echo("asyncio_protocol", 10, [30000.0] * 5, size=1024, mib_per_s=30000 * 1024 / 2 ** 20))
    benches.append(rf.echo("asyncio_protocol", 10, [20000.0] * 5, size=102400,
                           mib_per_s=20000 * 102400 / 2 ** 20))
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
    assert "| selectors | 0.999 [90–110] ⚠ 3 starving |" in out
    # the size table: each cell the rate and the MiB/s saved with it (29.296875 and 1953.125);
    # the 64B rows carry the factory's 1.0 MiB/s
    assert tables(out)["Echo by message size — TCP, 10 connections"] == [
        ["implementation", "64B", "1KiB", "100KiB"],
        ["native_epoll", "199,990 · 1.0 MiB/s", "", ""],
        ["uvloop_protocol", "149,992 · 1.0 MiB/s", "", ""],
        ["asyncio_protocol", "39,998 · 1.0 MiB/s", "30,000 · 29.3 MiB/s", "20,000 · 1,953.1 MiB/s"]]
    assert "| aiozmq_rpc-asyncio | 5,000 ± 0.0% | 0.25 |" in out


def tables(markdown):
    """{title: [head, row, ...]} of every table in a Markdown report, cells stripped."""
    out = {}
    title = None
    for line in markdown.splitlines():
        if line.startswith("### "):
            title = line[4:]
            out[title] = []
        elif line.startswith("|") and title is not None and not line.startswith("|---"):
            out[title].append([c.strip() for c in line.strip()[1:-1].split(" | ")])
    return out


def small_run(python="3.11.7", when="2026-11-22T10:00:00"):
    """A small run whose every cell is worked out by hand in the tests below."""
    ceiling = rf.echo("x", 1, [1.0])
    ceiling.update(group="ceiling", name="test_ceiling[c100-64B]",
                   fullname="tests/bench/test_ceiling.py::test_ceiling[c100-64B]",
                   extra_info={"impl": "loadgen_ceiling", "connections": 100, "size": 64, "msgs_per_s": 250000.4,
                               "engine_msgs_per_s": 199999.6, "engine_to_ceiling": 0.79996,
                               "loadgen_cpu_share": 0.974})
    fallback = rf.echo("asyncio_protocol", 10, [10240.0] * 2, size=1024)
    del fallback["extra_info"]["mib_per_s"]  # the table computes it: 10240 x 1024 / 2^20 = 10.0
    return rf.run([
        rf.echo("native_epoll", 10, [90000.0, 110000.0], cpu_us=4.0, latency_p50_us=12.345,
                latency_p95_us=40.06, latency_p99_us=1234.56, server_cpu_share=0.5, loadgen_cpu_share=0.95,
                loadgen_bound=True, server_user_share=None, fairness_jain=0.98765, fairness_min=5,
                fairness_max=1234, starving_connections=2, mib_per_s=99000 * 64 / 2 ** 20),
        rf.echo("native_epoll", 100, [80000.0] * 2, cpu_us=5.0),
        rf.echo("uvloop_protocol", 10, [100000.0] * 2, cpu_us=4.5),
        rf.echo("uvloop_protocol", 100, [30000.0] * 2, cpu_us=6.25, server_user_share=0.255),
        rf.echo("asyncio_protocol", 10, [22000.0] * 3, cpu_us=24.5),
        rf.echo("asyncio_protocol", 100, [40000.0] * 2, cpu_us=25.0),
        rf.echo("native_epoll", 10, [50000.0] * 2, size=1024, mib_per_s=50000 * 1024 / 2 ** 20),
        fallback,
        ceiling,
        rf.switch("yield_from-d1", [50.0], group="depth-sweep", depth=1),
        rf.switch("yield_from-d2", [60.0], group="depth-sweep", depth=2),
        rf.switch("yield_from-d4", [100.0], group="depth-sweep", depth=4),
    ], python=python, when=when)


def test_report_cells_are_the_hand_computed_values(tmp_path, capsys):
    rf.save(tmp_path, "0001_small", small_run())
    assert cli.main(["report", "--storage", str(tmp_path), "0001"]) == 0
    t = tables(capsys.readouterr().out)
    where = "TCP, 64B messages"
    head = ["implementation", "10 conns", "100 conns"]
    # order: by the geometric mean of each row's rates (native 88,994, uvloop 54,772, asyncio
    # 29,665), not by the first column (uvloop fastest) nor the last (asyncio before uvloop)
    # native at 10: 2 x 10000 round trips in 10000/90000 + 10000/110000 s = 99,000 msgs/s;
    # ± t(1) x stdev / sqrt(2) / mean = 12.706 x 14142.1 / 1.41421 / 100000 = 127.1 %;
    # ≥: the load generator was bound
    assert t[f"Echo throughput (msgs/s) — {where}"] == [
        head, ["native_epoll", "≥99,000 ± 127.1%", "80,000 ± 0.0%"],
        ["uvloop_protocol", "100,000 ± 0.0%", "30,000 ± 0.0%"],
        ["asyncio_protocol", "22,000 ± 0.0%", "40,000 ± 0.0%"]]
    # slowest = 1: at 10 conns 99000/22000 = 4.5, 100000/22000 = 4.545; at 100 conns /30000
    assert t[f"Relative speed — {where}"] == [
        head, ["native_epoll", "4.5", "2.7"], ["uvloop_protocol", "4.5", "1.0"], ["asyncio_protocol", "1.0", "1.3"]]
    assert t[f"Ratio to native_epoll — {where}"] == [
        head, ["native_epoll", "1.00", "1.00"], ["uvloop_protocol", "1.01", "0.38"],
        ["asyncio_protocol", "0.22", "0.50"]]
    # latency: the saved µs, one decimal, thousands separated; the factory's own for the others
    # (p99 = 100 + 1000 x conns / rate: 101.25 for native at 100; p50 = p99 / 3, p95 = 0.8 p99;
    # halves round to even: 33.75 -> 33.8, 101.25 -> 101.2)
    assert t[f"Latency p50 (µs) — {where}"][1] == ["native_epoll", "12.3", "33.8"]
    assert t[f"Latency p95 (µs) — {where}"][1] == ["native_epoll", "40.1", "81.0"]
    assert t[f"Latency p99 (µs) — {where}"] == [
        head, ["native_epoll", "1,234.6", "101.2"], ["uvloop_protocol", "100.1", "103.3"],
        ["asyncio_protocol", "100.5", "102.5"]]
    # CPU per round trip and its excess over native_epoll's at the same connections
    assert t[f"Server CPU per round trip (µs) and excess over native_epoll — {where}"] == [
        head, ["native_epoll", "4.00 (+0.00)", "5.00 (+0.00)"], ["uvloop_protocol", "4.50 (+0.50)", "6.25 (+1.25)"],
        ["asyncio_protocol", "24.50 (+20.50)", "25.00 (+20.00)"]]
    # busy: server / load generator; no user share when too few ticks; 25.5 % shows as 26 %
    assert t[f"CPU busy: server / load generator, and the server's user share — {where}"] == [
        head, ["native_epoll", "50% / 95% · lg-bound", "99% / 50% · user 30%"],
        ["uvloop_protocol", "99% / 50% · user 30%", "99% / 50% · user 26%"],
        ["asyncio_protocol", "99% / 50% · user 30%", "99% / 50% · user 30%"]]
    assert t[f"Fairness — {where}"][1] == ["native_epoll", "0.988 [5–1,234] ⚠ 2 starving", "0.999 [90–110]"]
    # size: the saved MiB/s (99000 x 64 / 2^20 = 6.04; 50000 x 1024 / 2^20 = 48.83), or
    # computed when a run did not save it (10240 x 1024 / 2^20 = 10.0); rows by the geometric
    # mean of their own cells: uvloop 100,000, native 70,356, asyncio 15,010
    assert t["Echo by message size — TCP, 10 connections"] == [
        ["implementation", "64B", "1KiB"], ["uvloop_protocol", "100,000 · 1.0 MiB/s", ""],
        ["native_epoll", "≥99,000 · 6.0 MiB/s", "50,000 · 48.8 MiB/s"],
        ["asyncio_protocol", "22,000 · 1.0 MiB/s", "10,240 · 10.0 MiB/s"]]
    assert t["Load generator ceiling"] == [
        ["scale", "minimal client msgs/s", "engine msgs/s", "engine / minimal", "load generator CPU"],
        ["100 conns × 64B", "250,000", "200,000", "0.80 ⚠ below 0.95", "97%"]]
    # depth 1, 2, 4 at 50, 60, 100 ns: mean depth 7/3, mean ns 70; Sxy = 80, Sxx = 42/9:
    # slope 120/7 = 17.14 ns per level, intercept 70 - 17.14 x 7/3 = 30.0; residuals 20/7,
    # -30/7, 10/7: SSres = 1400/49, SStot = 1400, r² = 1 - 1/49 = 0.9796
    assert t["Depth sweep: cost per extra level"] == [
        ["chain", "slope (ns per level)", "intercept (ns)", "r²", "depths"],
        ["yield_from", "17.14", "30.0", "0.9796", "1, 2, 4"]]


def test_report_by_python_slopes_and_cpu_are_the_hand_computed_values(tmp_path, capsys):
    old = small_run(python="3.10.13")
    new = small_run(python="3.12.1")
    # 3.10: exactly 40 + 20 ns per level; no await chain
    old["benchmarks"] = [b for b in old["benchmarks"] if "depth" not in b["extra_info"]] + [
        rf.switch(f"yield_from-d{d}", [40.0 + 20.0 * d], group="depth-sweep", depth=d) for d in (1, 8, 32)]
    # 3.12: the await chain at two depths, (130 - 100) / (4 - 1) = 10 ns per level
    new["benchmarks"] += [rf.switch("await-d1", [100.0], group="depth-sweep", depth=1),
                          rf.switch("await-d4", [130.0], group="depth-sweep", depth=4)]
    for b in new["benchmarks"]:
        if b["extra_info"].get("impl") == "asyncio_protocol" and b["extra_info"]["connections"] == 100:
            b["extra_info"]["server_cpu_us_per_msg"] = 18.125
    rf.save(tmp_path, "0001_m", old, "Linux-CPython-3.10-64bit")
    rf.save(tmp_path, "0001_m", new, "Linux-CPython-3.12-64bit")
    assert cli.main(["report", "--by-python", "--storage", str(tmp_path), "*/*_m"]) == 0
    t = tables(capsys.readouterr().out)
    assert t["Depth sweep: ns per extra level of delegation"] == [
        ["chain", "Python 3.10.13", "Python 3.12.1"], ["await", "", "10.0"], ["yield_from", "20.0", "17.1"]]
    # rows in natural order of the labels; 18.125 rounds to 18.12 (binary 18.125 is exact: half to even)
    assert t["Server CPU per round trip (µs) — 100 connections × 64B over TCP"] == [
        ["implementation", "Python 3.10.13", "Python 3.12.1"], ["asyncio_protocol", "25.00", "18.12"],
        ["native_epoll", "5.00", "5.00"], ["uvloop_protocol", "6.25", "6.25"]]
    assert t["Echo msgs/s — 10 connections × 64B over TCP"][1:] == [
        ["asyncio_protocol", "22,000 ± 0.0%", "22,000 ± 0.0%"], ["native_epoll", "≥99,000 ± 127.1%", "≥99,000 ± 127.1%"],
        ["uvloop_protocol", "100,000 ± 0.0%", "100,000 ± 0.0%"]]


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
    from pyconcbench.report import plots

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
    assert "| x\\|y | &lt;b> |" in md and "|---|---:|" in md and "T &lt;x>" in md
    h = t.html()
    assert "&lt;b&gt;" in h and "T &lt;x&gt;" in h and "n &amp; m" in h


def test_fairness_note_states_the_starving_rule_the_code_applies():
    from pyconcbench import loadgen

    info = rf.echo("selectors", 100, [50000.0] * 2, starving_connections=1)["extra_info"]
    note = next(t.note for t in report.echo_scale_tables([info], "tcp", 64) if t.title.startswith("Fairness"))
    assert loadgen.STARVING_SHARE == 0.10
    assert "fewer than 10% of the mean round trips per connection" in note
    assert "no round trip" not in note  # the old note: a connection with 1 round trip of 100 is starving too
    assert loadgen.fairness([1, 100, 100, 99]).starving == 1


def test_png_names_from_the_run_stay_in_the_folder_and_dollars_stay_text(tmp_path, capsys, matplotlib_fonts):
    # a hostile saved run (issue 16): its transport is in the PNG names, its labels in the legends
    benches = [rf.echo(impl, c, [100.0 * c, 101.0 * c], transport="../../escaped", label=label)
               for impl, label in (("selectors", "$\\frac$"), ("threads", "threads")) for c in (1, 10)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(rf.run(benches)))
    path = str(path)
    out = tmp_path / "png"
    assert cli.main(["report", path, "--png", str(out)]) == 0, capsys.readouterr().err
    written = sorted(p.name for p in out.iterdir())
    assert written and all("/" not in n and not n.startswith(".") for n in written), written
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.parent.glob("*escaped*"))


def memory_run():
    """Three servers at 10 and 1,000 connections with their memory (idle 10 MiB each), and one
    saved before the memory was measured."""
    per_conn = {"native_epoll": (200000.0, {10: 0.0, 1000: 1.2}), "asyncio_protocol": (40000.0, {10: 5.0, 1000: 4.5}),
                "threads": (20000.0, {10: 80.0, 1000: 70.0})}
    benches = [rf.echo(impl, c, [rate] * 3, rss=[10240 + round(kib * c)] * 3, rss_idle=10240)
               for impl, (rate, kibs) in per_conn.items() for c, kib in kibs.items()]
    benches.append(rf.echo("selectors", 10, [50000.0] * 3))
    return rf.run(benches)


def test_report_memory_table_is_the_hand_computed_values(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(memory_run()))
    assert cli.main(["report", str(path)]) == 0
    t = tables(capsys.readouterr().out)
    # idle 10,240 KiB = 10.0 MiB; threads at 10: 10,240 + 800 = 11,040 KiB = 10.78 MiB, at 1,000:
    # 10,240 + 70,000 = 80,240 KiB = 78.36 MiB; asyncio at 1,000: 14,740 KiB = 14.39 MiB; native
    # at 1,000: 11,440 KiB = 11.17 MiB; selectors (saved before memory was measured): blank
    assert t["Server memory: idle → with the connections open (MiB) · per connection (KiB) — TCP, 64B messages"] == [
        ["implementation", "10 conns", "1,000 conns"],
        ["native_epoll", "10.0 → 10.0 MiB · 0.0 KiB/conn", "10.0 → 11.2 MiB · 1.2 KiB/conn"],
        ["selectors", "", ""],
        ["asyncio_protocol", "10.0 → 10.0 MiB · 5.0 KiB/conn", "10.0 → 14.4 MiB · 4.5 KiB/conn"],
        ["threads", "10.0 → 10.8 MiB · 80.0 KiB/conn", "10.0 → 78.4 MiB · 70.0 KiB/conn"]]


def test_report_of_a_run_without_memory_has_no_memory_table(storage, capsys):
    assert cli.main(["report", "--storage", str(storage), "0001"]) == 0
    out = capsys.readouterr().out
    assert "Echo throughput (msgs/s)" in out and "Server memory" not in out


def test_report_plots_memory_per_connection(tmp_path, capsys, matplotlib_fonts):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(memory_run()))
    png, page = tmp_path / "png", tmp_path / "report.html"
    assert cli.main(["report", str(path), "--png", str(png), "--html", str(page)]) == 0
    assert sorted(p.name for p in png.iterdir()) == [
        "echo-kib-per-conn-vs-connections-tcp-64B.png", "echo-msgs-vs-connections-tcp-64B.png",
        "echo-p95-vs-connections-tcp-64B.png"]
    plot = png / "echo-kib-per-conn-vs-connections-tcp-64B.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10000
    text = page.read_text()
    assert text.count("src='data:image/png;base64,") == 3
    assert "<figcaption>echo-kib-per-conn-vs-connections-tcp-64B.png</figcaption>" in text
    assert "no plot: KiB per connection" not in capsys.readouterr().err
    # a run saved before the memory was measured: said why there is no such plot
    old = tmp_path / "old.json"
    old.write_text(json.dumps(rf.run([rf.echo("threads", c, [1000.0] * 3) for c in (10, 100)])))
    assert cli.main(["report", str(old), "--png", str(tmp_path / "old")]) == 0
    assert "no plot: KiB per connection vs connections: no server's memory" in capsys.readouterr().err
    assert not any("kib" in p.name for p in (tmp_path / "old").iterdir())


def openloop_run(p99_at_90=(900.0, 950.0, 1000.0)):
    return rf.run([rf.openloop("native_epoll", f, 200000.0, f * 200000.0, [60.0, 62.0, 64.0] if f < 0.9 else list(p99_at_90))
                   for f in (0.25, 0.5, 0.9)]
                  + [rf.openloop("asyncio_protocol", f, 120000.0, min(f, 0.8) * 120000.0, [90.0, 95.0, 99.0])
                     for f in (0.25, 0.5, 0.9)])


def test_report_open_loop_section_and_curves(tmp_path, capsys, matplotlib_fonts):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(openloop_run()))
    png = tmp_path / "png"
    assert cli.main(["report", str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "## Open loop: latency at a fixed offered rate" in out
    assert "### Open loop, 100 connections x 64B over tcp" in out
    # asyncio_protocol at 90 % of 120,000: asked 108,000, achieved 96,000 (0.89 of it): not held
    assert "| asyncio_protocol | 108,000 | 90% | 96,000 | NO | 31.7 | 95.0 |" in out
    assert "| native_epoll | 50,000 | 25% | 50,000 | yes |" in out
    names = sorted(p.name for p in png.iterdir())
    assert names == ["openloop-distribution-tcp-64-100-1-25pct.png", "openloop-distribution-tcp-64-100-1-50pct.png",
                     "openloop-distribution-tcp-64-100-1-90pct.png", "openloop-latency-vs-rate-tcp-64-100-1.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10000 for p in png.iterdir())


def test_the_gate_reads_the_open_loops_corrected_latency(tmp_path, capsys):
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(openloop_run()))
    new.write_text(json.dumps(openloop_run(p99_at_90=(1900.0, 2000.0, 2100.0))))
    assert cli.main(["compare", str(base), str(new), "--fail-on", "latency_p99:+25%",
                     "--fail-correction", "none"]) == 1
    out = capsys.readouterr().out
    assert "test_openloop[native_epoll-c100-64B-90pct]" in out and "latency_p99" in out
