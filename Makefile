# pyconcbench: `make bench` runs the quick echo suite and prints its tables; `make test` runs
# the tests, then the native ones again under AddressSanitizer and UBSan (`make test-asan`).
# Both create .venv and install the package (building the C extension) first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pyconcbench-installed
EXTRAS ?= test,all
BENCH_ARGS ?=
# the benchmark suite (shipped in the package); `make test` runs it once per case, untimed
SUITE := src/pyconcbench/suite
TEST_ARGS ?=

.PHONY: install bench compare test test-fast test-asan debug test-debug clean tox matrix report

$(STAMP): pyproject.toml setup.py $(wildcard native/*.c native/*.h native/helpers/*.c)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	@touch $(STAMP)

install: $(STAMP)

# The quick profile (`pyconcbench run`: the suite shipped in the package), saved as a baseline
# in .benchmarks/ and compared with the previous saved run when there is one.
bench: $(STAMP)
	$(VENV)/bin/pyconcbench run --profile quick $(BENCH_ARGS)

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
	$(PY) -m pytest tests $(SUITE) --benchmark-disable --pcb-messages 2000 $(TEST_ARGS)
	$(MAKE) --no-print-directory test-asan

# Unit tests only, skipping the 10k-connection tests.
test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow" $(TEST_ARGS)

# The sanitizer pass.  The extension is built -O0 -g with AddressSanitizer and UBSan (float-cast
# overflow included, every finding fatal: PCB_DEBUG=1 in setup.py) into a copy of the package in
# build/asan/lib, which PYTHONPATH puts before the editable install; the .venv's own extension
# is left as it is.  The tests of the engine, the binding (and its fuzzing), the histogram, the
# echo servers and the native switch loops then run with the sanitizer runtimes preloaded into
# Python (and into every process they start).
SAN_CC ?= gcc
ASAN_LIB := build/asan/lib
ASAN_STAMP := build/asan/.built
# (not test_native_loop_runs_every_iteration: it times -O2 loops against each other)
ASAN_MICRO := $(addprefix tests/test_micro.py::test_native_,syscall_is_made_every_time \
	case_counts_every_op bad_arguments_are_value_errors run_is_bounded_by_its_timeout \
	run_is_interruptible)
ASAN_TESTS ?= tests/test_binding.py tests/test_fuzz_binding.py tests/test_hist.py \
	tests/test_loadgen.py tests/test_openloop.py tests/test_serve.py $(ASAN_MICRO)
ASAN_ARGS ?=
# seconds a test may take under the sanitizers before pytest-timeout stops it (stacks dumped)
ASAN_TIMEOUT ?= 120
ASAN_ENV := LD_PRELOAD="$$($(SAN_CC) -print-file-name=libasan.so) $$($(SAN_CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=halt_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	PYTHONPATH=$(ASAN_LIB)

$(ASAN_STAMP): $(STAMP) $(wildcard native/*.c native/*.h native/helpers/*.c) $(shell find src -name '*.py')
	@for lib in libasan.so libubsan.so; do test -f "$$($(SAN_CC) -print-file-name=$$lib)" || \
	    { echo "make test-asan: $$lib not found for $(SAN_CC): install gcc's sanitizer runtimes (libasan, libubsan)"; exit 1; }; done
	@$(PY) -c 'import setuptools' 2>/dev/null || $(PY) -m pip install --quiet setuptools
	rm -rf build/asan
	PCB_DEBUG=1 $(PY) setup.py --quiet build --build-base build/asan/tmp --build-lib $(ASAN_LIB)
	@touch $@

test-asan: $(ASAN_STAMP)
	@$(ASAN_ENV) $(PY) -c 'import sys, pyconcbench._native as m; f = m.__file__; \
	    sys.exit(None if "/$(ASAN_LIB)/" in f else "make test-asan: _native was loaded from " + f)'
	@# --capture=sys: a sanitizer writes its report to file descriptor 2 and then ends the
	@# process, so pytest must leave that descriptor to the terminal or the report is lost.
	$(ASAN_ENV) $(PY) -m pytest $(ASAN_TESTS) -m "not slow" --benchmark-disable -p no:cacheprovider \
	    --capture=sys -o timeout=$(ASAN_TIMEOUT) $(ASAN_ARGS) \
	    || { echo "make test-asan: FAILED (a sanitizer report, if any, is above)"; exit 1; }

# The same build, kept under their old names.
debug: $(ASAN_STAMP)
test-debug: test-asan

clean:
	rm -rf build $(VENV) src/*.egg-info src/pyconcbench/*.so src/pyconcbench/pcb_forkloop .pytest_cache
