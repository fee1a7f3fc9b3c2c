"""Property tests of the C binding's arguments and of LoadSpec: whatever they are given, they
accept it or refuse it with one clear exception (ValueError naming the argument, or TypeError),
never crash, never wrap; accepted means exactly the documented ranges.  `make test` runs them
again under AddressSanitizer and UBSan (float-cast overflow included), where an out-of-bounds
access or an overflowing conversion aborts the run."""
import math
import os

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from pyconcbench import _native
from pyconcbench.loadgen import LoadSpec

from brokenservers import BrokenServer

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALLOWED = sorted(os.sched_getaffinity(0))
# The documented limits, written out (test_binding.py checks the modules export the same).
CPU_SETSIZE = 1024
MAX_CONNECTIONS = 1 << 20
MAX_SIZE = 1 << 20
MAX_PAYLOAD = 2 << 30
MAX_MESSAGES = 2 ** 63 - 1
MAX_ERRORS = 2 ** 32 - 1
MAX_ITERATIONS = 10 ** 7
MAX_COUNT = 2 ** 62
HIST_MIN_NS, HIST_MAX_NS = 100, 100 * 10 ** 9

#: Integers around every edge that matters to C: 0, +-1, 2**31, 2**32, 2**63, 2**64 and beyond.
EDGES = [0, 1, -1, 2, 64, 65535, 65536, (1 << 20), (1 << 20) + 1, 2 ** 31 - 1, 2 ** 31,
         2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 2 ** 64 + 1,
         -2 ** 31, -2 ** 63, -2 ** 64, 10 ** 30, -10 ** 30]
wild_ints = st.one_of(st.sampled_from(EDGES), st.integers(), st.integers(-5, 70_000))
non_ints = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.just(b"1"))
wild_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from([0.0, -0.0, 1e-300, 1e300, -1e300, 1e9, 1e10, 9.3e9]))


def is_int(v):
    return isinstance(v, int)  # bool included: the binding takes anything with __index__


def within(v, lo, hi):
    return is_int(v) and lo <= v <= hi


@st.composite
def mostly_good(draw, good, wild):
    """Arguments where at most two are drawn wild, the rest good: both accepted and refused
    cases come up often (drawing each wild or good alike, nearly every case is refused)."""
    names = draw(st.sets(st.sampled_from(sorted(good)), max_size=2))
    return {k: draw(wild[k] if k in names else good[k]) for k in good}


# ---- LoadSpec ----------------------------------------------------------------------------

SPEC_GOOD = dict(connections=st.integers(1, 100), size=st.integers(1, 4096),
                 messages=st.integers(0, 10_000), warmup_messages=st.integers(0, 100),
                 max_errors=st.integers(0, 10), seed=st.integers(0, 2 ** 64 - 1),
                 port=st.integers(1, 65535), cpu=st.one_of(st.none(), st.sampled_from(ALLOWED)),
                 duration=st.floats(0.0, 10.0), stall_timeout=st.floats(0.1, 10.0),
                 deadline=st.floats(0.1, 10.0), connect_timeout=st.floats(0.1, 10.0))
SPEC_WILD = {k: st.one_of(wild_floats, non_ints) if k in ("duration", "stall_timeout", "deadline",
                                                           "connect_timeout")
             else st.one_of(wild_ints, non_ints) for k in SPEC_GOOD}


SPEC_BASE = dict(connections=1, size=64, messages=1, warmup_messages=0, max_errors=0, seed=0, port=9,
                 cpu=None, duration=0.0, stall_timeout=1.0, deadline=1.0, connect_timeout=1.0)


