# Two entry points, both self-contained on a fresh clone:
#   make demo   plan and run the seed's workload on the NumPy reference backend
#   make test   install everything (torch 2.13.0 CPU included) and run lint, types and tests
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test lint clean

$(VENV)/.core: pyproject.toml backends/reference/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -e '.[dev]' -e backends/reference
	touch $@

# torch is pinned first so that nothing pulls a (multi-GB) CUDA build.
$(VENV)/.full: $(VENV)/.core backends/npu/pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e 'backends/npu[test]'
	touch $@

demo: $(VENV)/.core
	$(PY) -m pypto_sched_reference.demo

lint: $(VENV)/.full
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy backends/reference/tests
	$(VENV)/bin/mypy backends/npu/tests

test: lint
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV)
