"""The cupti source on CPU: real cupti-python (record classes, enums, the
errors it raises without a driver) with the GPU replayed (tests/cupti_replay.py).
"""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from cupti import cupti as real_cupti
from cupti_replay import LaunchOnEveryOp, ReplayCupti, ReplayPm, kernel_record_class, profile_replayed

from headcount import AttentionProfiler, attention_range
from headcount.api import resolve_backend
from headcount.attribute import attribution, graphs
from headcount.cli.main import main as cli_main
from headcount.cli.models import load_model, make_inputs
from headcount.collector import cupti_load, cupti_source, pm_sampler
from headcount.collector.cupti_errors import classify
from headcount.collector.cupti_source import CuptiRecorder, record_of
from headcount.common.errors import HeadcountError
from headcount.derive.occupancy import LIMITS
from headcount.parsers import cupti_records


@pytest.fixture(scope="module")
def llama():
    model, _ = load_model(None)
    return model, make_inputs(model, 2, 32)


# ---------------------------------------------------------------- records
def test_record_of_reads_cupti_python_objects():
    k = kernel_record_class()()
    k.kind = int(real_cupti.ActivityKind.CONCURRENT_KERNEL)
    k.name, k.start, k.end, k.queued, k.submitted = "flash_fwd", 100, 250, 40, 60
    k.correlation_id, k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y, k.block_z = 9, 8, 4, 2, 128, 1, 1
    k.registers_per_thread, k.static_shared_memory, k.dynamic_shared_memory = 168, 1024, 65536
    rec = record_of(real_cupti, k)
    assert rec["kind"] == "kernel" and rec["name"] == "flash_fwd"
    assert (rec["start"], rec["end"], rec["queued"], rec["submitted"]) == (100, 250, 40, 60)
    assert (rec["registers_per_thread"], rec["dynamic_shared_memory"]) == (168, 65536)

    api = real_cupti.ActivityAPI()
    api.kind, api.cbid = int(real_cupti.ActivityKind.DRIVER), int(real_cupti.driver_api_trace_cbid.cuLaunchKernel)
    rec = record_of(real_cupti, api)
    assert rec["kind"] == "driver" and rec["name"] == "cuLaunchKernel"
    api.kind, api.cbid = int(real_cupti.ActivityKind.RUNTIME), int(real_cupti.runtime_api_trace_cbid.cudaGraphLaunch_v10000)
    assert record_of(real_cupti, api)["name"] == "cudaGraphLaunch_v10000"

    ext = real_cupti.ActivityExternalCorrelation()
    ext.kind, ext.correlation_id, ext.external_id = int(real_cupti.ActivityKind.EXTERNAL_CORRELATION), 9, 42
    ext.external_kind = 0  # older bindings (13.0.1) leave a fresh record's fields uninitialised
    assert record_of(real_cupti, ext) == {"kind": "external_correlation", "correlation_id": 9, "external_id": 42,
                                          "external_kind": 0}
    other = real_cupti.ActivityAPI()
    other.kind = int(real_cupti.ActivityKind.MEMORY_POOL)
    assert record_of(real_cupti, other) is None


def test_records_file_round_trip_and_event_columns(llama, tmp_path):
    model, inputs = llama
    prof, replay = profile_replayed(model, inputs, steps=1, tmp_path=tmp_path)
    header, records = cupti_records.read_records(tmp_path / cupti_source.RECORDS_FILE)
    assert header["format"] == "headcount-cupti-records" and header["stats"]["dropped_records"] == 0
    kinds = pd.Series([r["kind"] for r in records]).value_counts()
    assert kinds["kernel"] == kinds["runtime"] == replay.launches
    events = cupti_records.events_frame(header, records)
    kernels = events[events["kind"] == "kernel"]
    assert kernels["queued_ns"].notna().all() and (kernels["queued_ns"] <= kernels["submitted_ns"]).all()
    assert (kernels["submitted_ns"] <= kernels["start_ns"]).all()
    ranges = events[events["kind"] == "range"]
    assert set(ranges["name"].str.split("@").str[0]) == {"headcount", "headcount.step"}
    # every launch inside a headcount range carries that range's id
    assert kernels["external_id"].notna().sum() > 0
    assert set(kernels["external_id"].dropna()) <= set(ranges["external_id"])


def test_bad_records_files_are_one_line_errors(tmp_path):
    missing = tmp_path / "none.jsonl.gz"
    with pytest.raises(HeadcountError, match="no such file"):
        cupti_records.read_records(missing)
    foreign = tmp_path / "foreign.jsonl.gz"
    with gzip.open(foreign, "wt") as fh:
        fh.write(json.dumps({"traceEvents": []}) + "\n")
    with pytest.raises(HeadcountError, match="not a headcount CUPTI records file"):
        cupti_records.read_records(foreign)
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text("hello")
    with pytest.raises(HeadcountError, match="unreadable or truncated"):
        cupti_records.read_records(plain)
    good = tmp_path / "good.jsonl.gz"
    with gzip.open(good, "wt") as fh:
        fh.write(json.dumps({"kind": "header", "format": "headcount-cupti-records", "pid": 1}) + "\n")
        for i in range(2000):
            fh.write(json.dumps({"kind": "runtime", "name": "x", "start": i, "end": i + 1, "process_id": 1,
                                 "thread_id": 1, "correlation_id": i, "cbid": 1}) + "\n")
    data = good.read_bytes()
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(HeadcountError, match="truncated"):
        cupti_records.read_records(truncated)
    header, records = cupti_records.read_records(good)
    assert len(records) == 2000 and records[1999]["correlation_id"] == 1999
    malformed = tmp_path / "malformed.jsonl.gz"
    with gzip.open(malformed, "wt") as fh:
        fh.write(json.dumps({"kind": "header", "format": "headcount-cupti-records", "pid": 1}) + "\n{\"kind\": \n")
    with pytest.raises(HeadcountError, match="unreadable or truncated"):
        cupti_records.read_records(malformed)