@FUZZ
@given(mostly_good(SPEC_GOOD, SPEC_WILD))
@example(dict(SPEC_BASE, messages=2 ** 63))
@example(dict(SPEC_BASE, warmup_messages=2 ** 64 + 1))
@example(dict(SPEC_BASE, max_errors=2 ** 32))
@example(dict(SPEC_BASE, connections=(1 << 20) + 1, size=1))
def test_loadspec_accepts_only_what_the_engine_can_run(fields):
    try:
        spec = LoadSpec(**fields)
    except ValueError as exc:
        event("refused")
        assert str(exc).startswith("LoadSpec."), exc
        assert "\n" not in str(exc)
        return
    event("accepted")
    assert 1 <= spec.connections <= MAX_CONNECTIONS
    assert 1 <= spec.size <= MAX_SIZE
    assert spec.connections * spec.size <= MAX_PAYLOAD
    assert 0 <= spec.messages <= MAX_MESSAGES and 0 <= spec.warmup_messages <= MAX_MESSAGES
    assert 0 <= spec.max_errors <= MAX_ERRORS and 0 <= spec.seed < 2 ** 64
    for name in ("duration", "stall_timeout", "deadline", "connect_timeout"):
        assert math.isfinite(getattr(spec, name))
    # and the engine takes every spec LoadSpec takes (its own checks agree)
    _native.Load("tcp", spec.host, spec.port, spec.connections, spec.size,
                 connect_timeout=float(spec.connect_timeout), cpu=-1 if spec.cpu is None else spec.cpu,
                 max_errors=spec.max_errors, seed=spec.seed)


# ---- _native.Load ------------------------------------------------------------------------

def load_expected(family, address, port, connections, size, connect_timeout, cpu, max_errors, seed):
    """None when _native.Load should accept these, else the exception type it should raise (the
    first bad integer, in the order of the signature, decides)."""
    for value, lo, hi in ((port, 0, 65535), (connections, 1, MAX_CONNECTIONS), (size, 1, MAX_SIZE),
                          (cpu, -1, CPU_SETSIZE - 1), (max_errors, 0, MAX_ERRORS), (seed, 0, 2 ** 64 - 1)):
        if not is_int(value):
            return TypeError
        if not lo <= value <= hi:
            return ValueError
    if connections * size > MAX_PAYLOAD or not connect_timeout > 0:
        return ValueError
    if family == "unix":
        return None if 0 < len(address.encode()) < 108 else ValueError
    loopback = address in ("127.0.0.1", "127.1.2.3", "::1")
    return None if family == "tcp" and loopback and port >= 1 else ValueError


LOAD_GOOD = dict(family=st.just("tcp"), address=st.sampled_from(["127.0.0.1", "127.1.2.3", "::1"]),
                 port=st.integers(1, 65535), connections=st.integers(1, 64), size=st.integers(1, 4096),
                 connect_timeout=st.floats(0.1, 100.0), cpu=st.integers(-1, 3),
                 max_errors=st.integers(0, 10), seed=st.integers(0, 2 ** 64 - 1))
LOAD_WILD = dict(family=st.sampled_from(["tcp", "unix", "udp", ""]),
                 address=st.sampled_from(["127.0.0.1", "::1", "10.0.0.1", "/tmp/pcb.sock", "", "x" * 120]),
                 connect_timeout=wild_floats,
                 **{k: st.one_of(wild_ints, non_ints)
                    for k in ("port", "connections", "size", "cpu", "max_errors", "seed")})


@FUZZ
@given(mostly_good(LOAD_GOOD, LOAD_WILD))
def test_native_load_accepts_exactly_its_ranges(args):
    expected = load_expected(**args)
    family, address, connect_timeout = args.pop("family"), args.pop("address"), args.pop("connect_timeout")
    try:
        load = _native.Load(family, address, args.pop("port"), args.pop("connections"), args.pop("size"),
                            connect_timeout=connect_timeout, **args)
    except (ValueError, TypeError) as exc:
        event(f"refused: {type(exc).__name__}")
        assert "\n" not in str(exc)
        assert type(exc) is expected, f"refused with {exc!r}, expected {expected}"
        return
    event("accepted")
    assert expected is None, f"accepted, expected {expected.__name__}"
    assert not load.is_open


# ---- Load.phase --------------------------------------------------------------------------

