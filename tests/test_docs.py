"""docs/reliability.md names, for every fault, the test that proves what the user sees: each
test it names must exist, so the document cannot drift from the suite."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ``tests/FILE.py::name``, or ``::name`` continuing the file named last in the same cell.
REF = re.compile(r"`(tests/[\w/]+\.py)(?:::([\w\[\]…]+))?`|`::([\w\[\]…]+)`")


def _refs(text):
    current = None
    for m in REF.finditer(text):
        path, name, cont = m.groups()
        if path:
            current = path
            if name:
                yield path, name
        elif cont and current:
            yield current, cont


def test_every_test_the_reliability_doc_names_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    refs = list(_refs(text))
    assert len(refs) > 40, f"only {len(refs)} test references found: the pattern no longer matches the doc"
    missing = []
    for path, name in refs:
        source = ROOT / path
        base = name.split("[")[0]
        if not source.exists():
            missing.append(f"{path} (no such file)")
        elif base != "…" and not re.search(rf"^\s*(async )?def {re.escape(base)}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, "docs/reliability.md names tests that do not exist: " + ", ".join(missing)
