"""Figures that say what they are (issue 56, items 7, 9–12): time is busy time and a span is a span; speed-ups and
outliers only between like and like; ncu triage names the kernel that dominates; words that match the tables.

Expected figures are counted from the raw trace events here (plain json), not by headcount."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

FIX = Path(__file__).parent / "fixtures"


def _built(path: Path):
    from headcount.build.kineto import tables_from_kineto
    from headcount.parsers.kineto_json import read_trace

    return tables_from_kineto(read_trace(path), "r")


@pytest.fixture(scope="module")
def b200():
    return _built(FIX / "kineto" / "b200_vllm_gpt-oss_kineto.json.gz")


def _union(intervals) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def test_attention_time_is_busy_time_and_the_span_is_apart(b200):
    """B200 vLLM: each call's time is the busy union of the GPU work launched inside its operator (hand count from the
    raw events: launch inside ``vllm::unified_attention_with_output`` on its thread), not first start to last end."""
    trace = json.loads(gzip.open(FIX / "kineto" / "b200_vllm_gpt-oss_kineto.json.gz").read())
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "vllm::unified_attention_with_output"]
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    gpu = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    busy, span = 0.0, 0.0
    for op in ops:
        mine = [gpu[c["args"]["correlation"]] for c in launches
                if c["tid"] == op["tid"] and op["ts"] <= c["ts"] <= op["ts"] + op["dur"] and c["args"]["correlation"] in gpu]
        ns = [(round(k["ts"] * 1000), round((k["ts"] + k["dur"]) * 1000)) for k in mine]  # µs with 3 decimals: whole ns
        busy += _union(ns)
        span += max(e for _, e in ns) - min(s for s, _ in ns)
    layers = b200.tables["layers"]
    assert len(ops) == 36 and int(layers["calls"].sum()) == 36
    assert set(layers["duration_basis"]) == {"gpu_busy"}
    assert layers["duration_ns"].sum() == busy  # 0.649 ms
    assert layers["gpu_span_ns"].sum() == span  # 7.29 ms: a span, idle included
    steps = b200.tables["steps"]
    assert steps["attention_gpu_ns"].iloc[0] == busy
    # shares of busy time: each layer ≤ 100 %, and together the steps' attention share
    assert (layers["share_of_gpu_busy_pct"] <= 100).all()
    assert layers["share_of_gpu_busy_pct"].sum() == pytest.approx(float(steps["attention_share_pct"].iloc[0]), rel=1e-6)


def test_symmetric_memory_all_reduce_is_communication(b200):
    """The B200 trace's all-reduce runs as PyTorch symmetric-memory kernels (``multimem_all_reduce_kernel``), not NCCL:
    communication all the same (it was counted as compute)."""
    trace = json.loads(gzip.open(FIX / "kineto" / "b200_vllm_gpt-oss_kineto.json.gz").read())
    from headcount.common import communication

    comm = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e.get("cat") == "kernel"
            and communication.kind_of(e["name"]) is not None]
    multimem = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "multimem_all_reduce_kernel" in e["name"]]
    assert len(multimem) == 73 and len(comm) == 74  # 73 symmetric-memory all-reduces and one NCCL all-gather
    assert b200.tables["steps"]["communication_ns"].iloc[0] == pytest.approx(_union(comm) * 1e3, rel=1e-6)
    rows = b200.tables["collectives"].set_index("kind")
    assert rows.loc["all_reduce", "calls"] == 73 and rows.loc["all_reduce", "library"] == "PyTorch symmetric memory"
    assert rows.loc["all_gather", "calls"] == 1 and rows.loc["all_gather", "library"] == "NCCL"


@pytest.mark.parametrize("name, kind", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "all_to_all"),
    ("void dpsk::ep::internode::combine<true, 8>(...)", "all_to_all"),
    ("multimem_all_reduce_kernel<float, 8>", "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", "reduce"),
    ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<...>", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(...)", "reduce_scatter"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
])
def test_communication_by_what_it_is(name, kind):
    from headcount.common import communication

    assert communication.kind_of(name) == kind


@pytest.mark.parametrize("name", ["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>(Flash_fwd_params)",
                                  "ampere_sgemm_128x64_tn", "void at::native::reduce_kernel<512, 1>(...)",
                                  "flash_fwd_splitkv_combine_kernel"])
def test_compute_is_not_communication(name):
    from headcount.common import communication

    assert communication.kind_of(name) is None


def test_nccl_message_sizes_give_bytes_and_bus_bandwidth():
    """A100 DDP rank 0 of 2: torch.profiler writes each NCCL kernel's message; bytes = max(in, out) × 4 (Float), summed
    by hand from the raw kernel args; busbw = algbw × 2(n−1)/n = algbw for 2 ranks (nccl-tests)."""
    path = FIX / "kineto" / "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"
    trace = json.loads(gzip.open(path).read())
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
    assert all(e["args"]["dtype"] == "Float" and e["args"]["Group size"] == 2 for e in kernels)
    by_hand = sum(4 * max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) for e in kernels)
    time_by_hand = sum(e["dur"] for e in kernels) * 1e3
    rows = _built(path).tables["collectives"]
    reduce = rows[rows["kind"] == "all_reduce"]
    assert int(reduce["calls"].sum()) == len(kernels) == 15
    assert reduce["bytes"].sum() == pytest.approx(by_hand, rel=1e-12)
    whole = reduce["bytes"].sum() / reduce["sized_time_ns"].sum()
    assert reduce["sized_time_ns"].sum() == pytest.approx(time_by_hand, rel=1e-6)
    assert (reduce["busbw_gbps"] == reduce["algbw_gbps"]).all() and whole == pytest.approx(by_hand / time_by_hand, rel=1e-6)


def test_an_nsys_export_has_no_sizes_and_says_null(tmp_path):
    from headcount.derive.collectives import collectives

    k = pd.DataFrame({"kind": ["kernel"] * 2, "name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gemm"], "implementation": "unknown",
                      "pid": "1", "device": "cuda:0", "step": pd.array([0, 0], dtype="Int64"), "start_ns": [0, 5], "end_ns": [10, 20]})
    rows = collectives(k)
    assert len(rows) == 1 and rows["calls"].iloc[0] == 1 and rows["time_ns"].iloc[0] == 10
    assert pd.isna(rows["bytes"].iloc[0]) and pd.isna(rows["algbw_gbps"].iloc[0])  # unknown, never 0


def test_compare_never_gives_a_speed_up_between_two_models(tmp_path):
    """The SD3.5 pipeline on an MI300X: its eager calls (text encoders) and sdpa calls (the transformer) ran different
    layers and shapes: no speed-up between them, and no slow_implementation finding."""
    from headcount.reports.compare import comparison
    from headcount.store import dataset

    built = _built(FIX / "kineto" / "mi300x_xdit_sd3.5_kineto.json.gz")
    layers = built.tables["layers"].assign(run_id="r")
    table, notes = comparison(layers, pd.DataFrame({"run_id": ["r"], "implementation": ["mixed"]}))
    assert set(table["implementation"]) == {"eager", "sdpa"}
    assert table["speedup"].isna().all()
    assert any("ran different work" in n for n in notes)
    assert "slow_implementation" not in set(built.tables["findings"]["kind"])
    del dataset


def test_compare_takes_no_unknown_baseline_and_no_run_against_itself():
    from headcount.reports.compare import comparison

    one = pd.DataFrame({"run_id": ["r"], "implementation": ["unknown"], "phase": ["fwd"], "layer_name": ["layer.0"], "layer": [0],
                        "calls": [3], "steps": [1], "duration_ns": [3e6], "duration_basis": ["gpu_busy"], "kernel_count": [3],
                        "cpu_launch_cost_ns": [1e3], "dram_bytes": [None], "dram_bytes_provenance": [None], "flop": [None]})
    table, notes = comparison(one, pd.DataFrame({"run_id": ["r"], "implementation": ["unknown"]}))
    assert table["speedup"].isna().all() and any("no baseline" in n for n in notes)
    alone = one.assign(implementation="sdpa")
    table, _ = comparison(alone, pd.DataFrame({"run_id": ["r"], "implementation": ["sdpa"]}))
    assert table["speedup"].isna().all()  # not 1.00× of a run against itself


def test_ncu_triage_names_the_dominant_kernel_and_its_limiter():
    """rtx2080ti_two_kernels.ncu-rep: kernel_A is 99.9 % of the replayed time (ncu's own durations, read here with
    ncu_report-independent CSV: the raw page), compute-bound by the Speed of Light rule; and the report has no DRAM
    byte counters, which a notice says with the section that gives them."""
    from headcount.build.ncu import tables_from_ncu
    from headcount.parsers.ncu_csv import read_csv

    raw = pd.read_csv(FIX / "ncu" / "rtx2080ti_two_kernels.raw.C.csv", skiprows=[1])
    durations = pd.to_numeric(raw["gpu__time_duration.sum"])
    share = 100 * durations.max() / durations.sum()
    built = tables_from_ncu(read_csv(FIX / "ncu" / "rtx2080ti_two_kernels.raw.C.csv"), "r")
    dominant = built.tables["findings"][built.tables["findings"]["kind"] == "dominant_kernel"]
    assert len(dominant) == 1 and dominant["value"].iloc[0] == pytest.approx(share, rel=1e-9)
    assert "kernel_A" in dominant["subject"].iloc[0] and "compute-bound" in dominant["evidence"].iloc[0]
    assert any("no DRAM byte counters" in n and "MemoryWorkloadAnalysis" in n for n in built.notices)


def test_query_csv_to_stdout(tmp_path):
    from headcount.store.dataset import write_run

    out = tmp_path / "r"
    b = _built(FIX / "kineto" / "h100_bert-small_sdpa_kineto.json.gz")
    from headcount.common.tables import WRITTEN

    write_run(out, "r1", {k: v for k, v in b.tables.items() if k in WRITTEN}, {"run_id": "r1", "source": "torch"})
    done = subprocess.run([sys.executable, "-m", "headcount", "query", str(out), "SELECT count(*) AS n FROM layers", "--csv", "-"],
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    assert done.stdout.splitlines() == ['"n"', "4"]
    assert not (tmp_path / "-").exists()


def test_the_caption_says_flop_unknown_where_no_shapes(tmp_path):
    from headcount.reports.console import _provenance_caption

    frame = pd.DataFrame({"duration_basis": ["gpu_busy"], "duration_provenance": ["measured"], "dram_bytes_provenance": [None],
                          "flop": [float("nan")]})
    assert "FLOP: not known" in _provenance_caption(frame)
    assert "FLOP: analytic" in _provenance_caption(frame.assign(flop=1.0))


def test_a_collective_is_what_torch_distributed_called_it():
    """Rank 0 of 128: every NCCL kernel is ``ncclKernel_SendRecv…``, but torch.distributed's ``nccl:…`` annotation around
    each launch names an all-to-all, an all-reduce or an all-gather; counted by hand from the raw events (the innermost
    ``nccl:`` annotation on the launching thread around the launch call), per step."""
    path = FIX / "kineto" / "unnamed-gpu_rank0of128_streams_nccl_kineto.json.gz"
    events = json.loads(gzip.open(path).read())["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    notes = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    by_hand: dict = {}
    for k in (e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()):
        call = launch[k["args"]["correlation"]]
        around = [n for n in notes if n["tid"] == call["tid"] and n["ts"] <= call["ts"] <= n["ts"] + n["dur"]]
        name = min(around, key=lambda n: n["dur"])["name"].removeprefix("nccl:")
        step = next(int(s["name"].split("#")[1]) for s in steps if s["ts"] <= call["ts"] <= s["ts"] + s["dur"])
        kind = {"all_to_all": "all_to_all", "all_reduce": "all_reduce", "_all_gather_base": "all_gather"}[name]
        by_hand[(step, kind)] = by_hand.get((step, kind), 0) + 1
    assert all("SendRecv" in e["name"] for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    rows = _built(path).tables["collectives"]
    assert {(int(r.step), r.kind): int(r.calls) for r in rows.itertuples()} == by_hand


def test_collective_times_are_exact_nanoseconds():
    """time_ns is the kernels' durations summed exactly (absolute CUPTI times ~1.7e18 ns are 256 ns apart in float64)."""
    path = FIX / "kineto" / "v100_rank1of2_cudagraph_nccl_kineto.json.gz"
    built = _built(path)
    k = built.tables["kernels"]
    comm = k[k["name"].str.contains("nccl", case=False) & (k["kind"] == "kernel")]
    assert built.tables["collectives"]["time_ns"].sum() == float(comm["duration_ns"].sum())
