"""What every route of the composition shares (docs/architecture.md §1, § The house): a recording or a
file → headcount's tables goes through one route module of this folder (:mod:`~headcount.build.in_process`,
:mod:`~headcount.build.kineto`, :mod:`~headcount.build.nsys`, :mod:`~headcount.build.ncu`), each built on
what is here; this module imports none of them. The API, ``headcount profile``, ``run`` and ``parse`` all
build their tables through these routes; no other folder composes stages.

- :func:`tables_from_events`: an events table (torch.profiler, CUPTI) and the
  tagger's call log → ``kernels`` (CPU operators on a CPU run, plus GPU
  kernels where the recording has them), ``ranges``, ``layers``, ``heads``
  and the ``attention_breakdown`` view;
- :class:`Built` and :func:`finished`: what every ``tables_from_*`` returns, and how each ends (run ids,
  roofline class, launch summary, findings: one way for all);
- the attention and steps tables, the findings over a run (:func:`with_findings`), the roofline
  (:func:`add_roofline`), the facts a run's metadata takes from its calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headcount.attribute import attribution, graphs, labels, nesting, untagged, untagged_calls
from headcount.attribute.calls import attach_calls, calls_frame
from headcount.build.user_ranges import user_ranges
from headcount.common import process_ids
from headcount.common.arrays import equals
from headcount.common.device import Device
from headcount.common.naming import DOMAIN, STEP_DOMAIN, USER_DOMAIN
from headcount.derive import aggregate, analytic, collectives, launch, occupancy, sampling, triage
from headcount.derive import peaks as device_peaks
from headcount.derive import steps as step_view


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
    already: :func:`nsys_pieces` does, for the files it streams), and pid/tid become integers
    (:func:`headcount.common.process_ids.as_integers`: the API's DataFrames as the Parquet tables)."""
    for table in tables.values():
        if "run_id" not in table:
            table.insert(0, "run_id", run_id)
    add_roofline(tables, device, calls)
    tables.setdefault("launch", launch.summary(tables["layers"], tables["kernels"]))
    if "collectives" not in tables:  # streamed builds gave theirs piece by piece
        tables["collectives"] = collectives.collectives(tables["kernels"])
        tables["collectives"].insert(0, "run_id", run_id)
    notices = list(notices or [])
    if "findings" not in tables:
        with_findings(tables)
        said = overlap_notice(tables.get("steps"))
        if said:
            notices.append(said)
    for name, table in tables.items():  # the ids as the tables hold them, whichever way the tables go on
        if isinstance(table, pd.DataFrame):
            tables[name] = process_ids.as_integers(table, name)
    return Built(tables, notices, info or {})


BREAKDOWN_COLUMNS = [
    "implementation", "phase", "layer_name", "layer", "head", "kv_head", "calls", "steps",
    "duration_ns", "duration_per_call_ns", "duration_basis", "duration_provenance",
    "dram_bytes", "dram_bytes_provenance", "analytic_min_bytes",
    "bandwidth_gbps", "bandwidth_provenance",
    "flop", "flop_provenance", "intensity_flop_per_byte", "intensity_provenance",
    "op_count", "cpu_ops_ns", "share_of_layer_pct", "share_of_phase_pct", "split_overhead_ns", "provenance",
]