def test_records_files_the_json_module_wrote_are_read_nan_included(tmp_path):
    """Files written before the records were encoded with msgspec: the json module's NaN (no JSON) is read."""
    old = tmp_path / "old.jsonl.gz"
    with gzip.open(old, "wt") as fh:
        fh.write(json.dumps({"kind": "header", "format": "headcount-cupti-records", "pid": 1}) + "\n")
        fh.write(json.dumps({"kind": "pm_sample", "start": 1, "end": 2, "values": {"dram": float("nan"), "x": 1.5}}) + "\n")
    header, records = cupti_records.read_records(old)
    assert header["pid"] == 1 and math.isnan(records[0]["values"]["dram"]) and records[0]["values"]["x"] == 1.5


def test_an_unclosed_range_is_an_error_not_a_guess():
    header = {"pid": 1}
    records = [{"kind": "range", "id": 1, "domain": "headcount", "name": "fwd", "process_id": 1, "thread_id": 1,
                "start": 5, "end": None}]
    with pytest.raises(HeadcountError, match="never closed"):
        cupti_records.events_frame(header, records)


def test_ranges_left_open_by_an_interrupt_are_left_out_with_a_notice(llama, tmp_path):
    """A process stopped by Ctrl-C mid-call (``headcount run --backend cupti``) leaves its call and step in progress
    open in its records: with ``ended_by`` a signal, they are left out with a notice and the rest is the report (the
    last layer call fewer); without it, an open range stays an error."""
    import gzip
    import os

    from headcount.build import run_folder

    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=2, tmp_path=tmp_path)
    header, records = cupti_records.read_records(prof.trace_path)
    ranges = [r for r in records if r["kind"] == "range"]
    last_layer = max((r for r in ranges if r["name"].startswith("layer.")), key=lambda r: r["start"])
    last_step = max((r for r in ranges if r["name"].startswith("step.")), key=lambda r: r["start"])
    for r in (last_layer, last_step):
        r["end"] = None  # as the interrupt found them
    cut = tmp_path / "interrupted.jsonl.gz"
    with gzip.open(cut, "wt") as fh:
        for line in (header, *records):
            fh.write(json.dumps(line) + "\n")
    child = {"records": str(cut), "calls": prof._tagger.calls, "rank": 0, "world_size": 1, "pid": os.getpid(), "notices": [],
             "nvtx_tagged": prof._tagger.emitter.use_nvtx, "device": {"kind": "cpu", "compute_capability": "9.0"}}
    [run] = run_folder.from_in_process([{**child, "ended_by": "signal SIGINT"}], prof.run_id)
    assert any("2 headcount ranges were open when the recording was interrupted" in n for n in run.info["collector"]["notices"])
    whole = prof.get_stats()["ranges"]
    kept = run.tables["ranges"]
    assert len(kept[kept["level"] == "layer"]) == len(whole[whole["level"] == "layer"]) - 1
    with pytest.raises(HeadcountError, match="never closed"):
        run_folder.from_in_process([{**child, "ended_by": "exit"}], prof.run_id)


def test_the_loaded_libcupti_exports_what_pm_sampling_calls():
    """The libcupti the cupti source loads (headcount's folder's, `headcount cupti install`: 13.4, whatever libcupti the
    environment's torch pins) exports every function PM sampling calls on headcount's path and is as new as the
    bindings declare, so no notice; a library lacking them (the C library itself, a real one) gets a notice naming
    each and saying where DRAM comes from instead."""
    library = cupti_load.libcupti_path()
    assert library and "libcupti.so" in library
    assert pm_sampler.missing_functions(library) == [] and pm_sampler.pm_sampling_gap(library) is None
    libc = next(p for p in open("/proc/self/maps").read().split() if "/libc.so" in p or "/libc-" in p)  # this process's
    gap = pm_sampler.pm_sampling_gap(libc)
    assert gap.startswith("PM sampling needs cuptiProfilerInitialize, ") and "cuptiPmSamplingCounterDataGetSampleInfo" in gap
    assert "--backend nsys --gpu-metrics on, or --backend ncu" in gap
    assert pm_sampler.missing_functions("/nonexistent/libcupti.so") == list(pm_sampler.PM_SAMPLING_FUNCTIONS)


