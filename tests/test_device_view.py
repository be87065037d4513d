"""The device seen whole (issue 56): a step's busy and idle time count every stream's work and every step's,
communication overlapped and exposed, graph replays, captures, and a torch.profiler trace's own annotations.

Every figure is checked against ``tests/fixtures/hand_counts/kineto_hand_counts.json``: counted from the raw
JSON events of real multi-stream, multi-rank, CUDA-graph DDP traces by ``scripts/hand_counts.py`` (plain
json/gzip, every union computed twice by two methods; independent of headcount)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headcount.derive import device_view

FIX = Path(__file__).parent / "fixtures"
HAND = json.loads((FIX / "hand_counts" / "kineto_hand_counts.json").read_text())
TRACES = ["v100_rank1of2_cudagraph_nccl_kineto.json.gz", "a100-80gb_rank0of16_cudagraph_nccl_kineto.json.gz",
          "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz", "unnamed-gpu_rank0of128_streams_nccl_kineto.json.gz",
          "unnamed-gpu_rank1of128_streams_nccl_kineto.json.gz"]


@pytest.fixture(scope="module")
def whole():
    from headcount.build.kineto import tables_from_kineto
    from headcount.parsers.kineto_json import read_trace

    return {name: tables_from_kineto(read_trace(FIX / "kineto" / name), "r") for name in TRACES}


@pytest.fixture(scope="module")
def built(whole):
    return {name: b.tables for name, b in whole.items()}


def _step_number(name: str) -> int:
    return int(name.split("#")[1])


@pytest.mark.parametrize("name", TRACES)
def test_busy_is_the_device_union_over_each_step_window(built, name):
    """Busy % per step equals the hand count of the union of every GPU op of the device inside the window (all
    streams, whatever step launched it) within 0.5 pt — here within 0.01 pt; the step's own work apart."""
    steps = built[name]["steps"].dropna(subset=["step"]).set_index("step")
    hand = HAND[name]["per_step"]
    assert len(hand) == len(steps)
    for h in hand:
        row = steps.loc[_step_number(h["step"])]
        assert row["window_ns"] == pytest.approx(h["window_us"] * 1e3, abs=1.0)
        assert row["gpu_busy_pct"] == pytest.approx(h["busy_pct"], abs=0.01)
        assert row["own_busy_ns"] == pytest.approx(h["own_busy_us"] * 1e3, abs=1.0)
        # idle is the device's, split by cause without remainder
        causes = sum(row[c] for c in ("idle_launch_bound_ns", "idle_sync_ns", "idle_host_ns", "idle_other_ns", "idle_unknown_ns",
                                      "idle_capture_ns"))
        assert causes == pytest.approx(row["idle_ns"], abs=1.0)


@pytest.mark.parametrize("name", TRACES)
def test_exposed_communication_equals_the_hand_count(built, name):
    """The part of each step's NCCL union that no compute kernel of the device covered, within 1 %."""
    steps = built[name]["steps"].dropna(subset=["step"]).set_index("step")
    for h in HAND[name]["per_step"]:
        row = steps.loc[_step_number(h["step"])]
        assert row["communication_ns"] == pytest.approx(h["nccl_union_us"] * 1e3, rel=1e-6)
        assert row["communication_exposed_ns"] == pytest.approx(h["exposed_nccl_vs_kernels_us"] * 1e3, rel=0.01)
        assert row["communication_overlapped_ns"] + row["communication_exposed_ns"] == pytest.approx(row["communication_ns"], abs=1.0)


def test_pipelined_steps_are_said_and_not_called_idle(built, whole):
    """The V100 DDP trace (CUDA graphs, side streams): its steps overlap; the device was 95.5–97.7 % busy in every
    window (by hand), and no finding claims an idle gain beyond the device's idle time."""
    name = TRACES[0]
    steps = built[name]["steps"].dropna(subset=["step"])
    assert steps["windows_overlap"].all()
    assert steps["gpu_busy_pct"].between(95.5, 97.7).all()
    assert (steps["others_busy_ns"] > 0).all()
    assert steps["note"].str.contains("overlaps a neighbouring step").all()
    assert any(n.startswith("6 of 6 steps' GPU windows overlap a neighbour's") for n in whole[name].notices)
    assert not any("windows overlap" in n for n in whole["a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"].notices)
    findings = built[name]["findings"]
    idle_pct = float((100 * steps["idle_ns"] / steps["window_ns"]).max())
    gains = findings.loc[findings["kind"].str.startswith("gpu_idle"), "expected_gain_pct"].dropna()
    assert (gains <= idle_pct + 1e-9).all()


