#!/usr/bin/env bash
# Rebuild occupancy_kernels.fatbin (committed; the GPU machine has no nvcc).
set -euo pipefail
cd "$(dirname "$0")"
nvcc -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
     -gencode arch=compute_90,code=compute_90 occupancy_kernels.cu -o occupancy_kernels.fatbin
nvcc -cubin -O3 -arch=sm_90 occupancy_kernels.cu -o /dev/null -Xptxas -v 2>&1 | grep -E "Compiling|Used" || true
