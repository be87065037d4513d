#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check (docs/architecture.md §8, tier 3), run in one go
# on a machine with an NVIDIA GPU, Python 3.12 with CUDA torch, transformers,
# pandas, pyarrow and ncu, and no network:
#
#   bash scripts/gpu_check.sh [--dry-run] [OUT]      (OUT: else $OUT, else gpu_check_out/)
#
# Wheels that machine lacks (cupti-python, nvtx, rich, ...) travel with the
# checkout in the git-ignored .whl/ folder (make gpu-wheels fills it) and are
# installed there with `pip install --no-index --target`. In about 8 minutes
# on an H200 it:
#   1. prints the device and versions (environment.json, nvidia-smi.txt, doctor.json);
#   2. probes the README's route (`headcount cupti install`'s folder: cupti-python 13.4 and
#      libcupti 13.4 beside torch), 13.4 over torch's own libcupti, and 13.0: the libcupti each
#      loaded and its PM samples; the profile uses the first that sampled; then NVTX marker
#      records (probe-*.json);
#   3. measures the copy-bandwidth ceiling (bandwidth.json);
#   4. compares the occupancy calculator with the driver's (occupancy.json);
#   5a. the counters (issue 47): a bert-base-sized model at seq 128, 512 and 2048 (batch 64, 16, 4), sdpa and
#      eager, under `headcount run --backend cupti` (PM-sampled DRAM bytes) and `--backend ncu` (measured, layers
#      0 and 1), then head mode at seq 2048 (layer 0 under ncu): sampled/measured per layer and head call
#      (counters/: both reports with their raw records, plan-*.json);
#   5. profiles a bert-base-sized model (12 layers, 12 heads, batch 16, seq 512,
#      bf16) forward+backward with eager, sdpa (and flash_attention_2 when
#      flash-attn imports) in layer and head mode with the cupti source
#      (report/, raw CUPTI records in records-layer/ and records-head/);
#   6. measures the collector's overhead on that training step (overhead.json);
#   6b. times a training loop untagged and under StepProfiler, windows written by its
#      background worker (training.json, training/);
#   7. profiles a slice (layers 0 and 1, sdpa, one step) under ncu and parses it
#      (ncu/slice.ncu-rep, ncu-report/);
#   8. runs the workload as a plain script under `headcount run` with nsys, cupti and
#      (layer 0 of one step) ncu (run-nsys/, run-cupti/, run-ncu/);
#   8b. profiles the same model under torch.compile in head mode (report-compiled/, records-compiled/);
#   8c. captures its forward into a CUDA graph while tagged and replays it once per step, under
#      the cupti source (report-graphed/) and under nsys --cuda-graph-trace=node (graph-nsys/,
#      report-graph-nsys/): every replayed attention kernel must land in its layer;
#   8e. torch 2.15's own routes (issue 59), where the device's torch has them: torch.profiler's own PM samples of
#      the profiled model against headcount's (torch-pm/), a capture labelled by the tagger replayed and exported with
#      its annotations (torch-graph/); skipped with the reason where not (torch-routes.json);
#   8d. interrupts `headcount run` (ncu, cupti, nsys, torch) after step 3 as a terminal does: the report must
#      hold the steps before it, exit 130, nothing left running (interrupt-*.json);
#   9. checks the numbers against physics and writes summary.json (exit 1 if a check fails).
# Each step has a time limit and the whole check a deadline ($DEADLINE, default
# 480 s; steps that no longer fit are skipped, the checks always run); a
# failed step is logged and the next one runs.
#
# --dry-run (any machine, CI): the same steps on bert-tiny with the torch
# source on CPU; GPU-only steps and checks are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-gpu_check_out}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
: > "$OUT/steps.log"

log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$OUT/steps.log"; }
DEADLINE=${DEADLINE:-480}  # seconds for the whole check (issue 47: one device call of 8 minutes at most); the checks keep 45
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output in NAME.log
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 45))
  if [ "$left" -lt 20 ]; then
    log "skip $name: out of time (DEADLINE=$DEADLINE s)"
    echo "skipped: out of time" > "$OUT/$name.log"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "start $name"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "end $name: exit $rc after $((SECONDS - t0)) s"
  tail -n 8 "$OUT/$name.log"
  return $rc
}

