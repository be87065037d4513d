"""AttentionProfiler on CPU (torch source): the breakdown, ranges and kernels tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import inputs_for, llama_model, profiled

from headcount import AttentionProfiler, HeadcountError

BREAKDOWN_REQUIRED = ["phase", "layer", "head", "calls", "duration_ns", "dram_bytes", "bandwidth_gbps", "flop",
                      "intensity_flop_per_byte", "duration_provenance", "dram_bytes_provenance", "flop_provenance"]


def test_layer_mode_breakdown():
    prof = profiled(llama_model("sdpa"), steps=2)
    stats = prof.get_stats()
    bd = stats["attention_breakdown"]
    assert set(BREAKDOWN_REQUIRED) <= set(bd.columns)
    assert len(bd) == 4  # (fwd, bwd) x 2 layers
    assert set(zip(bd["phase"], bd["layer"])) == {("fwd", 0), ("fwd", 1), ("bwd", 0), ("bwd", 1)}
    assert bd["head"].isna().all()
    assert (bd["calls"] == 2).all()
    assert (bd["duration_ns"] > 0).all()
    assert set(bd["duration_provenance"]) == {"measured"}
    assert set(bd["dram_bytes_provenance"]) == {"analytic"}
    assert set(bd["flop_provenance"]) == {"analytic"}
    # analytic: batch 2, 4 heads, causal 16x16 -> 136 pairs, head dim 16 -> fwd flop 4*B*H*P*D per call
    fwd = bd[bd["phase"] == "fwd"]
    assert np.allclose(fwd["flop"], 2 * 4 * 2 * 4 * 136 * 16)
    bwd = bd[bd["phase"] == "bwd"]
    assert np.allclose(bwd["flop"].to_numpy(), 2.5 * fwd["flop"].to_numpy())
    assert np.allclose(bd["bandwidth_gbps"], bd["dram_bytes"] / bd["duration_ns"])
    assert np.allclose(bd["intensity_flop_per_byte"], bd["flop"] / bd["dram_bytes"])
    heads = stats["heads"]
    assert len(heads) == 4 * 4 and set(heads["provenance"]) == {"apportioned"}
    # apportioned heads add back up to their layer
    summed = heads.groupby(["phase", "layer"])["duration_ns"].sum().sort_index()
    layers = stats["layers"].set_index(["phase", "layer"])["duration_ns"].sort_index()
    assert np.allclose(summed.to_numpy(), layers.to_numpy())


def test_head_mode_breakdown_measures_each_head():
    prof = profiled(llama_model("eager"), mode="head")
    stats = prof.get_stats()
    bd = stats["attention_breakdown"]
    assert len(bd) == 2 * 2 * 4
    assert set(bd["provenance"]) == {"measured"}
    assert list(bd[(bd.phase == "fwd") & (bd.layer == 0)].sort_values("head")["kv_head"]) == [0, 0, 1, 1]
    layers = stats["layers"]
    # heads are nested in their layer range, and the split's own cost is what is left
    assert (layers["heads_duration_ns"] <= layers["duration_ns"]).all()
    assert (layers["split_overhead_ns"] >= 0).all()
    share = bd.groupby(["phase", "layer"])["share_of_layer_pct"].sum()
    assert np.allclose(share, 100.0)


def test_ranges_and_kernels_tables():
    stats = profiled(llama_model("sdpa"), mode="head").get_stats()
    ranges = stats["ranges"]
    assert set(ranges["level"]) == {"phase", "layer", "head"}
    by_id = ranges.set_index("range_id")
    heads = ranges[ranges["level"] == "head"]
    parents = by_id.loc[heads["parent_range_id"]]
    assert (parents["level"] == "layer").all()
    assert (heads["start_ns"].to_numpy() >= parents["start_ns"].to_numpy()).all()
    assert (heads["end_ns"].to_numpy() <= parents["end_ns"].to_numpy()).all()
    # ops inside a layer include those of its heads
    layer_ops = ranges[ranges.level == "layer"].set_index("range_id")["op_count"]
    head_ops = heads.groupby("parent_range_id")["op_count"].sum()
    assert (layer_ops.loc[head_ops.index] >= head_ops).all()
    kernels = stats["kernels"]
    attributed = kernels[kernels["nvtx_path"].notna()]
    assert len(attributed) and (attributed["device"] == "cpu").all()
    # every attributed op lies inside its range
    r = by_id.loc[attributed["range_id"].astype(int)]
    assert (attributed["start_ns"].to_numpy() >= r["start_ns"].to_numpy()).all()
    assert (attributed["end_ns"].to_numpy() <= r["end_ns"].to_numpy()).all()
    assert set(attributed["phase"]) == {"fwd", "bwd"}
    # counts are preserved: ops of head ranges == ops attributed at head depth or below
    assert heads["op_count"].sum() == attributed["head"].notna().sum()
    # top-level CPU op time never exceeds the range's own wall time
    assert (ranges["cpu_ops_ns"] <= ranges["duration_ns"] + 1).all()


def test_no_model_form_tags_whatever_runs():
    model = llama_model("sdpa")
    prof = AttentionProfiler()
    with prof:
        model(**inputs_for("llama_gqa")).loss.backward()
    assert len(prof.get_stats()["attention_breakdown"]) == 4


def test_errors():
    with pytest.raises(HeadcountError, match="backend"):
        AttentionProfiler(backend="nsight")
    with pytest.raises(HeadcountError, match="mode"):
        AttentionProfiler(mode="heads")
    prof = AttentionProfiler(llama_model())
    with pytest.raises(HeadcountError, match="after the"):
        prof.get_stats()
    with prof:
        torch.ones(3).sum()


def test_a_block_without_attention_gives_its_operators_steps_and_findings(capsys):
    """Nothing tagged is no error: the block's operators, its one step and its
    findings, and a notice that no attention was found (never 'nothing was written')."""
    prof = AttentionProfiler(llama_model())
    with prof:
        torch.ones(3).sum()
    stats = prof.get_stats()
    assert "no attention call was tagged" in capsys.readouterr().err
    assert not len(stats["layers"]) and (stats["kernels"]["kind"] == "op").any()
    steps = stats["steps"]
    assert len(steps) == 1 and steps["basis"].iloc[0] == "cpu_step" and np.isnan(steps["attention_share_pct"].iloc[0])
    assert list(stats["findings"].columns[:3]) == ["run_id", "rank", "kind"]


def test_another_profiler_holding_the_session_is_a_clear_error(capsys):
    model = llama_model()
    with torch.profiler.profile():
        with pytest.raises(HeadcountError, match="already recording"):
            with AttentionProfiler(model, strict=True):
                pass
        # not strict: one line, and the block still runs (unprofiled)
        prof = AttentionProfiler(model)
        ran = False
        with prof:
            ran = True
        assert ran and "source did not start" in capsys.readouterr().err
        with pytest.raises(HeadcountError, match="nothing was recorded: a torch.profiler session of yours is already recording"):
            prof.get_stats()
    from transformers.modeling_utils import AttentionInterface

    from headcount.tagging import tagger as tagging

    assert not tagging._active and AttentionInterface.get_interface.__name__ == "get_interface"