def _split_domains(events: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ranges (headcount's, both domains, and the recording's own annotations, domain :data:`USER_DOMAIN`)
    and everything else."""
    is_range = (events["kind"] == "range").to_numpy(dtype=bool)
    ranges = events[is_range].copy(deep=False)  # a new frame already: a deep copy copied every column once more
    names = ranges["name"].astype(object).astype(str)  # the ranges' only: a few among millions of operators and kernels
    domain = np.full(len(ranges), USER_DOMAIN, dtype=object)
    for dom in (DOMAIN, STEP_DOMAIN):
        domain[names.str.startswith(dom + "@").to_numpy(dtype=bool)] = dom
    ranges["domain"] = domain
    ranges["name"] = [n.split("@", 1)[1] if d != USER_DOMAIN else n for n, d in zip(ranges["name"], ranges["domain"])]
    return ranges, events[~is_range].copy(deep=False)


def tables_from_events(events: pd.DataFrame, calls, implementation: str, source: str = "torch",
                       limits=None, pm_samples: pd.DataFrame | None = None,
                       exclude_steps=(), graph_nodes: dict[int, int] | None = None,
                       void_steps: tuple[str, ...] = (), launched: bool | None = None,
                       with_figures: bool = False, sm_count: int | None = None) -> dict[str, pd.DataFrame]:
    """Build the tables of one profiled session.

    Args:
        events: Kineto events (:func:`headcount.parsers.kineto_json.events_frame`) or
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
    user = _user_annotations(ranges)

    projected, gpu, cpu_inner = _attributed(main, cpu, gpu, runtime, correlated, keyed, graph_nodes)
    gpu_inner = gpu["range_id"].to_numpy()
    gpu = gpu.reset_index(drop=True)
    gpu["theoretical_occupancy_pct"] = occupancy.kernel_occupancy(gpu, limits)
    gpu["waves_per_sm"] = occupancy.kernel_waves(gpu, limits, sm_count)
    is_gpu = len(gpu) > 0
    if is_gpu:
        projected = _with_gpu_figures(projected, gpu, gpu_inner, pm_samples)
    ranges_table = _with_user_ranges(_with_shapes(_labelled(projected, steps, is_gpu), calls, implementation),
                                     user, gpu, runtime, steps, implementation, ops)
    frames = [cpu.assign(device="cpu", range_id=cpu_inner)]
    if is_gpu:
        gpu_rows = _gpu_rows(gpu, gpu_inner)
        if pm_samples is not None and len(pm_samples):
            per_kernel = sampling.window_totals(pm_samples, gpu_rows["start_ns"], gpu_rows["end_ns"])
            gpu_rows = pd.concat([gpu_rows, per_kernel], axis=1)
        frames.append(gpu_rows)
    kernels = launch.kernel_columns(_kernels_table(frames, projected, steps, source, implementation, launched))
    return _tables(kernels, ranges_table, steps, runtime, implementation, exclude_steps, found=len(main) > 0, with_figures=with_figures)


def typed_like(extra: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """``extra`` (rows to be concatenated to ``frame``) with the columns of ``frame`` it leaves empty as nulls of
    their nullable dtype in ``frame``: a concat with a missing or empty ``object`` column turns the column into
    ``object`` or ``Float64`` (the kernels' ids held as Python objects; the heads' ``kv_head`` as floats)."""
    n = len(extra)
    empty = {c: pd.array([pd.NA] * n, dtype=frame[c].dtype) for c in frame.columns
             if isinstance(frame[c].dtype, pd.api.extensions.ExtensionDtype)
             and not isinstance(frame[c].dtype, pd.CategoricalDtype)
             and (c not in extra.columns or (extra[c].dtype == object and not extra[c].notna().any()))}
    return extra.assign(**empty) if empty else extra


def _user_annotations(ranges: pd.DataFrame) -> pd.DataFrame:
    """The recording's own annotations among the nested ranges (torch.profiler's ``ProfilerStep#N`` aside: those are steps)."""
    mine = (ranges["domain"] == USER_DOMAIN).to_numpy(dtype=bool)
    return ranges[mine & ~ranges["name"].astype(str).str.match(r"ProfilerStep#\d+$").to_numpy(dtype=bool)]


def _with_user_ranges(ranges_table: pd.DataFrame, user: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame,
                      steps: pd.DataFrame, implementation: str,
                      ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ranges table with the recording's own annotations after headcount's ranges (:mod:`headcount.build.user_ranges`);
    ``gpu`` gets (in place) the ``collective`` their ``nccl:…`` annotations name, where they name one."""
    if not len(user):
        return ranges_table
    twins = ops[(ops["kind"] == "gpu_annotation").to_numpy(dtype=bool)] if ops is not None else None  # Kineto's GPU-side ones
    mine, collective = user_ranges(user, gpu, runtime, steps, twins)
    if collective is not None:
        gpu["collective"] = collective
    mine = mine.assign(implementation=implementation)
    columns = list(dict.fromkeys([*ranges_table.columns, *mine.columns]))
    if not len(ranges_table):
        return mine.reindex(columns=columns)
    ours, theirs = ranges_table.reindex(columns=columns), typed_like(mine, ranges_table).reindex(columns=columns)
    for column in [c for c, kind in ours.dtypes.items() if isinstance(kind, pd.CategoricalDtype)]:
        # categorical labels keep their order (the layers table follows it): the annotations' values after them
        extra = pd.unique(theirs[column].dropna().astype(object))
        kind = pd.CategoricalDtype(ours[column].cat.categories.append(pd.Index(extra, dtype=object).difference(
            ours[column].cat.categories, sort=False)))
        ours[column], theirs[column] = ours[column].astype(kind), theirs[column].astype(object).astype(kind)
    return pd.concat([ours, theirs], ignore_index=True)


def _tables(kernels: pd.DataFrame, ranges_table: pd.DataFrame, steps: pd.DataFrame, runtime: pd.DataFrame, implementation: str,
            exclude_steps, found: bool, with_figures: bool) -> dict[str, pd.DataFrame]:
    """:func:`tables_from_events`'s tables from its kernels and labelled ranges: the attention tables over the
    ranges whose figures count (excluded steps and graph captures aside), the steps view, plain strings."""
    figures = ranges_table[~ranges_table["step"].isin(list(exclude_steps)).to_numpy() & ~graphs.capture_only(ranges_table)]
    tables = {"kernels": kernels, "ranges": ranges_table, **attention_tables(figures, kernels)}
    syncs = step_view.sync_calls(runtime)
    step_rows = steps_of(kernels, syncs, steps, ranges_table, implementation, found=found)
    tables["steps"] = step_rows[~step_rows["step"].isin(list(exclude_steps)).to_numpy(dtype=bool)].reset_index(drop=True)
    for table in tables.values():
        labels.plain(table)  # in-process recordings are small: users get plain strings
    if with_figures:
        tables["figures"] = figures[figures["level"].isin(["layer", "head", "module"]).to_numpy(dtype=bool)]
        tables["syncs"] = syncs.assign(step=labels.step_of(syncs["start_ns"].to_numpy(np.int64), steps))
    return tables


def _attributed(main: pd.DataFrame, cpu: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame, correlated: bool, keyed: bool,
                graph_nodes: dict[int, int] | None):
    """headcount's ranges with their projected work, the GPU work with its range, the CPU operators' ranges
    (:func:`headcount.attribute.attribution.attribute`); without GPU work the GPU columns are unknown, not zero."""
    # CPU operators belong to the ranges that wholly contain them on their own thread; GPU work to
    # those around its launch call (Kineto puts GPU activity in lanes pid=<device>, tid=<stream>, so
    # the launching process and thread come from the runtime call), or, where the launch carried
    # one, to the range whose external correlation id it carried
    captured = graphs.captured_by_external_id(graph_nodes, main) if graph_nodes and correlated else None
    assigned = attribution.by_call_key(main, pd.array(gpu[untagged.CALL_KEY], dtype="Int64").to_numpy(np.int64, na_value=-1)) \
        if keyed else None
    projected, gpu, cpu_inner = attribution.attribute(main, gpu.assign(pid=None), runtime, cpu=cpu,
                                                      match_external=correlated, captured=captured, assigned=assigned)
    if not len(gpu):  # no GPU recorded: unknown, not zero
        for column in ("gpu_op_count", "gpu_start_ns", "gpu_end_ns"):
            projected[column] = pd.array([pd.NA] * len(projected), dtype="Int64")
    return projected, gpu, cpu_inner


def _with_gpu_figures(projected: pd.DataFrame, gpu: pd.DataFrame, gpu_inner: np.ndarray, pm_samples: pd.DataFrame | None) -> pd.DataFrame:
    """The ranges' launch figures (:func:`headcount.derive.launch.per_range`), kernel counts and, where PM
    samples were taken, their sampled totals over each range's GPU window."""
    launch_figures = launch.per_range(projected, gpu, nesting.ancestor_rows(projected, gpu_inner), gpu["theoretical_occupancy_pct"])
    projected = projected.merge(launch_figures, on="range_id", how="left")
    projected["kernel_count"] = projected["gpu_op_count"]
    if pm_samples is not None and len(pm_samples):
        sampled = sampling.window_totals(pm_samples, pd.to_numeric(projected["gpu_start_ns"]), pd.to_numeric(projected["gpu_end_ns"]))
        projected = pd.concat([projected.reset_index(drop=True), sampled], axis=1)
    return projected


def busy_time(ranges_table: pd.DataFrame) -> None:
    """Each range's GPU time: ``duration_ns`` the busy union of the GPU work launched inside it (nested ranges'
    included; ``kernel_busy_ns``), ``gpu_span_ns`` its first start to last end, idle between its kernels included
    (a span, not a time)."""
    span = (pd.to_numeric(ranges_table["gpu_end_ns"], errors="coerce")
            - pd.to_numeric(ranges_table["gpu_start_ns"], errors="coerce")).astype("float64")
    busy = pd.to_numeric(ranges_table["kernel_busy_ns"], errors="coerce").astype("float64") \
        if "kernel_busy_ns" in ranges_table else span
    ranges_table["gpu_span_ns"] = span.to_numpy(np.float64, na_value=np.nan)
    ranges_table["duration_ns"] = busy.where(busy.notna(), span).to_numpy(np.float64, na_value=np.nan)


def _labelled(projected: pd.DataFrame, steps: pd.DataFrame, is_gpu: bool) -> pd.DataFrame:
    """The ranges table: labels (:func:`headcount.attribute.labels.label_ranges`), and each range's duration,
    its GPU-projected span where GPU work was recorded, else its CPU span (``duration_basis`` says which)."""
    ranges_table = labels.label_ranges(projected, steps)
    if is_gpu:
        busy_time(ranges_table)
    else:
        ranges_table["duration_ns"] = (ranges_table["end_ns"] - ranges_table["start_ns"]).astype("float64")
    ranges_table["duration_basis"] = "gpu_busy" if is_gpu else "cpu_range"
    if "sm_warps_active_sampled_pct" in ranges_table:
        # weighted by the window the samples cover (the span), as the layers' rate divides by it
        ranges_table["sm_warps_active_x_duration"] = ranges_table["sm_warps_active_sampled_pct"] * ranges_table["gpu_span_ns"]
    return ranges_table


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
    if "kind" in kernels and kernels["kind"].isin(step_view.GPU_KINDS).any():
        return step_view.gpu_steps(kernels, syncs, attention_found=found)
    layer_ranges = ranges_table[(ranges_table["level"] == "layer").to_numpy(dtype=bool, na_value=False)] if len(ranges_table) else ranges_table
    ops = kernels[equals(kernels["kind"], "op")] if "kind" in kernels else None
    steps = steps.assign(step=labels.step_of(steps["start_ns"].to_numpy(np.int64), steps) if steps["name"].notna().all()
                         else pd.array([pd.NA] * len(steps), dtype="Int64"))
    return step_view.cpu_steps(steps, layer_ranges, implementation, attention_found=found, ops=ops)


def with_findings(tables: dict) -> dict:
    """Add (or replace) ``findings``: :func:`headcount.derive.triage.findings` of
    the run's ``steps``, ``layers`` and ``heads`` (in place; returned); the layers
    first get their shares of the steps (:func:`headcount.derive.aggregate.with_step_shares`)."""
    if tables.get("layers") is not None and tables.get("steps") is not None:
        aggregate.with_step_shares(tables["layers"], tables["steps"])
    findings = triage.findings(tables.get("steps"), tables.get("layers"), tables.get("heads"), kernels=tables.get("kernels"))
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
    gpu = k["kind"].isin(step_view.GPU_KINDS).to_numpy(dtype=bool)
    k["runs_on"] = runs_on(gpu)
    unlaunched = gpu & (k["api_start_ns"].isna().to_numpy() if "api_start_ns" in k else np.ones(len(k), dtype=bool))
    if unlaunched.any() and ((gpu & ~unlaunched).any() if launched is None else launched):
        # GPU work whose launch the recording lacks, where it has the others' (launched before it began): no step of it
        step_time = step_time.where(~unlaunched, -1)
    for col, values in labels.label_ops(k["range_id"].to_numpy(np.int64), ranges).items():
        k[col] = values
    k["step"] = labels.step_of(step_time.to_numpy(np.int64), steps)
    k["range_id"] = k["range_id"].where(k["range_id"] >= 0).astype("Int64")
    collectives.message_columns(k)
    return k


def run_facts(calls) -> dict:
    """What a parsed recording's calls say of its run (its ``runs`` row): the ``implementation``, the ``model``
    (the model classes the calls name), and the
    ``dtype``, ``batch`` and ``seq`` (query length) where every call that has shapes agrees; nothing
    where no call was found (the row keeps ``unknown`` and nulls)."""
    if not calls:
        return {}
    shapes = [c.shape for c in calls if c.shape is not None]
    facts = {"implementation": implementation_of(calls)}
    models = sorted({c.model for c in calls if getattr(c, "model", None)})
    if models:  # the model classes whose layers the calls are (several: a pipeline's, named apart)
        facts["model"] = ", ".join(models)
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
    impls = {c.shape.implementation if c.shape is not None else getattr(c, "implementation", None) for c in calls} - {None}
    if len(impls) == 1:
        return impls.pop()
    return fallback or ("mixed" if impls else "unknown")


NO_ATTENTION = "no attention found: kernels, steps and findings only"


NO_ATTENTION_IN_EXPORT = f"{NO_ATTENTION} (neither headcount's ranges nor an attention operator, module or kernel name in the export)"


def note_no_attention(layers: pd.DataFrame, notices: list[str]) -> None:
    """Say (once) that an export's run has no attention layers."""
    if not len(layers) and not any(NO_ATTENTION in n for n in notices):
        notices.append(NO_ATTENTION_IN_EXPORT)


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
        how = [provenance.get((p, n), untagged_calls.CALL_ORDER) for p, n in zip(table["phase"], table["layer_name"])]
        table["provenance"] = np.where(table["provenance"] == "apportioned", "apportioned", how)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` concatenated, the empty ones left out (all empty: the first, for its columns; none: the steps columns)."""
    full = [f for f in frames if len(f)]
    if full:
        return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0]
    return frames[0] if frames and len(frames[0].columns) else pd.DataFrame(columns=step_view.COLUMNS)


def run_findings(steps: list[pd.DataFrame], layers: pd.DataFrame, heads: pd.DataFrame,
                 notices: list[str] | None = None) -> pd.DataFrame:
    """The findings of a run built in pieces (its ``steps`` rows gathered from every piece); where step windows
    overlap, a notice goes to ``notices``."""
    gathered = _concat(steps)
    said = overlap_notice(gathered)
    if said and notices is not None:
        notices.append(said)
    return with_findings({"steps": gathered, "layers": layers, "heads": heads})["findings"]


def overlap_notice(steps: pd.DataFrame | None) -> str | None:
    """What a reader must know where steps' GPU windows overlap (pipelined work), else ``None``."""
    if steps is None or not len(steps) or "windows_overlap" not in steps:
        return None
    overlap = steps["windows_overlap"].eq(True)  # NaN (no windows) is no overlap
    if not overlap.any():
        return None
    return (f"{int(overlap.sum())} of {int(steps['step'].notna().sum())} steps' GPU windows overlap a neighbour's (pipelined "
            "work: the next step's copies or collectives ran during this one): busy and idle are the device's over each "
            "window, every stream's and every step's work; own_busy_ns is the step's own")


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
    name = device_peaks.gpu_name(device)
    ceiling = device_peaks.ceiling_gbps(device, measured_gbps)
    for table_name in ("layers", "heads"):
        if table_name in tables and len(tables[table_name]):
            table = tables[table_name]
            table["peak_bandwidth_pct"], table["peak_flop_pct"] = device_peaks.achieved_pct(table, name, dtype, ceiling)
            table["roofline_class"] = device_peaks.roofline_class(table, name, dtype, ceiling)
    return tables

def collected(pieces) -> dict[str, pd.DataFrame]:
    """``(table name, rows)`` pieces (a streamed build's) gathered into one table per name."""
    parts: dict[str, list[pd.DataFrame]] = {}
    for name, frame in pieces:
        parts.setdefault(name, []).append(frame)
    return {name: _concat(frames) for name, frames in parts.items()}
