"""Launch latency that means launch (headcount/derive/launch.py ``latency_columns``): a kernel's time from its
launch call to its start is launch latency only where its stream was idle when the call returned; where the
stream was still running earlier work, the kernel waited behind it, and that is ``queue_delay_ns``.

Checked on the H100's own records (tests/fixtures/gpu/h100-2026-12-05): every kernel's split counted again
from the raw records, independently of headcount's code."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headcount.build.in_process import tables_from_cupti
from headcount.common.device import limits_for
from headcount.derive import launch

GPU = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05"


def test_a_busy_stream_and_an_idle_one():
    """Stream 7: a kernel launched while the one before still runs waited 140 ns behind it (queue delay, no launch
    latency); the next, launched after the stream drained, took 2,000 ns to start (launch latency). Stream 8 is idle."""
    t = 1_796_500_009_669_000_000  # an epoch time: float64 would round these to 256 ns
    k = pd.DataFrame({"kind": "kernel", "pid": "1", "device": "cuda:0", "stream": [7, 7, 7, 8],
                      "start_ns": [t + 100, t + 200, t + 5_000, t + 150], "end_ns": [t + 1_000, t + 2_000, t + 6_000, t + 161],
                      "api_start_ns": pd.array([t, t + 10, t + 3_000, t + 120], dtype="Int64"),
                      "api_end_ns": pd.array([t + 50, t + 60, t + 3_050, t + 131], dtype="Int64")})
    launch.latency_columns(k)
    assert k["launch_latency_ns"].tolist() == [100.0, pd.NA, 2_000.0, 30.0]
    assert k["queue_delay_ns"].tolist() == [pd.NA, 140.0, pd.NA, pd.NA]
    assert k["cpu_launch_cost_ns"].tolist() == [50.0, 50.0, 50.0, 11.0]


def _by_hand(impl: str) -> pd.DataFrame:
    """Each kernel of the raw records with its launch call and whether its stream was busy when the call returned
    (an earlier kernel, copy or memset of the same device and stream still running)."""
    with gzip.open(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", "rt") as fh:
        records = [json.loads(line) for line in fh]
    calls = {r["correlation_id"]: r for r in records if r["kind"] in ("runtime", "driver")}
    work = sorted((r for r in records if r["kind"] in ("kernel", "memcpy", "memset")),
                  key=lambda r: (r["device_id"], r["stream_id"], r["start"]))
    rows, last = [], {}
    for r in work:
        stream = (r["device_id"], r["stream_id"])
        busy_until = last.get(stream)
        last[stream] = max(busy_until or 0, r["end"])
        call = calls.get(r["correlation_id"])
        if r["kind"] != "kernel" or call is None:
            continue
        waited = busy_until is not None and busy_until > call["end"]
        rows.append({"correlation_id": r["correlation_id"], "start_ns": r["start"],
                     "latency": None if waited else r["start"] - call["start"], "queue": r["start"] - call["end"] if waited else None})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_every_h100_kernel_split_as_counted_by_hand(impl):
    built = tables_from_cupti(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", [], "h100", impl, limits_for("9.0"))
    kernels = built.tables["kernels"]
    ours = kernels[kernels["kind"] == "kernel"][["correlation_id", "start_ns", "launch_latency_ns", "queue_delay_ns"]]
    hand = _by_hand(impl)
    both = ours.astype({"correlation_id": "int64", "start_ns": "int64"}).merge(hand, on=["correlation_id", "start_ns"])
    assert len(both) == len(hand) == len(ours)
    assert both["launch_latency_ns"].isna().eq(both["latency"].isna()).all()
    idle = both["latency"].notna()
    assert (both.loc[idle, "launch_latency_ns"].astype(float) == both.loc[idle, "latency"].astype(float)).all()
    assert (both.loc[~idle, "queue_delay_ns"].astype(float) == both.loc[~idle, "queue"].astype(float)).all()
    assert both.loc[idle, "queue_delay_ns"].isna().all()
    # most of this training step's kernels waited behind earlier work: what the old column called latency
    assert 0.9 < (~idle).mean() < 1.0


def test_layers_report_latency_on_an_idle_stream_apart_from_queue_delay():
    """The H100 sdpa step: forward attention work (kernels and memsets) launched onto an idle stream starts 7.0 µs
    after its launch call began (p50); the rest waited behind earlier work for milliseconds (the 0.8–6 ms once
    reported as latency)."""
    built = tables_from_cupti(GPU / "records-layer" / "sdpa" / "cupti-records.jsonl.gz", [], "h100", "sdpa", limits_for("9.0"))
    summary = launch.summary(built.tables["layers"], built.tables["kernels"]).set_index("phase")
    kernels = built.tables["kernels"]
    fwd = kernels[(kernels["phase"] == "fwd") & kernels["layer_name"].notna() & (kernels["runs_on"] == "gpu")]
    idle = fwd["launch_latency_ns"].dropna().astype(float)
    assert summary.loc["fwd", "launch_latency_p50_ns"] == pytest.approx(float(np.median(idle)))
    assert summary.loc["fwd", "launch_latency_p50_ns"] == 7_011.5
    assert summary.loc["fwd", "queue_delay_p50_ns"] > 1_000_000
    assert summary.loc["fwd", "queued_kernels_pct"] == pytest.approx(100 * fwd["queue_delay_ns"].notna().mean())
    assert np.isnan(summary.loc["bwd", "launch_latency_p50_ns"])  # every backward kernel waited: no latency claimed
    layers = built.tables["layers"]
    assert {"queue_delay_p50_ns", "queue_delay_p99_ns", "queued_kernels_pct"} <= set(layers.columns)


# ---------------------------------------------------------------- the step view and the findings use the split
def _work(rows, stream=7):
    """GPU work of one thread: (start, end, api_start, api_end) in ns, launch latency and queue delay filled by the
    rule under test's neighbour (:func:`launch.latency_columns`)."""
    k = pd.DataFrame([{"kind": "kernel", "implementation": "x", "pid": "1", "tid": "T", "device": "cuda:0", "stream": stream,
                       "step": 0, "name": f"k{i}", "start_ns": s, "end_ns": e, "api_start_ns": a, "api_end_ns": b,
                       "correlation_id": i, "layer_name": None} for i, (s, e, a, b) in enumerate(rows)])
    k["api_start_ns"], k["api_end_ns"] = k["api_start_ns"].astype("Int64"), k["api_end_ns"].astype("Int64")
    return launch.latency_columns(k)


