# Two entry points, both self-contained on a fresh clone:
#   make demo   plan and run the seed's workload on the NumPy reference backend
#   make test   install everything (torch 2.13.0 CPU included) and run lint, types and tests,
#               then the tests again on the lowest declared versions without optional packages
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

MIN_VENV := .venv-min

.PHONY: demo test test-min lint clean

$(VENV)/.core: pyproject.toml backends/reference/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -e '.[dev]' -e backends/reference
	touch $@

# torch is pinned first so that nothing pulls a (multi-GB) CUDA build.
$(VENV)/.full: $(VENV)/.core backends/npu/pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e 'backends/npu[test]' -e '.[dev,ray]'
	touch $@

demo: $(VENV)/.core
	$(PY) -m pypto_sched_reference.demo

lint: $(VENV)/.full
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy backends/reference/tests
	$(VENV)/bin/mypy backends/npu/tests

test: lint test-min
	$(VENV)/bin/pytest

# The lowest versions the pyproject files allow (their >= floors, pinned), without the optional
# torch, transformers and matplotlib: the suite must pass there, skipping what needs those.
$(MIN_VENV)/.done: pyproject.toml backends/reference/pyproject.toml .ci/min_constraints.py
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(PYTHON) .ci/min_constraints.py --exclude torch mypy ruff safetensors matplotlib \
		> $(MIN_VENV)/constraints.txt
	$(MIN_VENV)/bin/python -m pip --disable-pip-version-check install -q \
		-c $(MIN_VENV)/constraints.txt -e '.[testing,cli]' -e backends/reference pytest \
		pytest-timeout
	touch $@

test-min: $(MIN_VENV)/.done
	$(MIN_VENV)/bin/pytest -p no:cacheprovider

clean:
	rm -rf $(VENV) $(MIN_VENV)