def test_pm_sampling_loads_and_fails_only_at_the_driver():
    """Where cupti-python has PM sampling, its collector imports and is refused only by the missing driver (never a
    missing module or symbol), with the folder `headcount cupti install` fills beside torch's own libcupti (the
    README's route). Skipped, naming what is missing, where the loaded cupti-python has no pm_sampling."""
    try:
        from cupti import pm_sampling
    except ImportError as exc:
        pytest.skip(f"cupti-python {cupti_load.cupti_version()} has no pm_sampling ({exc})")
    from headcount.common import env

    if env.driver_present():
        pytest.skip("an NVIDIA driver is present: the collector would start")
    with pytest.raises(Exception) as raised:
        pm_sampling.Collector(device_index=0).enable()
    assert "driver" in str(raised.value).lower(), raised.value


# ---------------------------------------------------------------- attribution
@pytest.mark.parametrize("mode", ["layer", "head"])
def test_external_correlation_attributes_like_the_launch_calls(llama, mode):
    """The exact mapping (external ids) and the timestamp rule (innermost range
    around the launch call on its thread) agree on every kernel."""
    model, inputs = llama
    prof, replay = profile_replayed(model, inputs, mode=mode)
    stats = prof.get_stats()
    k = stats["kernels"]
    assert len(k) == replay.launches and (k["source"] == "cupti").all()
    ranges = stats["ranges"]
    nested = ranges[ranges["domain"] == "headcount"].assign(external_id=lambda r: r["external_id"])
    work = k.assign(launch_pid=k["pid"], launch_tid=k["tid"])
    by_time = attribution.launched_in(work, nested)
    by_id = attribution.by_external_id(work, nested)
    assert (by_time == by_id).all()
    assert (by_id >= 0).sum() > 0 and (by_id == -1).sum() > 0  # attention and non-attention kernels
    layers = stats["layers"]
    assert set(layers["phase"]) == {"fwd", "bwd"} and set(layers["layer"]) == {0, 1, 2, 3}
    if mode == "head":
        heads = stats["heads"]
        assert (heads["provenance"] == "measured").all() and len(heads) == 2 * 4 * 8


def test_launch_statistics_follow_the_replayed_gpu(llama):
    model, inputs = llama
    replay = ReplayCupti(launch_cost_ns=4_000, latency_ns=6_000, kernel_ns=10_000)
    prof, replay = profile_replayed(model, inputs, replay=replay)
    stats = prof.get_stats()
    k = stats["kernels"].dropna(subset=["layer_name"])
    # kernel start − launch call start ≥ call cost + latency; CPU cost is the call's duration
    assert (k["launch_latency_ns"] >= 10_000).all()
    assert (k["cpu_launch_cost_ns"] == 4_000).all()
    layers = stats["layers"]
    kernels_per_layer = k.groupby(["phase", "layer"]).size()
    got = layers.set_index(["phase", "layer"])["kernel_count"]
    assert (got.loc[kernels_per_layer.index] == kernels_per_layer).all()
    assert np.allclose(layers["cpu_launch_cost_ns"], layers["kernel_count"] * 4_000)
    # busy time is the kernels' union: kernels never overlap on the one replayed stream
    assert np.allclose(layers["kernel_busy_ns"], layers["kernel_count"] * 10_000)
    assert (layers["kernel_gap_ns"] >= 0).all()
    # time is busy time; the span (first start to last end) is apart, the gaps between the kernels included
    assert np.allclose(layers["duration_ns"], layers["kernel_busy_ns"])
    assert np.allclose(layers["gpu_span_ns"], layers["kernel_busy_ns"] + layers["kernel_gap_ns"])
    launch = stats["launch"]
    assert set(launch["phase"]) == {"fwd", "bwd"}
    assert (launch["launch_latency_p50_ns"] >= 10_000).all()
    assert np.allclose(launch["cpu_launch_cost_per_call_ns"], launch["kernels_per_call"] * 4_000)
    assert (launch["queue_p50_ns"] == 4_000 // 2 + 500).all()  # replay: queued mid-call, submitted 500 ns after it
    occ = k["theoretical_occupancy_pct"]
    assert occ.notna().all() and ((occ > 0) & (occ <= 100)).all()


def test_pm_samples_are_apportioned_with_their_provenance(llama):
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, pm=ReplayPm(bytes_per_ns=2.0, warps_pct=40.0))
    stats = prof.get_stats()
    layers = stats["layers"]
    assert (layers["dram_bytes_provenance"] == "sampled").all()
    # 2 B/ns read + 1 B/ns written over each range's GPU window
    assert np.allclose(layers["bandwidth_gbps"], 3.0)
    # sampled over each range's GPU window: its span (first start to last end), not its busy time
    assert np.allclose(layers["dram_bytes"], 3.0 * layers["gpu_span_ns"]) and (layers["duration_ns"] < layers["gpu_span_ns"]).all()
    assert (layers["achieved_occupancy_provenance"] == "sampled").all() and np.allclose(layers["achieved_occupancy_pct"], 40.0)
    assert (layers["bandwidth_provenance"] == "sampled").all()
    heads = stats["heads"]
    assert (heads["dram_bytes_provenance"] == "apportioned").all()
    info = prof.run_metadata()["collector"]["pm_sampling"]
    # no interval asked: the finest CUPTI accepts (the stand-in accepts all)
    assert info["enabled"] and info["interval_ns"] == pm_sampler.PM_INTERVALS_NS[0] and info["completed_samples"] > 0
    assert info["interval_choice"] == "auto" and info["refused_intervals_ns"] == []