def test_a_late_launch_is_launch_bound_for_the_travel_this_recording_measured():
    """30 kernels launched onto an idle stream, each starting 2 µs after its 4-µs launch call returned (p90 2 µs); then
    one that started 20 µs after its call returned: 4 µs in the call + 2 µs travel are launch-bound, the other 18 µs
    the GPU had the work and did not run it ("other"). A fixed 50-µs allowance called all 24 µs launch-bound."""
    from headcount.derive import steps as step_view

    us = 1_000
    rows = []
    for i in range(30):
        t = i * 100 * us
        rows.append((t + 6 * us, t + 16 * us, t, t + 4 * us))
    t = 30 * 100 * us
    rows.append((t + 24 * us, t + 30 * us, t, t + 4 * us))
    step = step_view.gpu_steps(_work(rows)).iloc[0]
    assert step["launch_travel_ns"] == 2 * us
    assert step["queued_kernels_pct"] == 0.0 and step["launch_latency_p50_ns"] == 6 * us
    # the last gap (2,916 → 3,024 µs): 2,916 → 3,000 within the pace of the launch before, 3,000 → 3,006 the call and travel
    last_gap_other = 18 * us
    assert step["idle_other_ns"] == last_gap_other
    assert step["idle_ns"] == pytest.approx(step[["idle_launch_bound_ns", "idle_sync_ns", "idle_host_ns", "idle_other_ns",
                                                  "idle_unknown_ns"]].sum())


def test_too_few_idle_launches_keep_the_ceiling():
    from headcount.derive import steps as step_view

    us = 1_000
    rows = [(i * 100 * us + 6 * us, i * 100 * us + 16 * us, i * 100 * us, i * 100 * us + 4 * us) for i in range(5)]
    step = step_view.gpu_steps(_work(rows)).iloc[0]
    assert step["launch_travel_ns"] == step_view.LAUNCH_TRAVEL_NS


