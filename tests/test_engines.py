"""Several load engine processes as one (pyconcbench.engines.EngineSet): connections split, each
engine on its own source address, rounds started together and merged exactly."""
import re
import subprocess

import pytest

from pyconcbench import _native, engines, harness, loadgen
from pyconcbench.loadgen import LoadError, LoadSpec

from brokenservers import BrokenServer


@pytest.fixture
def native():
    with harness.ServerProcess("native_epoll", cpu=None) as server:
        yield server


def spec_for(server, **kw):
    host, port = server.address
    return LoadSpec(host=host, port=port, **kw)


def test_three_engines_are_one_load(native):
    spec = spec_for(native, connections=300, messages=30000, warmup_messages=600)
    with engines.EngineSet(spec, 3) as es:
        peers = subprocess.run(["ss", "-tnH", "state", "established", "dst", f"{native.address[0]}:{native.address[1]}"],
                               capture_output=True, text=True).stdout
        r = es.round()
        p = es.round(messages=6000, rate=6000.0, arrival="poisson")
    assert r.completed == 30000 and r.connections == 300 and r.bytes == 30000 * 64
    assert r.histogram.count == 30000 and r.fairness.starving == 0
    assert p.completed == p.sent == 6000 and p.histogram_uncorrected.count == 6000 and p.rate == 6000.0
    # engine k binds 127.0.0.(k+1): 100 connections from each address
    sources = [line.split()[2].rsplit(":", 1)[0] for line in peers.splitlines() if line.strip()]
    assert {a: sources.count(a) for a in set(sources)} == {"127.0.0.1": 100, "127.0.0.2": 100, "127.0.0.3": 100}
    usage = native.stop()
    assert usage.accepted == 300 and usage.bytes == (600 + 30000 + 6000) * 64


def test_merged_percentiles_are_those_of_every_value():
    values = [[1_000 + 37 * i for i in range(5000)], [90_000 + 11 * i for i in range(3000)], [5_000_000]]
    parts, whole = [], _native.Histogram()
    for vals in values:
        h = _native.Histogram()
        h.record_many(vals)
        whole.record_many(vals)
        parts.append(_native.Histogram.from_bytes(h.to_bytes()))  # as it travels between processes
    merged = _native.Histogram()
    for h in parts:
        merged.merge(h)
    assert merged.summary() == whole.summary()
    assert merged.min == 1000 and merged.max == 5_000_000


@pytest.mark.parametrize("data, fragment", [
    (b"", "wrong tag or length"),
    (b"PCBHIST2" + bytes(len(_native.Histogram().to_bytes()) - 8), "wrong tag or length"),
])
def test_a_histogram_that_is_not_one_is_refused(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        _native.Histogram.from_bytes(data)


def test_a_histogram_whose_counts_do_not_add_up_is_refused():
    h = _native.Histogram()
    h.record_many([1000, 2000])
    raw = bytearray(h.to_bytes())
    raw[8 + 1000 // 1 * 0 + 8 * 100] ^= 1  # a count somewhere in the buckets
    with pytest.raises(ValueError, match="do not add up|outside"):
        _native.Histogram.from_bytes(bytes(raw))


def test_an_engine_that_fails_is_named(native):
    with BrokenServer("flip", at=300) as server:
        with engines.EngineSet(spec_for(server, connections=4, messages=100, warmup_messages=0), 2) as es:
            with pytest.raises(LoadError) as info:
                es.round(messages=400)
    assert info.value.kind == "payload_mismatch"
    # the server's first connection is either engine's first (they connect at once)
    assert re.match(r"load payload_mismatch: engine [12] of 2: connection 0: payload mismatch in message \d+",
                    str(info.value)), str(info.value)


def test_round_trips_split_unevenly_still_add_up(native):
    # 1,000 over 3 engines: 334 + 333 + 333 (a share of each rounded would ask for 999)
    with engines.EngineSet(spec_for(native, connections=3, messages=1000, warmup_messages=30), 3) as es:
        assert es.round().completed == 1000
        assert es.round(messages=100).completed == 100
        with pytest.raises(ValueError, match="2 round trips cannot be split over 3 engines"):
            es.round(messages=2)


def test_splitting():
    assert engines.shares(10, 3) == [4, 3, 3] and sum(engines.shares(60000, 4)) == 60000
    assert engines.engines_for(100, limit=19936) == 1
    assert engines.engines_for(19936, limit=19936) == 1
    assert engines.engines_for(60000, limit=19936) == 4
    assert engines.engines_for(60000, limit=100_000) == 3  # the port range, not the fds
    assert engines.source_for("127.0.0.1", 0) is None and engines.source_for("127.0.0.1", 2) == "127.0.0.3"
    assert engines.source_for("::1", 3) is None


@pytest.mark.parametrize("changes, fragment", [
    (dict(source="10.0.0.1"), "LoadSpec.source: refusing host '10.0.0.1': not a loopback address"),
    (dict(source="::1"), "is not of the family of host '127.0.0.1'"),
    (dict(transport="unix", path="/tmp/x", source="127.0.0.2"), "is for tcp only"),
])
def test_bad_sources_are_refused(changes, fragment):
    with pytest.raises(ValueError) as info:
        LoadSpec(port=1, **changes)
    assert fragment in str(info.value)


def test_the_engine_binds_its_source(native):
    spec = spec_for(native, connections=20, messages=200, warmup_messages=0, source="127.0.0.9")
    with loadgen.LoadSession(spec) as s:
        peers = subprocess.run(["ss", "-tnH", "state", "established", "src", "127.0.0.9"],
                               capture_output=True, text=True).stdout
        assert s.round().completed == 200
    assert len([line for line in peers.splitlines() if line.strip()]) == 20