def test_pm_interval_auto_takes_the_finest_accepted_and_short_windows_get_null(llama, capsys):
    """Where the finest intervals are refused, the next is used and said; a kernel or range with fewer than
    4 whole samples inside it gets null sampled figures and a notice naming ncu, never a share of a sample."""
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm(finest_ns=20_000))
    stats = prof.get_stats()
    info = prof.run_metadata()["collector"]["pm_sampling"]
    assert info["interval_ns"] == 20_000 and info["refused_intervals_ns"] == [5_000, 10_000]
    kernels = stats["kernels"]
    # the replayed kernels last 20 µs: one whole 20-µs sample at most, never 4
    assert (kernels["pm_whole_samples"] < 4).all() and kernels["dram_read_sampled_bytes"].isna().all()
    ranges = stats["ranges"]
    layer = ranges[ranges["level"] == "layer"]
    resolved = layer["pm_whole_samples"] >= 4
    assert layer.loc[resolved, "dram_read_sampled_bytes"].notna().all() and layer.loc[~resolved, "dram_read_sampled_bytes"].isna().all()
    assert "does not resolve" in capsys.readouterr().err
    layers = stats["layers"]
    # a layer row is sampled only where every call of it is resolved; else analytic, not a partial sum
    every = layer.groupby(["phase", "layer_name"])["pm_whole_samples"].min() >= 4
    for row in layers.itertuples():
        assert (row.dram_bytes_provenance == "sampled") == bool(every[(row.phase, row.layer_name)])
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm(), pm_interval_ns=50_000)
    prof.get_stats()
    info = prof.run_metadata()["collector"]["pm_sampling"]
    assert info["interval_ns"] == 50_000 and info["interval_choice"] == "asked"


def test_a_recording_longer_than_the_decode_budget_says_so_and_its_late_ranges_get_null(llama, capsys, monkeypatch):
    """PM samples are decoded up to a budget (host memory); a longer recording keeps its first samples, says so,
    and a range after the last sample (or partly after it) gets no sampled figure, never the part covered."""
    model, inputs = llama
    monkeypatch.setattr(pm_sampler, "PM_MAX_DECODED_SAMPLES", 40)
    prof, _ = profile_replayed(model, inputs, steps=2, pm=ReplayPm())
    stats = prof.get_stats()
    assert "outlasted 40 samples at 5 µs (the decode budget)" in capsys.readouterr().err
    info = prof.run_metadata()["collector"]["pm_sampling"]
    assert info["decode_budget"] == 40 and info["populated_samples"] == 40
    ranges = stats["ranges"]
    layer = ranges[ranges["level"] == "layer"].sort_values("gpu_start_ns")
    last = info["samples"]["last_ns"]
    late = layer["gpu_end_ns"] > last
    assert late.any() and layer.loc[late, "dram_read_sampled_bytes"].isna().all()
    assert layer.loc[~late & (layer["pm_whole_samples"] >= 4), "dram_read_sampled_bytes"].notna().all()


def test_pm_sampling_waits_for_cuda_and_says_so_if_it_never_comes(llama, capsys):
    """`headcount run` starts recording before the program touches CUDA, where CUPTI's profiler knows no device (on
    an H100: "Invalid device_index: 0", tests/fixtures/gpu/h100-2026-12-05): PM sampling starts at the first range
    that opens once CUDA is up, and a run where it never comes says so, its DRAM analytic (never zero)."""
    model, inputs = llama
    replay = ReplayCupti()
    prof, _ = profile_replayed(model, inputs, steps=1, replay=replay, pm=ReplayPm(), cuda_ready=lambda: replay.launches > 0)
    assert (prof.get_stats()["layers"]["dram_bytes_provenance"] == "sampled").all()
    collector = prof.run_metadata()["collector"]
    assert collector["pm_sampling"]["enabled"] and collector["pm_sampling"]["completed_samples"] > 0
    assert collector["pm_sampling_started_ns"] > collector["started_ns"]
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm(), cuda_ready=lambda: False)
    assert "PM sampling never started: CUDA was not initialized" in capsys.readouterr().err
    layers = prof.get_stats()["layers"]
    assert (layers["dram_bytes_provenance"] == "analytic").all()
    assert "dram_bytes_sampled" not in layers or layers["dram_bytes_sampled"].isna().all()


def test_pm_sampling_unavailable_is_a_notice_and_tracing_goes_on(llama, capsys):
    model, inputs = llama
    prof, replay = profile_replayed(model, inputs, steps=1, pm=ReplayPm(fail=PermissionError("ERR_NVGPUCTRPERM")))
    err = capsys.readouterr().err
    assert "PM sampling unavailable" in err and "ERR_NVGPUCTRPERM" in err
    stats = prof.get_stats()
    assert len(stats["kernels"]) == replay.launches
    assert (stats["layers"]["dram_bytes_provenance"] == "analytic").all()


