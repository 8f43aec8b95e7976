PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# Stamp file: the venv is rebuilt only when the dependency list changes.
STAMP := $(VENV)/.installed

.PHONY: $(VENV) venv demo test bench clean

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

bench: $(STAMP)
	$(VPY) -m pytest tests/bench --benchmark-only -q

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
