# The two commands a newcomer runs (see README):
#   make profile   set up .venv, profile the embedded default model, (re)write ./headcount-report
#   make test      set up .venv, run the test suite
#
# torch is installed first and pinned to the CPU build this machine keeps on
# disk (2.13.0): an unpinned torch would pull a multi-GB CUDA build. On a GPU
# machine, install the CUDA build of your choice into .venv first (or set
# TORCH_SPEC); an importable torch is left alone.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PROFILE_ARGS ?= --force
PYTEST_ARGS ?=

.PHONY: setup profile test lint bench clean gpu-wheels gpu-check-dry test-cupti-pins test-torch-215 readme-picture

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	$(VENV)/bin/headcount cupti install > /dev/null  # cupti-python 13.4 + libcupti 13.4 beside the environment
	$(PY) -m pip install -q --no-deps "HolisticTraceAnalysis==0.5.0"  # its jupyterlab is not needed to read traces
	touch $@

profile: setup
	$(VENV)/bin/headcount profile $(PROFILE_ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check headcount tests scripts benchmarks

bench: setup
	$(PY) benchmarks/tagging_overhead.py
	$(PY) benchmarks/profile_default.py

# the README's picture of the HTML report, painted anew by the report test's headless Chromium
readme-picture: setup
	HEADCOUNT_README_PICTURE=1 $(PY) -m pytest -q tests/test_html_report.py -k readme_picture

# wheels the GPU machine lacks (cupti-python, nvtx, rich, ...) into .whl/ for scripts/gpu_check.sh
gpu-wheels: setup
	PIP=$(VENV)/bin/pip bash scripts/fetch_gpu_wheels.sh

# the GPU check's logic on this machine (bert-tiny, torch source, GPU-only steps skipped)
gpu-check-dry: setup
	PYTHON=$(PY) bash scripts/gpu_check.sh --dry-run gpu_check_dry_out

# the suite with the libcupti that CUDA torch pins (13.0.85, 13.2.86), CPU torch beside it (scripts/cupti_pins.sh)
test-cupti-pins:
	PYTHON=$(PYTHON) bash scripts/cupti_pins.sh

# the tests of torch 2.15's own profiler APIs (PM-sample counter events, its Chrome writer), in .venv-torch215 (scripts/torch_215.sh)
test-torch-215:
	PYTHON=$(PYTHON) bash scripts/torch_215.sh

clean:
	rm -rf $(VENV) headcount-report .pytest_cache .hypothesis gpu_check_out gpu_check_dry_out .whl/site-* .venv-cupti-* .venv-torch215*
