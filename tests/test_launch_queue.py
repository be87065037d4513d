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

from headcount.build import tables_from_cupti
from headcount.derive import launch
from headcount.device import limits_for

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