@pytest.mark.parametrize("name", TRACES)
def test_no_idle_finding_claims_more_than_the_device_idled(built, name):
    steps = built[name]["steps"]
    stepped = steps.dropna(subset=["step"]) if steps["step"].notna().any() else steps
    idle_pct = float((100 * stepped["idle_ns"] / stepped["window_ns"]).median())
    findings = built[name]["findings"]
    for f in findings[findings["kind"].str.startswith("gpu_idle")].itertuples():
        assert pd.isna(f.expected_gain_pct) or f.expected_gain_pct <= idle_pct + 1e-6


def test_graph_replays_are_counted(built):
    """The V100 trace: 12 cudaGraphLaunch calls ran 5,046 GPU operations (hand count), 2 per step."""
    name = TRACES[0]
    steps = built[name]["steps"].dropna(subset=["step"])
    assert HAND[name]["meta"]["graph_launch_calls"] == 12
    assert int(steps["graph_launches"].sum()) == HAND[name]["meta"]["graph_launch_calls"]
    assert int(steps["graph_ops"].sum()) == HAND[name]["meta"]["gpu_ops_launched_by_graph_launch"] == 5046


def test_user_annotations_are_ranges_with_their_gpu_time(built):
    """``record_function`` / ``user_annotation`` ranges go to the ranges table; each name's GPU time is the busy union of
    the GPU work launched inside it on its thread (hand count, per instance, summed)."""
    name = "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"
    ranges = built[name]["ranges"]
    user = ranges[ranges["domain"] == "torch.profiler"]
    hand = HAND[name]["user_annotation"]
    by_name = user.groupby("name")
    for label in ("nccl:all_reduce", "## forward ##", "DistributedDataParallel.forward", "Optimizer.step#SGD.step",
                  "## optimizer ##", "nccl:broadcast"):
        g = by_name.get_group(label)
        assert len(g) == hand[label]["count"]
        assert int(g["gpu_op_count"].sum()) == hand[label]["gpu_ops"]
        assert g["duration_ns"].sum() == pytest.approx(hand[label]["gpu_ops_union_us"] * 1e3, rel=1e-6)
        assert set(g["duration_basis"]) == {"gpu_busy"}
    # Kineto's GPU-side twins (gpu_user_annotation: one stream's first-to-last span) kept beside, as the trace wrote them
    twins = HAND[name]["gpu_user_annotation"]
    for label, counted in twins.items():
        assert by_name.get_group(label)["gpu_annotation_ns"].sum() == pytest.approx(counted["sum_dur_us"] * 1e3, rel=1e-6)
    assert by_name.get_group("## forward ##")["gpu_annotation_ns"].isna().all()  # the trace wrote it none
    # a range that launched no GPU work keeps its CPU time, said so
    zero = by_name.get_group("Optimizer.zero_grad#SGD.zero_grad")
    assert hand["Optimizer.zero_grad#SGD.zero_grad"]["gpu_ops"] == 0 and set(zero["duration_basis"]) == {"cpu_range"}
    # ProfilerStep#N stays the steps' (not a user range)
    assert not user["name"].str.startswith("ProfilerStep#").any()


def test_the_report_says_communication_overlap_and_replays(built, tmp_path):
    from headcount.reports import findings

    lines = findings.step_lines(built[TRACES[0]]["steps"])
    text = " ".join(lines)
    assert "every stream's work" in text and "step windows overlap" in text
    assert "exposed (no compute kernel ran beside it)" in text and "graph replays: 2 launches per step" in text


# ------------------------------------------------------------------ the interval arithmetic, against brute force

def _brute(groups, starts, ends, queries):
    out = []
    for g, x, y in queries:
        t = np.arange(x, y)  # integer ns: a point is covered where some interval holds it
        hit = np.zeros(len(t), dtype=bool)
        for gg, s, e in zip(groups, starts, ends):
            if gg == g:
                hit |= (t >= s) & (t < e)
        out.append(float(hit.sum()))
    return np.array(out)


def test_covered_agrees_with_counting_every_nanosecond():
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(1, 30))
        groups = rng.integers(0, 3, n)
        starts = rng.integers(0, 200, n).astype(float)
        ends = starts + rng.integers(0, 40, n)
        queries = [(int(rng.integers(0, 3)), *sorted(rng.integers(0, 260, 2).tolist())) for _ in range(10)]
        got = device_view.covered(device_view.pieces(groups, starts, ends), np.array([q[0] for q in queries]),
                                  np.array([q[1] for q in queries], dtype=float), np.array([q[2] for q in queries], dtype=float))
        assert got.tolist() == _brute(groups, starts, ends, queries).tolist()


