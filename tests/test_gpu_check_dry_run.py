"""scripts/gpu_check.sh --dry-run: the GPU check's steps and checks on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nsight import nsight_bin

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    tools = Path(nsight_bin("nsys")).parent  # the dry run also wraps a script with the real nsys
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
                          env={**os.environ, "PYTHON": sys.executable, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    checks = {c["check"]: c for c in summary["checks"]}
    assert summary["failed"] == 0
    assert checks["heads explain their layer"]["status"] == "ok"
    assert checks["copy-bandwidth ceiling"]["status"] == "skip"  # a CPU copy is no GPU ceiling
    assert checks["cupti probe probe-cupti-folder"]["detail"].startswith("no NVIDIA driver")
    assert {r["implementation"] for r in summary["per_implementation"]} == {"eager", "sdpa"}
    assert summary["overhead"]["model"] == "bert-tiny" and summary["overhead"]["median_step_s_with"] > 0
    training = checks["training windows (background worker)"]
    assert training["status"] == "ok", training
    assert sorted(summary["training"]["written"]) == [0, 3] and summary["training"]["ratio"] > 0  # in the order written
    env = json.loads((out / "environment.json").read_text())
    assert env["cuda_available"] is False
    doctor = json.loads((out / "doctor.json").read_text())
    assert doctor["usable"]["cupti"] is False
    files = (out / "files.tsv").read_text()
    assert "report/layers/" in files and "bandwidth.json" in files
    assert checks["headcount run --backend nsys"]["status"] == "ok"
    assert checks["Ctrl-C keeps the recording (nsys)"]["status"] == "ok", checks["Ctrl-C keeps the recording (nsys)"]
    assert checks["Ctrl-C keeps the recording (torch)"]["status"] == "ok", checks["Ctrl-C keeps the recording (torch)"]
    assert "report/report.html" in files
    graph = checks["CUDA graph replays in their layers (cupti)"]  # no CUDA graph on CPU: the eager stand-in's calls
    assert graph["status"] == "skip" and "calls [3]" in graph["detail"], graph
    # issue 47: the counters workload ran under headcount run (nsys on CPU), each shape's steps numbered and planned;
    # the comparison itself needs cupti and ncu on a GPU, and says so
    plan = json.loads((out / "counters" / "plan-layer.json").read_text())
    assert [(p["seq"], p["measured"]) for p in plan["steps"]] == [(32, False), (32, True), (64, False), (64, True),
                                                                  (128, False), (128, True)]
    assert "counters/cupti-sdpa/ranges/" in files
    assert checks["cupti-sampled vs ncu-measured DRAM bytes per layer"]["status"] == "skip"
    compiled = checks["torch.compile: head ranges hold their kernels, in the dtype asked"]
    assert compiled["status"] == "ok" and "0 head ranges" not in compiled["detail"], compiled
    heads = checks["heads explain their layer"]
    assert "split cost" in heads["detail"] and "glue" in heads["detail"], heads  # the paired layer-mode profile ran
