"""Saved runs: pytest-benchmark's JSON files, found and read through its own ``FileStorage``,
and the benchmarks in them sorted into the workload families the reports know.

A RUN names saved runs the way ``--benchmark-compare`` does: a path to a JSON file, or a
prefix of a file name in the storage folder (``0003``, ``0003_abc*``, ``Linux-CPython-3.11-64bit/0003``).
No RUN means the newest saved run.

Every run is checked on load against the result schema (``metrics.check_run``): a field of the
wrong kind, a missing one the reports need, NaN or an infinity is refused with one line naming
the file, the benchmark and the field (``ResultsError``), before any table or gate reads it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from pyconcbench import metrics

DEFAULT_STORAGE = ".benchmarks"


class ResultsError(Exception):
    """A run that cannot be found or read: the message says which and why."""


@dataclass
class Run:
    """One saved pytest-benchmark run."""

    path: str
    data: Dict[str, Any]

    @property
    def benchmarks(self) -> List[Dict[str, Any]]:
        return self.data.get("benchmarks") or []

    @property
    def machine(self) -> Dict[str, Any]:
        return self.data.get("machine_info") or {}

    @property
    def facts(self) -> Dict[str, Any]:
        """pyconcbench's own machine facts (CPU, kernel, fd limit, pinning, libraries)."""
        return self.machine.get("pyconcbench") or {}

    @property
    def python(self) -> str:
        m = self.machine
        return str(self.facts.get("python") or m.get("python_version") or "?")

    @property
    def python_label(self) -> str:
        """'3.11.7' or 'PyPy 7.3' style: what a by-Python column is headed with."""
        impl = self.facts.get("python_implementation") or self.machine.get("python_implementation") or "CPython"
        version = metrics.python_label(self.python, self.facts.get("python_build"), self.facts.get("gil_enabled"))
        return version if impl == "CPython" else f"{impl} {version}"

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def label(self) -> str:
        """'Linux-CPython-3.11-64bit/0003_x.json': the name with its machine-id folder."""
        p = Path(self.path)
        return f"{p.parent.name}/{p.name}" if p.parent.name else p.name

    @property
    def commit(self) -> str:
        info = self.data.get("commit_info") or {}
        cid = info.get("id") or ""
        dirty = " (uncommitted changes)" if info.get("dirty") else ""
        return (cid[:12] + dirty) if cid else "?"


class _Quiet:
    """The logger pytest-benchmark's FileStorage wants; unreadable files become errors here."""

    def __init__(self) -> None:
        self.warnings: List[str] = []

    def warning(self, text: str, *args: Any, **kwargs: Any) -> None:
        self.warnings.append(text)

    def info(self, text: str, *args: Any, **kwargs: Any) -> None:
        pass


def checked(path: str, data: Any) -> Run:
    """A run read from ``path``, once the schema check passed: ResultsError naming the file, the
    benchmark and the field otherwise."""
    found = metrics.check_run(data)
    if found is None:
        return Run(path, data)
    bench, where, why = found
    if where == "benchmarks" and not bench:
        raise ResultsError(f"{path}: {why}")
    what = f"benchmark {one_line(bench)}: " if bench else ""
    raise ResultsError(f"{path}: {what}{one_line(where) or 'the benchmark'}: {why}")


def one_line(text: str) -> str:
    """Saved text as (part of) one line of a message: line breaks and control characters escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _read_file(path: Path) -> Run:
    try:
        data = json.loads(path.read_text(encoding="utf8"))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not a JSON file: {exc}") from None
    except RecursionError:
        raise ResultsError(f"{path}: not a pytest-benchmark run (nested too deeply to read)") from None
    return checked(str(path), data)


def load_runs(names: Sequence[str] = (), storage: str = DEFAULT_STORAGE) -> List[Run]:
    """The runs ``names`` select, in the order given (each name's matches oldest first);
    the newest saved run when ``names`` is empty.  Raises ResultsError with one line when
    nothing matches."""
    runs: List[Run] = []
    folder = Path(storage[len("file://"):] if storage.startswith("file://") else storage)
    for name in names:
        candidate = Path(name)
        if candidate.is_file():
            runs.append(_read_file(candidate))
            continue
        if candidate.suffix == ".json":
            raise ResultsError(f"{name}: no such file")
        runs.extend(_query(folder, name))
    if not names:
        # file numbers count per machine-id folder: the newest is the latest "datetime"
        found = sorted(_query(folder, None), key=lambda r: (str(r.data.get("datetime", "")), r.name))
        runs.append(found[-1])
    return runs


def _query(folder: Path, name: Optional[str]) -> List[Run]:
    if not folder.is_dir():
        raise ResultsError(f"no saved runs: {folder} does not exist (save one with "
                           f"`pyconcbench run`, or name a JSON file)")
    from pytest_benchmark.storage.file import FileStorage

    logger = _Quiet()
    store = FileStorage(str(folder), logger)
    try:
        found = list(store.load(name) if name is not None else store.load())
    except ValueError as exc:
        raise ResultsError(f"{name}: {exc}") from None
    except RecursionError:
        raise ResultsError(f"{name}: a saved run in {folder} is nested too deeply to read") from None
    if logger.warnings:
        raise ResultsError(logger.warnings[0])
    if not found:
        what = f"matching {name!r} " if name is not None else ""
        raise ResultsError(f"no saved run {what}in {folder}")
    return [checked(str(store.path / rel), data) for rel, data in found]


# ---- families ---------------------------------------------------------------------------

def family(bench: Dict[str, Any]) -> str:
    """'echo', 'ceiling', 'switch', 'zmq', 'ab', 'openloop' or 'other': the benchmark's stamp, or for a run saved
    before it, by what its extra_info holds (pyconcbench.metrics); ResultsError for a schema
    this code cannot read."""
    try:
        return metrics.family_of(bench.get("extra_info") or {}, bench.get("name") or bench.get("fullname") or "?")
    except metrics.SchemaError as exc:
        raise ResultsError(str(exc)) from None


@dataclass
class Families:
    echo: List[Dict[str, Any]] = field(default_factory=list)
    ceiling: List[Dict[str, Any]] = field(default_factory=list)
    switch: List[Dict[str, Any]] = field(default_factory=list)
    zmq: List[Dict[str, Any]] = field(default_factory=list)
    ab: List[Dict[str, Any]] = field(default_factory=list)
    openloop: List[Dict[str, Any]] = field(default_factory=list)
    other: List[Dict[str, Any]] = field(default_factory=list)


def merged_benchmarks(runs: Iterable[Run]) -> List[Dict[str, Any]]:
    """Every benchmark of the runs; a test saved in several runs is taken from the last."""
    out: Dict[str, Dict[str, Any]] = {}
    for run in runs:
        for bench in run.benchmarks:
            out[metrics.bench_key(bench)] = bench
    return list(out.values())


def split(benchmarks: Iterable[Dict[str, Any]]) -> Families:
    fams = Families()
    for bench in benchmarks:
        getattr(fams, family(bench)).append(bench)
    return fams
