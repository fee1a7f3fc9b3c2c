"""The project's own code that does not import or build: a failure in one line, never a skip.

A skip says only that something this project does not ship is absent here -- a package not
installed, a program not on PATH, a release that does not run on this Python -- and is decided
before any of the project's own code for the case runs (``importlib.util.find_spec``,
``shutil.which``, importing the third-party package first).  Anything else that goes wrong in
code of ours -- a module of this package that raises on import, a Go source of ours that does
not compile -- is ``Broken``: a bug, reported as a failure with one line naming the error and
where it was raised.
"""
from __future__ import annotations

import os
import traceback

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Broken(RuntimeError):
    """The project's own code for a case does not import or build: a bug here, never a skip.
    The message is one line."""


def _short(path: str) -> str:
    path = os.path.abspath(path)
    if path.startswith(_SRC + os.sep):
        return os.path.relpath(path, _SRC)  # pyconcbench/zmq/_pyzmq.py
    return path


def where(exc: BaseException) -> str:
    """``file:line`` where ``exc`` was raised (the innermost frame outside the import
    machinery; a SyntaxError's own file and line), '' when unknown."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return "%s:%s" % (_short(exc.filename), exc.lineno)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<")]  # <frozen importlib._bootstrap>
    if not frames:
        return ""
    return "%s:%s" % (_short(frames[-1].filename), frames[-1].lineno)


def describe(exc: BaseException) -> str:
    """One line: ``NameError: name 'x' is not defined (pyconcbench/zmq/_pyzmq.py:42)``."""
    text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    text = " ".join(text.split()) or "(no message)"
    place = where(exc)
    return "%s: %s%s" % (type(exc).__name__, text, " (%s)" % place if place else "")
