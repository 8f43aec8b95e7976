PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# Stamp file: the venv is rebuilt only when the dependency list changes.
STAMP := $(VENV)/.installed

.PHONY: $(VENV) venv demo test test-nolitert test-fast collect-noshared bench bench-fast fuzz soak clean pycoral-suite

venv: $(STAMP)

$(VENV): $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/coralrt demo

# Benchmarks are slow and report ratios, not pass/fail: they run only in `make bench`.
test: $(STAMP)
	$(VPY) -m pytest -q --ignore=tests/bench

# The suite as on a board without LiteRT wheels: a second venv with ai-edge-litert
# and libusb-package uninstalled (pyusb then loads the system's libusb-1.0); every test runs on the NumPy backend except those that compare
# against LiteRT or need what it lacks, which skip with the reason (tests/conftest.py).
NOLITERT ?= .venv-nolitert
test-nolitert:
	$(PYTHON) -m venv $(NOLITERT)
	$(NOLITERT)/bin/python -m pip install -q --upgrade pip
	$(NOLITERT)/bin/python -m pip install -q -e '.[dev]'
	$(NOLITERT)/bin/python -m pip uninstall -y -q ai-edge-litert libusb-package
	$(NOLITERT)/bin/python -m pytest -q --ignore=tests/bench

# The kernel tests and the end-to-end exactness tests with the `fast` extra (numba's
# compiled kernels, docs/simulator.md): a second venv with '.[dev,fast]'.  The kernel
# harness then checks every kernel on both paths, and CORALRT_REQUIRE_COMPILED=1 makes
# the tests that need numba fail instead of skipping.  The dev venv stays without numba.
FASTVENV ?= .venv-fast
FASTSTAMP := $(FASTVENV)/.installed
$(FASTSTAMP): pyproject.toml
	$(PYTHON) -m venv $(FASTVENV)
	$(FASTVENV)/bin/python -m pip install -q --upgrade pip
	$(FASTVENV)/bin/python -m pip install -q -e '.[dev,fast]'
	touch $(FASTSTAMP)

test-fast: $(FASTSTAMP)
	CORALRT_REQUIRE_COMPILED=1 $(FASTVENV)/bin/python -m pytest -q tests/kernels \
		tests/test_sim_session.py

# The suite in a checkout without ../shared beside it (a fresh clone): every test
# that needs the shared models or images must collect and skip with its reason,
# not break the collection.  The tracked files are copied to a folder that has no
# shared/ next to it, and collected there.
NOSHARED := $(shell mktemp -u -d /tmp/coralrt-noshared.XXXXXX)
collect-noshared: $(STAMP)
	mkdir -p $(NOSHARED)/repo
	git ls-files -z | xargs -0 tar -cf - | tar -xf - -C $(NOSHARED)/repo
	cd $(NOSHARED)/repo && $(abspath $(VPY)) -m pytest --collect-only -q -p no:cacheprovider \
		--ignore=tests/bench > $(NOSHARED)/collect.txt || { tail -30 $(NOSHARED)/collect.txt; exit 1; }
	tail -1 $(NOSHARED)/collect.txt
	rm -rf $(NOSHARED)

bench: $(STAMP)
	$(VPY) -m pytest tests/bench --benchmark-only -q

# The same benchmarks with the compiled kernels (the fast venv above).
bench-fast: $(FASTSTAMP)
	$(FASTVENV)/bin/python -m pytest tests/bench --benchmark-only -q

# A longer differential fuzzing campaign than the one in `make test` (about 5 min
# on 2 cores): mutated models on LiteRT's default and reference kernels, the NumPy
# backend and the simulated Edge TPU, each case in a child process; prints the
# outcomes per leg and each distinct failure, saves one reproducer per failure in
# FUZZ_SAVE (CONTRIBUTING.md, "Fuzzing").  FUZZ_SEED and FUZZ_CASES pick the cases.
FUZZ_SEED ?= 0
FUZZ_CASES ?= 1500
FUZZ_SAVE ?= /tmp/coralrt-fuzz
fuzz: $(STAMP)
	$(VPY) tools/fuzz_models.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --save $(FUZZ_SAVE)

clean:
	rm -rf $(VENV) $(NOLITERT) $(FASTVENV) build dist *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# A long soak of the USB driver on a misbehaving simulated stick (tests/test_soak.py):
# CORALRT_SOAK_INFERENCES inferences (default 5,000) with random faults from a seeded
# RNG; prints the counts.  `make test` runs a short one.
soak: $(STAMP)
	CORALRT_SOAK=1 $(VPY) -m pytest -s -q tests/test_soak.py

# Google's pycoral unit tests and examples, unchanged, on the simulated Edge TPU
# (tools/pycoral_suite.py; docs/porting.md, "Running pycoral's own tests and
# examples"). CORALRT_PYCORAL_DIR names a pycoral checkout, CORALRT_CORAL_TEST_DATA
# Coral's test_data folder; without both the target says so and does nothing.
# PYCORAL_SUITE_ARGS passes options: --stand-ins, --only NAME, --timeout S.
PYCORAL_SUITE_ARGS ?=
pycoral-suite:
	@if [ -z "$$CORALRT_PYCORAL_DIR" ] || [ -z "$$CORALRT_CORAL_TEST_DATA" ]; then \
		echo "pycoral-suite skipped: set CORALRT_PYCORAL_DIR (a checkout of google-coral/pycoral)" \
		     "and CORALRT_CORAL_TEST_DATA (Coral's test_data folder)"; \
	else \
		$(MAKE) -s --no-print-directory $(STAMP) && \
		$(VPY) tools/pycoral_suite.py $(PYCORAL_SUITE_ARGS); \
	fi