def test_short_kernels_that_queued_are_no_launch_problem():
    """300 kernels of 3 µs, each launch call 5 µs: shorter than their launch. Launched while a 2-ms kernel ran, all
    queued behind it (the CPU was ahead): no "many small kernels" finding. The same kernels launched one by one onto
    an idle stream (the GPU waited for each launch) get it."""
    from headcount.derive import steps as step_view
    from headcount.derive import triage

    us = 1_000
    ahead = [(0, 2_000 * us, -10 * us, -5 * us)]
    ahead += [(2_000 * us + 3 * i * us, 2_000 * us + 3 * (i + 1) * us, 5 * i * us, 5 * (i + 1) * us) for i in range(300)]
    steps = step_view.gpu_steps(_work(ahead))
    assert steps["queued_kernels_pct"].iloc[0] == pytest.approx(100 * 300 / 301)
    assert steps["kernel_p50_ns"].iloc[0] < steps["cpu_launch_cost_p50_ns"].iloc[0]
    assert "many_small_kernels" not in set(triage.findings(steps, None, None)["kind"])

    behind = [(7 * i * us + 6 * us, 7 * i * us + 9 * us, 7 * i * us, 7 * i * us + 5 * us) for i in range(300)]
    steps = step_view.gpu_steps(_work(behind))
    assert steps["queued_kernels_pct"].iloc[0] == 0.0
    found = triage.findings(steps, None, None)
    small = found[found["kind"] == "many_small_kernels"]
    assert len(small) == 1 and "0 % of the work waited" in small["evidence"].iloc[0]
    assert "6.00 µs (p50) after its launch call began" in small["evidence"].iloc[0]


