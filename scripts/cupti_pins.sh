#!/usr/bin/env bash
# scripts/cupti_pins.sh — the test suite with the CUPTI that users' CUDA torch pins (issue 35).
#
#   bash scripts/cupti_pins.sh [PIN ...]      (default: 13.0.85 13.2.86; make test-cupti-pins)
#
# Every CUDA torch on PyPI pins its libcupti (torch 2.14: nvidia-cuda-cupti 13.0.85; 2.15: 13.2.86). Instead of a
# multi-GB CUDA torch, each environment here holds the CPU torch plus that pin (about 11 MB), set up with the
# README's commands: `pip install -e '.[test]'` (no cupti-python in any extra, so the pin and torch stay; pip check
# clean), then `headcount cupti install` (cupti-python 13.4 and libcupti 13.4 into a folder beside the environment).
# The whole suite must pass there, PM sampling loading from the folder and failing only at the missing driver.
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
  "$venv/bin/python" -m pip check || status=1  # before HolisticTraceAnalysis, which is installed without its jupyterlab
  "$venv/bin/headcount" cupti install || status=1
  PIP_CONSTRAINT="$constraints" "$venv/bin/python" -m pip install -q --no-deps "HolisticTraceAnalysis==0.5.0"
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(torch|cupti-python|nvidia-cuda-cupti) "
  "$venv/bin/headcount" doctor | grep -E "cupti|libcupti|PM sampling" || true
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnraisableExceptionWarning || status=1
done
exit $status
