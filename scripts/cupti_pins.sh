#!/usr/bin/env bash
# scripts/cupti_pins.sh — the test suite with the CUPTI that users' CUDA torch pins (issue 35).
#
#   bash scripts/cupti_pins.sh [PIN ...]      (default: 13.0.85 13.2.86; make test-cupti-pins)
#
# Every CUDA torch on PyPI pins its libcupti (torch 2.14: nvidia-cuda-cupti 13.0.85; 2.15: 13.2.86). Instead of a
# multi-GB CUDA torch, each environment here holds the CPU torch plus that pin (about 11 MB):
#   1. `pip install -e '.[test]'` under the pin: pip then takes the cupti-python the pin allows (13.0.1 has no PM
#      sampling, 13.2.0 neither); the whole suite must pass, PM-sampling tests skipped naming what is missing;
#   2. the README's route for PM sampling with that torch, `pip install --no-deps 'cupti-python==13.4.*' pyelftools`
#      over the pinned libcupti: the cupti tests must pass, PM sampling loading and failing only at the driver.
# Environments are kept in .venv-cupti-<PIN>/ (make clean removes them).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
pins=("$@")
[ ${#pins[@]} -gt 0 ] || pins=(13.0.85 13.2.86)
status=0
for pin in "${pins[@]}"; do
  venv=".venv-cupti-$pin"
  constraints="$venv.constraints.txt"
  # the pin, plus whatever constraints pip is already configured with (this machine caps torch at the wheels on disk)
  configured=$("$PYTHON" -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*constraint='\(.*\)'$/\1/p")
  { echo "nvidia-cuda-cupti==$pin.*"; for f in $configured ${PIP_CONSTRAINT:-}; do
      if [ -f "$f" ]; then cat "$f"; fi; done; } > "$constraints"
  echo "== nvidia-cuda-cupti $pin: $venv"
  test -x "$venv/bin/python" || $PYTHON -m venv "$venv"
  PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q "$TORCH_SPEC" "nvidia-cuda-cupti==$pin.*"
  PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q -e ".[test]"
  PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q --no-deps "HolisticTraceAnalysis==0.5.0"
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(torch|cupti-python|nvidia-cuda-cupti) "
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnraisableExceptionWarning || status=1
  echo "== $pin with the README's route: cupti-python 13.4 over libcupti $pin"
  PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q --no-deps "cupti-python==13.4.*" pyelftools
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnraisableExceptionWarning tests/test_cupti.py || status=1
  "$venv/bin/headcount" doctor --backend cupti | grep -E "cupti-python|libcupti|PM sampling" || true
done
exit $status