def test_dropped_records_are_reported(llama, capsys):
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, replay=ReplayCupti(dropped=17))
    assert "dropped 17 activity records" in capsys.readouterr().err
    prof.get_stats()
    assert prof.run_metadata()["collector"]["dropped_records"] == 17


def test_the_cupti_report_is_written_and_read_back(llama, tmp_path):
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm())
    out = prof.save(tmp_path / "report")
    layers = pd.read_parquet(out / "layers")
    kernels = pd.read_parquet(out / "kernels")
    assert (kernels["source"] == "cupti").all() and kernels["queued_ns"].notna().all()
    assert layers["kernels_per_call"].notna().all() and layers["theoretical_occupancy_pct"].notna().all()
    assert (pd.read_parquet(out / "runs")["source"] == "cupti").all()


# ---------------------------------------------------------------- failure modes
def test_without_a_gpu_the_real_cupti_python_says_so():
    with pytest.raises(Exception) as info:
        real_cupti.get_timestamp()
    err = classify(info.value)
    assert err.one_line().startswith("no NVIDIA driver on this machine")
    assert "--backend torch" in err.hint
    ok, why = cupti_load.probe()
    assert not ok and "no NVIDIA driver" in why


@pytest.mark.parametrize("status,expect", [
    ("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", "already held by another profiler"),
    ("ERROR_INSUFFICIENT_PRIVILEGES", "ERR_NVGPUCTRPERM"),
    ("ERROR_NOT_COMPATIBLE", "does not match"),
    ("ERROR_UNKNOWN", "CUPTI failed while starting the cupti source: ERROR_UNKNOWN"),
])
def test_cupti_status_errors_name_the_cause(status, expect):
    err = classify(real_cupti.cuptiError(int(real_cupti.Result[status])))
    assert expect in err.one_line() and err.hint and err.exit_code == 3
    assert "\n" not in err.one_line()


def test_other_failures_name_the_cause():
    assert "not installed" in classify(ModuleNotFoundError("No module named 'cupti'", name="cupti")).message
    assert "ERR_NVGPUCTRPERM" in classify(PermissionError("x")).message
    old = type("NotSupportedError", (RuntimeError,), {})("CUDA driver version is older than required (12080 < 13000)")
    assert "too old" in classify(old).message and "13.0" in classify(old).hint


def test_a_held_cupti_is_a_notice_and_the_block_runs(llama, capsys):
    model, inputs = llama
    held = real_cupti.cuptiError(int(real_cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))
    replay = ReplayCupti(fail_enable=held)
    prof = AttentionProfiler(model, recorder=CuptiRecorder(cupti=replay, pm_sampling=False))
    with prof:
        out = model(**inputs)
    assert out.loss is not None
    assert "already held by another profiler" in capsys.readouterr().err
    assert replay.enabled == set()
    with pytest.raises(HeadcountError, match="nothing was recorded: CUPTI is already held"):
        prof.get_stats()
    strict = AttentionProfiler(model, recorder=CuptiRecorder(cupti=ReplayCupti(fail_enable=held), pm_sampling=False), strict=True)
    with pytest.raises(HeadcountError, match="already held"):
        with strict:
            pass


def test_backend_cupti_without_gpu(llama, capsys):
    model, inputs = llama
    prof = AttentionProfiler(model, backend="cupti")
    with prof:
        model(**inputs)
    assert "cupti source did not start" in capsys.readouterr().err
    with pytest.raises(HeadcountError, match="nothing was recorded: no NVIDIA driver"):
        prof.get_stats()


def test_auto_falls_back_to_torch_and_says_so(llama, capsys):
    backend, why = resolve_backend("auto")
    assert backend == "torch" and "cupti unavailable: no NVIDIA driver" in why
    model, inputs = llama
    prof = AttentionProfiler(model)
    assert prof.backend == "torch"
    assert "backend auto: torch" in capsys.readouterr().err
    with prof:
        model(**inputs)
    assert len(prof.get_stats()["layers"])


