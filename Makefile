# pyconcbench: `make bench` runs the quick echo suite and prints its tables; `make test` runs
# the tests.  Both create .venv and install the package (building the C extension) first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pyconcbench-installed
EXTRAS ?= test,all
BENCH_ARGS ?=
TEST_ARGS ?=

.PHONY: install bench compare test test-fast debug test-debug clean tox matrix report

$(STAMP): pyproject.toml setup.py $(wildcard native/*.c native/*.h native/helpers/*.c)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $(STAMP)

install: $(STAMP)

# The quick profile, saved as a baseline in .benchmarks/ and compared with the previous
# saved run when there is one.
bench: $(STAMP)
	$(PY) -m pytest tests/bench --pcb-profile quick --benchmark-autosave \
	    $$(ls .benchmarks/*/*.json >/dev/null 2>&1 && echo --benchmark-compare) $(BENCH_ARGS)

# The studies' tables of the newest saved run, with plots and an HTML page.
report: $(STAMP)
	$(VENV)/bin/pyconcbench report --png bench-plots --html bench-report.html

# tox across every Python pyenv has and tools/get_pythons.sh installed (interpreters missing
# are skipped): `make tox` runs the tests on each, `make matrix` the quick suite on each and
# the cross-version report.
empty :=
space := $(empty) $(empty)
PCB_PYTHONS_DIR ?= $(HOME)/.local/share/pyconcbench/pythons
TOX_PATH := $(subst $(space),:,$(wildcard $(shell pyenv root 2>/dev/null)/versions/*/bin $(PCB_PYTHONS_DIR)/*/bin))
TOX := $(if $(TOX_PATH),PATH="$(TOX_PATH):$$PATH") $(VENV)/bin/tox

$(VENV)/bin/tox: $(STAMP)
	$(PY) -m pip install --quiet 'tox>=4'

tox: $(VENV)/bin/tox
	$(TOX)

matrix: $(VENV)/bin/tox
	$(TOX) -e matrix

# Compare the newest saved run with the one before it (pytest-benchmark's own table).
compare: $(STAMP)
	$(VENV)/bin/pytest-benchmark compare --group-by=group --columns=min,median,max,rounds \
	    $$(ls -t .benchmarks/*/*.json | head -2 | tac)

test: $(STAMP)
	$(PY) -m pytest tests --benchmark-disable --pcb-messages 2000 $(TEST_ARGS)

# Unit tests only, skipping the 10k-connection tests.
test-fast: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/bench -m "not slow" $(TEST_ARGS)

# -O0 -g with AddressSanitizer and UBSan; the sanitizer runtime must be preloaded into Python.
debug:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	PCB_DEBUG=1 $(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@rm -f $(STAMP)

test-debug: debug
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0 \
	    $(PY) -m pytest tests/test_hist.py tests/test_loadgen.py tests/test_serve.py tests/test_micro.py -m "not slow" $(TEST_ARGS)

clean:
	rm -rf build $(VENV) src/*.egg-info src/pyconcbench/*.so src/pyconcbench/pcb_forkloop .pytest_cache