def _steps_by_hand(records: list[dict]) -> dict[int, dict]:
    """Per step of the raw records: the GPU work (kernels, copies, memsets) whose launch call started in the step range,
    how much of it waited behind earlier work of its stream when its launch call returned, the median launch latency
    of the rest, the median duration of its launch calls, and the p90 (linear, as numpy) of start − call end over its
    launches onto an idle stream (50 µs, the ceiling, with fewer than 20 of them)."""
    calls = {r["correlation_id"]: r for r in records if r["kind"] in ("runtime", "driver")}
    steps = sorted((r for r in records if r["kind"] == "range" and r["domain"] == "headcount.step"), key=lambda r: r["start"])
    work = sorted((r for r in records if r["kind"] in ("kernel", "memcpy", "memset")),
                  key=lambda r: (r["device_id"], r["stream_id"], r["start"]))
    last, per_step = {}, {}
    for r in work:
        stream = (r["device_id"], r["stream_id"])
        busy_until = last.get(stream)
        last[stream] = max(busy_until or 0, r["end"])
        call = calls.get(r["correlation_id"])
        if call is None:
            continue
        waited = busy_until is not None and busy_until > call["end"]
        step = next((int(s["name"].split(".")[1]) for s in steps if s["start"] <= call["start"] <= s["end"]), None)
        if step is not None:
            mine = per_step.setdefault(step, {"waited": 0, "launched": 0, "latency": [], "calls": {}, "travel": []})
            mine["calls"][call["correlation_id"]] = call["end"] - call["start"]
            mine["launched"] += 1
            mine["waited"] += waited
            if not waited:
                mine["latency"].append(r["start"] - call["start"])
                mine["travel"].append(r["start"] - call["end"])
    return {step: {"queued_pct": 100 * v["waited"] / v["launched"], "call_p50": float(np.median(list(v["calls"].values()))),
                   "latency_p50": float(np.median(v["latency"])) if v["latency"] else None,
                   "travel": float(np.quantile(v["travel"], 0.9)) if len(v["travel"]) >= 20 else 50_000.0}
            for step, v in per_step.items()}


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_h100_steps_queue_share_latency_and_travel_as_counted_by_hand(impl):
    """The H100 training steps: the first (warm) step launched 14 % (sdpa) of its work onto an idle stream; steps 1
    and 2 queued all of it (the CPU ran ahead of the GPU the whole step). The first step's travel allowance is its
    own p90 (2.7 µs for sdpa), not 50 µs; the others, with no launch onto an idle stream, keep the ceiling (their
    gaps are all "other": the work was launched before the GPU ran dry)."""
    with gzip.open(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", "rt") as fh:
        records = [json.loads(line) for line in fh]
    hand = _steps_by_hand(records)
    built = tables_from_cupti(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", [], "h100", impl, limits_for("9.0"))
    steps = built.tables["steps"].set_index("step")
    assert sorted(hand) == sorted(steps.index.dropna().astype(int)) == [0, 1, 2]
    for step, want in hand.items():
        row = steps.loc[step]
        assert row["queued_kernels_pct"] == pytest.approx(want["queued_pct"], abs=1e-9)
        assert row["launch_travel_ns"] == pytest.approx(want["travel"], abs=1e-6)
        assert row["cpu_launch_cost_p50_ns"] == want["call_p50"]  # to the ns (float64 of epoch times rounds to 256)
        if want["latency_p50"] is None:
            assert np.isnan(row["launch_latency_p50_ns"])
        else:
            assert row["launch_latency_p50_ns"] == want["latency_p50"]
    assert steps.loc[1, "queued_kernels_pct"] == steps.loc[2, "queued_kernels_pct"] == 100.0
    assert steps.loc[0, "launch_travel_ns"] < 5_000
    assert "many_small_kernels" not in set(built.tables.get("findings", pd.DataFrame({"kind": []}))["kind"])


def test_the_bert_small_kineto_step_waited_for_every_launch(tmp_path):
    """BERT-small inference on an H100 (torch.profiler): each of the step's 61 GPU operations started on an idle stream
    (queued 0 %), 1.9 µs p90 after its launch call returned: counted from the trace's own events (µs, to the ns)."""
    import gzip as gz

    from headcount.cli.main import main
    from headcount.derive.steps import MIN_IDLE_LAUNCHES

    path = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"
    events = json.load(gz.open(path))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    work = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: (e["args"]["device"], e["args"]["stream"], e["ts"]))
    last, waited, travel = {}, 0, []
    for e in work:
        stream = (e["args"]["device"], e["args"]["stream"])
        busy_until = last.get(stream)
        last[stream] = max(busy_until or 0, e["ts"] + e["dur"])
        call = calls[e["args"]["correlation"]]
        if busy_until is not None and busy_until > call["ts"] + call["dur"]:
            waited += 1
        else:
            travel.append(round(e["ts"] * 1000) - round((call["ts"] + call["dur"]) * 1000))
    assert waited == 0 and len(travel) == 61 >= MIN_IDLE_LAUNCHES
    assert main(["parse", str(path), "-o", str(tmp_path / "r")]) == 0
    steps = pd.read_parquet(tmp_path / "r" / "steps")
    row = steps[steps["step"] == 6].iloc[0]
    assert row["queued_kernels_pct"] == 0.0
    assert row["launch_travel_ns"] == pytest.approx(float(np.quantile(travel, 0.9)), abs=2.0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_cuptis_queued_timestamp_agrees_with_the_split(impl):
    """CUPTI's own latency timestamp (H100: ``queued`` recorded, ``submitted`` 0 → null): a kernel the timeline says
    was launched onto an idle stream started a few µs after CUPTI wrote it into the command buffer; one that waited
    behind earlier work, milliseconds after (median). ``queued`` lies inside the launch call."""
    built = tables_from_cupti(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", [], "h100", impl, limits_for("9.0"))
    k = built.tables["kernels"]
    k = k[k["kind"] == "kernel"]
    queued = pd.array(k["queued_ns"], dtype="Int64")
    assert not pd.isna(queued).any() and k["submitted_ns"].isna().all() and k["queue_ns"].isna().all()
    assert ((queued > pd.array(k["api_start_ns"], dtype="Int64")) & (queued < pd.array(k["api_end_ns"], dtype="Int64"))).all()
    wait = (pd.array(k["start_ns"], dtype="Int64") - queued).astype("float64")
    idle = k["launch_latency_ns"].notna().to_numpy()
    assert np.quantile(wait[idle], 0.9) < 6_000 and np.median(wait[~idle]) > 1_000_000