def test_cli_backend_cupti_fails_with_one_line(tmp_path, capsys):
    rc = cli_main(["profile", "--backend", "cupti", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1
    assert err[0].startswith("headcount: error: --backend cupti cannot run here: no NVIDIA driver")
    assert not (tmp_path / "r").exists()


def test_nvtx_injection_is_set_only_when_asked_and_possible(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADCOUNT_CUPTI_HOME", str(tmp_path / "no-folder"))  # the wheel's library, not headcount's
    lib_dir = tmp_path / "nvidia" / "cu13" / "lib"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libcupti.so.13").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.setenv("HEADCOUNT_NVTX_INJECTION", "0")
    assert cupti_load.enable_nvtx_injection() is None
    monkeypatch.delenv("HEADCOUNT_NVTX_INJECTION")
    assert cupti_load.enable_nvtx_injection() == str(lib_dir / "libcupti.so.13")
    import os

    assert os.environ["NVTX_INJECTION64_PATH"] == str(lib_dir / "libcupti.so.13")
    assert cupti_load.enable_nvtx_injection() is None  # already set: left alone


def test_injection_set_too_late_is_detected(llama, monkeypatch, capsys):
    """MARKER enabled (the variable is set) but no marker record arrives: say why."""
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/nonexistent/libcupti.so")
    model, inputs = llama
    prof, replay = profile_replayed(model, inputs, steps=1)
    prof.get_stats()
    assert "no NVTX marker record arrived" in capsys.readouterr().err
    assert any("before the process's first NVTX call" in n for n in prof.run_metadata()["collector"]["notices"])


def test_pm_samples_on_another_clock_are_said_not_used(llama, capsys):
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm(offset_ns=10**15))
    stats = prof.get_stats()
    assert "PM samples do not overlap the kernels in time" in capsys.readouterr().err
    assert (stats["layers"]["dram_bytes_provenance"] == "analytic").all()
    assert prof.run_metadata()["collector"]["pm_sampling"]["samples"]["samples"] > 0


def test_pm_sampling_takes_the_largest_metric_set_the_chip_accepts(llama, capsys):
    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, pm=ReplayPm(accepts=2))
    stats = prof.get_stats()
    info = prof.run_metadata()["collector"]["pm_sampling"]
    assert info["metrics"] == ["dram__bytes_read.sum", "dram__bytes_write.sum"]
    assert (stats["layers"]["dram_bytes_provenance"] == "sampled").all()
    assert stats["layers"]["achieved_occupancy_pct"].isna().all()  # warps active not sampled: unknown
    prof, replay = profile_replayed(model, inputs, steps=1, pm=ReplayPm(accepts=1))
    err = capsys.readouterr().err
    assert "PM sampling unavailable: no metric set accepted" in err
    assert len(prof.get_stats()["kernels"]) == replay.launches


def test_console_summary_shows_launch_costs(llama):
    from rich.console import Console

    from headcount.reports import console as console_report

    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, steps=1, replay=ReplayCupti(launch_cost_ns=4_000, latency_ns=6_000))
    stats = prof.get_stats()
    con = Console(record=True, width=200)
    console_report.print_summary(stats["layers"], stats["heads"], None, console=con, kernels=stats["kernels"])
    text = con.export_text()
    assert "GPU ops/call" in text and "Launching attention (per layer call)" in text
    launch_part = text.split("Launching attention (per layer call)")[1]
    row = next(line for line in launch_part.splitlines() if " fwd " in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:4] == ["sdpa", "fwd", "4.0", "16.0"]  # 4 kernels a call, 4 × 4 µs of launch calls
    assert cells[6:8] == ["10.0", "10.0"]  # latency p50/p99: 4 µs call + 6 µs latency


def test_pm_sampling_that_cannot_start_is_a_notice(llama, capsys):
    model, inputs = llama
    pm = ReplayPm()
    original = pm.Collector

    class NoStart(original):
        def start(self):
            raise real_cupti.cuptiError(int(real_cupti.Result.ERROR_INSUFFICIENT_PRIVILEGES))

    pm.Collector = NoStart
    prof, replay = profile_replayed(model, inputs, steps=1, pm=pm)
    assert "PM sampling unavailable: GPU performance counters are not permitted" in capsys.readouterr().err
    assert len(prof.get_stats()["kernels"]) == replay.launches
    assert prof.run_metadata()["collector"]["pm_sampling"]["enabled"] is False


def test_the_replay_keeps_no_wall_clock(llama):
    """Two replays of the same steps give the same timeline to the nanosecond:
    the stand-in GPU's clock is virtual, so a loaded machine changes nothing."""
    model, inputs = llama
    timelines = []
    for _ in range(2):
        prof, _ = profile_replayed(model, inputs, steps=1, replay=ReplayCupti(launch_cost_ns=4_000, latency_ns=6_000))
        k = prof.get_stats()["kernels"]
        timelines.append(k[["name", "start_ns", "end_ns", "launch_latency_ns", "cpu_launch_cost_ns"]]
                         .assign(start_ns=k["start_ns"] - k["start_ns"].min(), end_ns=k["end_ns"] - k["start_ns"].min()))
    assert timelines[0].equals(timelines[1])
    assert (timelines[0]["launch_latency_ns"] == 10_000).all()  # 4 µs call + 6 µs latency, never queued behind the GPU


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_one_recording_gives_the_same_tables_in_process_and_through_headcount_run(llama, tmp_path, mode):
    """The same CUPTI records (the replay) through AttentionProfiler and through
    ``headcount run --backend cupti``'s per-process assembly: one build path, identical tables."""
    import os

    from headcount.build import run_folder

    model, inputs = llama
    prof, _ = profile_replayed(model, inputs, mode=mode, pm=ReplayPm(), tmp_path=tmp_path)
    stats = prof.get_stats()
    child = {"records": str(prof.trace_path), "calls": prof._tagger.calls, "rank": 0, "world_size": 1, "pid": os.getpid(),
             "notices": [], "nvtx_tagged": prof._tagger.emitter.use_nvtx,
             "device": {"kind": "cpu", "compute_capability": "9.0"}}  # the limits the in-process run used (LIMITS["9.0"])
    [run] = run_folder.from_in_process([child], prof.run_id)
    for name in ("kernels", "ranges", "layers", "heads", "launch"):
        pd.testing.assert_frame_equal(stats[name].reset_index(drop=True), run.tables[name].reset_index(drop=True), check_like=True)
    assert run.info["collector"] == prof.collector_info


