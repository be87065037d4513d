"""Inductor's per-kernel estimates (``kernel_flop``, ``kernel_num_gb``) in the kernels table, with their provenance
(issue 59, route 3). Both ways torch writes them, through torch's own code:

- ``python -m torch._inductor.analysis.profile_analysis --augment_trace`` over a real H100 trace (TimeSformer,
  ``../shared/fixtures/kineto``): torch writes the estimates onto each kernel and its operator;
- the profiler operator Inductor wraps each Triton launch in (``torch._C._profiler._RecordFunctionFast`` with
  the kwargs of ``CachingAutotuner.get_profiler_kwargs``), recorded by torch.profiler on this CPU and exported
  by torch; the launch and the kernel it starts are the GPU boundary (:func:`_launched_kernel` stands in for them).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMESFORMER = ROOT.parent / "shared" / "fixtures" / "kineto" / "h100_timesformer_eager_kineto.json.gz"


def _parse(trace: Path, out: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(trace), "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.fixture(scope="module")
def augmented(tmp_path_factory):
    if not TIMESFORMER.exists():
        pytest.skip(f"{TIMESFORMER} is not here (../shared/fixtures)")
    tmp = tmp_path_factory.mktemp("augmented")
    plain = tmp / "trace.json"
    plain.write_bytes(gzip.decompress(TIMESFORMER.read_bytes()))
    done = subprocess.run([sys.executable, "-m", "torch._inductor.analysis.profile_analysis", "--augment_trace",
                           str(plain), str(tmp / "augmented.json"), "bfloat16"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    stderr = _parse(tmp / "augmented.json", tmp / "out")
    return json.loads((tmp / "augmented.json").read_text()), tmp / "out", stderr


def test_each_kernel_of_an_augmented_trace_has_torchs_estimate_when_it_is_its_operators_only_kernel(augmented):
    doc, out, stderr = augmented
    raw = [ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel"]
    per_op = pd.Series([ev["args"].get("External id") for ev in raw]).value_counts()
    by_hand = {ev["args"]["correlation"]: ev["args"] for ev in raw}
    kernels = pd.read_parquet(out / "kernels")
    kernels = kernels[kernels["kind"] == "kernel"]
    assert len(kernels) == len(raw) == 446
    checked = 0
    for row in kernels.itertuples():
        args = by_hand[row.correlation_id]
        sole = per_op[args["External id"]] == 1
        flop, gb = args.get("kernel_flop"), args.get("kernel_num_gb")
        if sole and flop:
            assert row.estimated_flop == pytest.approx(flop, rel=1e-12)
            checked += 1
        else:
            assert np.isnan(row.estimated_flop)
        if sole and gb:
            assert row.estimated_min_bytes == pytest.approx(gb * 1e9, rel=1e-12)
            assert row.estimate_provenance == "inductor estimate"
        else:
            assert np.isnan(row.estimated_min_bytes)
    assert checked == 133  # 137 kernels carry a FLOP count; the 4 of one convolution share theirs
    shared = int((per_op[per_op > 1]).sum())
    assert f"{shared} kernels of 1 operator that launched several kernels" in stderr


def _inductor_operator(tmp_path: Path, kwargs: dict) -> dict:
    """The operator torch.profiler records around an Inductor Triton launch, as torch writes it (this CPU)."""
    script = f"""
import json, torch
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    with torch._C._profiler._RecordFunctionFast("triton_poi_fused_add_0", (torch.ones(4),), {kwargs!r}):
        torch.ones(4) + 1
prof.export_chrome_trace({str(tmp_path / "cpu.json")!r})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "cpu.json").read_text())
    return doc, next(ev for ev in doc["traceEvents"] if ev.get("name") == "triton_poi_fused_add_0")


def _launched_kernel(doc: dict, op: dict, correlation: int) -> None:
    """Stands in for the GPU: the launch call inside the operator and the kernel it starts (Kineto's fields,
    the kernel's ``External id`` that of the operator around its launch, as Kineto links them)."""
    ts = op["ts"] + op["dur"] / 4
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernel", "pid": op["pid"], "tid": op["tid"], "ts": ts, "dur": 5.0,
         "args": {"correlation": correlation, "External id": op["args"]["External id"]}},
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0", "pid": 0, "tid": 7, "ts": ts + 20.0, "dur": 3.5,
         "args": {"External id": op["args"]["External id"], "device": 0, "stream": 7, "correlation": correlation,
                  "grid": [1, 1, 1], "block": [128, 1, 1], "registers per thread": 16, "shared memory": 0}},
    ]
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}]


