"""pyconcbench.zmq thread placement, read back from /proc independently of the package.

For every mode and both placements: every thread of the measurement -- the calling (client)
thread, every thread that appeared in this process while the session was open (libzmq's
``ZMQbg/IO/0`` and ``ZMQbg/Reaper``, an in-process server thread), and every thread of the
``pyzmq_process`` server process -- runs where the placement says (``1cpu``: all on the client
CPU; ``2cpu``: the client thread on the client CPU, everything else on the server CPU), and
close() restores the calling thread's affinity.  Threads that existed before the session
opened (pytest's, an earlier test's) are left out by their ids."""
import os
import threading
import time

import pytest

from skipping import zmq_unavailable
from pyconcbench import zmq as pcbzmq
from pyconcbench.zmq import Session

ALLOWED = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs to place threads on")
#: (server CPU, client CPU); the client CPU is the higher one, as the plugin's default 0,1.
CPUS = tuple(ALLOWED[:2]) if len(ALLOWED) >= 2 else (0, 1)
LIBZMQ_THREADS = {"ZMQbg/IO/0", "ZMQbg/Reaper"}


_unavailable = zmq_unavailable


@pytest.fixture(params=list(pcbzmq.MODES))
def mode(request):
    reason = _unavailable(request.param)
    if reason is not None:
        pytest.skip(reason)
    return request.param


@pytest.fixture(scope="module", autouse=True)
def libuv_global_pipe():
    """libuv opens one process-wide pipe (its signal pipe) with the first uvloop loop and keeps
    it: open it before the project's fd-leak check starts counting."""
    try:
        import uvloop
    except Exception:
        yield
        return
    uvloop.new_event_loop().close()
    yield


@pytest.fixture(autouse=True)
def affinity_restored():
    before = os.sched_getaffinity(0)
    yield before
    assert os.sched_getaffinity(0) == before, "the calling thread's affinity was not restored"


# ---- reading /proc (deliberately not pyconcbench.zmq._placement) ---------------------------

def _cpu_list(text):
    out = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def _threads(pid="self"):
    """{tid: (name, cpus)} for every thread of the process."""
    out = {}
    for tid in os.listdir("/proc/%s/task" % pid):
        base = "/proc/%s/task/%s/" % (pid, tid)
        try:
            with open(base + "comm") as f:
                name = f.read().strip()
            with open(base + "status") as f:
                status = f.read()
        except OSError:  # exited meanwhile
            continue
        line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
        out[int(tid)] = (name, _cpu_list(line.split(":", 1)[1]))
    return out


def _named(threads, tries=100):
    """A thread libzmq has just started may not have named itself yet: wait until it has."""
    for _ in range(tries):
        current = threads()
        if LIBZMQ_THREADS <= {name for name, _ in current.values()}:
            return current
        time.sleep(0.01)
    return threads()


def _expected(placement):
    server, client = CPUS
    return client, (client if placement == "1cpu" else server)


# ---- every mode, both placements --------------------------------------------------------------

@pytest.mark.parametrize("placement", ["1cpu", "2cpu"])
def test_every_thread_is_placed(mode, placement):
    before = set(_threads())
    me = threading.get_native_id()
    client_cpu, others_cpu = _expected(placement)
    with Session(mode, cpus=CPUS, placement=placement, inflight=3, timeout=5) as session:
        session.warmup(50)
        assert session.round(200).requests == 200
        mine = _named(lambda: {t: v for t, v in _threads().items() if t not in before or t == me})
        server = session.server_pid
        theirs = _named(lambda: _threads(server)) if server else {}

        assert mine[me][1] == {client_cpu}, "the client thread runs on %s" % sorted(mine[me][1])
        others = {tid: v for tid, v in mine.items() if tid != me}
        names = sorted(name for name, _ in others.values())
        assert LIBZMQ_THREADS <= set(names), "no libzmq threads found among %s" % names
        wrong = {"%s (tid %d)" % (name, tid): sorted(cpus) for tid, (name, cpus) in others.items()
                 if cpus != {others_cpu}}
        assert not wrong, "threads not on CPU %d: %s" % (others_cpu, wrong)

        if mode == "pyzmq_thread":  # the server thread: a thread of ours that is not libzmq's
            assert [n for n in names if not n.startswith("ZMQbg/")], names
        if mode == "pyzmq_process":
            assert server and LIBZMQ_THREADS <= {name for name, _ in theirs.values()}
            wrong = {"%s (tid %d)" % (name, tid): sorted(cpus) for tid, (name, cpus) in theirs.items()
                     if cpus != {others_cpu}}
            assert not wrong, "server process threads not on CPU %d: %s" % (others_cpu, wrong)
            assert os.sched_getaffinity(server) == {others_cpu}
        else:
            assert server is None

        # the package's own read-back agrees, and is what the results keep
        assert session.misplaced() == []
        info = session.describe()
        assert info["placement"] == placement
        seen = info["threads"]
        assert [t for t in seen if t["role"] == "client"] == [
            {"role": "client", "name": mine[me][0], "cpus": [client_cpu]}]
        assert all(t["cpus"] == [others_cpu] for t in seen if t["role"] != "client")
        assert ({t["role"] for t in seen} - {"client"}
                == ({"in-process", "server process"} if server else {"in-process"}))
        assert placement in session.pinning and "CPU %d" % client_cpu in session.pinning


