"""Attention inside a wrapper module (issue 56, item 6): where an attention module launches attention kernels,
those kernels are the attention, not the whole module; a module whose attention ran elsewhere is not GPU attention.

The recordings are the real H100 Qwen1.5-0.5B trace (tests/fixtures/kineto) with its attention *operators*
removed, as a pybind extension (nano-vllm's flash-attn call) leaves them out: the ``Qwen2Attention`` modules then
hold projections, rotary, copies and one ``flash_fwd_kernel`` launch each, as nano-vllm's ``Attention`` does; and the
same with the flash kernels removed too (attention run on the CPU). Expected figures are counted from the raw
events here, without headcount."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hand_union import union_length

FIX = Path(__file__).parent / "fixtures" / "kineto"


def _events(drop_kernels: bool) -> dict:
    trace = json.loads(gzip.open(FIX / "h100_qwen1.5-0.5b_kineto.json.gz").read())
    keep = []
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op" and re.search("attention", e.get("name", "")):
            continue
        if drop_kernels and e.get("cat") == "kernel" and "flash_fwd" in e.get("name", ""):
            continue
        keep.append(e)
    trace["traceEvents"] = keep
    return trace


def _parse(trace: dict, tmp_path: Path):
    from headcount.build.kineto import tables_from_kineto
    from headcount.parsers.kineto_json import read_trace

    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    return tables_from_kineto(read_trace(path), "r")


def test_the_kernels_are_the_attention_and_the_module_is_stated_apart(tmp_path):
    trace = _events(drop_kernels=False)
    launched = {e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    flash = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e.get("cat") == "kernel" and "flash_fwd" in e["name"] and e["args"].get("correlation") in launched]
    assert len(flash) == 24
    built = _parse(trace, tmp_path)
    layers = built.tables["layers"]
    assert len(layers) == 24 and set(layers["signal"]) == {"kernel"}
    assert set(layers["implementation"]) == {"flash_attention_2"}  # from the kernel's name, not "unknown"
    # attention time: the flash kernels' union (by hand), not the module's work
    assert layers["duration_ns"].sum() == pytest.approx(union_length(flash) * 1e3, rel=1e-6)
    assert (layers["module_kernel_busy_ns"] > 3 * layers["duration_ns"]).all()  # the module's other work, apart
    # advice never suggests what ran
    for suggestion in built.tables["findings"]["suggestion"]:
        assert "--impl flash_attention_2" not in suggestion


def test_a_module_whose_attention_ran_elsewhere_is_not_gpu_attention(tmp_path):
    built = _parse(_events(drop_kernels=True), tmp_path)
    assert not len(built.tables["layers"])
    said = [n for n in built.notices if "attention modules launched GPU work but no attention kernel" in n]
    assert said and said[0].startswith("24 ")
    steps = built.tables["steps"]
    assert steps["attention_gpu_ns"].isna().all()  # no attention found: null, never 0 or the module's work