if [ "$DRY" = 1 ]; then
  MODEL=bert-tiny BATCH=2 SEQ=32 DTYPE=float32 STEPS=2 HEAD_STEPS=1 OVERHEAD_STEPS=3 TRAINING_STEPS=6 TRAINING_EVERY=3 BACKEND=torch DRYFLAG=--dry-run DEVICE=cpu
else
  MODEL=bert-base BATCH=${BATCH:-16} SEQ=${SEQ:-512} DTYPE=bfloat16 STEPS=3 HEAD_STEPS=2 OVERHEAD_STEPS=10 TRAINING_STEPS=40 TRAINING_EVERY=10 BACKEND=cupti DRYFLAG= DEVICE=cuda
fi

# 1. wheels and environment -------------------------------------------------
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY" = 0 ] && [ -d .whl/common ]; then
  for set in common cupti-13.0; do
    [ -d ".whl/$set" ] && step "install-$set" 120 $PY -m pip install -q --no-index --no-deps --upgrade --target ".whl/site-$set" .whl/$set/*.whl
  done
  export PYTHONPATH="$PWD/.whl/site-common:$PYTHONPATH"
elif [ "$DRY" = 0 ]; then
  log "no .whl/ folder: using what $PY already has (make gpu-wheels fills .whl/ on a machine with PyPI)"
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
$PY - > "$OUT/environment.json" <<'EOF'
import json, platform, subprocess, shutil
import torch, transformers
env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
       "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    env.update(device=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
               memory_bytes=p.total_memory)
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        env["driver"] = f"unknown ({exc})"
for tool in ("ncu", "nsys"):
    exe = shutil.which(tool)
    env[tool] = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1] if exe else None
from headcount.common.env import package_version
for dist in ("nvidia-cuda-cupti", "cuda-toolkit", "cupti-python", "cuda-bindings", "nvtx"):  # what torch brought (issue 35)
    env[dist] = package_version(dist)
try:
    import flash_attn
    env["flash_attn"] = flash_attn.__version__
except Exception:
    env["flash_attn"] = None
print(json.dumps(env, indent=2))
EOF
cat "$OUT/environment.json"

# 2. which cupti-python records here, over which libcupti (issue 35) ------------
# folder: the README's route, what `headcount cupti install` does (cupti-python 13.4 and libcupti 13.4 with
#   pip install --target into a folder beside the environment; headcount loads them first), from the carried wheels;
# 13.4-torchlib: cupti-python 13.4 alone over the libcupti torch brought (CUPTI refused PM sampling there on an H100);
# 13.0: fits torch 2.14's pins, no PM sampling.
# Each probe records the libcupti it loaded (path, wheel, API version) and its PM samples; the profile uses the
# first that sampled, else the first that recorded kernels.
NO_FOLDER="$PWD/.whl/no-cupti-folder"
if [ "$DRY" = 0 ] && ls .whl/cupti-13.4/cupti_python-*.whl > /dev/null 2>&1; then
  step install-cupti-folder 120 $PY -m pip install -q --no-index --no-deps --upgrade --target .whl/cupti-folder .whl/cupti-13.4/*.whl
  step install-cupti-13.4-torchlib 120 $PY -m pip install -q --no-index --no-deps --upgrade --target .whl/site-cupti-13.4-torchlib \
    .whl/cupti-13.4/cupti_python-*.whl
fi
CUPTI_SITE=
PROBES="folder 13.4-torchlib 13.0"
[ "$DRY" = 1 ] && PROBES=folder  # no driver: one probe shows the message
for v in $PROBES; do
  if [ "$v" = folder ]; then
    folder="$PWD/.whl/cupti-folder"
    [ "$DRY" = 1 ] && folder=$($PY -c "from headcount.collector import cupti_home; print(cupti_home.home())")
    HEADCOUNT_CUPTI_HOME=$folder step probe-cupti-folder 120 $PY scripts/gpu_check.py probe-cupti "$OUT/probe-cupti-folder.json"
    continue
  fi
  site="$PWD/.whl/site-cupti-$v"
  [ -d "$site" ] || continue
  HEADCOUNT_CUPTI_HOME=$NO_FOLDER PYTHONPATH="$site:$PYTHONPATH" step "probe-cupti-$v" 120 $PY scripts/gpu_check.py probe-cupti "$OUT/probe-cupti-$v.json"
done
chosen=$($PY scripts/gpu_check.py choose-cupti "$OUT" $PROBES)
log "cupti-python for the profile: $chosen"
if [ "$chosen" = folder ] && [ "$DRY" = 0 ]; then
  export HEADCOUNT_CUPTI_HOME="$PWD/.whl/cupti-folder"
  CUPTI_SITE=none
elif [ "$chosen" != none ]; then
  export HEADCOUNT_CUPTI_HOME=$NO_FOLDER
  CUPTI_SITE="$PWD/.whl/site-cupti-$chosen"
  [ "$DRY" = 1 ] || [ ! -d "$CUPTI_SITE" ] && CUPTI_SITE=none
fi
if [ -n "$CUPTI_SITE" ] && [ "$CUPTI_SITE" != none ]; then export PYTHONPATH="$CUPTI_SITE:$PYTHONPATH"; fi
if [ -n "$CUPTI_SITE" ]; then
  LIBCUPTI=$($PY -c "from headcount.collector.cupti_load import injection_library; print(injection_library() or '')")
  log "NVTX injection library: ${LIBCUPTI:-none found}"
  if [ -n "$LIBCUPTI" ]; then
    # the profile injects NVTX into libcupti only if this probe shows that it works
    if ! NVTX_INJECTION64_PATH=$LIBCUPTI step probe-nvtx-markers 150 $PY scripts/gpu_check.py probe-cupti "$OUT/probe-nvtx-markers.json" --nvtx-markers; then
      export HEADCOUNT_NVTX_INJECTION=0
    fi
  else
    export HEADCOUNT_NVTX_INJECTION=0
  fi
elif [ "$DRY" = 0 ]; then
  log "no cupti-python records here: the profile falls back to the torch source"
  BACKEND=torch
fi
$PY -m headcount.cli.main doctor --json > "$OUT/doctor.json" 2>&1

# 3-4. bandwidth ceiling, occupancy vs the driver ------------------------------
step bandwidth 120 $PY scripts/gpu_check.py bandwidth "$OUT" $DRYFLAG
if [ "$DRY" = 0 ]; then step occupancy 120 $PY scripts/gpu_check.py occupancy "$OUT"; fi

# 5a. the counters (issue 47): cupti-sampled against ncu-measured DRAM bytes of the same calls, three shapes, ------
# sdpa and eager, layer mode (layers 0 and 1 under ncu), then head mode on the longest shape (layer 0 under ncu).
# The workload is a plain script (two training steps per shape, the first warming up); headcount run tags it.
if [ "$DRY" = 1 ]; then SHAPES=${SHAPES:-32x2,64x2,128x1}; HEAD_SHAPE=${HEAD_SHAPE:-64x2}; CBACKEND=nsys
else SHAPES=${SHAPES:-128x64,512x16,2048x4}; HEAD_SHAPE=${HEAD_SHAPE:-2048x4}; CBACKEND=$BACKEND; fi
mkdir -p "$OUT/counters"
CW="scripts/gpu_check.py counters-workload --dtype $DTYPE $DRYFLAG"
HAVE_NCU=0
if [ "$DRY" = 0 ] && command -v ncu > /dev/null; then HAVE_NCU=1; fi
for impl in sdpa eager; do
  if [ "$DRY" = 1 ] && [ "$impl" = eager ]; then continue; fi  # CPU: one wrapped run shows the steps work
  step "counters-cupti-$impl" 150 $PY -m headcount.cli.main run --backend $CBACKEND -o "$OUT/counters/cupti-$impl" --force \
    -- $PY $CW --impl $impl --shapes $SHAPES --plan "$OUT/counters/plan-layer.json"
  if [ "$HAVE_NCU" = 1 ]; then
    step "counters-ncu-$impl" 200 $PY -m headcount.cli.main run --backend ncu --cache-control none --launch-count 0 \
      --nvtx-include "headcount@fwd/layer.0/" --nvtx-include "headcount@bwd/layer.0/" \
      --nvtx-include "headcount@fwd/layer.1/" --nvtx-include "headcount@bwd/layer.1/" \
      -o "$OUT/counters/ncu-$impl" --force -- $PY $CW --impl $impl --shapes $SHAPES
  fi
done
if [ "$DRY" = 0 ]; then
  step counters-cupti-head 150 $PY -m headcount.cli.main run --backend $CBACKEND --mode head -o "$OUT/counters/cupti-head" --force \
    -- $PY $CW --impl sdpa --shapes $HEAD_SHAPE --plan "$OUT/counters/plan-head.json"
  if [ "$HAVE_NCU" = 1 ]; then
    step counters-ncu-head 200 $PY -m headcount.cli.main run --backend ncu --mode head --cache-control none --launch-count 0 \
      --nvtx-include "headcount@fwd/layer.0/" --nvtx-include "headcount@bwd/layer.0/" \
      -o "$OUT/counters/ncu-head" --force -- $PY $CW --impl sdpa --shapes $HEAD_SHAPE
  fi
fi

# 5. the profile: layer and head mode -------------------------------------------
impls=eager,sdpa
if [ "$DRY" = 0 ] && $PY -c "import flash_attn" 2>/dev/null; then impls=$impls,flash_attention_2; fi
step profile-layer 300 $PY -m headcount.cli.main profile --model $MODEL --impl $impls --mode layer --backend $BACKEND --device $DEVICE \
  --dtype $DTYPE --batch $BATCH --seq $SEQ --steps $STEPS --trace-dir "$OUT/records-layer" -o "$OUT/report" --append
step profile-head 300 $PY -m headcount.cli.main profile --model $MODEL --impl $impls --mode head --backend $BACKEND --device $DEVICE \
  --dtype $DTYPE --batch $BATCH --seq $SEQ --steps $HEAD_STEPS --trace-dir "$OUT/records-head" -o "$OUT/report" --append

# the measured ceiling stored with the report, then its HTML page (report/report.html)
if [ "$DRY" = 0 ]; then step calibrate 120 $PY -m headcount.cli.main calibrate -o "$OUT/report"; fi
step html-report 120 $PY -m headcount.cli.main report "$OUT/report"

# 6. overhead of the collector ------------------------------------------------------
step overhead 180 $PY scripts/gpu_check.py overhead "$OUT" --model $MODEL --batch $BATCH --seq $SEQ --dtype $DTYPE \
  --impl sdpa --steps $OVERHEAD_STEPS $DRYFLAG

# 6b. training windows written by the background worker ---------------------------------
step training 150 $PY scripts/gpu_check.py training "$OUT" --model $MODEL --batch $BATCH --seq $SEQ --dtype $DTYPE \
  --impl sdpa --steps $TRAINING_STEPS --every $TRAINING_EVERY $DRYFLAG

# 7. a slice under ncu ------------------------------------------------------------
if [ "$DRY" = 0 ] && command -v ncu > /dev/null; then
  mkdir -p "$OUT/ncu"
  step ncu 300 ncu --nvtx --nvtx-include "headcount@fwd/layer.0/" --nvtx-include "headcount@bwd/layer.0/" \
    --nvtx-include "headcount@fwd/layer.1/" --nvtx-include "headcount@bwd/layer.1/" \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__maximum_warps_per_active_cycle_pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__shared_mem_config_size \
    --clock-control none --cache-control none -f -o "$OUT/ncu/slice" \
    $PY scripts/gpu_check.py workload --model $MODEL --batch $BATCH --seq $SEQ --dtype $DTYPE --impl sdpa
  [ -f "$OUT/ncu/slice.ncu-rep" ] && step ncu-parse 120 $PY -m headcount.cli.main parse "$OUT/ncu/slice.ncu-rep" -o "$OUT/ncu-report" --force
else
  log "skip ncu slice (dry run or no ncu)"
fi

# 8. headcount run on a plain script: nsys, cupti, and ncu on layer 0 of one step --------
if [ "$DRY" = 0 ]; then
  RUNARGS="--model $MODEL --batch ${RUN_BATCH:-4} --seq $SEQ --dtype $DTYPE --impl sdpa --plain"
  command -v nsys > /dev/null && step run-nsys 180 $PY -m headcount.cli.main run --backend nsys -o "$OUT/run-nsys" -- $PY scripts/gpu_check.py workload $RUNARGS
  step run-cupti 180 $PY -m headcount.cli.main run --backend cupti -o "$OUT/run-cupti" -- $PY scripts/gpu_check.py workload $RUNARGS
  command -v ncu > /dev/null && step run-ncu 240 $PY -m headcount.cli.main run --backend ncu --steps 1 \
    --nvtx-include "headcount@fwd/layer.0/" --nvtx-include "headcount@bwd/layer.0/" --cache-control none \
    -o "$OUT/run-ncu" -- $PY scripts/gpu_check.py workload $RUNARGS
elif command -v nsys > /dev/null; then
  step run-nsys 180 $PY -m headcount.cli.main run --backend nsys -o "$OUT/run-nsys" -- $PY scripts/gpu_check.py workload \
    --model $MODEL --batch $BATCH --seq $SEQ --dtype $DTYPE --impl sdpa --plain --dry-run
fi

# 8b. the model under torch.compile (Inductor): head mode, every attention kernel in its range --------
# (no layer-mode pair: it would compile the model a second time; the uncompiled head profile states the split's cost)
step profile-compiled 240 $PY -m headcount.cli.main profile --compile --model $MODEL --impl sdpa --mode head --no-layer-pair --backend $BACKEND \
  --device $DEVICE --dtype $DTYPE --batch $BATCH --seq $SEQ --steps $HEAD_STEPS --trace-dir "$OUT/records-compiled" \
  -o "$OUT/report-compiled" --force

# 8e. torch 2.15's own routes (issue 59): torch.profiler's PM samples of the profiled model, a labelled CUDA-graph
# capture replayed under torch.profiler; each skipped with its reason where this torch has no route (torch-routes.json)
step torch-routes 150 $PY scripts/gpu_check.py torch-routes "$OUT" --model $MODEL --batch $BATCH --seq $SEQ --dtype $DTYPE \
  --impl sdpa --steps 3 $DRYFLAG

# 8c. a CUDA-graphed forward: captured while tagged, replayed once per step ----------------------
GRAPHARGS="--model $MODEL --batch ${GRAPH_BATCH:-4} --seq $SEQ --dtype $DTYPE --impl sdpa --steps 3 $DRYFLAG"
step cuda-graph 180 $PY scripts/gpu_check.py cuda-graph "$OUT" $GRAPHARGS
if [ "$DRY" = 0 ] && command -v nsys > /dev/null; then
  mkdir -p "$OUT/graph-nsys"
  step graph-nsys 180 nsys profile --trace=cuda,nvtx --cuda-graph-trace=node --sample=none --cpuctxsw=none \
    -o "$OUT/graph-nsys/run" --force-overwrite true $PY scripts/gpu_check.py cuda-graph "$OUT" $GRAPHARGS --tagger-only
  [ -f "$OUT/graph-nsys/run.nsys-rep" ] && step graph-nsys-parse 120 $PY -m headcount.cli.main parse \
    "$OUT/graph-nsys/run.nsys-rep" -o "$OUT/report-graph-nsys" --force
fi

# 8d. Ctrl-C keeps the recording: headcount run interrupted after step 3 (issue 33; ncu's first check on a GPU) ----
INTARGS="--model $MODEL --batch ${RUN_BATCH:-4} --seq $SEQ --dtype $DTYPE --impl sdpa $DRYFLAG"
if [ "$DRY" = 0 ]; then
  command -v ncu > /dev/null && step interrupt-ncu 150 $PY scripts/gpu_check.py interrupt "$OUT" --backend ncu $INTARGS
  step interrupt-cupti 120 $PY scripts/gpu_check.py interrupt "$OUT" --backend cupti $INTARGS
fi
command -v nsys > /dev/null && step interrupt-nsys 120 $PY scripts/gpu_check.py interrupt "$OUT" --backend nsys $INTARGS
step interrupt-torch 120 $PY scripts/gpu_check.py interrupt "$OUT" --backend torch $INTARGS  # torch.profiler in the program

# 9. physics ---------------------------------------------------------------------
log "start check"
timeout 120 $PY scripts/gpu_check.py check "$OUT" 2>&1 | tee "$OUT/check.log"
rc=${PIPESTATUS[0]}
( cd "$OUT" && find . -type f -printf '%s\t%p\n' | sort -k2 > files.tsv )
log "done: exit $rc; outputs in $OUT"
exit $rc
