"""The in-process route (docs/architecture.md § One route per recording): a recording window of the
cupti or torch source (:class:`Recording`, picklable: what the API, ``headcount profile`` and the training
worker hand over) → headcount's tables (:class:`~headcount.build.shared.Built`).

``run --backend cupti`` builds each child's records here too (:func:`tables_from_cupti`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.attribute import graphs
from headcount.build.shared import Built, finished, tables_from_events
from headcount.common.device import Device
from headcount.common.errors import HeadcountError
from headcount.derive import peaks as device_peaks
from headcount.derive import sampling


def tables_from_cupti(path, calls, run_id: str, implementation: str, limits=None, nvtx_tagged: bool = True,
                      device: Device | None = None, exclude_steps=(), void_steps=(), interrupted: bool = False) -> Built:
    """The one path from a cupti source's records file to headcount's tables,
    for :class:`~headcount.api.AttentionProfiler` and ``headcount run --backend cupti`` alike.

    Args:
        path: the records file (:mod:`headcount.parsers.cupti_records`).
        calls: the tagger's call log of the recorded process.
        implementation: :func:`implementation_of` the calls (with the caller's fallback).
        limits: the device's SM limits (theoretical occupancy is null without them).
        nvtx_tagged: headcount's ranges were also emitted as NVTX (so marker
            records were to be expected when NVTX injection was on).
        device: where the work ran (for ``roofline_class``).
        exclude_steps: steps kept out of the figures (:func:`tables_from_events`).
        void_steps: step ranges that are no step (:func:`tables_from_events`).
        interrupted: the recording was stopped by a signal (Ctrl-C): the ranges still open then (the call
            and step in progress) are left out, with a notice; otherwise an open range is an error.

    Returns:
        The tables; ``info``: the collector's facts for the run metadata (its
        notices included); ``notices``: those found here.
    """
    from headcount.derive.sampling import sample_gaps
    from headcount.parsers import cupti_records

    header, records = cupti_records.read_records(path)
    info = {**header.get("stats", {}), "notices": list(header.get("notices", [])),
            "nvtx_marker_records": cupti_records.marker_count(records)}
    new = []
    if interrupted:
        records, open_ranges = cupti_records.without_open_ranges(records)
        if open_ranges:
            new.append(f"{open_ranges} headcount ranges were open when the recording was interrupted (the call and step in "
                       "progress): left out, with what they alone held")
    if info.get("nvtx_markers_enabled") and not info["nvtx_marker_records"] and nvtx_tagged:
        new.append("NVTX_INJECTION64_PATH is set but no NVTX marker record arrived: it must be set before the "
                   "process's first NVTX call (export it before starting Python); headcount's own ranges are unaffected")
    pm = cupti_records.pm_samples_frame(records)
    if len(pm):
        gaps = sample_gaps(pm)
        starts = [r["start"] for r in records if r["kind"] == "kernel"]
        ends = [r["end"] for r in records if r["kind"] == "kernel"]
        if starts and (gaps["last_ns"] < min(starts) or gaps["first_ns"] > max(ends)):
            new.append("PM samples do not overlap the kernels in time (different clocks?): sampled DRAM figures are null, "
                       "the analytic model is used")
        info.setdefault("pm_sampling", {})["samples"] = gaps
    graph_nodes = graphs.follow_clones(*cupti_records.graph_nodes(records))
    unknown = sum(1 for r in records if r["kind"] == "kernel" and r.get("graph_node_id") and r["graph_node_id"] not in graph_nodes)
    if unknown:
        new.append(f"{unknown} kernels were replayed from CUDA graphs whose capture was not recorded (captured before "
                   "profiling began): they count for the range around the graph launch, usually none; capture the "
                   "graph inside the profiled block to attribute them to their layers")
    tables = tables_from_events(cupti_records.events_frame(header, records), calls, implementation,
                                source="cupti", limits=limits, pm_samples=pm, exclude_steps=exclude_steps,
                                graph_nodes=graph_nodes, void_steps=void_steps, sm_count=device.sm_count if device else None)
    if len(pm):
        new += _pm_resolution(tables, pm, device, info)
    info["notices"] += new
    return finished(tables, run_id, device, calls, new, info)


def _pm_resolution(tables: dict, pm: pd.DataFrame, device: Device | None, info: dict, finer: str = sampling.FINER_OWN) -> list[str]:
    """What the PM samples resolve in a recording and how many single samples read above the device's DRAM
    ceiling (:func:`pm_resolution`, :func:`pm_ceiling`); the facts go to ``info["pm_sampling"]``, the notices are returned."""
    facts = info.setdefault("pm_sampling", {})
    return pm_resolution(tables, pm, facts, finer) + pm_ceiling(pm, device, facts)


def pm_resolution(tables: dict, pm: pd.DataFrame, facts: dict, finer: str = sampling.FINER_OWN) -> list[str]:
    """The notice for the attention ranges and kernels of ``tables`` the PM samples do not resolve
    (:data:`headcount.derive.sampling.MIN_WHOLE_SAMPLES`), if any, ``finer`` naming how to sample more often;
    the counts go to ``facts["resolution"]``."""
    kernels, ranges = tables["kernels"], tables["ranges"]
    gpu = kernels[(kernels["kind"] == "kernel").to_numpy(dtype=bool)] if "kind" in kernels else kernels.iloc[0:0]
    attention = ranges[ranges["level"].isin(["layer", "head"]).to_numpy(dtype=bool) & (ranges["gpu_op_count"].fillna(0) > 0).to_numpy(dtype=bool)]
    # unresolved: sampled, but no figure (too few whole samples inside, or not all of it covered by the samples)
    short = {name: int((frame["pm_whole_samples"].notna() & frame["dram_read_sampled_bytes"].isna()).sum())
             if "pm_whole_samples" in frame and "dram_read_sampled_bytes" in frame else 0
             for name, frame in (("kernels", gpu), ("ranges", attention))}
    interval = float(np.median(pm["end_ns"] - pm["start_ns"]))
    facts["resolution"] = {"min_whole_samples": sampling.MIN_WHOLE_SAMPLES, "median_window_ns": interval,
                           "kernels": len(gpu), "kernels_unresolved": short["kernels"],
                           "attention_ranges": len(attention), "attention_ranges_unresolved": short["ranges"]}
    said = sampling.unresolved_notice(len(gpu), short["kernels"], len(attention), short["ranges"], interval, finer)
    return [said] if said else []


def pm_ceiling(pm: pd.DataFrame, device: Device | None, facts: dict) -> list[str]:
    """The notice for single PM samples that read more DRAM traffic than the device's ceiling, if any
    (:func:`headcount.derive.sampling.above_ceiling`); the counts go to ``facts["above_ceiling"]``."""
    ceiling, basis = _dram_peak(device)
    above = sampling.above_ceiling(pm, ceiling)
    facts["above_ceiling"] = {**above, "ceiling_basis": basis}
    if not above["count"]:
        return []
    return [f"{above['count']} of {above['samples']} PM samples read more DRAM traffic than the device's ceiling "
            f"({ceiling:,.0f} GB/s, {facts['above_ceiling']['ceiling_basis']}): the highest {above['max_gbps']:,.0f} GB/s; "
            "single samples are not bounded by it (their windows' edges), figures over several samples are"]


def trace_samples(counters: list[tuple], device: Device | None) -> tuple[pd.DataFrame | None, list[str]]:
    """A torch trace's PM samples (:func:`headcount.parsers.kineto_counters.pm_samples` of its counter events), % of
    peak metrics converted with the device's peak DRAM bandwidth: the trace's own figure, else the datasheet's."""
    from headcount.parsers.kineto_counters import pm_samples

    if not counters:
        return None, []
    peak, basis = _dram_peak(device)
    return pm_samples(counters, peak, {"device": "the trace's device properties", "datasheet": f"datasheet of {device.name}"}.get(basis))