def test_phase_accepts_or_refuses_every_argument():
    """Accepted phases are kept short (a few messages, or under 50 ms) whatever their timeouts:
    they must end ok, timeouts of 1e300 s or infinity included."""
    with BrokenServer("echo") as server:
        load = _native.Load("tcp", server.address[0], server.address[1], 2, 64)
        assert load.open()["status"] == "ok"
        seen = set()
        try:
            @FUZZ
            @given(messages=st.one_of(st.integers(0, 20), wild_ints.filter(lambda v: v < 0 or v > 20), non_ints),
                   duration=st.one_of(st.floats(0.0, 0.05), wild_floats),
                   stall_timeout=st.one_of(st.floats(0.5, 10.0), wild_floats),
                   deadline=st.one_of(st.floats(0.5, 10.0), wild_floats))
            def check(messages, duration, stall_timeout, deadline):
                if is_int(messages) and messages == 0:
                    assume(not duration > 0.05)
                ok_messages = within(messages, 0, MAX_MESSAGES)
                accepted = (ok_messages and (messages > 0 or duration > 0)
                            and stall_timeout > 0 and deadline > 0)
                assume(not (accepted and messages > 20))  # it would run to its deadline
                try:
                    res = load.phase(messages, duration, stall_timeout, deadline)
                except (ValueError, TypeError) as exc:
                    seen.add("refused")
                    assert "\n" not in str(exc)
                    assert not accepted, f"refused with {exc!r}"
                    assert (type(exc) is TypeError) == (not is_int(messages)), exc
                    return
                seen.add("accepted")
                assert accepted, "accepted"
                assert res["status"] == "ok", res["message"]
                if messages:
                    assert res["completed"] == messages

            check()
        finally:
            load.close()
    assert seen == {"accepted", "refused"}  # both kinds of case came up


# ---- Histogram ---------------------------------------------------------------------------

@FUZZ
@given(st.lists(st.tuples(st.one_of(wild_ints, st.integers(0, 2 * 10 ** 11)),
                          st.one_of(st.just(1), wild_ints, st.just(MAX_COUNT))), max_size=20))
def test_histogram_record_counts_everything_or_refuses(records):
    h = _native.Histogram()
    totals = {True: 0, False: 0}  # in range, out of range
    for ns, count in records:
        kept_expected = HIST_MIN_NS <= ns <= HIST_MAX_NS
        try:
            kept = h.record(ns, count)
        except ValueError as exc:
            assert not within(count, 1, MAX_COUNT), exc
            assert str(exc).startswith("count: ") and "\n" not in str(exc)
            continue
        except OverflowError as exc:  # the 64-bit totals would wrap
            assert within(count, 1, MAX_COUNT) and totals[kept_expected] + count >= 2 ** 64, exc
            assert str(exc).startswith("count: ") and "\n" not in str(exc)
            continue
        assert within(count, 1, MAX_COUNT)
        assert kept == kept_expected
        totals[kept] += count
    assert h.count == totals[True] and h.out_of_range == totals[False]
    s = h.summary()
    assert s["count"] == totals[True] and s["out_of_range"] == totals[False]


# ---- the cache-line probe ----------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cpu_a=st.one_of(st.sampled_from(ALLOWED), wild_ints), cpu_b=st.one_of(st.sampled_from(ALLOWED), wild_ints),
       iterations=st.one_of(st.integers(1, 300), wild_ints, non_ints))
def test_cacheline_rtt_accepts_or_refuses(cpu_a, cpu_b, iterations):
    valid = (cpu_a in ALLOWED and cpu_b in ALLOWED and is_int(iterations)
             and 1 <= iterations <= MAX_ITERATIONS)
    if valid:
        assume(iterations <= 300)  # keep the accepted probes short
    try:
        ns = _native.cacheline_rtt(cpu_a, cpu_b, iterations)
    except (ValueError, TypeError) as exc:
        event("refused")
        assert not valid, f"refused with {exc!r}"
        assert "\n" not in str(exc)
        return
    event("accepted")
    assert valid and ns > 0
