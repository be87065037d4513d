"""Recordings people already have, without headcount's tags: attention found by
operator, module and kernel names (headcount/attribute/untagged.py).

Real recordings only: torch.profiler traces of real GPUs (TimeSformer eager on an
H100; SGLang and vLLM on an MI300X; BERT and Qwen SDPA on an H100; a CNN on an
A100), a torch.profiler trace recorded here on the CPU (forward + backward), and
an nsys export recorded here by the real nsys. Figures that the tests compare
are recomputed from the raw events, independently of headcount's code.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from headcount.attribute import untagged
from headcount.build.kineto import tables_from_kineto
from headcount.cli.main import main
from headcount.common import signals
from headcount.parsers import kineto_json as kineto
from headcount.reports import findings
from tests.nsight import nsight_bin

KINETO = Path(__file__).parent / "fixtures" / "kineto"
TIMESFORMER = KINETO / "h100_timesformer_eager_kineto.json.gz"
SGLANG = KINETO / "mi300x_sglang_qwen3-8b_kineto.json.gz"
VLLM = KINETO / "mi300x_vllm_piecewise_kineto.json.gz"
WORKLOAD = Path(__file__).parent / "workloads" / "emit_nvtx_untagged.py"


def _tables(path: Path):
    built = tables_from_kineto(kineto.read_trace(path), "r")
    return built.tables, built.notices


def _raw(path: Path) -> list[dict]:
    with gzip.open(path) as fh:
        return json.load(fh)["traceEvents"]


# ---------------------------------------------------------------- the signal table
@pytest.mark.parametrize("kind,name,framework", [
    ("operator", "aten::scaled_dot_product_attention", "PyTorch SDPA"),
    ("operator", "aten::_scaled_dot_product_flash_attention_backward", "PyTorch SDPA backward"),
    ("operator", "flash_attn::_flash_attn_varlen_forward", "flash-attn (flash_attn::, flash_attn_3::)"),
    ("operator", "vllm::unified_attention_with_output", "vLLM"),
    ("operator", "sglang_profiler::mha__mha_batch_prefill_167", "SGLang (its profiler's operator ranges)"),
    ("operator", "xformers::efficient_attention_forward_cutlass", "xFormers"),
    ("operator", "flashinfer::batch_prefill_with_paged_kv_cache_run", "FlashInfer"),
    ("module", "nn.Module: RadixAttention_5", None),
    ("module", "CoreAttention", None),
    ("module", "nn.Module: LlamaFlashAttention2_0", None),
    ("kernel", "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernel", None),
    ("kernel", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", None),
    ("kernel", "kernel_unified_attention_2d", None),
])
def test_the_table_names_each_framework(kind, name, framework):
    row = signals.match(kind, name)
    assert row is not None and row.kind == kind
    if framework:
        assert row.framework == framework


@pytest.mark.parametrize("kind,name", [
    ("operator", "aten::bmm"), ("operator", "vllm::unified_kv_cache_update"), ("operator", "xformers::swiglu_packedw"),
    ("operator", "aten::_fused_sdp_choice"), ("module", "nn.Module: Qwen3DecoderLayer_3"),
    ("module", "nn.Module: TimesformerSelfOutput_0"), ("module", "nn.Module: Linear_4"),
    ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
    ("kernel", "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16>"),
])
def test_names_that_are_not_attention(kind, name):
    assert signals.match(kind, name) is None


# ---------------------------------------------------------------- TimeSformer: eager attention in modules
def _layer0_by_hand() -> list[dict]:
    """TimesformerLayer_0's attention calls from the raw events: each innermost
    ``TimesformerSelfAttention`` module range, the GPU work (kernels, memsets, memcpys)
    launched (by correlation) from runtime calls inside it on its thread, its first
    start and last end (ns), and the names of its kernels."""
    events = [e for e in _raw(TIMESFORMER) if e.get("ph") == "X"]
    layer = next(e for e in events if e["name"] == "nn.Module: TimesformerLayer_0")
    inner = sorted((e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: TimesformerSelfAttention_")
                    and e["tid"] == layer["tid"] and layer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= layer["ts"] + layer["dur"]),
                   key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")}
    calls = []
    for m in inner:
        launched = [kernels[r["args"]["correlation"]] for r in runtime
                    if r["tid"] == m["tid"] and m["ts"] <= r["ts"] and r["ts"] + r["dur"] <= m["ts"] + m["dur"]
                    and r["args"].get("correlation") in kernels]
        start = min(round(k["ts"] * 1000) for k in launched)
        end = max(round((k["ts"] + k["dur"]) * 1000) for k in launched)
        busy, reach = 0, None  # the union of the launched work: busy time (ns)
        for s, e in sorted((round(k["ts"] * 1000), round((k["ts"] + k["dur"]) * 1000)) for k in launched):
            if reach is None or s > reach:
                busy, reach = busy + e - s, e
            elif e > reach:
                busy, reach = busy + e - reach, e
        calls.append({"module": m["name"].removeprefix("nn.Module: "), "kernels": sorted(k["name"] for k in launched if k["cat"] == "kernel"),
                      "duration_ns": busy, "span_ns": end - start})
    return calls


def test_timesformer_24_eager_calls_in_12_layers():
    tables, notices = _tables(TIMESFORMER)
    layers = tables["layers"]
    assert len(layers) == 12 and sorted(layers["layer"]) == list(range(12))
    assert (layers["calls"] == 2).all() and int(layers["calls"].sum()) == 24
    assert (layers["duration_ns"] > 0).all() and (layers["signal"] == "module").all()
    assert (layers["provenance"] == "module ranges").all()
    assert any("24 by module" in n for n in notices)
    # every layer's attention holds its batched matmuls and its softmax
    k = tables["kernels"]
    for name, g in k[k["layer_name"].notna()].groupby("layer_name"):
        text = " ".join(g["name"])
        assert "softmax" in text.lower() and ("gemm" in text or "Kernel2" in text), name


def test_timesformer_layer0_checked_against_the_raw_events():
    by_hand = _layer0_by_hand()
    assert len(by_hand) == 2
    tables, _ = _tables(TIMESFORMER)
    r = tables["ranges"]
    mine = r[(r["level"] == "layer") & (r["layer_name"] == "layer.0")].sort_values("start_ns")
    assert [f.rsplit("/", 1)[1] for f in mine["found_as"]] == [c["module"] for c in by_hand]
    assert mine["duration_ns"].tolist() == [c["duration_ns"] for c in by_hand]
    assert mine["gpu_span_ns"].tolist() == [c["span_ns"] for c in by_hand]
    k = tables["kernels"]
    ours = sorted(k.loc[(k["layer_name"] == "layer.0") & (k["kind"] == "kernel"), "name"])
    assert ours == sorted(n for c in by_hand for n in c["kernels"])
    # shapes from the recorded softmax and bmm inputs: the time attention (8 frames) and the space attention (3137 patches)
    assert mine[["batch", "q_heads", "q_len", "kv_len", "head_dim"]].astype(int).values.tolist() == [
        [3136, 12, 8, 8, 64], [8, 12, 3137, 3137, 64]]
    assert (mine["flop"] == 2 * mine["batch"] * mine["q_heads"] * mine["q_len"] * mine["kv_len"] * 128).all()
    layers = tables["layers"]
    assert layers.loc[layers["layer_name"] == "layer.0", "duration_ns"].item() == sum(c["duration_ns"] for c in by_hand)


# ---------------------------------------------------------------- SGLang on an MI300X
def test_sglang_36_layers_and_every_fmha_kernel_in_one():
    tables, notices = _tables(SGLANG)
    layers = tables["layers"]
    assert sorted(layers["layer"]) == list(range(36)) and (layers["calls"] == 1).all()
    assert (layers["signal"] == "operator").all() and (layers["implementation"] == "sglang").all()
    assert layers["found_as"].str.match(r"Qwen3DecoderLayer_\d+/Qwen3Attention_\d+/RadixAttention_\d+/sglang_profiler::").all()
    k = tables["kernels"]
    fmha = k[k["name"].str.contains("Fmha|paged_attention|PagedAttention", regex=True)]
    assert len(fmha) == 36 and fmha["layer_name"].notna().all() and fmha["layer_name"].nunique() == 36
    # the layer's index is the decoder block's own (instance suffix), checked on the raw trace for one call
    r = tables["ranges"]
    one = r[(r["level"] == "layer") & (r["layer_name"] == "layer.7")]
    assert one["found_as"].item().startswith("Qwen3DecoderLayer_7/")
    # heads and head dims as recorded; lengths are not: no FLOPs, no bytes, and a notice that says so
    assert one[["q_heads", "kv_heads", "head_dim"]].astype(int).values.tolist() == [[32, 8, 128]]
    assert one["batch"].isna().all() and layers["flop"].isna().all() and layers["dram_bytes"].isna().all()
    assert any("packed variable-length" in n for n in notices)
    run_device = kineto.run_device(kineto.read_trace(SGLANG)["devices"])
    assert run_device.name == "AMD Instinct MI300X"


# ---------------------------------------------------------------- vLLM piecewise graphs, no modules
def test_vllm_attention_operators_and_their_kernels():
    tables, notices = _tables(VLLM)
    layers = tables["layers"]
    assert sorted(layers["layer"]) == list(range(24)) and (layers["calls"] == 1).all()
    assert (layers["signal"] == "operator").all() and (layers["provenance"] == "call order").all()
    k = tables["kernels"]
    attention = k[k["name"] == "kernel_unified_attention_2d"]
    assert len(attention) == 24 and attention["layer_name"].notna().all() and attention["layer_name"].nunique() == 24
    # call order: the k-th operator in the trace is layer.k
    ops = sorted((e for e in _raw(VLLM) if e.get("name") == "vllm::unified_attention_with_output" and e.get("ph") == "X"),
                 key=lambda e: e["ts"])
    r = tables["ranges"]
    starts = r[r["level"] == "layer"].sort_values("start_ns")
    assert starts["layer_name"].tolist() == [f"layer.{i}" for i in range(24)]
    assert len(ops) == 24
    assert any("position" in n for n in notices)
    # the trace names no GPU (empty names in deviceProperties): unknown, not "", and no roofline against a guess
    device = kineto.run_device(kineto.read_trace(VLLM)["devices"])
    assert device.name is None and device.sm_count == 304 and layers["roofline_class"].isna().all()


# ---------------------------------------------------------------- kernels alone
def test_kernel_names_find_calls_in_a_trace_of_gpu_activity_only(tmp_path):
    """A trace recorded with ``activities=[ProfilerActivity.CUDA]`` has kernels and
    runtime calls but no operators or modules: the real H100 BERT trace with its CPU
    events left out, as such a recording holds them."""
    raw = json.load(gzip.open(KINETO / "h100_bert-small_sdpa_kineto.json.gz"))
    raw["traceEvents"] = [e for e in raw["traceEvents"] if e.get("cat") not in ("cpu_op", "python_function", "user_annotation")]
    path = tmp_path / "gpu_only.json"
    path.write_text(json.dumps(raw))
    tables, notices = _tables(path)
    layers = tables["layers"]
    assert len(layers) == 4 and (layers["signal"] == "kernel").all() and layers["flop"].isna().all()
    k = tables["kernels"]
    flash = k[k["name"].str.contains("flash_fwd_kernel")]
    assert len(flash) == 4 and flash["layer_name"].notna().all()
    assert any("have no shapes: record with record_shapes=True" in n for n in notices)


# ---------------------------------------------------------------- the SDPA path: as before
@pytest.mark.parametrize("trace,layers,names", [
    ("h100_bert-small_sdpa_kineto.json.gz", 4, r"BertLayer_\d/BertAttention_\d/BertSdpaSelfAttention_\d/aten::scaled_dot_product_attention"),
    ("h100_qwen1.5-0.5b_kineto.json.gz", 24, r"Qwen2DecoderLayer_\d+/(Qwen2\w*Attention_\d+/)+aten::scaled_dot_product_attention"),
])
def test_sdpa_traces_say_what_found_them(trace, layers, names):
    tables, _ = _tables(KINETO / trace)
    table = tables["layers"]
    assert len(table) == layers and (table["signal"] == "operator").all() and table["found_as"].str.fullmatch(names).all()


def test_the_whole_attention_module_is_reported_beside_its_core():
    """Issue 31, item 2, on the Qwen1.5 H100 trace: each Qwen2Attention module runs 23 GPU operations (the flash
    kernel among them) for ~650 µs of busy time; the layers table reports the module beside the core, each figure
    equal to what the raw events give by hand (launches inside the module on its thread, their GPU operations)."""
    raw = json.load(gzip.open(KINETO / "h100_qwen1.5-0.5b_kineto.json.gz"))["traceEvents"]
    modules = sorted((e for e in raw if str(e.get("name", "")).startswith("nn.Module: Qwen2Attention_")), key=lambda e: e["ts"])
    launches = [e for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"]
    work = {e["args"].get("correlation"): e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    by_hand = []
    for m in modules:
        ops = [work[r["args"]["correlation"]] for r in launches if r["tid"] == m["tid"] and m["ts"] <= r["ts"]
               and r["ts"] + r["dur"] <= m["ts"] + m["dur"] and r["args"].get("correlation") in work]
        by_hand.append((len(ops), max(o["ts"] + o["dur"] for o in ops) - min(o["ts"] for o in ops), sum(o["dur"] for o in ops)))
    tables, _ = _tables(KINETO / "h100_qwen1.5-0.5b_kineto.json.gz")
    layers = tables["layers"].sort_values("layer").reset_index(drop=True)
    assert len(layers) == len(by_hand) == 24
    for row, (ops, span_us, busy_us) in zip(layers.itertuples(), by_hand):
        assert row.module_calls == 1 and row.module_kernels_per_call == ops == 23
        assert row.module_gpu_span_ns == pytest.approx(span_us * 1e3, abs=2)  # µs with 3 decimals in the JSON
        assert row.module_kernel_busy_ns == pytest.approx(busy_us * 1e3, abs=25)
        assert row.module_duration_per_call_ns == row.module_kernel_busy_ns  # time is busy time
        assert row.kernels_per_call == 1 and row.core_share_of_module_pct == pytest.approx(100 * row.duration_ns / row.module_duration_ns)
    assert 640e3 < layers["module_kernel_busy_ns"].median() < 660e3 and 10 < layers["core_share_of_module_pct"].median() < 20
    line = findings.module_lines(layers)[0]
    assert line.startswith("fwd, sdpa: the whole attention modules take 15.5 ms per step (23.0 GPU operations per call, 49 % "
                           "of GPU busy time, spanning 16.5 ms first start to last end); the attention core 2.72 ms of it (18 %)")
    assert (tables["ranges"]["level"] == "module").sum() == 24


def test_a_module_holding_two_calls_is_neither_calls_module():
    """An attention module around two core calls (a cross- and a self-attention in one module) says nothing of
    either: no module range, no module figures."""
    def event(kind, name, start, end):
        return {"kind": kind, "name": name, "pid": 1, "tid": 1, "start_ns": start, "end_ns": end, "correlation_id": None,
                "args": None, "sequence": None, "graph_node_id": None}
    events = pd.DataFrame([event("module", "nn.Module: MyAttention_0", 0, 1000),
                           event("op", "aten::scaled_dot_product_attention", 100, 200),
                           event("op", "aten::scaled_dot_product_attention", 300, 400),
                           event("module", "nn.Module: MyAttention_1", 2000, 3000),
                           event("op", "aten::scaled_dot_product_attention", 2100, 2200)])
    found = untagged.find_calls(events)
    names = list(found.ranges["name"])
    assert names.count("headcount@module") == 1
    module = found.ranges[found.ranges["name"] == "headcount@module"].iloc[0]
    assert (module["start_ns"], module["end_ns"]) == (2000, 3000)


# ---------------------------------------------------------------- no attention at all
def test_a_trace_without_attention_exits_0_with_kernels_and_a_notice(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["parse", str(KINETO / "a100_cupti_range_profiler_kineto.json.gz"), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "no attention found" in err
    assert len(pd.read_parquet(out / "kernels")) > 0 and len(pd.read_parquet(out / "steps")) > 0
    assert len(pd.read_parquet(out / "layers")) == 0


# ---------------------------------------------------------------- forward and backward, recorded here
class _Attention(nn.Module):
    def __init__(self, eager: bool):
        super().__init__()
        self.qkv, self.eager = nn.Linear(32, 96), eager

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        if self.eager:
            out = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, t, 32)


class EagerSelfAttention(_Attention):
    def __init__(self):
        super().__init__(eager=True)


class SdpaSelfAttention(_Attention):
    def __init__(self):
        super().__init__(eager=False)


class DecoderLayer(nn.Module):
    def __init__(self, eager: bool):
        super().__init__()
        self.attn = EagerSelfAttention() if eager else SdpaSelfAttention()
        self.mlp = nn.Linear(32, 32)

    def forward(self, x):
        return x + self.mlp(x + self.attn(x))


@pytest.fixture(scope="module")
def training_trace(tmp_path_factory) -> Path:
    """A real torch.profiler trace of forward + backward on the CPU: layers 0 and 2 SDPA,
    layer 1 eager attention, recorded with modules and shapes."""
    torch.manual_seed(0)
    model = nn.Sequential(*(DecoderLayer(eager=i == 1) for i in range(3)))
    x = torch.randn(2, 16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_modules=True, with_stack=True,
                                record_shapes=True) as prof:
        model(x).sum().backward()
    path = tmp_path_factory.mktemp("train") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_backward_calls_belong_to_their_forward_layers(training_trace):
    tables, _ = _tables(training_trace)
    layers = tables["layers"].set_index(["phase", "layer_name"])
    assert sorted(layers.index) == [(p, f"layer.{i}") for p in ("bwd", "fwd") for i in range(3)]
    assert layers.loc[("fwd", "layer.1"), "signal"] == "module" and layers.loc[("bwd", "layer.1"), "signal"] == "module"
    assert layers.loc[("fwd", "layer.0"), "signal"] == "operator" and layers.loc[("bwd", "layer.2"), "signal"] == "operator"
    r = tables["ranges"]
    calls = r[r["level"] == "layer"].sort_values("start_ns")
    # forward 0, 1, 2 then backward 2, 1, 0: linked by autograd sequence numbers, not by position
    assert list(zip(calls["phase"], calls["layer_name"])) == [
        ("fwd", "layer.0"), ("fwd", "layer.1"), ("fwd", "layer.2"), ("bwd", "layer.2"), ("bwd", "layer.1"), ("bwd", "layer.0")]
    # the backward call has its forward call's shapes; FLOPs 2.5× (the analytic model's backward factor)
    fwd, bwd = layers.loc[("fwd", "layer.1")], layers.loc[("bwd", "layer.1")]
    assert bwd["flop"] == pytest.approx(2.5 * fwd["flop"]) and fwd["flop"] == 2 * 2 * 4 * 16 * 16 * 16
    sdpa = calls[calls["layer_name"] == "layer.0"]
    assert sdpa["causal"].tolist() == [True, True] and sdpa["q_len"].astype(int).tolist() == [16, 16]
    # the CPU operators of each call are attributed to it
    k = tables["kernels"]
    assert k.loc[(k["phase"] == "bwd") & (k["layer_name"] == "layer.0"), "name"].str.contains("backward").any()
    assert k.loc[(k["phase"] == "fwd") & (k["layer_name"] == "layer.1"), "name"].isin(["aten::softmax", "aten::_softmax"]).any()


# ---------------------------------------------------------------- nsys exports (real nsys)
@pytest.fixture(scope="module")
def emit_nvtx_export(tmp_path_factory) -> Path:
    nsys = nsight_bin("nsys")
    tmp = tmp_path_factory.mktemp("nvtx")
    rep = tmp / "untagged"
    subprocess.run([nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(rep), "--force-overwrite", "true",
                    sys.executable, str(WORKLOAD)], check=True, capture_output=True, timeout=300)
    sqlite_path = tmp / "untagged.sqlite"
    subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(sqlite_path), "--force-overwrite", "true", str(rep) + ".nsys-rep"],
                   check=True, capture_output=True, timeout=300)
    return sqlite_path


def test_emit_nvtx_operator_and_module_ranges_in_an_nsys_export(emit_nvtx_export, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["parse", str(emit_nvtx_export), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "attention found without headcount's tags: 6 calls" in err
    assert "naming their layer" not in err  # the model.layers.N ranges number every call
    layers = pd.read_parquet(out / "layers").set_index(["phase", "layer_name"])
    assert sorted(layers.index) == [(p, f"layer.{i}") for p in ("bwd", "fwd") for i in range(3)]
    assert layers.loc[("fwd", "layer.1"), "signal"] == "module"
    assert layers.loc[("fwd", "layer.1"), "found_as"] == "model.layers.1/CoreAttention"
    assert layers.loc[("bwd", "layer.2"), "signal"] == "operator"
    # SDPA sizes are recorded but not is_causal: FLOPs unknown; eager attention computes every score: known
    assert pd.isna(layers.loc[("fwd", "layer.0"), "flop"]) and layers.loc[("fwd", "layer.1"), "flop"] == 2 * 2 * 4 * 16 * 16 * 16
    assert (layers["provenance"] == "module ranges").all()  # each call inside its model.layers.N range
    ranges = pd.read_parquet(out / "ranges")
    calls = ranges[ranges["level"] == "layer"].sort_values("start_ns")
    assert list(zip(calls["phase"], calls["layer_name"])) == [
        ("fwd", "layer.0"), ("fwd", "layer.1"), ("fwd", "layer.2"), ("bwd", "layer.2"), ("bwd", "layer.1"), ("bwd", "layer.0")]


def test_an_nsys_export_without_attention_names_is_left_as_it_was(tmp_path):
    """The real 2×H100 export (T5 eager attention as bare aten::bmm / softmax NVTX ranges):
    nothing names attention, so nothing is made up."""
    out = tmp_path / "r"
    assert main(["parse", str(Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"), "-o", str(out)]) == 0
    assert len(pd.read_parquet(out / "layers")) == 0
