#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check, run in one go on a machine with an
# NVIDIA GPU (DESIGN §8, tier 3). It uses the python3 that holds CUDA torch and
# transformers there and runs headcount from this checkout (PYTHONPATH; no
# install, nothing fetched). nvtx is optional: without it only the
# torch.profiler ranges are emitted, which is all the torch source reads.
#
#   OUT=/tmp/gpu-check bash scripts/gpu_check.sh
#
# It profiles the embedded default model with the torch source in bfloat16
# across eager, sdpa (and flash_attention_2 when flash-attn imports), in layer
# and head mode, keeps the raw torch.profiler traces (future fixtures), and
# checks the numbers against physics (scripts/gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check-out}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None); print('transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/environment.txt"
impls=eager,sdpa
if $PY -c "import flash_attn" 2>/dev/null; then impls=$impls,flash_attention_2; fi
dtype=${DTYPE:-bfloat16}
if ! $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  dtype=float32  # a CPU dry run of this script (bfloat16 matmuls are slow on CPU)
fi
for mode in layer head; do
  $PY -m headcount.cli.main profile --impl "$impls" --mode "$mode" --dtype "$dtype" --batch "${BATCH:-4}" --seq "${SEQ:-512}" \
    --steps 3 --trace-dir "$OUT/traces-$mode" -o "$OUT/report" --append 2>&1 | tee "$OUT/profile-$mode.txt"
done
$PY scripts/gpu_check.py "$OUT/report" 2>&1 | tee "$OUT/checks.txt"