def _dram_peak(device: Device | None) -> tuple[float | None, str | None]:
    """The device's DRAM bandwidth ceiling (GB/s) and its basis: ``device`` (the recording's own figure),
    ``datasheet``, or ``None`` (not a GPU of the device table)."""
    reported = device_peaks.ceiling_gbps(device)
    if reported:
        return reported, "device"
    peaks = device_peaks.peaks_for(device.name) if device is not None and device.is_gpu else None
    return (peaks.dram_gbps, "datasheet") if peaks else (None, None)


def tables_from_torch(path, calls, run_id: str, implementation: str, limits=None,
                      device: Device | None = None, exclude_steps=(), void_steps=()) -> Built:
    """The torch source's trace (written by :class:`~headcount.collector.torch_source.TorchRecorder`)
    → headcount's tables, with ``roofline_class`` for ``device``; PM samples torch wrote into it (its counter
    events, :mod:`headcount.parsers.kineto_counters`) go through the same path as the cupti source's."""
    from headcount.parsers.kineto_json import read_trace

    trace = read_trace(path)
    pm, new = trace_samples(trace["counters"], device)
    tables = tables_from_events(trace.pop("events"), calls, implementation, limits=limits, pm_samples=pm,
                                exclude_steps=exclude_steps, void_steps=void_steps, sm_count=device.sm_count if device else None)
    info: dict = {}
    if pm is not None:
        new += _pm_resolution(tables, pm, device, info, sampling.FINER_TORCH)
    return finished(tables, run_id, device, calls, new, info)


@dataclass
class Recording:
    """One in-process recording window, ready to be built here or in a worker process (picklable, torch-free).

    Attributes:
        writes: what the recorder wrote (:attr:`headcount.collector.Recorder.writes`): ``kineto`` or ``cupti-records``.
        path: the recording.
        calls: the tagger's call log of the window, sizes worked out (:class:`~headcount.common.call_log.CallLog`).
        run_id, implementation: the window's run and the attention implementation it ran.
        limits: the GPU's SM limits (``None``: theoretical occupancy null); device: where the work ran.
        nvtx_tagged: headcount's ranges were also NVTX ranges (cupti: marker records were to be expected).
        exclude_steps, void_steps: as :func:`tables_from_events`.
    """

    writes: str
    path: Path
    calls: list
    run_id: str
    implementation: str
    limits: object | None
    device: Device | None
    nvtx_tagged: bool = True
    exclude_steps: tuple = ()
    void_steps: tuple = ()


def tables_from_recording(recording: Recording) -> Built:
    """The build a recording takes by what its recorder wrote (the API and the training worker alike)."""
    r = recording
    common = dict(device=r.device, exclude_steps=tuple(r.exclude_steps), void_steps=tuple(r.void_steps))
    if r.writes == "cupti-records":
        return tables_from_cupti(r.path, r.calls, r.run_id, r.implementation, r.limits, nvtx_tagged=r.nvtx_tagged, **common)
    if r.writes == "kineto":
        return tables_from_torch(r.path, r.calls, r.run_id, r.implementation, r.limits, **common)
    raise HeadcountError(f"{r.path}: a recording of a kind headcount does not build ({r.writes!r})",
                         hint="a recorder's `writes` is 'kineto' or 'cupti-records'")
