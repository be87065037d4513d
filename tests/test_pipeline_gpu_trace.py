"""The torch source's GPU path: kernels attributed by their launch call.

No GPU trace recorded with torch.profiler exists in the fixtures yet, so this
test builds a small Kineto trace by hand, in the format torch.profiler writes
on a CUDA machine (``cuda_runtime`` launch events and ``kernel`` events joined
by ``args.correlation``). It stands in for a real GPU recording until
scripts/gpu_check.sh brings one back; it checks the rule, not the numbers.
"""

from __future__ import annotations

import pandas as pd

from headcount.build.shared import tables_from_events
from headcount.common.call_log import CallLog, CallShape
from headcount.parsers.kineto_json import events_frame


def _x(cat, name, ts, dur, tid=1, pid=4242, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_kernels_follow_their_launch_not_their_execution():
    events = [
        _x("user_annotation", "headcount.step@step.0", 0, 1000),
        _x("user_annotation", "headcount@fwd", 10, 100),
        _x("user_annotation", "headcount@layer.0", 11, 98),
        _x("cpu_op", "aten::_scaled_dot_product_flash_attention", 20, 50),
        _x("cuda_runtime", "cudaLaunchKernel", 30, 5, correlation=7),
        _x("cuda_runtime", "cudaLaunchKernel", 200, 5, correlation=8),  # after the range: not attention
        # the kernel launched inside the range runs long after the range closed
        # Kineto's GPU lanes: pid = device, tid = stream
        _x("kernel", "flash_fwd_kernel", 400, 60, pid=0, tid=7, correlation=7, device=0, stream=7, grid=[4, 8, 2], block=[128, 1, 1]),
        _x("kernel", "other_kernel", 470, 10, pid=0, tid=7, correlation=8, device=0, stream=7),
    ]
    shape = CallShape("sdpa", 2, 8, 2, 16, 16, 64, 64, "bfloat16", 2, True)
    calls = [CallLog(1, "fwd", "layer.0", 0, None, None, shape, "M")]
    tables = tables_from_events(events_frame(events), calls, "sdpa")
    kernels = tables["kernels"]
    flash = kernels[kernels.name == "flash_fwd_kernel"].iloc[0]
    assert flash.nvtx_path == "fwd/layer.0" and flash.phase == "fwd" and flash.layer == 0
    assert flash.launch_latency_ns == 400_000 - 30_000 and flash.cpu_launch_cost_ns == 5_000
    assert flash.device == "cuda:0" and flash.step == 0
    assert (flash.pid, flash.tid) == ("4242", "1")  # the launching thread, not the GPU lane
    assert pd.isna(kernels[kernels.name == "other_kernel"].iloc[0].nvtx_path)
    layer = tables["ranges"].query("level == 'layer'").iloc[0]
    assert (layer.gpu_start_ns, layer.gpu_end_ns, layer.gpu_op_count) == (400_000, 460_000, 1)
    assert layer.duration_basis == "gpu_busy" and layer.duration_ns == 60_000
    bd = tables["attention_breakdown"].iloc[0]
    assert bd.duration_ns == 60_000 and bd.dram_bytes_provenance == "analytic"