def test_placement_holds_over_ipc_and_with_many_in_flight():
    if _unavailable("pyzmq_thread"):
        pytest.skip(_unavailable("pyzmq_thread"))
    before = set(_threads())
    server, client = CPUS
    with Session("pyzmq_thread", cpus=CPUS, placement="2cpu", transport="ipc", inflight=100, timeout=5) as s:
        s.warmup(300)
        s.round(1000)
        me = threading.get_native_id()
        threads = {t: v for t, v in _threads().items() if t not in before or t == me}
    assert threads[me][1] == {client}
    assert len(threads) >= 4  # client, server thread, IO, reaper
    assert all(cpus == {server} for tid, (_, cpus) in threads.items() if tid != me)


@pytest.mark.parametrize("placement", ["1cpu", "2cpu"])
def test_the_cpu_pair_is_not_hard_coded(placement):
    """The reversed pair (client on the lower CPU) moves everything with it."""
    if _unavailable("pyzmq_process"):
        pytest.skip(_unavailable("pyzmq_process"))
    server, client = CPUS[1], CPUS[0]
    others = client if placement == "1cpu" else server
    before = set(_threads())
    with Session("pyzmq_process", cpus=(server, client), placement=placement, timeout=5) as s:
        s.warmup(20)
        me = threading.get_native_id()
        mine = {t: v for t, v in _threads().items() if t not in before or t == me}
        theirs = _threads(s.server_pid)
    assert mine.pop(me)[1] == {client}
    assert mine and all(cpus == {others} for _, cpus in mine.values())
    assert theirs and all(cpus == {others} for _, cpus in theirs.values())


# ---- lazily started threads, a broken placement, no pinning ------------------------------------

def test_a_thread_started_after_open_is_placed_by_the_warmup():
    """A library that starts a thread from the client thread after open() (an executor) would
    put it on the client CPU: the warm-up moves it to where the placement wants it."""
    if _unavailable("aiozmq_core"):
        pytest.skip(_unavailable("aiozmq_core"))
    server, client = CPUS
    stop = threading.Event()
    started = threading.Event()
    tid = []

    def lazy():
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    with Session("aiozmq_core", cpus=CPUS, placement="2cpu", timeout=5) as s:
        thread = threading.Thread(target=lazy)
        thread.start()
        try:
            started.wait(5)
            assert _threads()[tid[0]][1] == {client}  # inherited from the client thread
            assert any("(tid %d)" % tid[0] in text for text in s.misplaced())
            s.warmup(20)
            assert _threads()[tid[0]][1] == {server}
            assert s.misplaced() == []
        finally:
            stop.set()
            thread.join()


