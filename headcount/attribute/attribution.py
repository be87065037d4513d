"""Give each op or kernel its NVTX path, and each range its projected work.

One rule for every source (the rule nsys applies in its ``nvtx_gpu_proj_trace``
report): an op belongs to every range that, on the thread that launched it,
wholly contains its launch. For GPU work the launch is its CUDA runtime or
driver call (matched on correlation id within one process); for a CPU
operator it is the operator itself (an autograd node that pops a range starts
inside it and ends outside, so it belongs to the parent).

Nesting and "innermost range at time t" are :mod:`headcount.attribute.nesting`;
replays of CUDA graphs are :mod:`headcount.attribute.graphs`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from headcount.attribute import graphs
from headcount.attribute.nesting import ancestor_rows, innermost_range, nest_ranges
from headcount.common.arrays import positions


def launches(gpu: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """Give GPU work its launch call: ``launch_pid``, ``launch_tid``,
    ``api_start_ns``, ``api_end_ns`` (null where no call matches), matched on
    correlation id within one process.

    Args:
        gpu: with ``pid`` (the launching process; ``None`` to match on the id
            alone, for traces whose GPU lanes do not name it) and ``correlation_id``.
        runtime: runtime/driver calls with ``pid``, ``tid``, ``correlation_id``, ``start_ns``, ``end_ns``.
    """
    calls = runtime.dropna(subset=["correlation_id"]).rename(columns={
        "pid": "launch_pid", "tid": "launch_tid", "start_ns": "api_start_ns", "end_ns": "api_end_ns"})
    # a runtime call and the driver call it makes may share a correlation id: the outer (earlier) one is the launch
    calls = calls[["launch_pid", "launch_tid", "correlation_id", "api_start_ns", "api_end_ns"]].sort_values("api_start_ns", kind="stable")
    if gpu["pid"].isna().all():
        calls = calls.drop_duplicates("correlation_id")
        return gpu.merge(calls, on="correlation_id", how="left")
    calls = calls.drop_duplicates(["launch_pid", "correlation_id"])
    return gpu.merge(calls, left_on=["pid", "correlation_id"], right_on=["launch_pid", "correlation_id"], how="left")


def _project_overlapping(projected: pd.DataFrame, work: pd.DataFrame, block: int = 1024) -> None:
    """On threads whose ranges overlap without nesting, count each GPU
    operation for every range that contains its launch call (not only its
    ancestors), and give each operation its tightest such range. In place."""
    loose = projected[~projected["nested"]]
    for (pid, tid), ranges in loose.groupby(["pid", "tid"], observed=True):
        mine = (work["launch_pid"] == pid) & (work["launch_tid"] == tid) & work["api_start_ns"].notna()
        ops = work[mine.fillna(False).to_numpy(dtype=bool)]
        a_s = ops["api_start_ns"].to_numpy(np.int64)
        a_e = ops["api_end_ns"].to_numpy(np.int64)
        o_s = ops["start_ns"].to_numpy(np.int64)
        o_e = ops["end_ns"].to_numpy(np.int64)
        r_s = ranges["start_ns"].to_numpy(np.int64)
        r_e = ranges["end_ns"].to_numpy(np.int64)
        count = np.zeros(len(ranges), dtype=np.int64)
        first = np.full(len(ranges), np.iinfo(np.int64).max)
        last = np.full(len(ranges), np.iinfo(np.int64).min)
        best_slack = np.full(len(ops), np.iinfo(np.int64).max)
        best = np.full(len(ops), -1, dtype=np.int64)
        ids = ranges["range_id"].to_numpy(np.int64)
        for lo in range(0, len(ranges), block):
            contains = (r_s[lo:lo + block, None] <= a_s[None, :]) & (r_e[lo:lo + block, None] >= a_e[None, :])
            count[lo:lo + block] = contains.sum(axis=1)
            first[lo:lo + block] = np.where(contains, o_s[None, :], first[0]).min(axis=1, initial=first[0])
            last[lo:lo + block] = np.where(contains, o_e[None, :], last[0]).max(axis=1, initial=last[0])
            slack = np.where(contains, (a_s[None, :] - r_s[lo:lo + block, None]) + (r_e[lo:lo + block, None] - a_e[None, :]),
                             np.iinfo(np.int64).max)
            pick = slack.argmin(axis=0)
            better = slack[pick, np.arange(len(ops))] < best_slack
            best_slack = np.where(better, slack[pick, np.arange(len(ops))], best_slack)
            best = np.where(better, ids[lo + pick], best)
        has = count > 0
        projected.loc[ranges.index, "gpu_op_count"] = count
        projected.loc[ranges.index, "gpu_start_ns"] = pd.Series(first, index=ranges.index, dtype="Int64").where(has)
        projected.loc[ranges.index, "gpu_end_ns"] = pd.Series(last, index=ranges.index, dtype="Int64").where(has)
        work.loc[ops.index, "range_id"] = best


def launched_in(work: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """Innermost range (``range_id``, -1 if none) that wholly contains each GPU
    operation's launch call on the launching thread.

    Args:
        work: output of :func:`launches`.
        ranges: nested ranges (:func:`nest_ranges`).
    """
    work = work.reset_index(drop=True)
    inner = np.full(len(work), -1, dtype=np.int64)
    probe = work[work["api_start_ns"].notna()]
    if len(probe):
        probe = probe.assign(pid=probe["launch_pid"], tid=probe["launch_tid"]).astype({"api_start_ns": "int64", "api_end_ns": "int64"})
        inner[probe.index.to_numpy()] = innermost_range(probe, ranges, "api_start_ns", "api_end_ns")
    return inner

def project(ranges: pd.DataFrame, ops: pd.DataFrame, innermost: np.ndarray, copy: bool = True) -> pd.DataFrame:
    """Per range: ops launched inside it at any depth, first op start, last op end.

    Args:
        copy: work on a copy of ``ranges`` (``False``: add the columns to it).

    Returns:
        ``ranges`` with ``op_count`` (0 where none), ``op_start_ns`` and ``op_end_ns``
        (null where none).
    """
    out = ranges.copy() if copy else ranges
    n = len(out)
    count = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    starts = ops["start_ns"].to_numpy(dtype=np.int64) if len(ops) else np.zeros(0, np.int64)
    ends = ops["end_ns"].to_numpy(dtype=np.int64) if len(ops) else np.zeros(0, np.int64)
    for level in ancestor_rows(out, innermost) if n else []:
        ok = level >= 0
        rows = level[ok]
        count += np.bincount(rows, minlength=n)
        np.minimum.at(first, rows, starts[ok])
        np.maximum.at(last, rows, ends[ok])
    out["op_count"] = count
    has = count > 0
    out["op_start_ns"] = pd.array(np.where(has, first, 0), dtype="Int64")
    out["op_end_ns"] = pd.array(np.where(has, last, 0), dtype="Int64")
    out.loc[~has, ["op_start_ns", "op_end_ns"]] = pd.NA
    return out


class Attributed(NamedTuple):
    """What :func:`attribute` gives back.

    Attributes:
        ranges: the ranges given (plus one row per CUDA graph replay instance) with
            ``gpu_op_count``, ``gpu_start_ns``, ``gpu_end_ns`` (GPU work launched inside,
            at any depth: count, first start, last end; ns) and, when CPU operators
            were given, ``op_count``, ``cpu_op_start_ns``, ``cpu_op_end_ns`` and
            ``cpu_ops_ns`` (summed time of the operators not nested in another
            operator of the range, ns).
        gpu: the GPU work with its launch columns (:func:`launches`) and the
            ``range_id`` of its innermost range (-1: none).
        cpu_range: each CPU operator's innermost ``range_id`` (-1: none); ``None`` without CPU operators.
    """

    ranges: pd.DataFrame
    gpu: pd.DataFrame
    cpu_range: np.ndarray | None


def attribute(ranges: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame, *, cpu: pd.DataFrame | None = None,
              match_external: bool = False, captured: dict[int, int] | None = None,
              replayable: np.ndarray | None = None, assigned: np.ndarray | None = None) -> Attributed:
    """The one attribution of every source: GPU work (and CPU operators) to the ranges that launched them.

    Args:
        ranges: nested ranges (:func:`~headcount.attribute.nesting.nest_ranges`) that work may belong to.
        gpu: GPU work: ``pid`` of the launching process (``None`` to match on the
            correlation id alone), ``correlation_id``, ``start_ns``, ``end_ns``
            (and ``external_id`` with ``match_external``).
        runtime: launch calls (``pid``, ``tid``, ``correlation_id``, ``start_ns``, ``end_ns``).
        cpu: CPU operators (``pid``, ``tid``, ``start_ns``, ``end_ns``): each
            belongs to the ranges that wholly contain it on its thread.
        match_external: GPU work belongs to the range whose id its launch carried
            as CUPTI external correlation id (exact), not to the ranges around its launch call.
        captured: CUDA graph node id → the range that made it
            (:func:`~headcount.attribute.graphs.capture_ranges`): replayed work
            belongs to a replay instance of that range (:mod:`headcount.attribute.graphs`).
        replayable: per range, whether it may get replay instances (``None``: all).
        assigned: per GPU row, the range it belongs to whatever its launch (-1: by the rule): the attention
            kernels of a graph replay found by name in an untagged recording (:mod:`headcount.attribute.untagged`).
    """
    work = launches(gpu, runtime).reset_index(drop=True)
    inner = by_external_id(work, ranges) if match_external else launched_in(work, ranges)
    # before the replay instances: those hold replayed GPU work, never a CPU operator
    cpu_range = innermost_range(cpu, ranges, "start_ns", "end_ns") if cpu is not None else None
    if captured:
        ranges, inner = graphs.replay_instances(ranges, work, inner, captured, replayable)
    if assigned is not None:  # a kernel assigned by name stays with its call, whatever its launch or node
        inner = np.where(assigned >= 0, assigned, inner)
    work["range_id"] = inner
    if cpu is not None:
        ranges = project(ranges, cpu, cpu_range).rename(columns={"op_start_ns": "cpu_op_start_ns", "op_end_ns": "cpu_op_end_ns"})
        ranges["cpu_ops_ns"] = _top_level_op_time(cpu, cpu_range, ranges)
        gpu_proj = project(ranges[["range_id", "parent_range_id"]], work, inner)
        for ours, theirs in (("gpu_op_count", "op_count"), ("gpu_start_ns", "op_start_ns"), ("gpu_end_ns", "op_end_ns")):
            ranges[ours] = gpu_proj[theirs].to_numpy()
    else:
        ranges = project(ranges, work, inner, copy=False)
        ranges.columns = [{"op_count": "gpu_op_count", "op_start_ns": "gpu_start_ns", "op_end_ns": "gpu_end_ns"}.get(c, c)
                          for c in ranges.columns]
    if cpu is None and "nested" in ranges and not ranges["nested"].all():
        _project_overlapping(ranges, work)
    return Attributed(ranges, work, cpu_range)


def project_gpu(ranges: pd.DataFrame, runtime: pd.DataFrame, gpu: pd.DataFrame, keys: list[str] = ["pid", "tid"],
                with_paths: bool = True, graph_nodes: pd.DataFrame | None = None,
                not_replayed: tuple[str, ...] = (), assigned_keys: np.ndarray | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """NVTX ranges projected onto GPU time, as nsys's ``nvtx_gpu_proj_trace`` (an nsys export's attribution).

    Args:
        ranges: ``range_id``, ``pid``, ``tid``, ``name``, ``start_ns``, ``end_ns`` (+ ``keys``).
        runtime: launch calls (``pid``, ``tid``, ``correlation_id``, ``start_ns``, ``end_ns``).
        gpu: GPU work (``pid`` of the launching process, ``correlation_id``, ``start_ns``, ``end_ns``).
        keys: nesting groups (nsys: all domains of a thread together).
        with_paths: also build ``path`` (see :func:`~headcount.attribute.nesting.nest_ranges`).
        graph_nodes: CUDA graph node events (:class:`~headcount.common.tables.Timeline`):
            GPU work replayed from a graph belongs to a replay instance of the
            range that made its node (:mod:`headcount.attribute.graphs`), not to
            the range around the graph launch.
        not_replayed: domains whose ranges get no replay instances (steps).
        assigned_keys: per row of ``gpu``, the ``call_key`` of the range it belongs to whatever its launch
            (-1: by the rule; ``ranges`` then has a ``call_key`` column): an untagged graph replay's attention
            kernels (:func:`headcount.attribute.untagged.assigned_keys`).

    Returns:
        ``(ranges, gpu)``: ranges with ``parent_range_id``, ``depth``, ``path``,
        ``gpu_op_count``, ``gpu_start_ns``, ``gpu_end_ns``, ``child_count``
        (children that launched GPU work) and ``replay_of``; GPU work with its
        launch columns and the ``range_id`` of its innermost range (-1 if none).
    """
    nested = nest_ranges(ranges, keys=keys, with_paths=with_paths)
    captured = replayable = None
    if graph_nodes is not None and len(graph_nodes):
        captured = graphs.capture_ranges(graph_nodes, nested)
        replayable = ~nested["domain"].isin(list(not_replayed)).to_numpy() if "domain" in nested else None
    assigned = by_call_key(nested, assigned_keys) if assigned_keys is not None else None
    projected, work, _ = attribute(nested, gpu, runtime, captured=captured, replayable=replayable, assigned=assigned)
    with_ops = projected[projected["gpu_op_count"] > 0]
    children = with_ops[with_ops["parent_range_id"] >= 0].groupby("parent_range_id").size()
    projected["child_count"] = projected["range_id"].map(children).fillna(0).astype(np.int64)
    return projected, work


def _top_level_op_time(cpu: pd.DataFrame, inner: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Per range (row of ``ranges``): summed duration of the operators inside it that are not
    nested in another operator inside it (so nested aten calls count once).

    An operator's parent operator lies in a range that is an ancestor-or-self
    of the operator's own range; the operator counts for the ranges strictly
    below that one.
    """
    n = len(ranges)
    total = np.zeros(n, dtype=np.float64)
    if not len(cpu) or not n:
        return total
    op_rows = cpu.reset_index(drop=True).assign(domain="op", _row=np.arange(len(cpu)))
    nested = nest_ranges(op_rows[["pid", "tid", "domain", "name", "start_ns", "end_ns", "_row"]], with_paths=False)
    rows = nested["_row"].to_numpy()
    parent_nested = nested["parent_range_id"].to_numpy()
    parent_row = np.full(len(op_rows), -1, dtype=np.int64)
    parent_row[rows] = np.where(parent_nested >= 0, rows[np.maximum(parent_nested, 0)], -1)
    inner_row = positions(ranges["range_id"].to_numpy(np.int64), inner)  # each op's innermost range, as a row
    parent_inner = np.where(parent_row >= 0, inner_row[np.maximum(parent_row, 0)], -2)
    duration = (op_rows["end_ns"] - op_rows["start_ns"]).to_numpy(np.float64)
    stopped = np.zeros(len(op_rows), dtype=bool)
    for level in ancestor_rows(ranges, inner):
        stopped |= (level >= 0) & (level == parent_inner)
        active = (level >= 0) & ~stopped
        np.add.at(total, level[active], duration[active])
    return total


