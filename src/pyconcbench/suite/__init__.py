"""The benchmark suite, shipped in the package: ``pyconcbench run`` (or ``pytest --pyargs
pyconcbench.suite``) runs it from any folder, saving results under that folder's
``.benchmarks/``.  Each file only states a family's benchmarks and what a result must satisfy;
the plugin (``pyconcbench.plugin``) parametrizes them and ``pyconcbench.fixtures`` runs them.

Its ``pytest.ini`` makes this folder the rootdir of a run of it, so a benchmark's node id is
``test_echo.py::test_echo[asyncio_protocol-c100-64B]`` wherever the package is installed.
"""
import os

#: The folder of the suite's test files.
SUITE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The suite's files by family name (``pyconcbench run --family``, ``pyconcbench ab --tests``).
FILES = {"echo": "test_echo.py", "openloop": "test_openloop.py", "switch": "test_switch.py", "zmq": "test_zmq.py",
         "ceiling": "test_ceiling.py"}


def path(family: str) -> str:
    """The test file of ``family`` (a key of FILES)."""
    return os.path.join(SUITE_DIR, FILES[family])
