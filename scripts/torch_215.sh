#!/usr/bin/env bash
# scripts/torch_215.sh — the tests of torch 2.15's own profiler APIs, in an environment holding torch 2.15 (issue 59).
#
#   bash scripts/torch_215.sh [PYTEST_ARGS ...]      (make test-torch-215; .ci/run calls it)
#
# torch 2.15.0 (the +cu132 build: it imports without a GPU) ships PerformanceMetricsConfig and Cuspy, whose Chrome
# writer (torch/profiler/_cuspy/trace.py) the tests feed with a real H100 run's PM samples. Cuspy imports
# cupti-python, so it is installed beside torch, on torch's libcupti pin (13.2.86: the writer needs only the import). The environment is kept in .venv-torch215/ (about 5.5 GB; make clean removes it). Where the machine's
# pip configuration caps torch (this one: torch<=2.14.1, the wheels on its disk), the cap is left out for this
# environment only; every other constraint stays. The tests listed here must run, not skip: HEADCOUNT_REQUIRE_TORCH215=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=.venv-torch215
constraints="$venv.constraints.txt"
TESTS=(tests/test_torch_pm_samples.py tests/test_torch_pm_route.py tests/test_graph_annotations.py)
configured=$("$PYTHON" -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*constraint='\(.*\)'$/\1/p")
{ for f in $configured ${PIP_CONSTRAINT:-}; do
    if [ -f "$f" ]; then grep -viE '^(torch|torchvision|torchaudio)([<>=!~ ]|$)' "$f" || true; fi; done; } > "$constraints"
echo "== torch 2.15.0: $venv"
test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q "torch==2.15.0" numpy
# without its dependencies: cupti-python 13.4 asks for libcupti 13.4, torch pins 13.2.86 (the writer only imports it)
PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q --no-deps "cupti-python==13.4.0"
PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q -e ".[test]"
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(torch|cupti-python|nvidia-cuda-cupti) "
HEADCOUNT_REQUIRE_TORCH215=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" "${TESTS[@]}"
