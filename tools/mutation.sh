#!/usr/bin/env bash
# Mutation check (mutmut) of the numbers the suite reports: src/pyconcbench/stats.py, fairness
# (loadgen.fairness) and the noise judge (rounds.noise_reason), against the tests that pin them.
# (The latency histogram and its merge are C, native/pcb_hist.c: mutmut does not reach it; its
# property tests compare it with the exact samples.)  Runs in a scratch copy, so the work
# tree is never touched; not part of `make test`.  CPU-heavy: run at low priority.
#
#   tools/mutation.sh                      # every mutant of those functions; prints the survivors
#   KEEP=1 tools/mutation.sh               # keep the scratch copy (then: cd it; mutmut show NAME)
#   TESTS="tests/test_hist.py" tools/mutation.sh   # another test selection
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
if ! "$py" -c "import mutmut" 2>/dev/null; then
    "$py" -m pip install --quiet "mutmut>=3.8,<4"
fi
if ! ls "$root"/src/pyconcbench/_native*.so >/dev/null 2>&1; then
    echo "mutation.sh: build the extension first (make install)" >&2
    exit 2
fi

TESTS=${TESTS:-"tests/test_properties.py tests/test_hist.py tests/test_gate.py tests/test_plugin_units.py tests/test_report.py
tests/test_loadgen.py::test_fairness_figures"}
MUTANTS=${MUTANTS:-"pyconcbench.stats.* pyconcbench.loadgen.x_fairness__*
pyconcbench.rounds.x_noise_reason__*"}

work=$(mktemp -d "${TMPDIR:-/tmp}/pcb-mutation.XXXXXX")
if [ -z "${KEEP:-}" ]; then
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/src" "$work/tests"
cp -r "$root/src/pyconcbench" "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
cp "$root/conftest.py" "$root/pyproject.toml" "$work/"
cp "$root"/tests/*.py "$work/tests/"; cp -r "$root/tests/data" "$work/tests/"
{
    echo "[mutmut]"
    echo "source_paths = src"
    echo "only_mutate ="
    for f in stats loadgen rounds; do echo "    src/pyconcbench/$f.py"; done
    echo "pytest_add_cli_args = -p no:cacheprovider"
    echo "pytest_add_cli_args_test_selection ="
    for t in $TESTS; do echo "    $t"; done
} >"$work/setup.cfg"

cd "$work"
# shellcheck disable=SC2086  # MUTANTS are glob patterns for mutmut, not for the shell
set -f
nice -n 10 "$py" -m mutmut run $MUTANTS >"$work/run.log" 2>&1 || { tail -40 "$work/run.log"; exit 1; }
set +f
pattern='stats\.|x_fairness__|x_noise_reason__'
"$py" -m mutmut results --all true | grep -E "$pattern" >"$work/results.txt" || true
echo "mutants by status (stats.py, fairness, noise_reason):"
awk '{print $NF}' "$work/results.txt" | sort | uniq -c
echo "not killed:"
grep -v ": killed$" "$work/results.txt" || echo "    (none)"
[ -n "${KEEP:-}" ] && echo "scratch copy kept: $work"
exit 0