def test_a_thread_moved_away_is_reported(monkeypatch):
    """misplaced() and the warm-up's check can fail: a libzmq thread moved to the wrong CPU is
    named, and a placement that cannot be restored ends the warm-up with a RoundError."""
    if _unavailable("pyzmq_single"):
        pytest.skip(_unavailable("pyzmq_single"))
    server, client = CPUS
    before = set(_threads())
    with Session("pyzmq_single", cpus=CPUS, placement="1cpu", timeout=5) as s:
        s.round(10)
        io = next(t for t, (name, _) in _threads().items() if t not in before and name == "ZMQbg/IO/0")
        os.sched_setaffinity(io, {server})
        wrong = s.misplaced()
        assert len(wrong) == 1 and "ZMQbg/IO/0 (tid %d) on CPUs %d, expected %d" % (io, server, client) in wrong[0]
        from pyconcbench.zmq import _placement

        monkeypatch.setattr(_placement, "pin", lambda tid, cpu: True)  # pinning silently fails
        with pytest.raises(pcbzmq.RoundError, match=r"pyzmq_single: the 1cpu placement does not hold: "
                                                    r"in-process thread ZMQbg/IO/0"):
            s.warmup(10)
        monkeypatch.undo()
        with pytest.raises(pcbzmq.RoundError, match="unusable after an earlier failure"):
            s.round(1)


def test_pinning_off_leaves_every_thread_alone(mode, affinity_restored):
    full = affinity_restored
    before = set(_threads())
    with Session(mode, timeout=5) as s:
        s.warmup(20)
        threads = {t: v for t, v in _threads().items() if t not in before}
        server = s.server_pid
        theirs = _threads(server) if server else {}
        assert s.pinning == "pinning off"
        assert s.describe()["placement"] == "off"
        assert s.misplaced() == []
    assert threads and all(cpus == full for _, cpus in threads.values())
    assert all(cpus == full for _, cpus in theirs.values())


def test_a_failed_start_restores_the_affinity(monkeypatch):
    if _unavailable("pyzmq_single"):
        pytest.skip(_unavailable("pyzmq_single"))
    from pyconcbench.zmq import _pyzmq

    def broken(self):
        assert os.sched_getaffinity(0) == {CPUS[0]}  # placed before start(): 2cpu -> server CPU
        raise pcbzmq.RoundError("pyzmq_single: broken on purpose")

    monkeypatch.setattr(_pyzmq.Single, "start", broken)
    with pytest.raises(pcbzmq.RoundError, match="broken on purpose"):
        Session("pyzmq_single", cpus=CPUS, placement="2cpu").open()


def test_aiozmq_rpc_does_not_use_an_earlier_global_context():
    """aiozmq.rpc takes its sockets from zmq.Context.instance(): a global context made earlier
    (its I/O thread started on both CPUs) must not carry the measurement's sockets, and is
    left as it was."""
    if _unavailable("aiozmq_rpc"):
        pytest.skip(_unavailable("aiozmq_rpc"))
    import zmq

    server, client = CPUS
    glob = zmq.Context.instance()
    sock = glob.socket(zmq.PAIR)  # starts the global context's I/O threads, unpinned
    try:
        before = set(_threads())
        with Session("aiozmq_rpc", cpus=CPUS, placement="2cpu", timeout=5) as s:
            s.warmup(20)
            assert s._workload.ctx is not glob
            assert zmq.Context.instance() is glob
            me = threading.get_native_id()
            mine = {t: v for t, v in _threads().items() if t not in before and t != me}
            assert LIBZMQ_THREADS <= {name for name, _ in mine.values()}
            assert all(cpus == {server} for _, cpus in mine.values())
        assert zmq.Context.instance() is glob and not glob.closed
    finally:
        sock.close(linger=0)
        glob.term()


# ---- the matrix ------------------------------------------------------------------------------

def test_case_ids_groups_and_settings():
    case = pcbzmq.Case("aiozmq_rpc", placement="2cpu")
    assert case.id == "aiozmq_rpc-200B-if1-2cpu" and case.group == "zmq-200B-if1-2cpu"
    assert pcbzmq.Case("aiozmq_rpc").id == "aiozmq_rpc-200B-if1"  # the default keeps its id
    assert Session("pyzmq_single", placement="2cpu").case == pcbzmq.Case("pyzmq_single", placement="2cpu")
    assert Session("pyzmq_single").placement == pcbzmq.DEFAULT_PLACEMENT == "1cpu"
    with pytest.raises(ValueError, match="placement: 'x' is not one of 1cpu, 2cpu"):
        pcbzmq.Case("pyzmq_single", placement="x")
