"""Launch statistics (docs/architecture.md §6): latency, CPU launch cost, kernels per call,
gaps between kernels, theoretical occupancy — per range, per aggregate row,
and per attention implementation.

Definitions (all ``_ns``):

- ``launch_latency_ns`` of a kernel = kernel start − start of its launch API
  call (same correlation id); ``cpu_launch_cost_ns`` = API end − API start;
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
    """``launch_latency_p50_ns`` and ``_p99_ns`` of the kernels of each group."""
    cols = [*keys, "launch_latency_p50_ns", "launch_latency_p99_ns"]
    if "launch_latency_ns" not in kernels or not len(kernels):
        return pd.DataFrame(columns=cols)
    k = kernels.dropna(subset=["launch_latency_ns"])
    k = k[k["layer_name"].notna()]
    if not len(k):
        return pd.DataFrame(columns=cols)
    lat = k["launch_latency_ns"].astype("float64")
    grouped = lat.groupby([k[c] for c in keys], dropna=False)
    out = pd.DataFrame({"launch_latency_p50_ns": grouped.quantile(0.5), "launch_latency_p99_ns": grouped.quantile(0.99)}).reset_index()
    return out


def summary(layers: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Per implementation × phase: what launching attention costs.

    Returns:
        ``implementation``, ``phase``, ``calls`` (layer calls), ``kernels_per_call``,
        ``cpu_launch_cost_per_call_ns``, ``kernel_gap_per_call_ns``,
        ``gpu_time_per_call_ns``, ``launch_latency_p50_ns``, ``launch_latency_p99_ns``,
        ``queue_p50_ns``, ``submit_to_start_p50_ns``.
    """
    cols = ["implementation", "phase", "calls", "kernels_per_call", "cpu_launch_cost_per_call_ns", "kernel_gap_per_call_ns",
            "gpu_time_per_call_ns", "launch_latency_p50_ns", "launch_latency_p99_ns", "queue_p50_ns", "submit_to_start_p50_ns"]
    if not len(layers) or "kernel_count" not in layers:
        return pd.DataFrame(columns=cols)
    g = layers.groupby(["implementation", "phase"], dropna=False)
    out = g.agg(calls=("calls", "sum"), kernel_count=("kernel_count", "sum"), cost=("cpu_launch_cost_ns", "sum"),
                gap=("kernel_gap_ns", "sum"), time=("duration_ns", "sum")).reset_index()
    out["kernels_per_call"] = out["kernel_count"] / out["calls"]
    out["cpu_launch_cost_per_call_ns"] = out["cost"] / out["calls"]
    out["kernel_gap_per_call_ns"] = out["gap"] / out["calls"]
    out["gpu_time_per_call_ns"] = out["time"] / out["calls"]
    k = kernels[kernels["layer_name"].notna()] if len(kernels) and "layer_name" in kernels else kernels.iloc[0:0]
    stats = {}
    for (impl, phase), group in k.groupby(["implementation", "phase"], dropna=False) if len(k) else []:
        def q(col, p):
            if col not in group:
                return np.nan
            v = pd.to_numeric(group[col], errors="coerce").dropna()
            return float(v.quantile(p)) if len(v) else np.nan
        stats[(impl, phase)] = (q("launch_latency_ns", 0.5), q("launch_latency_ns", 0.99), q("queue_ns", 0.5), q("submit_to_start_ns", 0.5))
    rows = [stats.get((i, p), (np.nan,) * 4) for i, p in zip(out["implementation"], out["phase"])]
    out[["launch_latency_p50_ns", "launch_latency_p99_ns", "queue_p50_ns", "submit_to_start_p50_ns"]] = pd.DataFrame(rows, index=out.index)
    return out[cols]
