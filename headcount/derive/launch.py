"""Launch statistics (docs/architecture.md §6): latency, CPU launch cost, kernels per call,
gaps between kernels, theoretical occupancy — per range, per aggregate row,
and per attention implementation.

Definitions (all ``_ns``):

- ``launch_latency_ns`` of a kernel = kernel start − start of its launch API
  call (same correlation id), **only where its stream was idle when the
  launch call returned** (no earlier work of its stream still running): the
  time launching took. Where the stream was still busy, the kernel waited
  behind earlier work, and that is ``queue_delay_ns`` = kernel start − end
  of its launch call (null where the stream was idle). The two never hold for
  one kernel, and ``cpu_launch_cost_ns`` (API end − API start) + either of
  them = start − API start. A stream is (process, device, stream); its
  earlier work is every GPU operation of it that started before;
- ``queue_ns`` = submitted − queued, ``submit_to_start_ns`` = start −
  submitted (CUPTI latency timestamps; null where not recorded);
- per range: ``kernel_busy_ns`` = the union of its kernels' execution
  intervals (kernels of nested ranges included), ``kernel_gap_ns`` = its
  GPU-projected span − busy time: the time the GPU spent between this
  range's kernels (launch overhead, synchronization, other streams' work).

Tables in, tables out; no I/O.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def kernel_columns(k: pd.DataFrame) -> pd.DataFrame:
    """Add ``queue_ns`` and ``submit_to_start_ns`` to a kernels table (in place; returned)."""
    if "queued_ns" in k and "submitted_ns" in k:
        k["queue_ns"] = (k["submitted_ns"] - k["queued_ns"]).astype("Float64")
        k["submit_to_start_ns"] = (k["start_ns"] - k["submitted_ns"]).astype("Float64")
    return k


def latency_columns(k: pd.DataFrame) -> pd.DataFrame:
    """Add ``launch_latency_ns``, ``queue_delay_ns`` and ``cpu_launch_cost_ns`` (see the module docstring) to a
    kernels table's GPU rows (``start_ns``, ``end_ns``, ``api_start_ns``, ``api_end_ns``, ``pid``, ``device``,
    ``stream``, ``kind``); null where the launch call is not recorded. Whole nanoseconds (int64: float64
    loses them at today's epoch times). In place; returned."""
    def ints(col):
        values = pd.array(pd.to_numeric(k[col], errors="coerce"), dtype="Int64")
        return values.to_numpy(np.int64, na_value=0), ~np.asarray(pd.isna(values), dtype=bool)

    api_start, has_start = ints("api_start_ns")
    api_end, has_end = ints("api_end_ns")
    start, has = ints("start_ns")
    gpu = k["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy(dtype=bool) if "kind" in k else np.ones(len(k), dtype=bool)
    busy_until = np.full(len(k), np.iinfo(np.int64).min, dtype=np.int64)  # no earlier work: idle
    rows = np.flatnonzero(gpu & has)
    if len(rows):
        keys = [c for c in ("pid", "device", "stream") if c in k]
        stream = (k.iloc[rows].groupby(keys, dropna=False, observed=True, sort=False).ngroup().to_numpy(np.int64) if keys
                  else np.zeros(len(rows), dtype=np.int64))
        s_int = start[rows]
        e_int = np.maximum(pd.array(k["end_ns"].iloc[rows], dtype="Int64").to_numpy(np.int64, na_value=0), s_int)
        order = np.lexsort((s_int, stream))
        lo = int(s_int.min())
        prev = previous_end(stream[order], e_int[order] - lo)  # the stream's earlier work's last end, relative
        busy_until[rows[order]] = np.where(np.isnan(prev), np.iinfo(np.int64).min, np.nan_to_num(prev).astype(np.int64) + lo)
    known = gpu & has & has_start & has_end
    waited = known & (busy_until > api_end)
    def column(values, where):
        out = pd.array(np.where(where, values, 0).astype(np.float64), dtype="Float64")  # differences: exact in float64
        out[~where] = pd.NA
        return out

    k["launch_latency_ns"] = column(start - api_start, known & ~waited)
    k["queue_delay_ns"] = column(start - api_end, waited)
    k["cpu_launch_cost_ns"] = column(api_end - api_start, known)
    return k


def previous_end(groups: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For rows sorted by (group, start), ``ends`` whole nanoseconds ≥ 0 (int64):
    the latest end among the group's earlier rows (nan at a group's first row),
    as float64. One pass of ``np.maximum.accumulate`` over the ends lifted by
    group (each group above the last), where int64 holds that; else per group
    with pandas (damaged timestamps spanning centuries)."""
    span = int(ends.max()) + 1 if len(ends) else 1
    n = int(groups.max()) + 1 if len(groups) else 0
    if span * (n + 1) < 2**62:
        lift = groups.astype(np.int64) * span
        running = (np.maximum.accumulate(ends + lift) - lift).astype(np.float64)
    else:
        running = pd.Series(ends).groupby(groups, sort=False).cummax().to_numpy(np.float64)
    prev = np.empty(len(ends))
    prev[1:] = running[:-1]
    if len(ends):
        prev[0] = np.nan
        prev[1:][groups[1:] != groups[:-1]] = np.nan
    return prev


def union_length(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """Per group code (0..n-1), the length of the union of its intervals (ns)."""
    if not len(groups):
        return np.zeros(n)
    order = np.lexsort((starts, groups))
    g, s, e = groups[order].astype(np.int64), starts[order].astype(np.float64), ends[order].astype(np.float64)
    lo = float(min(s.min(), e.min()))  # relative to the earliest time: whole nanoseconds in int64
    prev = previous_end(g, np.rint(e - lo).astype(np.int64)) + lo
    begin = np.where(np.isnan(prev), s, np.maximum(s, prev))
    return np.bincount(g, weights=np.maximum(e - begin, 0.0), minlength=n)


def per_range(ranges: pd.DataFrame, work: pd.DataFrame, levels: list[np.ndarray], occupancy: pd.Series | None = None) -> pd.DataFrame:
    """Launch figures of every range, its nested ranges' kernels included.

    Args:
        ranges: nested ranges with ``range_id``, ``parent_range_id``,
            ``gpu_start_ns``, ``gpu_end_ns``.
        work: GPU rows with ``start_ns``, ``end_ns``, ``api_start_ns``, ``api_end_ns``.
        levels: level by level, the row of ``ranges`` holding each work row, from its
            innermost range outwards (-1: none;
            :func:`~headcount.attribute.nesting.ancestor_rows`).
        occupancy: theoretical occupancy (%) of each work row.

    Returns:
        ``range_id``, ``kernel_busy_ns``, ``kernel_gap_ns``, ``cpu_launch_cost_ns``,
        ``theoretical_occupancy_x_busy`` (occupancy × kernel time, for time
        weighting); null where the range launched nothing.
    """
    n = len(ranges)  # per row of ranges
    busy = np.zeros(n)
    cost = np.zeros(n)
    cost_known = np.zeros(n, dtype=bool)
    occ_t = np.zeros(n)
    occ_known = np.zeros(n, dtype=bool)
    if n and len(work):
        work = work.reset_index(drop=True)
        start = work["start_ns"].to_numpy(np.float64)
        end = work["end_ns"].to_numpy(np.float64)
        api = (pd.to_numeric(work["api_end_ns"], errors="coerce") - pd.to_numeric(work["api_start_ns"], errors="coerce")).to_numpy(np.float64)
        occ = occupancy.to_numpy(np.float64) if occupancy is not None else np.full(len(work), np.nan)
        # one union per range over the kernels of all its levels (a range's own
        # kernels and its children's overlap in time)
        pairs = [(level[level >= 0], np.flatnonzero(level >= 0)) for level in levels]
        if pairs:
            owner = np.concatenate([p[0] for p in pairs])
            row = np.concatenate([p[1] for p in pairs])
            busy = union_length(owner, start[row], end[row], n)
        for level in levels:
            sel = level >= 0
            has_api = sel & ~np.isnan(api)
            np.add.at(cost, level[has_api], api[has_api])
            cost_known[level[has_api]] = True
            has_occ = sel & ~np.isnan(occ)
            np.add.at(occ_t, level[has_occ], occ[has_occ] * (end - start)[has_occ])
            occ_known[level[has_occ]] = True
    ids = ranges["range_id"].to_numpy(np.int64)
    span = (pd.to_numeric(ranges["gpu_end_ns"], errors="coerce") - pd.to_numeric(ranges["gpu_start_ns"], errors="coerce")).to_numpy(np.float64)
    launched = ~np.isnan(span)
    return pd.DataFrame({
        "range_id": ids,
        "kernel_busy_ns": np.where(launched, busy, np.nan),
        "kernel_gap_ns": np.where(launched, span - busy, np.nan),
        "cpu_launch_cost_ns": np.where(cost_known, cost, np.nan),
        "theoretical_occupancy_x_busy": np.where(occ_known, occ_t, np.nan),
    })


def latency_quantiles(kernels: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of the attention kernels: ``launch_latency_p50_ns``/``_p99_ns`` (kernels launched onto an idle
    stream), ``queue_delay_p50_ns``/``_p99_ns`` (kernels that waited behind earlier work) and
    ``queued_kernels_pct`` (the share of the group's launched kernels that waited)."""
    cols = [*keys, "launch_latency_p50_ns", "launch_latency_p99_ns", "queue_delay_p50_ns", "queue_delay_p99_ns", "queued_kernels_pct"]
    if "launch_latency_ns" not in kernels or not len(kernels):
        return pd.DataFrame(columns=cols)
    k = kernels[kernels["layer_name"].notna().to_numpy(dtype=bool)]
    queue = k["queue_delay_ns"] if "queue_delay_ns" in k else pd.Series(np.nan, index=k.index)
    lat, queue = pd.to_numeric(k["launch_latency_ns"], errors="coerce"), pd.to_numeric(queue, errors="coerce")
    launched = lat.notna() | queue.notna()
    if not launched.any():
        return pd.DataFrame(columns=cols)
    by = [k[c] for c in keys]
    out = pd.DataFrame({
        "launch_latency_p50_ns": lat.groupby(by, dropna=False).quantile(0.5),
        "launch_latency_p99_ns": lat.groupby(by, dropna=False).quantile(0.99),
        "queue_delay_p50_ns": queue.groupby(by, dropna=False).quantile(0.5),
        "queue_delay_p99_ns": queue.groupby(by, dropna=False).quantile(0.99),
        "queued_kernels_pct": 100.0 * queue.notna().groupby(by, dropna=False).sum() / launched.groupby(by, dropna=False).sum(),
    }).reset_index()
    return out[cols]


def summary(layers: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Per implementation × phase: what launching attention costs.

    Returns:
        ``implementation``, ``phase``, ``calls`` (layer calls), ``kernels_per_call``,
        ``cpu_launch_cost_per_call_ns``, ``kernel_gap_per_call_ns``,
        ``gpu_time_per_call_ns``, ``launch_latency_p50_ns``, ``launch_latency_p99_ns`` (kernels launched onto an
        idle stream), ``queue_delay_p50_ns``, ``queued_kernels_pct`` (kernels that waited behind earlier work),
        ``queue_p50_ns``, ``submit_to_start_p50_ns`` (CUPTI's latency timestamps, where recorded).
    """
    cols = ["implementation", "phase", "calls", "kernels_per_call", "cpu_launch_cost_per_call_ns", "kernel_gap_per_call_ns",
            "gpu_time_per_call_ns", "launch_latency_p50_ns", "launch_latency_p99_ns", "queue_delay_p50_ns", "queued_kernels_pct",
            "queue_p50_ns", "submit_to_start_p50_ns"]
    if not len(layers) or "kernel_count" not in layers:
        return pd.DataFrame(columns=cols)
    keys = ["implementation", "phase"]
    g = layers.groupby(keys, dropna=False)
    out = g.agg(calls=("calls", "sum"), kernel_count=("kernel_count", "sum"), cost=("cpu_launch_cost_ns", "sum"),
                gap=("kernel_gap_ns", "sum"), time=("duration_ns", "sum")).reset_index()
    out["kernels_per_call"] = out["kernel_count"] / out["calls"]
    out["cpu_launch_cost_per_call_ns"] = out["cost"] / out["calls"]
    out["kernel_gap_per_call_ns"] = out["gap"] / out["calls"]
    out["gpu_time_per_call_ns"] = out["time"] / out["calls"]
    # the launch latency, queue delay and queued share of the attention kernels: as the layers and heads get them
    out = out.merge(latency_quantiles(kernels, keys).astype({k: object for k in keys}), on=keys, how="left")
    k = kernels[kernels["layer_name"].notna()] if len(kernels) and "layer_name" in kernels else kernels.iloc[0:0]
    for col, name in (("queue_ns", "queue_p50_ns"), ("submit_to_start_ns", "submit_to_start_p50_ns")):  # CUPTI's timestamps
        p50 = (pd.to_numeric(k[col], errors="coerce").groupby([k[c] for c in keys], dropna=False).median().rename(name).reset_index()
               if col in k and len(k) else pd.DataFrame(columns=[*keys, name]))
        out = out.merge(p50.astype({c: object for c in keys}), on=keys, how="left")
    out = out.reindex(columns=cols)
    out[cols[7:]] = out[cols[7:]].astype("float64")  # NaN where none, as the figures above
    return out
