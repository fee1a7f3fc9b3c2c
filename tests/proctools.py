"""What the tests read of other processes from /proc: alive or not, children, process groups."""
import os
import signal
import time


def _stat(pid):
    """The fields of /proc/PID/stat after the command name, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid):
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _live_where(index, value):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(name)
            if fields is not None and fields[0] not in ("Z", "X") and int(fields[index]) == value:
                out.append(int(name))
    return out


def children(pid):
    """Live processes whose parent is ``pid``."""
    return _live_where(1, pid)


def group(pgid):
    """Live processes in process group ``pgid``."""
    return _live_where(2, pgid)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(cond, timeout, step=0.05):
    """Polls ``cond()`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def end(proc, pids=()):
    """A test's clean-up of a middle process it started (subprocess.Popen) and of the pids it
    saw: the pipes closed, the process killed and reaped if it still runs, each pid SIGKILLed."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
