#!/usr/bin/env bash
# Download, on a machine with PyPI access, the wheels the GPU machine lacks
# (Python 3.12, no network) into .whl/ (git-ignored; the device tool carries
# it with the checkout). scripts/gpu_check.sh installs them there with
# `pip install --no-index --target`.
#
#   .whl/common      nvtx (0.2.11), rich and its parts, cuda-pathfinder, pyelftools, and headcount's readers
#                    (msgspec, duckdb, adbc-driver-sqlite), which the image lacks
#   .whl/cupti-13.4  cupti-python 13.4 + libcupti 13.4: what `headcount cupti install` puts in its folder
#   .whl/cupti-13.0  cupti-python 13.0 (uses the libcupti 13.0 that CUDA-13.0 torch already installs)
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
PIP=${PIP:-.venv/bin/pip}
dl() {
  local dest=$1; shift
  mkdir -p "$dest"
  $PIP download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_25_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dest" "$@"
}
# the image has cuda-bindings, and ncu_report in Nsight Compute's extras/python (headcount finds it there):
# leaving both here keeps the checkout and these wheels under the device tool's 64 MiB
dl .whl/common "nvtx==0.2.11" rich markdown-it-py mdurl pygments pyelftools cuda-pathfinder msgspec duckdb \
  adbc-driver-sqlite adbc-driver-manager
dl .whl/cupti-13.4 "cupti-python==13.4.0" "nvidia-cuda-cupti>=13.4,<13.5"
dl .whl/cupti-13.0 "cupti-python==13.0.1"
du -sh .whl/*