def by_call_key(ranges: pd.DataFrame, keys: np.ndarray) -> np.ndarray:
    """Per GPU row, the ``range_id`` of the range whose ``call_key`` it carries (-1: a key of -1, or none
    of ``ranges``'): how an untagged graph replay's attention kernels reach their call
    (:mod:`headcount.attribute.untagged`), ``attribute(assigned=…)``'s argument.

    Args:
        ranges: nested ranges with ``call_key`` (-1 or null: a range no kernel is assigned to).
        keys: per GPU row, the key it carries (-1: none).
    """
    carried = pd.array(ranges["call_key"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    keyed = carried >= 0
    by_key = dict(zip(carried[keyed].tolist(), ranges["range_id"].to_numpy(np.int64)[keyed].tolist()))
    return np.array([by_key.get(k, -1) if k >= 0 else -1 for k in np.asarray(keys, dtype=np.int64).tolist()], dtype=np.int64)


def by_external_id(work: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """Range (``range_id``, -1 if none) whose id each GPU operation's launch
    carried as CUPTI external correlation id: the innermost headcount range
    open on the launching thread when the launch call ran. Exact: no
    timestamps are compared.

    Args:
        work: GPU rows with ``external_id`` (null: launched outside every range).
        ranges: nested ranges with ``external_id``.
    """
    ids = ranges["range_id"].to_numpy(np.int64)
    known = ranges["external_id"].to_numpy(np.int64)
    carried = pd.array(work["external_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    if not len(known) or not len(carried):
        return np.full(len(carried), -1, dtype=np.int64)
    order = np.argsort(known, kind="stable")
    # an id pushed again by an inner range belongs to the inner one: the last in nesting order
    at = (np.searchsorted(known[order], carried, side="right") - 1).clip(0)
    found = (carried >= 0) & (known[order][at] == carried)
    return np.where(found, ids[order][at], -1).astype(np.int64)
