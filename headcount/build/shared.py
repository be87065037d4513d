"""The one composition of the stages: a recording or a file → headcount's tables
(docs/architecture.md §1, §4). The API, ``headcount profile``, ``run`` and
``parse`` all build their tables here; no other module composes stages.

- :func:`tables_from_events`: an events table (torch.profiler, CUPTI) and the
  tagger's call log → ``kernels`` (CPU operators on a CPU run, plus GPU
  kernels where the recording has them), ``ranges``, ``layers``, ``heads``
  and the ``attention_breakdown`` view;
- :func:`tables_from_cupti`, :func:`tables_from_torch`, :func:`tables_from_kineto`,
  :func:`tables_from_nsys`, :func:`tables_from_ncu`: one per kind of
  recording, each through the shared attribution and derivations, each
  returning a :class:`Built` and ending in :func:`finished` (run ids, roofline
  class, launch summary, findings: one way for all);
- :func:`nsys_pieces`: an nsys export's tables process by process (``parse``
  and ``run --backend nsys`` read exports only this way);
- one file of ``headcount parse`` (read, built, and the lines the user sees)
  is :mod:`headcount.build.parse_file`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.attribute import attribution, graphs, labels, nesting, untagged
from headcount.attribute.calls import attach_calls, calls_frame
from headcount.common.device import Device
from headcount.common.errors import HeadcountError
from headcount.common.naming import DOMAIN, STEP_DOMAIN, parse_path
from headcount.common.tables import Timeline
from headcount.derive import aggregate, analytic, bound, launch, occupancy, sampling, triage
from headcount.derive import peaks as devices
from headcount.derive import steps as timeline
from headcount.parsers import ncu_metrics, nsys_sqlite
from headcount.parsers.options import ReadOptions
from headcount.parsers.plausible import drop_implausible


@dataclass
class Built:
    """One recording built into headcount's tables.

    Attributes:
        tables: ``kernels``, ``ranges``, ``layers``, ``heads``, ``attention_breakdown``,
            ``steps``, ``findings`` and ``launch`` (the kinds of recording that have no
            such rows give empty tables), each row with its ``run_id``.
        notices: what the reader should know, one line each, in the order found (not yet printed).
        info: facts for the run metadata (the cupti collector's statistics; empty for the others).
    """

    tables: dict[str, pd.DataFrame]
    notices: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)


def finished(tables: dict[str, pd.DataFrame], run_id: str, device: Device | None = None, calls=None,
             notices: list[str] | None = None, info: dict | None = None) -> Built:
    """How every build ends: each table gets its ``run_id``, the layers and heads
    their ``roofline_class`` (:func:`add_roofline`), the run its launch summary
    and its findings (:func:`with_findings`; kept where the build derived them
    already: :func:`nsys_pieces` does, for the files it streams)."""
    for table in tables.values():
        if "run_id" not in table:
            table.insert(0, "run_id", run_id)
    add_roofline(tables, device, calls)
    tables.setdefault("launch", launch.summary(tables["layers"], tables["kernels"]))
    if "findings" not in tables:
        with_findings(tables)
    return Built(tables, list(notices or []), info or {})


BREAKDOWN_COLUMNS = [
    "implementation", "phase", "layer_name", "layer", "head", "kv_head", "calls", "steps",
    "duration_ns", "duration_per_call_ns", "duration_basis", "duration_provenance",
    "dram_bytes", "dram_bytes_provenance", "analytic_min_bytes",
    "bandwidth_gbps", "bandwidth_provenance",
    "flop", "flop_provenance", "intensity_flop_per_byte", "intensity_provenance",
    "op_count", "cpu_ops_ns", "share_of_layer_pct", "share_of_phase_pct", "split_overhead_ns", "provenance",
]


def _split_domains(events: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Headcount's ranges (both domains) and everything else."""
    is_range = events["kind"] == "range"
    names = events["name"]
    domain = pd.Series(None, index=events.index, dtype=object)
    for dom in (DOMAIN, STEP_DOMAIN):
        hit = is_range & names.str.startswith(dom + "@")
        domain[hit] = dom
    ours = domain.notna()
    ranges = events[ours].copy()
    ranges["domain"] = domain[ours]
    ranges["name"] = [n.split("@", 1)[1] for n in ranges["name"]]
    return ranges, events[~ours & (events["kind"] != "range")].copy()


def tables_from_events(events: pd.DataFrame, calls, implementation: str, source: str = "torch",
                       limits=None, pm_samples: pd.DataFrame | None = None,
                       exclude_steps=(), graph_nodes: dict[int, int] | None = None,
                       void_steps: tuple[str, ...] = (), launched: bool | None = None,
                       with_figures: bool = False, sm_count: int | None = None) -> dict[str, pd.DataFrame]:
    """Build the tables of one profiled session.

    Args:
        events: Kineto events (:func:`headcount.parsers.kineto.events_frame`) or
            CUPTI events (:func:`headcount.parsers.cupti_records.events_frame`).
            With an ``external_id`` column (CUPTI), GPU work belongs to the
            range whose id its launch carried (exact, any thread); without
            it, to the innermost range that contains its launch call on the
            launching thread.
        calls: the tagger's :class:`~headcount.common.call_log.CallLog` list.
        implementation: attention implementation of the session (fills rows the
            call log does not name, e.g. operators outside attention).
        source: the ``source`` column of the kernels table.
        limits: the device's :class:`~headcount.derive.occupancy.SmLimits`
            (theoretical occupancy is null without them).
        pm_samples: PM samples (:func:`headcount.parsers.cupti_records.pm_samples_frame`).
        exclude_steps: step indices left out of ``layers``, ``heads``,
            ``attention_breakdown`` and ``steps`` (steps that compiled the
            model); their rows stay in ``ranges`` and ``kernels``.
        graph_nodes: CUDA graph node id → ``external_id`` of the range that
            captured it (-1: none), :func:`headcount.attribute.graphs.follow_clones`:
            kernels replayed from those nodes belong to a replay instance of
            that range (:mod:`headcount.attribute.graphs`).
        void_steps: names of step ranges that are no step (the profiler's
            implicit first step, closed unused when the steps came as
            ``with prof.step(i)``): dropped before anything is attributed.
        launched: whether the recording has GPU work whose launch it holds (``None``: whether
            ``events`` has; a trace built a group of steps at a time says it for the whole
            trace). Where it has, GPU work without its launch has no step.
        sm_count: the GPU's SMs (with ``limits``: each kernel's ``waves_per_sm``; null without).
        with_figures: also return ``figures``: the layer and head ranges whose figures count, their
            labels still categorical (for :func:`attention_tables` over several groups), and ``syncs``:
            the synchronizing calls with their step.

    Returns:
        ``kernels``, ``ranges``, ``layers``, ``heads``, ``attention_breakdown``
        and ``steps`` (without a headcount range, the attention tables are
        empty and the rest is built all the same); the callers add the
        roofline class, then the findings (:func:`with_findings`).
    """
    ranges, ops = _split_domains(events)
    if void_steps:
        ranges = ranges[~((ranges["domain"] == STEP_DOMAIN) & ranges["name"].isin(void_steps))]
    correlated = "external_id" in events.columns
    keyed = untagged.CALL_KEY in events.columns  # ranges whose kernels are assigned by name (an untagged graph replay's calls)
    ranges = nesting.nest_ranges(ranges[["pid", "tid", "domain", "name", "start_ns", "end_ns", *(["external_id"] if correlated else []),
                                         *([untagged.CALL_KEY] if keyed else [])]])
    ops = ops.reset_index(drop=True)
    cpu = ops[ops["kind"] == "op"].copy()
    gpu = ops[ops["kind"].isin(["kernel", "memcpy", "memset"])].copy()
    runtime = ops[ops["kind"] == "runtime"]

    main = ranges[ranges["domain"] == DOMAIN]
    steps = ranges[ranges["domain"] == STEP_DOMAIN]

    # CPU operators belong to the ranges that wholly contain them on their own thread; GPU work to
    # those around its launch call (Kineto puts GPU activity in lanes pid=<device>, tid=<stream>, so
    # the launching process and thread come from the runtime call), or, where the launch carried
    # one, to the range whose external correlation id it carried
    captured = graphs.captured_by_external_id(graph_nodes, main) if graph_nodes and correlated else None
    assigned = attribution.by_call_key(main, pd.array(gpu[untagged.CALL_KEY], dtype="Int64").to_numpy(np.int64, na_value=-1)) \
        if keyed else None
    projected, gpu, cpu_inner = attribution.attribute(main, gpu.assign(pid=None), runtime, cpu=cpu,
                                                      match_external=correlated, captured=captured, assigned=assigned)
    gpu_inner = gpu["range_id"].to_numpy()
    if not len(gpu):  # no GPU recorded: unknown, not zero
        for column in ("gpu_op_count", "gpu_start_ns", "gpu_end_ns"):
            projected[column] = pd.array([pd.NA] * len(projected), dtype="Int64")

    gpu = gpu.reset_index(drop=True)
    gpu["theoretical_occupancy_pct"] = occupancy.kernel_occupancy(gpu, limits)
    gpu["waves_per_sm"] = occupancy.kernel_waves(gpu, limits, sm_count)
    if is_gpu := len(gpu) > 0:
        launch_figures = launch.per_range(projected, gpu, nesting.ancestor_rows(projected, gpu_inner), gpu["theoretical_occupancy_pct"])
        projected = projected.merge(launch_figures, on="range_id", how="left")
        projected["kernel_count"] = projected["gpu_op_count"]
        if pm_samples is not None and len(pm_samples):
            sampled = sampling.window_totals(pm_samples, pd.to_numeric(projected["gpu_start_ns"]).to_numpy(np.float64, na_value=np.nan),
                                             pd.to_numeric(projected["gpu_end_ns"]).to_numpy(np.float64, na_value=np.nan))
            projected = pd.concat([projected.reset_index(drop=True), sampled], axis=1)
    ranges_table = labels.label_ranges(projected, steps)
    ranges_table["duration_ns"] = (
        (ranges_table["gpu_end_ns"] - ranges_table["gpu_start_ns"]).astype("float64")
        if is_gpu else (ranges_table["end_ns"] - ranges_table["start_ns"]).astype("float64")
    )
    ranges_table["duration_basis"] = "gpu_projected" if is_gpu else "cpu_range"
    if "sm_warps_active_sampled_pct" in ranges_table:
        ranges_table["sm_warps_active_x_duration"] = ranges_table["sm_warps_active_sampled_pct"] * ranges_table["duration_ns"]

    ranges_table = _with_shapes(ranges_table, calls, implementation)

    frames = [cpu.assign(device="cpu", range_id=cpu_inner)]
    if len(gpu):
        gpu_rows = _gpu_rows(gpu, gpu_inner)
        if pm_samples is not None and len(pm_samples):
            per_kernel = sampling.window_totals(pm_samples, gpu_rows["start_ns"].to_numpy(np.float64), gpu_rows["end_ns"].to_numpy(np.float64))
            gpu_rows = pd.concat([gpu_rows, per_kernel], axis=1)
        frames.append(gpu_rows)
    kernels = launch.kernel_columns(_kernels_table(frames, projected, steps, source, implementation, launched))

    figures = ranges_table[~ranges_table["step"].isin(list(exclude_steps)).to_numpy() & ~graphs.capture_only(ranges_table)]
    tables = {"kernels": kernels, "ranges": ranges_table, **attention_tables(figures, kernels)}
    syncs = timeline.sync_calls(runtime)
    step_rows = steps_of(kernels, syncs, steps, ranges_table, implementation, found=len(main) > 0)
    tables["steps"] = step_rows[~step_rows["step"].isin(list(exclude_steps)).to_numpy(dtype=bool)].reset_index(drop=True)
    for table in tables.values():
        labels.plain(table)  # in-process recordings are small: users get plain strings
    if with_figures:
        tables["figures"] = figures[figures["level"].isin(["layer", "head", "module"]).to_numpy(dtype=bool)]
        tables["syncs"] = syncs.assign(step=labels.step_of(syncs["start_ns"].to_numpy(np.int64), steps))
    return tables


def attention_tables(figures: pd.DataFrame, kernels: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``layers``, ``heads`` and ``attention_breakdown`` from the ranges whose figures count (``figures``:
    the labelled ranges less excluded steps and graph captures) and the kernels (their launch latency)."""
    layers = aggregate.layers_table(figures)
    heads = aggregate.heads_table(figures, layers)
    layers, heads = aggregate.with_launch_latency(layers, heads, kernels)
    layers, heads = aggregate.with_waves(layers, heads, kernels)
    breakdown_src = heads if (figures["level"] == "head").any() else layers
    return {"layers": layers, "heads": heads, "attention_breakdown": breakdown_src.reindex(columns=BREAKDOWN_COLUMNS)}


def steps_of(kernels: pd.DataFrame, syncs: pd.DataFrame, steps: pd.DataFrame, ranges_table: pd.DataFrame,
             implementation: str, found: bool) -> pd.DataFrame:
    """The ``steps`` rows of one recorded process (:mod:`headcount.derive.steps`):
    from its GPU work where it has any, else (a CPU run) from its step ranges.

    Args:
        kernels: the kernels table (GPU rows and, on a CPU run, CPU operators).
        syncs: its synchronizing calls (:func:`headcount.derive.steps.sync_calls`).
        steps: the step ranges (``headcount.step`` domain) with ``name``, ``pid``, ``start_ns``, ``end_ns``.
        ranges_table: the labelled ranges (attention ranges of level ``layer`` for a CPU run).
        found: the recording has attention calls (else attention figures are null, not 0).
    """
    syncs = syncs.assign(step=labels.step_of(syncs["start_ns"].to_numpy(np.int64), steps))
    if "kind" in kernels and kernels["kind"].isin(timeline.GPU_KINDS).any():
        return timeline.gpu_steps(kernels, syncs, attention_found=found)
    layer_ranges = ranges_table[(ranges_table["level"] == "layer").to_numpy(dtype=bool, na_value=False)] if len(ranges_table) else ranges_table
    ops = kernels[kernels["kind"].astype(object) == "op"] if "kind" in kernels else None
    steps = steps.assign(step=labels.step_of(steps["start_ns"].to_numpy(np.int64), steps) if steps["name"].notna().all()
                         else pd.array([pd.NA] * len(steps), dtype="Int64"))
    return timeline.cpu_steps(steps, layer_ranges, implementation, attention_found=found, ops=ops)


def with_findings(tables: dict) -> dict:
    """Add (or replace) ``findings``: :func:`headcount.derive.triage.findings` of
    the run's ``steps``, ``layers`` and ``heads`` (in place; returned); the layers
    first get their shares of the steps (:func:`headcount.derive.aggregate.with_step_shares`)."""
    if tables.get("layers") is not None and tables.get("steps") is not None:
        aggregate.with_step_shares(tables["layers"], tables["steps"])
    findings = triage.findings(tables.get("steps"), tables.get("layers"), tables.get("heads"))
    run_ids = [t["run_id"].iloc[0] for t in (tables.get("steps"), tables.get("layers")) if t is not None and "run_id" in t and len(t)]
    if run_ids:
        findings.insert(0, "run_id", run_ids[0])
    tables["findings"] = findings
    return tables


def _with_shapes(ranges_table: pd.DataFrame, calls, implementation: str) -> pd.DataFrame:
    """Attach the call log's shapes to the layer/head ranges, with the analytic
    FLOPs and minimum bytes of each (null where a range has no logged call)."""
    attention = ranges_table[ranges_table["level"].isin(["layer", "head"])]
    replays = attention["replay_of"].notna().to_numpy() if "replay_of" in attention else np.zeros(len(attention), dtype=bool)
    attention = attach_calls(attention[~replays], calls_frame(calls))
    if replays.any():  # a replay ran the call its captured range logged: the same shapes
        instances = ranges_table[ranges_table["level"].isin(["layer", "head"]).to_numpy()][replays]
        logged = attention.drop(columns=[c for c in instances.columns if c != "range_id"]).rename(columns={"range_id": "replay_of"})
        instances = instances.merge(logged.astype({"replay_of": "Int64"}), on="replay_of", how="left")
        attention = pd.concat([attention, instances], ignore_index=True)
    # the analytic model needs every size (a call found untagged may lack lengths or causality): else null
    inputs = [c for c in attention.columns if c in analytic.MODEL_INPUTS]  # not all ~60 columns: astype copies each
    for column, needs, model in (("flop", analytic.FLOP_NEEDS, analytic.flop), ("analytic_min_bytes", analytic.BYTES_NEEDS, analytic.min_bytes)):
        values = np.full(len(attention), np.nan)
        complete = attention[needs].notna().all(axis=1).to_numpy() if len(attention) else np.zeros(0, dtype=bool)
        if complete.any():
            known = attention.loc[complete, inputs].astype({c: "float64" for c in needs if c != "causal"})
            values[complete] = model(known, known["phase"])
        attention[column] = values
    attention["implementation"] = attention["implementation"].fillna(implementation)
    extra = [c for c in attention.columns if c not in ranges_table.columns]
    ranges_table = ranges_table.merge(attention[["range_id", *extra]], on="range_id", how="left")
    ranges_table["implementation"] = ranges_table["implementation"].fillna(implementation)
    return ranges_table


def _gpu_rows(work: pd.DataFrame, inner: np.ndarray) -> pd.DataFrame:
    """GPU operations as kernels-table rows: named by their launching process and thread."""
    g = work.reset_index(drop=True).copy()
    device = pd.Categorical(g["device"])  # a few GPUs for a million operations: named once each
    g["device"] = device.rename_categories([f"cuda:{int(d)}" for d in device.categories])
    g["range_id"] = inner
    launch, own = g["launch_pid"], g["pid"]
    if all(isinstance(c.dtype, pd.CategoricalDtype) for c in (launch, own)) and not launch.cat.categories.equals(own.cat.categories):
        both = launch.cat.categories.union(own.cat.categories)  # e.g. no launch call at all: no launching process known
        launch, own = launch.cat.set_categories(both), own.cat.set_categories(both)
    g["pid"] = launch.fillna(own)
    g["tid"] = g["launch_tid"]
    return g.drop(columns=["launch_pid", "launch_tid"])


def _kernels_table(frames: list[pd.DataFrame], ranges: pd.DataFrame, steps: pd.DataFrame, source: str,
                   implementation: str, launched: bool | None = None) -> pd.DataFrame:
    """One table of CPU operators and GPU operations, each labelled with the
    path, phase, layer and head of its innermost range and with its step
    (GPU work by its launch call)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=["source", "kind", "name", "start_ns", "end_ns", "duration_ns", "nvtx_path"])
    k = pd.concat(frames, ignore_index=True)
    k["source"] = source
    k["implementation"] = implementation
    k["duration_ns"] = k["end_ns"] - k["start_ns"]
    step_time = k["start_ns"]
    if "api_start_ns" in k:
        launch.latency_columns(k)
        step_time = k["api_start_ns"].fillna(k["start_ns"])
    gpu = k["kind"].isin(timeline.GPU_KINDS).to_numpy(dtype=bool)
    k["runs_on"] = runs_on(gpu)
    unlaunched = gpu & (k["api_start_ns"].isna().to_numpy() if "api_start_ns" in k else np.ones(len(k), dtype=bool))
    if unlaunched.any() and ((gpu & ~unlaunched).any() if launched is None else launched):
        # GPU work whose launch the recording lacks, where it has the others' (launched before it began): no step of it
        step_time = step_time.where(~unlaunched, -1)
    for col, values in labels.label_ops(k["range_id"].to_numpy(np.int64), ranges).items():
        k[col] = values
    k["step"] = labels.step_of(step_time.to_numpy(np.int64), steps)
    k["range_id"] = k["range_id"].where(k["range_id"] >= 0).astype("Int64")
    return k


def run_facts(calls) -> dict:
    """What a parsed recording's calls say of its run (its ``runs`` row): the ``implementation``, and the
    ``dtype``, ``batch`` and ``seq`` (query length) where every call that has shapes agrees; nothing
    where no call was found (the row keeps ``unknown`` and nulls)."""
    if not calls:
        return {}
    shapes = [c.shape for c in calls if c.shape is not None]
    facts = {"implementation": implementation_of(calls)}
    for key, attr in (("dtype", "dtype"), ("batch", "batch"), ("seq", "q_len")):
        values = {getattr(shape, attr) for shape in shapes} - {None}
        if len(values) == 1:
            facts[key] = values.pop()
    return facts


def runs_on(gpu: np.ndarray) -> pd.Categorical:
    """The ``runs_on`` column of a kernels table: ``gpu`` (kernels, copies, memsets) or ``cpu`` (CPU operators, which
    torch.profiler and in-process recordings keep beside the GPU work)."""
    return pd.Categorical.from_codes(np.asarray(gpu, dtype=np.int8), categories=["cpu", "gpu"])


def implementation_of(calls, fallback: str | None = None) -> str:
    """The attention implementation a recording ran: the one every logged call
    names; else ``fallback`` (e.g. the model config's); else ``mixed`` or ``unknown``."""
    impls = {c.shape.implementation for c in calls if c.shape is not None}
    if len(impls) == 1:
        return impls.pop()
    return fallback or ("mixed" if impls else "unknown")


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


def _pm_resolution(tables: dict, pm: pd.DataFrame, device: Device | None, info: dict) -> list[str]:
    """What the PM samples resolve in a recording (:data:`headcount.derive.sampling.MIN_WHOLE_SAMPLES`) and
    how many single samples read above the device's DRAM ceiling; the facts go to ``info["pm_sampling"]``,
    the notices are returned."""
    notices = []
    kernels, ranges = tables["kernels"], tables["ranges"]
    gpu = kernels[(kernels["kind"] == "kernel").to_numpy(dtype=bool)] if "kind" in kernels else kernels.iloc[0:0]
    attention = ranges[ranges["level"].isin(["layer", "head"]).to_numpy(dtype=bool) & (ranges["gpu_op_count"].fillna(0) > 0).to_numpy(dtype=bool)]
    # unresolved: sampled, but no figure (too few whole samples inside, or not all of it covered by the samples)
    short = {name: int((frame["pm_whole_samples"].notna() & frame["dram_read_sampled_bytes"].isna()).sum())
             if "pm_whole_samples" in frame else 0 for name, frame in (("kernels", gpu), ("ranges", attention))}
    interval = float(np.median(pm["end_ns"] - pm["start_ns"]))
    facts = info.setdefault("pm_sampling", {})
    facts["resolution"] = {"min_whole_samples": sampling.MIN_WHOLE_SAMPLES, "median_window_ns": interval,
                           "kernels": len(gpu), "kernels_unresolved": short["kernels"],
                           "attention_ranges": len(attention), "attention_ranges_unresolved": short["ranges"]}
    said = sampling.unresolved_notice(len(gpu), short["kernels"], len(attention), short["ranges"], interval)
    if said:
        notices.append(said)
    peaks = devices.peaks_for(device.name) if device is not None and device.is_gpu else None
    reported = devices.ceiling_gbps(device)  # the recording's own figure for its device, else the datasheet's
    ceiling = reported or (peaks.dram_gbps if peaks else None)
    above = sampling.above_ceiling(pm, ceiling)
    facts["above_ceiling"] = {**above, "ceiling_basis": "device" if reported else ("datasheet" if peaks else None)}
    if above["count"]:
        notices.append(f"{above['count']} of {above['samples']} PM samples read more DRAM traffic than the device's ceiling "
                       f"({ceiling:,.0f} GB/s, {facts['above_ceiling']['ceiling_basis']}): the highest {above['max_gbps']:,.0f} GB/s; "
                       "single samples are not bounded by it (their windows' edges), figures over several samples are")
    return notices


def tables_from_torch(path, calls, run_id: str, implementation: str, limits=None,
                      device: Device | None = None, exclude_steps=(), void_steps=()) -> Built:
    """The torch source's trace (written by :class:`~headcount.collector.torch_source.TorchRecorder`)
    → headcount's tables, with ``roofline_class`` for ``device``."""
    from headcount.parsers.kineto import load_trace

    tables = tables_from_events(load_trace(path), calls, implementation, limits=limits, exclude_steps=exclude_steps,
                                void_steps=void_steps, sm_count=device.sm_count if device else None)
    return finished(tables, run_id, device, calls)


def tables_from_kineto(trace: dict, run_id: str) -> Built:
    """Build headcount's tables from a torch.profiler trace held in memory
    (:func:`headcount.parsers.kineto.read_trace`): :func:`kineto_pieces` of its
    events as one group, gathered into whole tables. ``trace["events"]`` is
    taken out of ``trace`` (freed as soon as the build is done with it)."""
    from headcount.parsers import kineto

    notices: list[str] = []
    events = trace.pop("events")
    if not len(events):
        raise HeadcountError("the trace holds no complete event (ph \"X\")", hint="record with torch.profiler.profile() around some work")
    events = drop_implausible(events, "events", notices)  # a negative duration: no such event happened
    found: dict = {}
    whole = collected(kineto_pieces([(0, events)], trace.get("devices") or [], notices, found=found))
    steps = whole["steps"]  # the work outside every step first, as gpu_steps orders it
    whole["steps"] = steps.iloc[np.argsort(steps["step"].notna().to_numpy(dtype=bool), kind="stable")].reset_index(drop=True)
    whole.setdefault("attention_breakdown", found["attention_breakdown"])
    return finished(whole, run_id, kineto.run_device(trace.get("devices") or []), found["calls"], notices)


@dataclass
class GroupFigures:
    """What the whole trace's tables need of one group of its steps (:func:`kineto_group_pieces`),
    kept while the other groups are built (or sent back by the worker that built it)."""

    group: int
    figures: pd.DataFrame  # its layer and head ranges whose figures count, labels categorical
    attention_kernels: pd.DataFrame | None  # its attention kernels: names, times, launch latency, waves
    steps: pd.DataFrame  # its steps rows, less the work outside every step
    outside: tuple[pd.DataFrame, pd.DataFrame] | None  # its GPU work and synchronizing calls outside every step
    launching: set  # (device, process) of its GPU work with a launch call
    calls: list
    notices: list[str]
    tagged: bool  # it has headcount's ranges


def kineto_pieces(groups, devices: list[dict], notices: list[str], launched: bool | None = None, found: dict | None = None):
    """Headcount's tables from a torch.profiler trace, a group of whole steps at a time
    (:class:`headcount.parsers.kineto_steps.Pieces`): one trace headcount kept with
    ``--trace-dir``, one a user recorded with ``torch.profiler`` around a tagged model,
    or one recorded with no tags at all.

    With headcount's ranges in the trace, they are used as recorded (no call
    log: analytic FLOPs and bytes are null). Without them, attention calls
    are found by operator, module and kernel names
    (:func:`headcount.attribute.untagged.find_calls`), each row saying which
    ``signal`` found it, and the layers' ``provenance`` says how they were
    numbered (``module ranges`` or ``call order``). GPU kernels whose launch is not in
    the trace (launched before the window opened) are counted in a notice and
    attributed to nothing. A group in which no call is found has ``implementation``
    ``unknown``.

    A trace with neither gives kernels, steps and findings, and a notice
    (:data:`NO_ATTENTION`). torch.profiler's ``ProfilerStep#N`` annotations
    are its steps (where headcount's own step ranges are absent).

    Args:
        groups: ``(group number, events table)`` of each group, in order (each let go once built).
        devices: the trace's ``deviceProperties``.
        notices: where the notices go, once the last group is built (each group's counts summed).
        launched: whether the trace has GPU work whose launch it holds (``None``: each group says).
        found: filled with ``calls`` (the calls found, in order) and ``attention_breakdown``.

    Yields:
        ``ranges``, ``kernels`` and ``steps`` of each group (:func:`kineto_group_pieces`), then
        ``layers``, ``heads`` and ``findings`` of the whole trace (:func:`kineto_aggregates`).
    """
    from headcount.parsers import kineto

    device = kineto.run_device(devices)
    parts: list[GroupFigures] = []
    for group, events in groups:
        yield from kineto_group_pieces(events, group, device, launched, parts)
        del events
    whole = kineto_aggregates(parts, device, notices)
    if found is not None:
        found.update(calls=whole.pop("calls"), attention_breakdown=whole.pop("attention_breakdown"))
    yield from ((name, whole[name]) for name in ("steps", "layers", "heads", "findings"))


def kineto_group_pieces(events: pd.DataFrame, group: int, device: Device | None, launched: bool | None,
                        parts: list[GroupFigures]):
    """``ranges``, ``kernels`` and ``steps`` of one group of a trace's steps (range ids from
    ``group`` · 2³², unique across the groups); what the whole trace's tables need of it goes to ``parts``."""
    tables, calls, notices, tagged = _kineto_group(events, device, launched)
    del events
    ranges, kernels, figures = tables["ranges"], tables["kernels"], tables.pop("figures")
    offset = group << 32
    if offset:  # each group numbers its ranges from 0
        for frame in (ranges, kernels, figures):
            for column in ("range_id", "parent_range_id"):
                if column in frame:
                    frame[column] = frame[column] + offset
    attention_kernels = None
    if "launch_latency_ns" in kernels:
        attention_kernels = kernels.loc[kernels["layer_name"].notna().to_numpy(dtype=bool),
                              [*aggregate.GROUP_LAYER, "head", "name", "duration_ns", "launch_latency_ns", "waves_per_sm"]]
    steps, outside, syncs, launching = tables["steps"], None, tables.pop("syncs"), set()
    gpu = kernels["kind"].isin(timeline.GPU_KINDS).to_numpy(dtype=bool)
    if gpu.any():
        known = gpu & kernels["pid"].notna().to_numpy(dtype=bool) & kernels["device"].notna().to_numpy(dtype=bool)
        launching = set(zip(kernels.loc[known, "device"], kernels.loc[known, "pid"]))
        # the work outside every step is one row of the trace's, whichever groups it fell in: built at the end
        unstepped = kernels["step"].isna().to_numpy(dtype=bool)
        outside = (kernels.loc[gpu & unstepped, [c for c in timeline.WORK_COLUMNS if c in kernels]],
                   syncs[syncs["step"].isna().to_numpy(dtype=bool)])
        steps = steps[steps["step"].notna().to_numpy(dtype=bool)].reset_index(drop=True)
    parts.append(GroupFigures(group, figures, attention_kernels, steps, outside, launching, calls, notices, tagged))
    yield "ranges", ranges
    yield "kernels", kernels
    yield "steps", steps


def kineto_aggregates(parts: list[GroupFigures], device: Device | None, notices: list[str]) -> dict:
    """``layers``, ``heads``, ``findings`` and ``attention_breakdown`` of a whole trace from its groups
    (in order), with ``calls``: every call found; the groups' notices, counts summed, go to ``notices``."""
    from headcount.parsers.kineto_steps import merged

    calls = [c for part in parts for c in part.calls]
    ranges = parts[0].figures if len(parts) == 1 else _concat_categories([part.figures for part in parts])
    kernels = [part.attention_kernels for part in parts if part.attention_kernels is not None]
    attention = attention_tables(ranges, _concat(kernels) if kernels else pd.DataFrame())
    for table in attention.values():
        labels.plain(table)
    untagged_provenance(attention, ranges)
    add_roofline(attention, device, calls)
    notices += merged([n for part in parts for n in part.notices])
    captured = any(untagged.CAPTURED in n for part in parts for n in part.notices)
    if not calls and not any(part.tagged for part in parts) and not captured:
        notices.append(NO_ATTENTION + " (neither headcount's ranges nor an attention operator, module or kernel that "
                       "docs/cli.md § Untagged recordings lists; record with torch.profiler.profile(with_modules=True, "
                       "with_stack=True, record_shapes=True), or tag the model with headcount)")
    unstepped = _unstepped(parts, attention_found=bool(calls) or any(part.tagged for part in parts))
    findings = run_findings([*(part.steps for part in parts), unstepped], attention["layers"], attention["heads"])
    return {**attention, "steps": unstepped, "findings": findings, "calls": calls}


def _unstepped(parts: list[GroupFigures], attention_found: bool) -> pd.DataFrame:
    """The ``steps`` rows of the GPU work outside every step (:func:`headcount.derive.steps.gpu_steps`),
    from every group's: what a whole trace attributed at once gives (empty: no such work)."""
    outside = [part.outside for part in parts if part.outside is not None]
    work = _concat([w for w, _ in outside]) if outside else pd.DataFrame()
    if not len(work):
        return pd.DataFrame()
    # work without a launch call: its device's process where the device served one only (as gpu_steps does in one group)
    served: dict = {}
    for device_id, pid in set().union(*(part.launching for part in parts)):
        served.setdefault(device_id, set()).add(pid)
    sole = {device_id: next(iter(pids)) for device_id, pids in served.items() if len(pids) == 1}
    missing = work["pid"].isna().to_numpy(dtype=bool)
    if missing.any() and sole:
        work = work.assign(pid=work["pid"].astype(object).where(~missing, work["device"].map(sole)))
    return timeline.gpu_steps(work, _concat([s for _, s in outside]), attention_found=attention_found)


def _concat_categories(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` concatenated, their categorical columns kept categorical: categories in the order
    they first come (the order the attention tables' rows follow)."""
    frames = [f.copy(deep=False) for f in frames]
    for column in [c for c, t in frames[0].dtypes.items() if isinstance(t, pd.CategoricalDtype)]:
        order = pd.unique(np.concatenate([np.asarray(f[column].cat.categories, dtype=object) for f in frames
                                          if isinstance(f[column].dtype, pd.CategoricalDtype)]))
        kind = pd.CategoricalDtype(pd.Index(order, dtype=object))
        for f in frames:
            f[column] = f[column].astype(object).astype(kind)
    return pd.concat(frames, ignore_index=True)


def _kineto_group(events: pd.DataFrame, device: Device | None, launched: bool | None):
    """One group of a trace's events (:func:`kineto_pieces`) → ``(tables, calls, notices, tagged)``:
    its tables (:func:`tables_from_events`, with ``figures``), the calls found in it, the notices
    of what it holds, and whether it has headcount's ranges."""
    notices: list[str] = []
    events = _profiler_steps(events)
    tagged = bool(((events["kind"] == "range") & events["name"].astype(str).str.startswith(DOMAIN + "@")).any())
    calls = []
    if not tagged:
        found = untagged.find_calls(events)
        notices += found.notices
        calls = found.calls
        if len(found.ranges):
            keys = untagged.assigned_keys(found, len(events))
            if keys is not None:  # a replay's attention kernels: given to their call by name, not by the graph launch
                events = events.assign(**{untagged.CALL_KEY: keys})
            else:
                found.ranges = found.ranges.drop(columns=untagged.CALL_KEY)
            events = pd.concat([events, found.ranges], ignore_index=True)
    gpu = events["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy(dtype=bool)
    orphan = gpu & ~launched_in(events)
    if orphan.any():
        kernels = int((orphan & (events["kind"] == "kernel").to_numpy(dtype=bool)).sum())
        notices.append(f"{int(orphan.sum())} GPU operations ({kernels} kernels) have no launch call in the trace (launched "
                       "before it started): counted, attributed to no range")
    replayed = gpu & events["graph_node_id"].notna().to_numpy(dtype=bool)
    if replayed.any():
        notices.append(f"{int(replayed.sum())} GPU operations were replayed from CUDA graphs: a torch.profiler trace does not "
                       "record which range captured them, so (attention kernels found by name aside) they count for the range "
                       "around the graph launch (often none); record with `--backend cupti` or `nsys --cuda-graph-trace=node` "
                       "to attribute them to their layers")
    tables = tables_from_events(events, calls, implementation_of(calls), source="torch", limits=device.limits() if device else None,
                                launched=launched, with_figures=True, sm_count=device.sm_count if device else None)
    untagged_provenance(tables, tables["ranges"])
    return tables, calls, notices, tagged


NO_ATTENTION = "no attention found: kernels, steps and findings only"
NO_ATTENTION_IN_EXPORT = f"{NO_ATTENTION} (neither headcount's ranges nor an attention operator, module or kernel name in the export)"


def note_no_attention(layers: pd.DataFrame, notices: list[str]) -> None:
    """Say (once) that an export's run has no attention layers."""
    if not len(layers) and not any(NO_ATTENTION in n for n in notices):
        notices.append(NO_ATTENTION_IN_EXPORT)


def launched_in(events: pd.DataFrame) -> np.ndarray:
    """Which events' correlation id is that of a runtime call in ``events`` (a GPU operation whose launch is there)."""
    ids = pd.array(events["correlation_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)  # ids are never negative
    calls = ids[(events["kind"] == "runtime").to_numpy(dtype=bool) & (ids >= 0)]
    return np.isin(ids, calls) & (ids >= 0)


def untagged_provenance(tables: dict, ranges: pd.DataFrame) -> None:
    """Where the calls were found in an untagged recording (``numbered_by`` of the
    ranges, :mod:`headcount.attribute.untagged`), the attention tables' ``provenance``
    says how each layer was numbered: ``module ranges`` or ``call order`` (head rows
    apportioned from their layer stay ``apportioned``). In place; nothing for tagged calls."""
    if "numbered_by" not in ranges or not ranges["numbered_by"].notna().any():
        return
    known = ranges[ranges["numbered_by"].notna().to_numpy()]
    provenance = dict(zip(zip(known["phase"].astype(object), known["layer_name"].astype(object)), known["numbered_by"]))
    for name in ("layers", "heads", "attention_breakdown"):
        table = tables.get(name)
        if table is None or not len(table):
            continue
        how = [provenance.get((p, n), untagged.CALL_ORDER) for p, n in zip(table["phase"], table["layer_name"])]
        table["provenance"] = np.where(table["provenance"] == "apportioned", "apportioned", how)


def _profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """torch.profiler's ``ProfilerStep#N`` annotations as headcount's step ranges
    (``headcount.step@step#N``), where the trace has no step range of headcount's."""
    names = events.loc[events["kind"] == "range", "name"].astype(str)  # annotations only: a few among the operators
    if names.str.startswith(STEP_DOMAIN + "@").any():
        return events
    number = names.str.extract(r"^ProfilerStep#(\d+)$", expand=False).dropna()
    if not len(number):
        return events
    events = events.copy(deep=False)  # copy-on-write: only the renamed column is copied, not the whole table
    events.loc[number.index, "name"] = STEP_DOMAIN + "@step#" + number
    return events


def tables_from_nsys(export: Timeline, run_id: str, calls=None, implementation: str = "unknown",
                     device: Device | None = None) -> Built:
    """Build headcount's tables from an nsys export held in memory
    (:func:`headcount.parsers.nsys_sqlite.read_export`): :func:`nsys_pieces`
    of the one timeline, gathered into whole tables."""
    return gathered([export], run_id, calls, implementation, device, export.devices, export.gpu_metrics)


def gathered(parts, run_id: str, calls=None, implementation: str = "unknown", device: Device | None = None,
             devices: pd.DataFrame | None = None, gpu_metrics: pd.DataFrame | None = None, release: bool = False) -> Built:
    """:func:`nsys_pieces` of ``parts`` (see there) gathered into whole tables."""
    notices: list[str] = []
    whole = collected(nsys_pieces(parts, calls, implementation, device, devices, gpu_metrics, release=release, notices=notices))
    for name in ("layers", "heads"):  # small, and shown to users: plain strings; ranges and kernels stay coded
        labels.plain(whole[name])
    return finished(whole, run_id, device, calls, notices)


def nsys_pieces(parts, calls=None, implementation: str = "unknown", device: Device | None = None,
                devices: pd.DataFrame | None = None, gpu_metrics: pd.DataFrame | None = None, release: bool = False,
                notices: list[str] | None = None):
    """Headcount's tables from an nsys export, one process at a time.

    Ranges are projected onto the GPU exactly as nsys's ``nvtx_gpu_proj_trace``
    (all domains of a thread nest together). Ranges named by headcount's
    scheme (domain ``headcount``) give the layers/heads tables; other ranges
    (someone else's code) stay in ``ranges`` only, with ``level`` ``other``,
    and are never posed as layers (the report summarises them by name,
    :func:`headcount.store.query.range_summary`). Without the tagger's call log (``calls``: given by
    ``headcount run``, absent for a parsed file) analytic FLOPs and bytes are null.
    ``roofline_class`` uses ``device``, else the GPU the export describes.

    Args:
        parts: :class:`~headcount.common.tables.Timeline` s, one per process (NVTX
            ranges, launches and GPU work never cross processes, so each part
            is attributed alone and memory follows the largest process).
        devices, gpu_metrics: the export's GPUs and GPU-metrics samples (whole file).
        release: the parts were read for this call: each is emptied once projected.
        notices: where the notices found while building go (each part's reading notices too), in order.

    Yields:
        ``(table name, DataFrame)``: ``ranges``, ``kernels`` and ``steps`` once per part,
        then ``layers`` and ``heads`` (from every part's attention ranges) and ``findings``.
    """
    attention, used, steps = [], set(), []
    notices = [] if notices is None else notices
    yield from process_pieces(parts, calls, implementation, devices, gpu_metrics, attention, used, release=release, steps=steps,
                               notices=notices)
    # the GPU the work ran on: the program's (headcount run), else the one the export describes
    layers, heads = nsys_aggregates(attention, calls, device or nsys_sqlite.describe_device(devices, sorted(used)))
    note_no_attention(layers, notices)
    findings = run_findings(steps, layers, heads)  # first: it gives the layers their shares of the steps
    yield "layers", layers
    yield "heads", heads
    yield "findings", findings


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` concatenated, the empty ones left out (all empty: the first, for its columns; none: the steps columns)."""
    full = [f for f in frames if len(f)]
    if full:
        return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0]
    return frames[0] if frames and len(frames[0].columns) else pd.DataFrame(columns=timeline.COLUMNS)


def collected(pieces) -> dict[str, pd.DataFrame]:
    """``(table name, rows)`` pieces (a streamed build's) gathered into one table per name."""
    parts: dict[str, list[pd.DataFrame]] = {}
    for name, frame in pieces:
        parts.setdefault(name, []).append(frame)
    return {name: _concat(frames) for name, frames in parts.items()}


def process_pieces(parts, calls, implementation, devices, gpu_metrics, attention: list, used: set, release: bool = False,
                    steps: list | None = None, notices: list[str] | None = None):
    """``ranges``, ``kernels`` and ``steps`` of each part; its attention ranges go to ``attention``, its GPUs to
    ``used``, its steps rows to ``steps``. ``release``: the parts are transient (read for this): each is emptied once projected."""
    for export in parts:
        if notices is not None:
            notices.extend(export.notices)
        used.update(nsys_sqlite.devices_of(export))
        ranges_table, kernels, step_rows = _nsys_process(export, calls, implementation, devices, gpu_metrics, release=release,
                                                         notices=notices)
        calls_of_figures = (ranges_table["level"] != "other").to_numpy() & ~graphs.capture_only(ranges_table)
        attention.append(ranges_table[calls_of_figures].astype({"level": object}))
        if steps is not None:
            steps.append(step_rows)
        yield "ranges", ranges_table
        yield "kernels", kernels
        yield "steps", step_rows
        del ranges_table, kernels, export  # written by now: freed before the next process is built


def run_findings(steps: list[pd.DataFrame], layers: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """The findings of a run built in pieces (its ``steps`` rows gathered from every piece)."""
    return with_findings({"steps": _concat(steps), "layers": layers, "heads": heads})["findings"]


def nsys_aggregates(attention: list[pd.DataFrame], calls=None, device: Device | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``layers`` and ``heads`` from the attention ranges of every process, with ``roofline_class`` for ``device``."""
    attention = [a for a in attention if len(a.columns)] or attention[:1]
    ranges_table = pd.concat(attention, ignore_index=True) if len(attention) > 1 else attention[0]
    for col in ("flop", "analytic_min_bytes"):  # no call log: unknown
        if col not in ranges_table.columns:
            ranges_table[col] = np.nan
    if "kv_head" not in ranges_table.columns:
        ranges_table["kv_head"] = pd.array([pd.NA] * len(ranges_table), dtype="Int64")
    for col in ("phase", "layer_name"):
        ranges_table[col] = ranges_table[col].astype(object)
    layers = aggregate.layers_table(ranges_table)
    heads = aggregate.heads_table(ranges_table, layers)
    untagged_provenance({"layers": layers, "heads": heads}, ranges_table)
    add_roofline({"layers": layers, "heads": heads}, device, calls)
    return layers, heads


def nsys_shard(path: Path, plan, shard: int, shards: int, options: ReadOptions = ReadOptions()):
    """One shard of a large export (the processes whose id is ``shard`` modulo
    ``shards``), for a worker process: ``ranges``, ``kernels`` and ``steps`` pieces, then
    ``("attention", its attention ranges)`` for :func:`nsys_aggregates` in the
    parent (which also gets the ``steps`` rows back, for the findings)."""
    attention: list[pd.DataFrame] = []
    parts = nsys_processes(path, plan, (shard, shards), options)
    for name, frame in process_pieces(parts, None, "unknown", plan.devices, plan.gpu_metrics, attention, set(), release=True):
        yield name, frame
        del frame
    if not attention:  # no process id falls in this shard
        yield "attention", pd.DataFrame()
        return
    yield "attention", pd.concat(attention, ignore_index=True) if len(attention) > 1 else attention[0]


def nsys_processes(path: Path, plan, shard: tuple[int, int] | None = None, options: ReadOptions = ReadOptions()):
    """The one way an nsys export is read (``parse``, ``run --backend nsys``, the
    sharded workers): its processes (those of ``shard``, a ``(k, m)`` pair, when
    given), one :class:`~headcount.common.tables.Timeline` at a time: a large export
    read one process at a time, a smaller one in one read and then cut by process."""
    if plan.processes is not None:
        mine = [p for p in plan.processes if shard is None or p % shard[1] == shard[0]]
        yield from (nsys_sqlite.read_export(path, process=p, plan=plan, options=options) for p in mine)
        return
    export = nsys_sqlite.read_export(path, plan=plan, shard=shard, options=options)
    if len(export.ranges) or len(export.gpu):
        yield from nsys_sqlite.by_process(export)


def _nsys_process(export: Timeline, calls, implementation: str, devices, gpu_metrics,
                  release: bool = False, notices: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One process's ranges, kernels and steps tables (see :func:`nsys_pieces`).

    Args:
        release: empty ``export``'s ranges, launches and GPU work once projected
            (a transient part read for this call: its rows are not held twice).
    """
    found = assigned = None
    if not calls and not (export.ranges["domain"] == DOMAIN).any():  # no tags: attention by operator, module and kernel names
        events = untagged.nvtx_events(export.ranges, export.runtime, export.gpu)
        found = untagged.find_calls(events) if events is not None else None
        if found is not None and found.calls:
            export.ranges, calls = untagged.with_nvtx_ranges(export.ranges, found.ranges), found.calls
            if found.assigned:  # a replay's attention kernels: given to their call by name
                assigned = untagged.assigned_keys(found, len(export.gpu), events[untagged.GPU_ROW].to_numpy())
        del events
    projected, work = attribution.project_gpu(export.ranges, export.runtime, export.gpu, graph_nodes=export.graph_nodes,
                                              not_replayed=(STEP_DOMAIN,), assigned_keys=assigned)
    syncs = timeline.sync_calls(export.runtime)
    if release:
        export.ranges, export.runtime, export.gpu = export.ranges.iloc[:0], export.runtime.iloc[:0], export.gpu.iloc[:0]
        export.graph_nodes = export.graph_nodes.iloc[:0]
    steps = projected[(projected["domain"] == STEP_DOMAIN).to_numpy(dtype=bool, na_value=False)]
    ranges_table = labels.label_ranges(projected, steps, ours=(projected["domain"] == DOMAIN).to_numpy(dtype=bool, na_value=False))
    if len(work):
        ranges_table["duration_ns"] = (ranges_table["gpu_end_ns"] - ranges_table["gpu_start_ns"]).astype("float64")
        basis = "gpu_projected"
    else:  # a capture with no GPU work at all (a CPU-only program): the ranges' own time
        ranges_table["duration_ns"] = (ranges_table["end_ns"] - ranges_table["start_ns"]).astype("float64")
        basis = "cpu_range"
    n = len(ranges_table)
    ranges_table["duration_basis"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[basis])
    ranges_table["op_count"] = ranges_table["gpu_op_count"]
    if calls is not None and len(calls):
        ranges_table["implementation"] = None
        ranges_table = _with_shapes(ranges_table, calls, implementation)
    else:
        ranges_table["implementation"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[implementation])
        # flop, analytic_min_bytes, kv_head (GQA mapping) need the call log: left out of the frame, null in the files
    if len(work):  # with the limits of the GPU each kernel ran on, as the recording describes it
        work = work.assign(theoretical_occupancy_pct=occupancy.device_occupancy(work, devices).to_numpy())
    k = _kernels_table([_gpu_rows(work, work["range_id"].to_numpy())], projected, steps, "nsys", implementation)
    del work  # the kernels table holds its rows now: not held while the steps are derived
    if gpu_metrics is not None and len(gpu_metrics):
        k = sampling.apportion(k, gpu_metrics)
        said = sampling.unresolved_kernels_notice(k)
        if said and notices is not None:
            notices.append(said)
    if found is not None and notices is not None:
        notices.extend(found.notices)
    attention_found = bool((projected["domain"] == DOMAIN).any())
    return ranges_table, k, steps_of(k, syncs, steps, ranges_table, implementation, attention_found)


def tables_from_ncu(kernels: pd.DataFrame, run_id: str, calls=None, device: Device | None = None) -> Built:
    """Build headcount's tables from ncu kernels (:mod:`headcount.parsers.ncu_csv`,
    :mod:`headcount.parsers.ncu_rep`).

    Kernels whose NVTX stack follows headcount's naming (domain ``headcount``)
    are aggregated into ``layers`` (and ``heads`` in head mode) with measured
    DRAM bytes; ncu has no range instances, so ``ranges`` is empty. With the
    tagger's call log (``headcount run --backend ncu``) the calls, analytic
    FLOPs and minimum bytes are filled in. ``roofline_class`` uses the GPU the
    report's device attributes name, else ``device``. The readers' notices
    (``kernels.attrs["notices"]``) become the build's.
    """
    k = kernels.copy()
    k["implementation"] = "unknown"
    k["bound"] = bound.kernel_bound(k)  # ncu's Speed of Light rule on its own counters
    k["runs_on"] = runs_on(np.ones(len(k), dtype=bool))
    paths = [_headcount_stack(p) for p in k["nvtx_path"]]
    parsed = [parse_path(p) if p else None for p in paths]
    k["phase"] = [p.phase if p else None for p in parsed]
    k["layer_name"] = [p.layer_name if p else None for p in parsed]
    k["layer"] = pd.array([p.layer if p else None for p in parsed], dtype="Int64")
    k["head"] = pd.array([p.head if p else None for p in parsed], dtype="Int64")
    k["kv_head"] = pd.array([pd.NA] * len(k), dtype="Int64")
    with_head = k[k["head"].notna()]
    layers = aggregate.from_kernels(k, aggregate.GROUP_LAYER)
    heads = aggregate.from_kernels(with_head, aggregate.GROUP_HEAD)
    if calls:
        impl = implementation_of(calls)
        layers = aggregate.with_call_totals(layers, calls_frame(calls), impl, heads=False)
        heads = aggregate.with_call_totals(heads, calls_frame(calls), impl, heads=True)
    tables = {"kernels": k, "ranges": pd.DataFrame(), "layers": layers, "heads": heads,
              "steps": timeline.kernel_sum_steps(k, implementation_of(calls) if calls else "unknown")}
    notices = list(kernels.attrs.get("notices", []))
    if not len(layers):
        notices.append(f"{NO_ATTENTION} (no kernel in headcount's ranges)")
    return finished(tables, run_id, ncu_metrics.run_device(kernels) or device, calls, notices)


def _headcount_stack(nvtx: str | None) -> str | None:
    """``headcount@fwd/layer.3;other@x`` → ``fwd/layer.3`` (headcount's domain only)."""
    if not isinstance(nvtx, str):
        return None
    for part in nvtx.split(";"):
        domain, _, stack = part.partition("@")
        if domain == DOMAIN:
            return stack
    return None


def add_roofline(tables: dict, device: Device | None, calls=None, measured_gbps: float | None = None) -> dict:
    """Fill ``roofline_class`` of the layers and heads tables (in place), with the achieved
    fractions it rests on (``peak_bandwidth_pct``, ``peak_flop_pct``), from the peaks of the
    device the work ran on (:mod:`headcount.derive.peaks`) and the dtype of the logged
    calls; null where either is unknown (a CPU run, a mixed-dtype run).

    Args:
        device: the run's device (its name, and the memory bandwidth a recording reports).
        measured_gbps: a measured copy ceiling, which wins over the device's figure.
    """
    dtypes = {c.shape.dtype for c in (calls or []) if c.shape is not None}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    name = devices.gpu_name(device)
    ceiling = devices.ceiling_gbps(device, measured_gbps)
    for table_name in ("layers", "heads"):
        if table_name in tables and len(tables[table_name]):
            table = tables[table_name]
            table["peak_bandwidth_pct"], table["peak_flop_pct"] = devices.achieved_pct(table, name, dtype, ceiling)
            table["roofline_class"] = devices.roofline_class(table, name, dtype, ceiling)
    return tables


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