def test_graph_nodes_remember_the_range_that_captured_them(llama, tmp_path):
    """CUDA graphs on the replayed GPU (stands in for torch.cuda.graph under CUPTI:
    launches during stream capture make graph nodes inside the launch call, on
    the capturing thread; instantiation clones them; a replay runs one kernel
    per node carrying the node's id). Each node is recorded with the headcount
    range open at capture, and clones resolve to it."""
    model, inputs = llama
    replay = ReplayCupti()
    rec = CuptiRecorder(cupti=replay, pm_sampling=False, record_dir=tmp_path)
    prof = AttentionProfiler(model, recorder=rec)
    with prof:
        replay.begin_capture()
        with LaunchOnEveryOp(replay), torch.no_grad():
            model(**inputs)
        clones = replay.end_capture()
        with prof.step(0):
            replay.replay_graph()
    header, records = cupti_records.read_records(rec.records_path)
    assert header["stats"]["graph_nodes"] == {"created": len(clones), "cloned": len(clones), "callback_failures": 0}
    ranges = {r["id"]: r["name"] for r in records if r["kind"] == "range"}
    resolved = graphs.follow_clones(*cupti_records.graph_nodes(records))
    assert set(clones) <= set(resolved)  # every clone is followed back to the node it was made from
    captured_in = {ranges[resolved[c]] for c in clones if resolved[c] != -1}
    # every layer's forward captured nodes (attention kernels inside fwd/layer.N), and clones resolve like originals
    assert {f"layer.{i}" for i in range(model.config.num_hidden_layers)} <= captured_in
    assert -1 in resolved.values()  # embeddings, MLPs: made outside every range
    assert all(resolved[c] == resolved[c - 1_000] for c in clones)
    events = cupti_records.events_frame(header, records)
    replayed = events[events["kind"] == "kernel"]
    assert len(replayed) == len(clones) and set(replayed["graph_node_id"]) == set(clones)
    launch = events[(events["kind"] == "runtime") & events["correlation_id"].isin(replayed["correlation_id"])]
    assert launch["name"].tolist() == ["cudaGraphLaunch_v10000"]  # one launch call runs every node


def _graph_session(model, inputs, tmp_path, mode="layer", replays=3, eager_steps=0):
    """Capture one forward into a CUDA graph under the profiler (no step), then
    replay it once per step; with ``eager_steps``, first run that many plain
    (eager) steps, numbered after the replays. On the replayed GPU: stands in
    for ``torch.cuda.graph`` capture and ``graph.replay()`` under CUPTI."""
    replay = ReplayCupti()
    rec = CuptiRecorder(cupti=replay, pm_sampling=False, record_dir=tmp_path)
    rec.device_limits = LIMITS["9.0"]
    prof = AttentionProfiler(model, mode=mode, recorder=rec)
    with prof, torch.no_grad():
        for i in range(eager_steps):
            with prof.step(replays + i), LaunchOnEveryOp(replay):
                model(**inputs)
        replay.begin_capture()
        with LaunchOnEveryOp(replay):
            model(**inputs)
        replay.end_capture()
        for i in range(replays):
            with prof.step(i):
                replay.replay_graph()
    return prof


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_replayed_kernels_belong_to_the_range_that_captured_them(llama, tmp_path, mode):
    """Each replay of a captured forward is one call per layer (and head), in
    the step it replayed in, with exactly the kernels the same forward
    launches per call when it runs eagerly, and the shapes the capture logged."""
    model, inputs = llama
    prof = _graph_session(model, inputs, tmp_path, mode=mode, replays=3, eager_steps=1)
    stats = prof.get_stats()
    level = "head" if mode == "head" else "layer"
    ranges, kernels = stats["ranges"], stats["kernels"]
    attention = ranges[ranges["level"] == level]
    instances = attention[attention["replay_of"].notna()]
    captured = attention[attention["replay_of"].isna() & attention["step"].isna()]
    cfg = model.config
    units = cfg.num_hidden_layers * (cfg.num_attention_heads if mode == "head" else 1)
    assert len(captured) == units and len(instances) == 3 * units
    assert sorted(instances["step"].unique()) == [0, 1, 2]
    assert (captured["gpu_op_count"] == 0).all()  # a capture runs nothing
    assert set(instances["replay_of"]) == set(captured["range_id"])
    # the replay instance has its captured range's path and the call's shapes
    by_id = captured.set_index("range_id")
    for col in ("path", "q_len", "kv_len", "head_dim", "q_heads"):
        assert (instances[col].to_numpy() == by_id.loc[instances["replay_of"].astype(int), col].to_numpy()).all(), col
    assert instances["q_len"].notna().all() and instances["flop"].notna().all()

    replayed = kernels[kernels["graph_node_id"].notna()]
    assert replayed["range_id"].notna().any()
    inside = replayed[replayed["layer"].notna()]
    assert set(inside["range_id"].astype(int)) <= set(ranges.loc[ranges["replay_of"].notna(), "range_id"])  # never a capture's range
    # per call, a replayed layer (head) runs exactly the kernels its eager call runs (same model, same launches)
    table = stats["heads"] if mode == "head" else stats["layers"]
    key = ["phase", "layer"] + (["head"] if mode == "head" else [])
    eager = kernels[kernels["graph_node_id"].isna() & (kernels["step"] == 3) & kernels["layer"].notna()]
    eager_per_call = (eager[eager["head"].notna()] if mode == "head" else eager).groupby(key).size()
    rows = table.set_index(key)
    assert (rows["calls"] == 4).all() and (rows["steps"] == 4).all()  # 3 replays + 1 eager step
    assert (rows["kernels_per_call"] == eager_per_call.reindex(rows.index)).all()
    assert rows["duration_ns"].gt(0).all()