def test_overlapping_windows():
    keys = np.array([0, 0, 0, 1, 1])
    w0 = np.array([0.0, 10.0, 30.0, 0.0, 5.0])
    w1 = np.array([12.0, 20.0, 40.0, 5.0, 9.0])
    assert device_view.overlapping(keys, w0, w1).tolist() == [True, True, False, False, False]


def test_capture_spans_from_the_real_capture_calls():
    """SGLang's CUDA-graph capture on an MI300X (real runtime calls): one span from hipStreamBeginCapture to the end of
    hipStreamEndCapture, one for hipGraphInstantiateWithFlags; hipStreamGetCaptureInfo is neither."""
    import gzip

    from headcount.derive import captures
    from headcount.derive import steps as step_view

    raw = json.loads(gzip.open(FIX / "kineto" / "mi300x_sglang_decode_capture_kineto.json.gz").read())["traceEvents"]
    runtime = pd.DataFrame([{"pid": str(e["pid"]), "tid": str(e["tid"]), "name": e["name"], "start_ns": round(e["ts"] * 1000),
                             "end_ns": round((e["ts"] + e["dur"]) * 1000)} for e in raw if e.get("cat") == "cuda_runtime"])
    calls = step_view.sync_calls(runtime)
    spans = captures.capture_spans(calls)
    begin = next(e for e in raw if e.get("name") == "hipStreamBeginCapture")
    end = next(e for e in raw if e.get("name") == "hipStreamEndCapture")
    inst = next(e for e in raw if e.get("name") == "hipGraphInstantiateWithFlags")
    assert spans[["start_ns", "end_ns"]].values.tolist() == [
        [round(begin["ts"] * 1000), round((end["ts"] + end["dur"]) * 1000)],
        [round(inst["ts"] * 1000), round((inst["ts"] + inst["dur"]) * 1000)]]
    assert not calls.loc[calls["capture"], "name"].str.contains("GetCaptureInfo").any()


def test_idle_while_capturing_is_its_own_cause_with_no_gain():
    """The rule on one gap (the arithmetic; no recording here has GPU work on both sides of a capture): the part of a
    gap inside a capture span of the launching process is taken from host time first, and the causes still add up."""
    from headcount.derive.captures import capture_share as _capture_share

    causes = {"idle_host_ns": np.array([800.0]), "idle_other_ns": np.array([150.0]), "idle_sync_ns": np.array([0.0]),
              "idle_launch_bound_ns": np.array([50.0]), "idle_unknown_ns": np.array([0.0]), "idle_other_blocked_ns": np.array([0.0])}
    calls = pd.DataFrame({"pid": ["7", "7"], "tid": ["1", "1"], "name": ["cudaStreamBeginCapture", "cudaStreamEndCapture"],
                          "start_ns": [1_000, 1_900], "end_ns": [1_010, 1_950], "capture": [True, True]})
    out = _capture_share(causes, np.array([0.0]), np.array([1000.0]), np.array([0]), np.array(["7"], dtype=object), calls, 900)
    # the span [1000, 1950] less the origin 900 covers [100, 1050): 900 ns of the gap [0, 1000)
    assert out["idle_capture_ns"].tolist() == [900.0]
    assert out["idle_host_ns"].tolist() == [0.0] and out["idle_other_ns"].tolist() == [50.0]
    total = sum(out[c][0] for c in ("idle_capture_ns", "idle_host_ns", "idle_other_ns", "idle_sync_ns", "idle_launch_bound_ns",
                                    "idle_unknown_ns"))
    assert total == 1000.0


def test_a_capture_recording_is_the_device_union_by_hand():
    """SGLang's capture trace (MI300X): its one step's GPU work is the two kernels run before the capture began (the
    captured launches run nothing); busy is their union by hand over the window, and the capture is no idle finding."""
    import gzip

    from headcount.build.kineto import tables_from_kineto
    from headcount.parsers.kineto_json import read_trace

    path = FIX / "kineto" / "mi300x_sglang_decode_capture_kineto.json.gz"
    raw = json.loads(gzip.open(path).read())["traceEvents"]
    ops = sorted((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in raw  # µs, 3 decimals: ns
                 if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, reach = 0, None
    for s, e in ops:
        busy, reach = (busy + e - s, e) if reach is None or s > reach else (busy + max(e - reach, 0), max(reach, e))
    window = max(e for _, e in ops) - min(s for s, _ in ops)
    built = tables_from_kineto(read_trace(path), "r")
    step = built.tables["steps"].dropna(subset=["step"]).iloc[0]
    assert step["window_ns"] == window and step["gpu_busy_ns"] == busy
    assert step["gpu_busy_pct"] == pytest.approx(100 * busy / window, abs=1e-9)
    assert not built.tables["findings"]["kind"].str.startswith("gpu_idle").any()
