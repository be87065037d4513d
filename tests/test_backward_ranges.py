"""A backward range holds the attention core's backward and nothing else (issue 47, item 1).

On the H100 (tests/fixtures/gpu/h100-2026-12-05) 8 of the 11 kernels of each
bwd range of bert-base were the backward of the q/k/v projections: the range
closed from a hook on q, which autograd reaches only after it has run v's and
k's projection backward (it runs the ready node made last first). These tests
read which autograd nodes and operators run inside each ``bwd`` range on the
CPU (torch.profiler, the real thing), eager and compiled, layer and head mode,
and re-derive the fixture's ranges by the new rule.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import bert_model, inputs_for, llama_model, train_step
from torch.profiler import ProfilerActivity, profile

from headcount import AttentionTagger

# autograd nodes of a projection's backward (Linear: addmm or mm, its weight's transpose, the
# accumulation into a parameter's .grad) and of Llama's rotary embedding (neg, slice, cat): never attention's
PROJECTION_NODES = {"AddmmBackward0", "MmBackward0", "TBackward0", "torch::autograd::AccumulateGrad"}
ROTARY_NODES = {"NegBackward0", "SliceBackward0"}
CORE_NODES = {"ScaledDotProductFlashAttentionForCpuBackward0", "SoftmaxBackward0", "BmmBackward0"}
BUILDERS = {"bert": bert_model, "llama_gqa": llama_model}


def _inside_backward_ranges(events) -> list[list[str]]:
    """Per ``headcount@bwd`` range: the names of the events that start inside it on its thread."""
    ranges = [e for e in events if e.name == "headcount@bwd"]
    return [[e.name for e in events if e.thread == r.thread and r.time_range.start <= e.time_range.start < r.time_range.end
             and e is not r] for r in ranges]


def _nodes(names: list[str]) -> set[str]:
    prefix = "autograd::engine::evaluate_function: "
    return {n[len(prefix):] for n in names if n.startswith(prefix)}


@pytest.mark.parametrize("mode", ["layer", "head"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_backward_range_holds_the_core_only(name, impl, mode):
    model = BUILDERS[name](impl)
    inputs = inputs_for(name)
    with AttentionTagger([model], mode=mode, nvtx=False):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step(model, **inputs)
    inside = _inside_backward_ranges(list(prof.events()))
    assert len(inside) == 2  # one per layer
    for names in inside:
        nodes = _nodes(names)
        assert nodes & CORE_NODES, nodes  # the core's backward is inside ...
        assert not nodes & PROJECTION_NODES, nodes  # ... no projection's ...
        if name == "llama_gqa":
            assert not nodes & ROTARY_NODES, nodes  # ... and not the rotary embedding applied before the call
        assert "aten::addmm" not in names and "aten::mm" not in names


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["layer", "head"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_compiled_backward_range_holds_the_core_only(impl, mode, fresh_dynamo):
    """Under torch.compile the backward is Inductor's: its extern matmuls are the only operators the
    profiler sees, so the projections' (``aten::mm``) must be outside and the core's (bmm, SDPA) inside."""
    model = bert_model(impl)
    compiled = torch.compile(model)
    inputs = inputs_for("bert")
    with AttentionTagger([model], mode=mode, nvtx=False):
        train_step(compiled, **inputs)  # compiles
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step(compiled, **inputs)
    inside = _inside_backward_ranges(list(prof.events()))
    assert len(inside) == 2
    for names in inside:
        assert {"aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"} & set(names), names
        assert "aten::mm" not in names and "aten::addmm" not in names, names


# --------------------------------------------------------------------------- the H100 fixture, re-derived

GPU = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05"


def _projection_tail(kernels: pd.DataFrame, rng) -> list[str]:
    """The names of the kernels launched after ``rng`` closed and before the next layer's LayerNorm
    backward: the q projection's backward, which the old rule already left outside the range."""
    after = kernels[(kernels["api_start_ns"] > rng.end_ns) & kernels["range_id"].isna()]
    names = []
    for name in after["name"]:
        if "layer_norm" in name:
            break
        names.append(name)
    return names


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_h100_backward_ranges_rederived_leave_the_projections_out(impl):
    """Each recorded bwd range (the old rule) is the core's kernels followed by the same kernels, twice,
    as the q projection's backward right after the range (v's and k's projection backward). The new rule
    closes the range after the core: the re-derived range holds none of them."""
    from headcount.build.in_process import tables_from_cupti
    from headcount.common.device import limits_for

    built = tables_from_cupti(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", [], "h100", impl, limits_for("9.0"))
    kernels = built.tables["kernels"]
    kernels = kernels[kernels["kind"] == "kernel"].sort_values("api_start_ns").reset_index(drop=True)
    ranges = built.tables["ranges"]
    bwd = ranges[(ranges["phase"] == "bwd") & (ranges["level"] == "layer")]
    assert len(bwd) == 36  # 12 layers x 3 steps
    shares = []
    for rng in bwd.itertuples():
        inside = kernels[kernels["range_id"] == rng.range_id]
        names = inside["name"].tolist()
        projection = _projection_tail(kernels, rng)
        assert 4 <= len(projection) <= 5 and any("reduce_kernel" in n for n in projection)
        cut, stripped = len(names), 0
        while cut >= len(projection) and names[cut - len(projection):cut] == projection:
            cut -= len(projection)
            stripped += 1
        assert stripped == 2, (rng.path, names)  # v's and k's projection backward, inside today
        core = names[:cut]
        # what stays is attention's backward: cuDNN's SDPA backward, or eager's softmax backward and its matmuls
        marker = "flash_bprop" if impl == "sdpa" else "softmax_warp_backward"
        assert any(marker in n for n in core) and not any("reduce_kernel" in n for n in core), core
        out = inside.iloc[cut:]
        shares.append((out["duration_ns"].sum() / inside["duration_ns"].sum(), len(names) - cut, len(names)))
    time_share = sum(s[0] for s in shares) / len(shares)
    # the figures the docs quote (docs/gpu-check.md), counted here from the raw records: how many of each old range's
    # kernels were the projections' and their share of its kernels' time, mean over the 36 ranges
    if impl == "sdpa":
        assert all(s[1:] == (8, 11) for s in shares)
        assert round(time_share, 2) == 0.51
    else:
        assert all(s[1:] == (10, 18) for s in shares)
        assert round(time_share, 2) == 0.30
