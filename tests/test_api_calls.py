"""The cupti source records only the runtime and driver calls a table reads (headcount/collector/api_calls.py),
checked against the H100's own records (tests/fixtures/gpu/h100-2026-12-05, recorded with every call on) and
with the real cupti-python call-id enums through the replay (tests/cupti_replay.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from cupti_replay import ReplayCupti, profile_replayed

from headcount.collector import api_calls
from headcount.collector.cupti_source import CuptiRecorder
from headcount.derive.steps import SYNC_CALL

GPU = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05"


def _records(impl: str) -> list[dict]:
    with gzip.open(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_every_call_a_table_read_on_the_h100_is_still_recorded(impl):
    """Of the H100 step's API records, those a table reads — the launch of GPU work (same correlation id) or a
    synchronizing call — all have a chosen call id; most of the others (cudaGetDevice, …) are no longer recorded."""
    replay = ReplayCupti()
    runtime = set(api_calls.chosen(replay.runtime_api_trace_cbid, api_calls.RUNTIME_CALLS))
    driver = set(api_calls.chosen(replay.driver_api_trace_cbid, api_calls.DRIVER_CALLS))
    records = _records(impl)
    gpu = {r["correlation_id"] for r in records if r["kind"] in ("kernel", "memcpy", "memset")}
    calls = [r for r in records if r["kind"] in ("runtime", "driver")]
    read = [r for r in calls if r["correlation_id"] in gpu or SYNC_CALL.match(r["name"])]
    assert read and all(r["cbid"] in (runtime if r["kind"] == "runtime" else driver) for r in read), \
        sorted({r["name"] for r in read if r["cbid"] not in (runtime if r["kind"] == "runtime" else driver)})
    kept = [r for r in calls if r["cbid"] in (runtime if r["kind"] == "runtime" else driver)]
    assert len(kept) < 0.10 * len(calls)  # 5.5 % (sdpa) and 6.0 % (eager) of the step's API records are read
    assert not any(r["name"].startswith("cudaGetDevice") for r in kept)


def test_the_source_enables_call_ids_not_whole_kinds():
    replay = ReplayCupti()
    recorder = CuptiRecorder(cupti=replay, pm_sampling=False)
    recorder.start()
    try:
        assert int(replay.ActivityKind.RUNTIME) not in replay.enabled and int(replay.ActivityKind.DRIVER) not in replay.enabled
        cbid = replay.runtime_api_trace_cbid
        for name in ("cudaLaunchKernel_v7000", "cudaLaunchKernelExC_v11060", "cudaGraphLaunch_v10000", "cudaMemcpyAsync_v3020",
                     "cudaMemsetAsync_v3020", "cudaStreamSynchronize_v3020", "cudaDeviceSynchronize_v3020", "cudaFree_v3020",
                     "cudaStreamBeginCapture_v10000"):
            assert int(getattr(cbid, name)) in replay.runtime_calls, name
        for name in ("cudaGetDevice_v3020", "cudaStreamIsCapturing_v10000", "cudaLaunchHostFunc_v10000", "cudaEventRecord_v3020"):
            assert int(getattr(cbid, name)) not in replay.runtime_calls, name
        assert int(replay.driver_api_trace_cbid.cuLaunchKernel) in replay.driver_calls
        assert recorder.stats["api_calls"]["runtime"] == len(replay.runtime_calls)
    finally:
        recorder.stop()
    assert not replay.runtime_calls and not replay.driver_calls  # switched off again


def test_a_replayed_step_keeps_its_launches_and_syncs(tiny_llama):
    """A real model tagged under the replay, which delivers an API record only where its call id (or its whole
    kind) is enabled, as CUPTI does: every kernel still has its launch call."""
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    prof, replay = profile_replayed(tiny_llama, {"input_ids": ids, "labels": ids}, steps=1)
    kernels = prof.get_stats()["kernels"]
    gpu = kernels[kernels["runs_on"] == "gpu"]
    assert len(gpu) and gpu["api_start_ns"].notna().all() and gpu["launch_latency_ns"].notna().any()


def _missing(name: str):
    def get(self):
        raise AttributeError(name)
    return property(get)


class _OldCupti(ReplayCupti):
    """A cupti-python without per-call-id switches (``activity_enable_runtime_api``, ``…_driver_api``): the
    replay's own methods hidden, and not looked up in the installed cupti-python either."""

    activity_enable_runtime_api = _missing("activity_enable_runtime_api")
    activity_enable_driver_api = _missing("activity_enable_driver_api")

    def __getattr__(self, name):
        if name.startswith("activity_enable_") and name.endswith("_api"):
            raise AttributeError(name)
        return super().__getattr__(name)


def test_a_cupti_python_that_cannot_choose_records_every_call():
    replay = _OldCupti()
    recorder = CuptiRecorder(cupti=replay, pm_sampling=False)
    recorder.start()
    try:
        assert int(replay.ActivityKind.RUNTIME) in replay.enabled and int(replay.ActivityKind.DRIVER) in replay.enabled
        assert "cannot choose" in recorder.stats["api_calls"]
    finally:
        recorder.stop()
