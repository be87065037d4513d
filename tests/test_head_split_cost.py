"""Head mode states what its split costs (issue 47, item 4): heads' share of their layer, the time of a
layer call that no head holds (glue kernels and gaps between heads on a GPU), and the layer time against
a paired layer-mode profile."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headcount.cli.main import main
from headcount.derive.aggregate import heads_table, layers_table, with_split_cost
from headcount.reports.findings import split_lines


def _ranges(heads_bytes=(100.0, 100.0)) -> pd.DataFrame:
    """One fwd layer call on a GPU: the layer's kernels run 0–100 µs (busy 70 µs, the two heads' 20 µs each,
    so 30 µs of glue kernels in the layer outside both heads); heads at 10–30 and 40–60 µs."""
    base = {"implementation": "sdpa", "phase": "fwd", "layer_name": "layer.0", "layer": 0, "pid": "1", "step": 0,
            "duration_basis": "gpu_busy", "flop": np.nan, "analytic_min_bytes": np.nan, "kernel_gap_ns": 0.0,
            "cpu_launch_cost_ns": 0.0, "theoretical_occupancy_x_busy": np.nan, "op_count": 0, "cpu_ops_ns": 0.0}
    rows = [dict(base, range_id=1, parent_range_id=0, level="layer", head=None, kv_head=None, start_ns=0, duration_ns=100e3,
                 kernel_busy_ns=70e3, kernel_count=5, dram_read_sampled_bytes=200.0, dram_write_sampled_bytes=50.0)]
    for i, (start, b) in enumerate(zip((10, 40), heads_bytes)):
        rows.append(dict(base, range_id=2 + i, parent_range_id=1, level="head", head=i, kv_head=0, start_ns=start * 1000,
                         duration_ns=20e3, kernel_busy_ns=20e3, kernel_count=1, dram_read_sampled_bytes=b, dram_write_sampled_bytes=0.0))
    return pd.DataFrame(rows)


def test_split_figures_add_up_to_the_layer():
    layers = layers_table(_ranges())
    row = layers.iloc[0]
    assert row["heads_duration_ns"] == 40e3 and row["split_overhead_ns"] == 60e3
    assert row["heads_share_of_layer_pct"] == pytest.approx(40.0)
    assert row["split_glue_ns"] == 30e3 and row["split_gaps_ns"] == 30e3  # heads + glue + gaps = the layer
    assert row["heads_dram_bytes"] == 200 and row["heads_bytes_share_of_layer_pct"] == pytest.approx(80.0)
    heads = heads_table(_ranges(), layers)
    assert not {"split_glue_ns", "heads_share_of_layer_pct"} & set(heads.columns)


def test_split_lines_say_where_the_layer_time_went_and_the_cost():
    layers = layers_table(_ranges())
    [line] = split_lines(layers)
    assert ("the heads hold 40 % of their layers' time and 80 % of their sampled DRAM bytes (they do not add up within 10 %: "
            "60 % of the time and 20 % of the bytes apart); 60.0 µs per layer call belongs to no head (30.0 µs glue: work in the layer outside every head; "
            "30.0 µs gaps between heads)") in line
    assert "not measured here" in line
    paired = with_split_cost(layers, layers.assign(duration_per_call_ns=25e3, duration_per_call_p50_ns=np.nan))
    assert paired["split_cost_x"].iloc[0] == pytest.approx(4.0)  # 100 µs per call in head mode, 25 in layer mode
    [line] = split_lines(paired)
    assert "a layer call takes 4.0× its time in layer mode (25.0 µs there per call" in line


def test_profile_head_mode_on_cpu_states_the_split_cost(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["profile", "--steps", "2", "--batch", "1", "--seq", "32", "--impl", "sdpa", "--mode", "head", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    for phase in ("fwd", "bwd"):
        assert f"head mode, {phase}, sdpa: the heads hold" in printed
    assert "belongs to no head (a CPU run" in printed and "paired layer-mode profile): the split's cost" in printed
    layers = pd.read_parquet(out / "layers")
    assert layers["split_cost_x"].notna().all() and (layers["split_cost_x"] > 0).all()
    assert (layers["split_overhead_ns"] == layers["duration_ns"] - layers["heads_duration_ns"]).all()
    assert layers["heads_share_of_layer_pct"].between(0, 100).all()
    assert pd.read_parquet(out / "runs")["mode"].tolist() == ["head"]  # the pair is a reference, not a run of the report


def test_compiled_head_mode_keeps_the_dtype():
    """A bf16 model compiled in head mode computes its heads in bf16: every attention operator inside a
    head range (SDPA forward and backward) takes bf16 tensors, none float32 (on the H100, compiled head mode
    ran fp32 GEMMs: SDPA's math fallback upcasts; the GPU check now looks for that, docs/gpu-check.md)."""
    import torch
    from conftest import bert_model, inputs_for, train_step
    from torch.profiler import ProfilerActivity, profile

    from headcount import AttentionTagger

    torch._dynamo.reset()
    model = bert_model("sdpa").to(torch.bfloat16)
    compiled = torch.compile(model)
    inputs = inputs_for("bert")
    try:
        with AttentionTagger([model], mode="head", nvtx=False):
            train_step(compiled, **inputs)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                train_step(compiled, **inputs)
    finally:
        torch._dynamo.reset()
    events = list(prof.events())
    heads = [e for e in events if e.name.startswith("headcount@head.")]
    inside = [e for e in events if not e.name.startswith("headcount@") and ("dot_product" in e.name or "mm" in e.name)
              and any(h.thread == e.thread and h.time_range.start <= e.time_range.start < h.time_range.end for h in heads)]
    assert len(inside) == 2 * 4 * 2  # forward and backward SDPA of 4 heads in each of 2 layers
    tensors = {t for e in inside for t in e.input_dtypes if t in ("float", "c10::BFloat16", "double", "c10::Half")}
    assert {t for e in inside for t in e.input_dtypes[:3]} == {"c10::BFloat16"} and "c10::BFloat16" in tensors
