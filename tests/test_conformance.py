"""One conformance suite over every echo server implementation: the properties of
``pyconcbench.conformance`` (what ``pyconcbench check IMPL`` runs), each against every id in the
registry (as uvloop runs one TCP test class on both loops), so a new concurrency model, or a new
property, gets the whole suite for free.  A server that cannot run here (missing package or
toolchain) is a skip with the reason; a model that cannot have a property by design is an xfail
that says why.  Two properties are checked in test_serve.py instead, over TCP and UNIX and with
the server's usage report besides (``IN_TEST_SERVE``).
"""
import inspect

import pytest

import test_serve
from skipping import start_or_skip
from pyconcbench import conformance, harness, servers

IMPLS = list(servers.IMPLS)

#: Models that cannot have a property by design: {property name: {impl: reason}}.
XFAIL = {}

#: Properties checked by a test of test_serve.py (which asserts more about them): its name.
IN_TEST_SERVE = {"echo": "test_echo_conformance", "sigterm": "test_sigterm_with_connections_open_exits_promptly"}

PROPERTIES = [name for name in conformance.names() if name not in IN_TEST_SERVE]


@pytest.fixture(params=IMPLS)
def server(request):
    impl = request.param
    reason = XFAIL.get(request.node.callspec.params.get("name"), {}).get(impl)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    proc = harness.ServerProcess(impl, cpu=None)
    start_or_skip(proc)
    try:
        yield proc
    finally:
        proc.stop()


def check(prop, server):
    """Runs property ``prop``: PropertyFailed (its one line) fails the test; a property this
    machine cannot check is a skip saying why."""
    try:
        prop(server)
    except conformance.PropertyUnchecked as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", PROPERTIES)
def test_property(server, name):
    check(conformance.by_name(name), server)


def test_every_property_is_checked_over_every_implementation():
    """The properties this file leaves out are each run by the test of test_serve.py named for
    them, which is parametrized over every implementation."""
    for name, test_name in IN_TEST_SERVE.items():
        assert name in conformance.names(), f"{name} is no longer a property"
        test = getattr(test_serve, test_name)
        assert f"conformance.{name}(" in inspect.getsource(test), f"{test_name} does not run {name}"
        impls = [m.args[1] for m in getattr(test, "pytestmark", []) if m.name == "parametrize" and m.args[0] == "impl"]
        assert impls == [IMPLS], f"{test_name} is not parametrized over every implementation"
