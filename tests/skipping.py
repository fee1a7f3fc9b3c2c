"""The one rule for skipping, shared by the tests: skip only when a tool or package is absent
(not installed, not on PATH, not importable on this Python); fail, in one line, when our own
code does not import or build."""
import pytest

from pyconcbench import harness
from pyconcbench import zmq as pcbzmq


def start_or_skip(server):
    """``server.start()``; skips on harness.ServerUnavailable, fails on harness.ServerBroken."""
    broken = None
    try:
        return server.start()
    except harness.ServerUnavailable as exc:  # not installed, not on PATH, not on this Python
        pytest.skip(str(exc))
    except harness.ServerBroken as exc:  # our own code does not import or build: never a skip
        broken = str(exc)
    pytest.fail(broken, pytrace=False)  # outside the except: no chained traceback


def zmq_unavailable(name):
    """The skip reason of ZeroMQ mode ``name`` (a package not installed or not importable on
    this Python), or None; fails the test, in one line, when the mode's own module does not
    import."""
    broken = None
    try:
        pcbzmq.MODES[name].check()
    except pcbzmq.Unavailable as exc:
        return str(exc)
    except pcbzmq.Broken as exc:
        broken = str(exc)
    if broken is not None:
        pytest.fail(broken, pytrace=False)  # outside the except: no chained traceback
    return None