KWARGS = {"kernel_file": "/tmp/torchinductor/ab/cab.py", "kernel_hash": "cab", "kernel_backend": "triton", "stream": 0,
          "num_warps": 4, "num_stages": 1, "kernel_kwargs": "XBLOCK=128", "kernel_name": "triton_poi_fused_add_0"}


def test_a_triton_kernel_gets_the_estimates_inductor_wrote_on_the_operator_around_its_launch(tmp_path):
    doc, op = _inductor_operator(tmp_path, {**KWARGS, "kernel_flop": 4096, "kernel_num_gb": 3.2e-08})
    assert op["args"]["kernel_flop"] == 4096 and op["args"]["kernel_num_gb"] == 3.2e-08  # as torch wrote them
    _launched_kernel(doc, op, correlation=90001)
    (tmp_path / "trace.json").write_text(json.dumps(doc))
    _parse(tmp_path / "trace.json", tmp_path / "out")
    kernels = pd.read_parquet(tmp_path / "out" / "kernels")
    kernel = kernels[kernels["kind"] == "kernel"].iloc[0]
    assert kernel["estimated_flop"] == 4096 and kernel["estimated_min_bytes"] == pytest.approx(32.0)
    assert kernel["estimate_provenance"] == "inductor estimate"
    others = kernels[kernels["kind"] != "kernel"]
    assert others["estimated_flop"].isna().all() and others["estimate_provenance"].isna().all()


def test_inductors_zero_is_not_estimated_and_no_estimate_leaves_the_columns_null(tmp_path):
    doc, op = _inductor_operator(tmp_path, {**KWARGS, "kernel_num_gb": 0})  # Inductor's "not estimated"
    _launched_kernel(doc, op, correlation=90002)
    (tmp_path / "trace.json").write_text(json.dumps(doc))
    _parse(tmp_path / "trace.json", tmp_path / "out")
    kernel = pd.read_parquet(tmp_path / "out" / "kernels").query("kind == 'kernel'").iloc[0]
    assert np.isnan(kernel["estimated_min_bytes"]) and np.isnan(kernel["estimated_flop"]) and pd.isna(kernel["estimate_provenance"])


def test_the_roofline_places_the_estimated_kernels_at_their_estimates_over_their_measured_time(augmented, tmp_path):
    doc, out, _ = augmented
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "report", str(out), "-o", str(tmp_path / "r.html")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "a kernel (Inductor est.)" in page and "Grey crosses" in page
    # by hand, from torch's figures in the trace: the sm90 bf16 GEMM launches outside every layer (the kernels table
    # says which), each its operator's only kernel, their FLOPs and GB summed over their summed measured durations
    kernels = pd.read_parquet(out / "kernels")
    row = kernels[kernels["name"].str.startswith("sm90_xmma_gemm_bf16bf16") & kernels["layer_name"].isna()]
    raw = {ev["args"]["correlation"]: ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel"}
    mine = [raw[c] for c in row["correlation_id"]]
    assert len(mine) == 60
    flop = sum(ev["args"]["kernel_flop"] for ev in mine)
    rate = flop / (sum(ev["dur"] for ev in mine) * 1e-6)
    intensity = flop / (sum(ev["args"]["kernel_num_gb"] for ev in mine) * 1e9)
    shown = re.search(r"\(60 launches\): ([\d.,]+) FLOP/byte, ([\d.]+) TFLOP/s", page)
    assert shown, "no point for the 60 GEMM launches"
    assert float(shown.group(1).replace(",", "")) == pytest.approx(intensity, rel=1e-3)
    assert float(shown.group(2)) * 1e12 == pytest.approx(rate, rel=5e-3)
    assert 600e12 < rate < 989e12  # below the H100's bf16 dense peak