def _replayed_inside(model, inputs, tmp_path, layer) -> dict:
    """Capture the forward under the profiler, then replay it once in step 0
    inside a live ``attention_range(layer)`` (replayed GPU stand-in): the stats."""
    replay = ReplayCupti()
    rec = CuptiRecorder(cupti=replay, pm_sampling=False, record_dir=tmp_path)
    prof = AttentionProfiler(model, recorder=rec)
    with prof, torch.no_grad():
        replay.begin_capture()
        with LaunchOnEveryOp(replay):
            model(**inputs)
        replay.end_capture()
        with prof.step(0), attention_range(layer):
            replay.replay_graph()
    return prof.get_stats()


def test_kernels_made_outside_every_range_stay_outside_when_replayed(llama, tmp_path):
    """A graph launched inside a tagged block does not pull the whole graph into
    the range around its launch: nodes captured outside every range stay outside."""
    model, inputs = llama
    kernels = _replayed_inside(model, inputs, tmp_path, "around_replay")["kernels"]
    replayed = kernels[kernels["graph_node_id"].notna()]
    outside = replayed[replayed["range_id"].isna()]
    assert len(outside) and "around_replay" not in set(replayed["layer_name"].dropna())
    assert not outside["name"].str.contains("scaled_dot_product").any()  # attention stayed in its layers
    assert set(replayed["layer"].dropna().astype(int)) == set(range(model.config.num_hidden_layers))


def test_a_refused_graph_subscription_is_a_notice(llama, tmp_path):
    model, inputs = llama

    class Held(ReplayCupti):
        def subscribe(self, callback, userdata):
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    rec = CuptiRecorder(cupti=Held(), pm_sampling=False, record_dir=tmp_path)
    with AttentionProfiler(model, recorder=rec) as prof:
        with LaunchOnEveryOp(rec.cupti):
            model(**inputs)
    assert any("CUDA graph nodes are not followed" in n for n in rec.notices)
    assert len(prof.get_stats()["layers"])  # tracing went on


def test_a_piece_replayed_inside_its_own_live_range_keeps_it(llama, tmp_path):
    """A graph split at every range edge (Inductor's CUDA graphs around headcount's
    markers) replays each piece inside the live range of the path that captured
    it: that range is the replay's call, no second instance is made. Here the
    whole forward is replayed inside a live ``fwd/layer.0``: layer 0's kernels
    stay in it, the other layers get replay instances (replayed GPU stand-in)."""
    model, inputs = llama
    stats = _replayed_inside(model, inputs, tmp_path, 0)
    ranges, kernels = stats["ranges"], stats["kernels"]
    live = ranges[(ranges["level"] == "layer") & (ranges["step"] == 0) & ranges["replay_of"].isna()]
    assert live["layer_name"].tolist() == ["layer.0"] and int(live["gpu_op_count"].iloc[0]) > 0
    instances = ranges[(ranges["level"] == "layer") & ranges["replay_of"].notna()]
    assert sorted(instances["layer"]) == list(range(1, model.config.num_hidden_layers))
    layer0 = kernels[(kernels["layer"] == 0) & kernels["graph_node_id"].notna()]
    assert len(layer0) and (layer0["range_id"] == live["range_id"].iloc[0]).all()
    assert (stats["layers"]["calls"] == 1).all()  # the capture is not a call, the live range is


def test_a_graph_captured_before_profiling_is_said(llama, tmp_path):
    """Replays of a graph whose capture was not recorded cannot be attributed:
    a notice says so and what to do; the kernels stay outside every range."""
    model, inputs = llama
    replay = ReplayCupti()
    with torch.no_grad():
        replay.begin_capture()  # no subscriber yet: node creation goes unrecorded
        with LaunchOnEveryOp(replay):
            model(**inputs)
        replay.end_capture()
        rec = CuptiRecorder(cupti=replay, pm_sampling=False, record_dir=tmp_path)
        prof = AttentionProfiler(model, recorder=rec)
        with prof:
            with prof.step(0):
                replay.replay_graph()
            with LaunchOnEveryOp(replay):
                model(**inputs)  # one tagged eager call, so the block has ranges
        stats = prof.get_stats()
    assert any("replayed from CUDA graphs whose capture was not recorded" in n for n in prof.collector_info["notices"])
    replayed = stats["kernels"][stats["kernels"]["graph_node_id"].notna()]
    assert len(replayed) and replayed["range_id"].isna().all()
