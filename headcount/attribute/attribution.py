"""Give each op or kernel its NVTX path, and each range its projected work.

One rule for every source (the rule nsys applies in its ``nvtx_gpu_proj_trace``
report): an op belongs to every range that, on the thread that launched it,
was open when it was launched. For a GPU kernel "launched" is the start of its
CUDA runtime/driver call (matched on correlation id within one process); for
a CPU operator it is the operator itself, which must lie wholly inside the
range (an autograd node that pops a range starts inside it and ends outside,
so it belongs to the parent).

Push/pop ranges are properly nested per thread and domain, so nesting is a
stack sweep and "innermost open range at time t" is a binary search followed
by walking up parents: columnar, no per-op Python loop.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RANGE_KEYS = ["pid", "tid", "domain"]


def nest_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """Add ``range_id``, ``parent_range_id``, ``depth`` (0 = outermost) and
    ``path`` (names joined with ``/``, outermost first) to push/pop ranges.

    Args:
        ranges: columns ``pid``, ``tid``, ``domain``, ``name``, ``start_ns``, ``end_ns``.

    Returns:
        A copy sorted by (pid, tid, domain, start, -end); ``range_id`` is the row
        position, ``parent_range_id`` is -1 for outermost ranges.
    """
    out = ranges.sort_values(RANGE_KEYS + ["start_ns", "end_ns"], ascending=[True] * 4 + [False], kind="stable")
    out = out.reset_index(drop=True)
    n = len(out)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    starts = out["start_ns"].to_numpy()
    ends = out["end_ns"].to_numpy()
    names = out["name"].to_numpy(dtype=object)
    paths = np.empty(n, dtype=object)
    group_ids = out.groupby(RANGE_KEYS, sort=False, dropna=False).ngroup().to_numpy()
    stack: list[int] = []
    current_group = None
    for i in range(n):
        if group_ids[i] != current_group:
            current_group = group_ids[i]
            stack.clear()
        # a range is inside the top of the stack iff the top contains it
        while stack and ends[i] > ends[stack[-1]]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = depth[stack[-1]] + 1
            paths[i] = paths[stack[-1]] + "/" + names[i]
        else:
            paths[i] = names[i]
        stack.append(i)
    out["range_id"] = np.arange(n, dtype=np.int64)
    out["parent_range_id"] = parent
    out["depth"] = depth
    out["path"] = paths
    return out


def innermost_range(
    ops: pd.DataFrame,
    ranges: pd.DataFrame,
    time_col: str = "start_ns",
    end_col: str | None = "end_ns",
) -> np.ndarray:
    """For each op, the ``range_id`` of the innermost range containing it, or -1.

    Args:
        ops: columns ``pid``, ``tid`` and ``time_col`` (and ``end_col``).
        ranges: output of :func:`nest_ranges`, restricted to one domain.
        time_col: the op's launch time (ns) on its thread.
        end_col: if given, the range must also contain this time (CPU ops);
            ``None`` for GPU kernels, whose launch call is a point in time.
    """
    result = np.full(len(ops), -1, dtype=np.int64)
    if len(ops) == 0 or len(ranges) == 0:
        return result
    r_start = ranges["start_ns"].to_numpy()
    r_end = ranges["end_ns"].to_numpy()
    r_parent = ranges["parent_range_id"].to_numpy()
    r_ids = ranges["range_id"].to_numpy()
    pos_of_id = {int(rid): pos for pos, rid in enumerate(r_ids)}
    parent_pos = np.array([pos_of_id.get(int(p), -1) for p in r_parent], dtype=np.int64)
    op_groups = ops.groupby(["pid", "tid"], sort=False).indices
    range_groups = ranges.groupby(["pid", "tid"], sort=False).indices
    op_time = ops[time_col].to_numpy()
    op_end = ops[end_col].to_numpy() if end_col else op_time
    for key, op_idx in op_groups.items():
        r_idx = range_groups.get(key)
        if r_idx is None:
            continue
        r_idx = np.sort(r_idx)  # nest_ranges order: by start within a thread
        starts = r_start[r_idx]
        t = op_time[op_idx]
        t_end = op_end[op_idx]
        cand = np.searchsorted(starts, t, side="right") - 1
        cand = np.where(cand >= 0, r_idx[np.maximum(cand, 0)], -1)
        # walk up until the range contains the op (bounded by the nesting depth)
        for _ in range(64):
            bad = (cand >= 0) & (r_end[np.maximum(cand, 0)] < t_end)
            if not bad.any():
                break
            cand[bad] = parent_pos[cand[bad]]
        result[op_idx] = np.where(cand >= 0, r_ids[np.maximum(cand, 0)], -1)
    return result


def ancestors_matrix(ranges: pd.DataFrame, innermost: np.ndarray) -> list[np.ndarray]:
    """Level by level, the ancestor ``range_id`` of each op (self first), -1 past the root."""
    parent_of = dict(zip(ranges["range_id"].to_numpy().tolist(), ranges["parent_range_id"].to_numpy().tolist()))
    lookup = np.full(int(ranges["range_id"].max()) + 2 if len(ranges) else 1, -1, dtype=np.int64)
    for rid, par in parent_of.items():
        lookup[rid] = par
    levels = []
    cur = innermost.copy()
    while (cur >= 0).any():
        levels.append(cur.copy())
        cur = np.where(cur >= 0, lookup[np.maximum(cur, 0)], -1)
    return levels


def project(ranges: pd.DataFrame, ops: pd.DataFrame, innermost: np.ndarray) -> pd.DataFrame:
    """Per range: ops launched inside it at any depth, first op start, last op end.

    Returns:
        ``ranges`` with ``op_count`` (0 where none), ``op_start_ns`` and ``op_end_ns``
        (null where none).
    """
    out = ranges.copy()
    n = int(out["range_id"].max()) + 1 if len(out) else 0
    count = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    starts = ops["start_ns"].to_numpy(dtype=np.int64) if len(ops) else np.zeros(0, np.int64)
    ends = ops["end_ns"].to_numpy(dtype=np.int64) if len(ops) else np.zeros(0, np.int64)
    for level in ancestors_matrix(out, innermost) if n else []:
        ok = level >= 0
        ids = level[ok]
        count += np.bincount(ids, minlength=n)
        np.minimum.at(first, ids, starts[ok])
        np.maximum.at(last, ids, ends[ok])
    ids = out["range_id"].to_numpy()
    out["op_count"] = count[ids] if n else np.zeros(0, np.int64)
    has = out["op_count"].to_numpy() > 0
    out["op_start_ns"] = pd.array(np.where(has, first[ids] if n else 0, 0), dtype="Int64")
    out["op_end_ns"] = pd.array(np.where(has, last[ids] if n else 0, 0), dtype="Int64")
    out.loc[~has, ["op_start_ns", "op_end_ns"]] = pd.NA
    return out
