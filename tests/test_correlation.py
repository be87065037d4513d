"""External correlation only where attribution reads it (issue 49, item 1): the cupti source pushes a range's id
as CUPTI external correlation id only for the attention ranges a launch can carry. A step range pushes none (work
finds its step by the time of its launch call); of a phase and layer range opened together, only the inner one
pushes (nothing launches between the two). CUPTI writes an external correlation record for each recorded API call
made while an id is pushed: on the H100 step a step's id covered 44 % of them.

A recorder asked not to correlate at all (``CuptiRecorder(correlate=False)``, the GPU check's "+ ranges" row of
the overhead breakdown) pushes nothing, and its records are attributed by time on the launching thread instead:
the same tables."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from cupti_replay import ReplayCupti, profile_replayed

from headcount.cli.models import load_model, make_inputs


@pytest.fixture(scope="module")
def llama():
    model, _ = load_model(None)
    return model, make_inputs(model, 2, 32)


def _records(prof) -> list[dict]:
    with gzip.open(prof.trace_path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_only_the_ranges_a_launch_can_carry_push_their_id(llama, tmp_path, mode):
    model, inputs = llama
    prof, replay = profile_replayed(model, inputs, mode=mode, steps=2, tmp_path=tmp_path)
    records = _records(prof)
    stats = prof.get_stats()
    ranges = stats["ranges"]
    pushed = set(replay.pushed)
    assert len(pushed) == len(replay.pushed)  # each id once
    by_id = ranges.set_index("external_id")
    assert not (pushed & set(by_id.index[by_id["level"].isin(["phase"])]))  # the outer of each pair: never
    steps = [r for r in records if r["kind"] == "range" and r["domain"] == "headcount.step"]
    assert {r["name"] for r in steps} >= {"step.0", "step.1"} and not (pushed & {r["id"] for r in steps})
    inner = {"layer": ["layer"], "head": ["layer", "head"]}[mode]
    assert pushed == set(by_id.index[by_id["level"].isin(inner)])
    header = records[0]
    assert header["stats"]["correlation"] is True and header["stats"]["correlation_pushes"] == len(pushed)
    # the recorder's own account: records counted by kind as the file holds them, its start and stop parts timed
    counted: dict = {}
    for r in records[1:]:
        if r["kind"] != "range":
            counted[r["kind"]] = counted.get(r["kind"], 0) + 1
    assert header["stats"]["records_by_kind"] == counted and counted["external_correlation"] > 0
    assert {"enable", "synchronize", "flush_disable", "write"} <= set(prof.collector_stats["timings_ms"])
    # every launch still maps to its range exactly: the layers' kernels are the ones launched inside them
    k = stats["kernels"]
    carried = {r["external_id"] for r in records if r["kind"] == "external_correlation"}
    assert carried <= pushed
    assert k["layer_name"].notna().sum() == sum(1 for r in records if r["kind"] == "external_correlation")
    assert set(stats["layers"]["phase"]) == {"fwd", "bwd"}


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_without_correlation_the_ranges_are_attributed_by_time_alike(llama, tmp_path, mode):
    """Two recordings of the same replayed steps (the replay's clock is virtual: the same timestamps), one with
    external correlation and one without: the same kernels in the same layers and heads."""
    model, inputs = llama
    with_ids, _ = profile_replayed(model, inputs, mode=mode, steps=2, replay=ReplayCupti(), tmp_path=tmp_path / "a")
    without, replay = profile_replayed(model, inputs, mode=mode, steps=2, replay=ReplayCupti(), tmp_path=tmp_path / "b",
                                       correlate=False)
    records = _records(without)
    with_records = _records(with_ids)
    assert sum(r["kind"] == "external_correlation" for r in with_records) > 0
    assert not replay.pushed and not any(r["kind"] == "external_correlation" for r in records)
    assert records[0]["stats"]["correlation"] is False
    a, b = with_ids.get_stats(), without.get_stats()
    cols = ["implementation", "phase", "layer", "calls", "kernel_count", "duration_ns", "kernel_busy_ns", "cpu_launch_cost_ns"]
    pd.testing.assert_frame_equal(a["layers"][cols], b["layers"][cols])
    ka, kb = a["kernels"], b["kernels"]
    assert ka["layer_name"].notna().sum() == kb["layer_name"].notna().sum() > 0
    assert (ka["layer_name"].fillna("-").tolist() == kb["layer_name"].fillna("-").tolist())
    if mode == "head":
        pd.testing.assert_frame_equal(a["heads"][["phase", "layer", "head", "kernel_count", "duration_ns"]],
                                      b["heads"][["phase", "layer", "head", "kernel_count", "duration_ns"]])


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_h100_tables_need_only_what_the_collector_now_records(impl, tmp_path):
    """The H100 step, recorded with every API call and an id pushed by every range, read again with only what the
    collector now records: the chosen call ids, and external correlation records only of those calls made inside an
    attention range (CUPTI writes one with each recorded API call while an id is pushed; the steps push none).
    Every table a user reads is the same."""
    from pathlib import Path

    from headcount.build.in_process import tables_from_cupti
    from headcount.collector import api_calls
    from headcount.common.device import limits_for

    source = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05" / "records-layer" / impl / "cupti-records.jsonl.gz"
    with gzip.open(source, "rt") as fh:
        records = [json.loads(line) for line in fh]
    attention = {r["id"] for r in records if r["kind"] == "range" and r["domain"] == "headcount"}
    chosen = {r["correlation_id"] for r in records if r["kind"] in ("runtime", "driver")
              and (api_calls.RUNTIME_CALLS if r["kind"] == "runtime" else api_calls.DRIVER_CALLS).match(r["name"])}
    kept = [r for r in records if not (
        (r["kind"] in ("runtime", "driver") and r["correlation_id"] not in chosen)
        or (r["kind"] == "external_correlation" and (r["correlation_id"] not in chosen or r["external_id"] not in attention)))]
    assert len(kept) < 0.15 * len(records)
    now = tmp_path / "cupti-records.jsonl.gz"
    with gzip.open(now, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in kept)
    before = tables_from_cupti(source, [], "h100", impl, limits_for("9.0")).tables
    after = tables_from_cupti(now, [], "h100", impl, limits_for("9.0")).tables
    # a kernel launched outside attention carried its step's id before: no table reads it (steps come from time)
    k_before, k_after = before["kernels"], after["kernels"]
    inside = k_before["layer_name"].notna()
    assert k_before.loc[inside, "external_id"].tolist() == k_after.loc[inside, "external_id"].tolist()
    assert k_after.loc[~inside, "external_id"].isna().all()
    before["kernels"], after["kernels"] = k_before.drop(columns="external_id"), k_after.drop(columns="external_id")
    for name in ("kernels", "layers", "steps", "ranges"):
        a, b = before[name], after[name]
        if "run_id" in a:
            a, b = a.drop(columns="run_id"), b.drop(columns="run_id")
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_like=True, obj=name)
    assert after["layers"]["kernel_count"].sum() > 0 and after["steps"]["sync_calls"].notna().all()
