"""The nsys route: an export (SQLite, parquetdir, or a ``.nsys-rep`` exported first) → tables one
process at a time (:func:`nsys_processes`, :func:`nsys_pieces`), gathered into one
:class:`~headcount.build.shared.Built` per process (:func:`gathered`), or staged piece by piece; a large
export split by process into shards (:func:`nsys_shard`), whose layers and heads the parent adds
(:func:`nsys_aggregates`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.attribute import attribution, graphs, labels, nesting, untagged, untagged_nsys
from headcount.build.shared import (
    Built,
    _gpu_rows,
    _kernels_table,
    _with_shapes,
    add_roofline,
    busy_time,
    collected,
    finished,
    note_no_attention,
    run_findings,
    steps_of,
    untagged_provenance,
)
from headcount.common.device import Device
from headcount.common.naming import DOMAIN, STEP_DOMAIN
from headcount.common.tables import Timeline
from headcount.derive import aggregate, collectives, launch, occupancy, sampling
from headcount.derive import steps as step_view
from headcount.parsers import nsys_sqlite
from headcount.parsers.options import ReadOptions


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
    findings = run_findings(steps, layers, heads, notices)  # first: it gives the layers their shares of the steps
    yield "layers", layers
    yield "heads", heads
    yield "findings", findings




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
        yield "collectives", collectives.collectives(kernels)
        yield "steps", step_rows
        del ranges_table, kernels, export  # written by now: freed before the next process is built


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
        events = untagged_nsys.nvtx_events(export.ranges, export.runtime, export.gpu)
        found = untagged.find_calls(events, untagged.NSYS) if events is not None else None
        if found is not None and found.calls:
            export.ranges, calls = untagged_nsys.with_nvtx_ranges(export.ranges, found.ranges), found.calls
            if found.assigned:  # a replay's attention kernels: given to their call by name
                assigned = untagged.assigned_keys(found, len(export.gpu), events[untagged_nsys.GPU_ROW].to_numpy())
        del events
    projected, work = attribution.project_gpu(export.ranges, export.runtime, export.gpu, graph_nodes=export.graph_nodes,
                                              not_replayed=(STEP_DOMAIN,), assigned_keys=assigned)
    syncs = step_view.sync_calls(export.runtime)
    if release:
        # copies: a slice of no rows is a view that keeps the whole read alive
        export.ranges, export.runtime, export.gpu, export.graph_nodes = (
            t.iloc[:0].copy() for t in (export.ranges, export.runtime, export.gpu, export.graph_nodes))
    steps = projected[(projected["domain"] == STEP_DOMAIN).to_numpy(dtype=bool, na_value=False)]
    ranges_table = labels.label_ranges(projected, steps, ours=(projected["domain"] == DOMAIN).to_numpy(dtype=bool, na_value=False))
    if len(work):
        levels = nesting.ancestor_rows(ranges_table, work["range_id"].to_numpy(np.int64))
        figures = launch.per_range(ranges_table, work, levels)
        ranges_table["kernel_busy_ns"] = figures["kernel_busy_ns"].to_numpy(np.float64)
        ranges_table["kernel_gap_ns"] = figures["kernel_gap_ns"].to_numpy(np.float64)
        del figures, levels  # copied into the ranges table: not held through the steps (a large process's peak)
        busy_time(ranges_table)
        basis = "gpu_busy"
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
    attention_found = bool((projected["domain"] == DOMAIN).any())
    del work, projected  # the kernels and ranges tables hold their rows now: not held while the steps are derived
    if gpu_metrics is not None and len(gpu_metrics):
        k = sampling.apportion(k, gpu_metrics)
        said = sampling.unresolved_kernels_notice(k)
        if said and notices is not None:
            notices.append(said)
    if found is not None and notices is not None:
        notices.extend(found.notices)
    return ranges_table, k, steps_of(k, syncs, steps, ranges_table, implementation, attention_found)
