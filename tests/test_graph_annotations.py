"""CUDA-graph kernel annotations baked into a trace make ranges of a replay's kernels (issue 59, route 2), on the real
A100 graph trace with annotations as torch 2.15 writes them (:mod:`graph_annotation_trace` says how it is made)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import graph_annotation_trace
import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("annotated")
    marked = graph_annotation_trace.annotated(tmp / "trace.json")
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(tmp / "trace.json"), "-o", str(tmp / "out")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return marked, tmp / "out", done.stderr


def _ns(us: float) -> int:
    return round(us * 1000)


def test_replayed_kernels_with_headcounts_annotations_land_in_their_layers(parsed):
    marked, out, stderr = parsed
    layers = pd.read_parquet(out / "layers").set_index("layer_name")
    assert set(layers.index) == {"layer.0", "layer.1"} and set(layers["phase"]) == {"fwd"}
    kernels = pd.read_parquet(out / "kernels")
    for name in ("layer.0", "layer.1"):
        replays = marked[name]
        assert len(replays) == 10
        assert layers.loc[name, "calls"] == 10  # one call per graph replay
        assert layers.loc[name, "kernel_count"] == sum(len(k) for _, k in replays)  # counted by hand from the trace
        by_hand = sum(ev["dur"] for _, k in replays for ev in k) * 1e3
        mine = kernels[(kernels["layer_name"] == name) & (kernels["kind"] == "kernel")]
        assert len(mine) == sum(len(k) for _, k in replays)
        assert mine["duration_ns"].sum() == pytest.approx(by_hand, abs=len(mine))  # µs with three decimals → ns
    ranges = pd.read_parquet(out / "ranges")
    calls = ranges[ranges["level"] == "layer"]
    assert (calls["lane"] == "graph replay").all() and len(calls) == 20
    first = min(marked["layer.0"], key=lambda r: r[1][0]["ts"])[1]
    call = calls[(calls["layer_name"] == "layer.0")].sort_values("gpu_start_ns").iloc[0]
    assert call["gpu_start_ns"] == _ns(first[0]["ts"]) and call["gpu_end_ns"] == max(_ns(e["ts"] + e["dur"]) for e in first)
    assert "CUDA-graph kernel annotations: 20 headcount calls and 5 annotated regions of your own in 15 graph replays, from 55 annotated GPU operations" in stderr


def test_a_users_own_annotation_on_backward_work_is_a_range_of_its_own_with_its_kernels(parsed):
    marked, out, _ = parsed
    ranges = pd.read_parquet(out / "ranges")
    mine = ranges[ranges["name"] == "dense_arch (backward)"]
    assert len(mine) == 5 and (mine["domain"] == "torch.profiler").all() and (mine["lane"] == "graph replay").all()
    assert sorted(mine["gpu_op_count"]) == sorted(len(k) for _, k in marked["dense_arch"])
    kernels = pd.read_parquet(out / "kernels")
    assert kernels[kernels["layer_name"].notna()]["name"].str.contains("cutlass|triton").all()


def test_the_replays_other_work_stays_with_no_layer(parsed):
    marked, out, _ = parsed
    kernels = pd.read_parquet(out / "kernels")
    labelled = sum(len(k) for name in ("layer.0", "layer.1") for _, k in marked[name])
    assert int(kernels["layer_name"].notna().sum()) == labelled  # memsets and unlabelled replays: no layer


def test_torch_215s_own_renderer_writes_the_args_the_stand_in_writes():
    import os

    try:
        from torch.profiler._chrome_trace_export import _annotation_args
    except ImportError as exc:
        if os.environ.get("HEADCOUNT_REQUIRE_TORCH215"):
            raise
        pytest.skip(f"torch 2.15's exporter is not here ({exc}): scripts/torch_215.sh runs this test")
    import json

    for annotation in ({"name": "headcount@fwd/layer.3"}, {"name": "dense_arch", "autograd_phase": "backward", "stream": 3}):
        fragment, stream, _ = _annotation_args(annotation)
        assert json.loads("{" + fragment + "}") == {k: str(v) for k, v in annotation.items() if k != "stream"}
        assert stream == annotation.get("stream")


def test_torch_here_cannot_annotate_captured_kernels_so_the_tagger_wraps_nothing():
    from headcount.tagging import graph_marks
    from headcount.tagging.ranges import RangeEmitter

    emitter = RangeEmitter(nvtx=False)
    push2 = emitter.push2
    assert graph_marks.marking(emitter) is False  # CPU torch (2.13), or 2.15 without cuda-bindings' driver support
    assert emitter.push2 == push2 and "push2" not in vars(emitter)


def test_the_tagger_marks_each_call_it_opens_while_a_graph_is_captured(tiny_llama, llama_inputs):
    """A real tagged training step of a small Llama; the capture and torch's ``mark_kernels`` stand in for the GPU
    (the stream "captures" for the forward only; each scope entered and left is recorded)."""
    from conftest import train_step

    from headcount import AttentionTagger
    from headcount.tagging import graph_marks

    scopes, capturing = [], {"on": True}

    class Scope:
        def __init__(self, annotation, backward):
            self.annotation, self.backward, self.open = annotation, backward, False

        def __enter__(self):
            self.open = True
            scopes.append(self)

        def __exit__(self, *exc):
            self.open = False

    with AttentionTagger([tiny_llama], nvtx=False) as tagger:
        graph_marks.wrap(tagger.emitter, Scope, lambda: capturing["on"])
        with torch.no_grad():
            tiny_llama(**{k: v for k, v in llama_inputs.items() if k != "labels"})
        capturing["on"] = False
        train_step(tiny_llama, **llama_inputs)
    layers = tiny_llama.config.num_hidden_layers
    assert [s.annotation for s in scopes] == [{"name": f"headcount@fwd/layer.{i}"} for i in range(layers)]
    assert all(s.backward is False and not s.open for s in scopes)  # headcount marks its own backward ranges
