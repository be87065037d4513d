"""How push/pop ranges nest, and which range holds a point or a span of time (docs/architecture.md §3).

Push/pop ranges are properly nested per thread and domain, so nesting is a
stack sweep (or, vectorized, a count of the ranges open at each start) and
"innermost open range at time t" is a binary search followed by walking up
parents: columnar, no per-op Python loop. Shared by attribution
(:mod:`headcount.attribute.attribution`) and CUDA graph replays
(:mod:`headcount.attribute.graphs`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common.arrays import codes_of, positions, unique_inverse

RANGE_KEYS = ["pid", "tid", "domain"]


def nest_ranges(ranges: pd.DataFrame, keys: list[str] = RANGE_KEYS, with_paths: bool = True) -> pd.DataFrame:
    """Add ``range_id``, ``parent_range_id``, ``depth`` (0 = outermost) and
    ``path`` (names joined with ``/``, outermost first) to push/pop ranges.

    A range's parent is the tightest range of the same group that contains it
    (the rule of nsys's ``nvtx_gpu_proj_trace``): found by counting open ranges
    (vectorized) when ranges nest properly, else by a stack sweep.

    Args:
        ranges: columns ``pid``, ``tid``, ``name``, ``start_ns``, ``end_ns`` and the ``keys``;
            an existing ``range_id`` column is kept (else the row position is used).
        keys: ranges nest within groups of these columns: per thread and domain
            by default; nsys nests all domains of a thread together (``["pid", "tid"]``).
        with_paths: build the ``path`` strings (one new string per range: on
            millions of ranges the largest cost in time and memory).

    Returns:
        A copy sorted by (keys, start, -end); ``parent_range_id`` is -1 for outermost ranges.
    """
    out = ranges.sort_values(keys + ["start_ns", "end_ns"], ascending=[True] * (len(keys) + 1) + [False], kind="stable")
    out = out.reset_index(drop=True)
    n = len(out)
    group_ids = _runs(out, keys)
    starts = out["start_ns"].to_numpy(dtype=np.int64)
    ends = out["end_ns"].to_numpy(dtype=np.int64)
    parent, depth, improper = _nest_by_counting(group_ids, starts, ends)
    if improper.any():  # ranges that overlap without nesting: nsys's tightest-container rule
        parent, depth = _nest_by_tightest(group_ids, starts, ends, parent, improper)
    if with_paths:
        out["path"] = path_categories(out["name"], parent, depth)
    if "range_id" not in out.columns:
        out["range_id"] = np.arange(n, dtype=np.int64)
    ids = out["range_id"].to_numpy(dtype=np.int64)
    out["parent_range_id"] = np.where(parent >= 0, ids[np.maximum(parent, 0)], -1)
    out["depth"] = depth
    out["nested"] = ~improper[group_ids] if n else np.zeros(0, dtype=bool)  # False: group with partial overlaps
    return out


def _runs(frame: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Each row's group of equal ``keys`` (nulls a group of their own), numbered 0, 1, … in row order, for a frame
    sorted by ``keys``: a group is a run of equal values (what ``groupby(keys, sort=False).ngroup()`` gives it,
    without hashing millions of rows)."""
    change = np.zeros(len(frame), dtype=bool)
    change[:1] = True
    for key in keys:
        codes = codes_of(frame[key])[0]
        change[1:] |= codes[1:] != codes[:-1]
    return np.cumsum(change) - 1


def path_categories(names: pd.Series, parent: np.ndarray, depth: np.ndarray) -> pd.Categorical:
    """Each range's path (names joined with ``/``, outermost first) as a
    Categorical: a path is numbered by (its parent's path number, its own
    name's code), level by level, so only the distinct paths (hundreds, where
    ranges are millions) ever become strings.

    Args:
        names: range names (null names count as empty).
        parent: row of each range's parent (-1: none); depth: 0 = outermost.
    """
    n = len(names)
    if n == 0:
        return pd.Categorical([], categories=pd.Index([], dtype=object))
    name_codes, name_values = pd.factorize(names.array if hasattr(names, "array") else names)
    name_codes = name_codes.astype(np.int64)
    width = len(name_values) + 1
    path = np.full(n, -1, dtype=np.int64)
    parent_path, path_name = [], []
    for d in range(int(depth.max()) + 1):
        rows = np.flatnonzero(depth == d)
        above = path[parent[rows]] if d else np.full(len(rows), -1, dtype=np.int64)
        keys, inverse = unique_inverse((above + 1) * width + (name_codes[rows] + 1))
        path[rows] = len(parent_path) + inverse.reshape(-1)
        parent_path.extend((keys // width - 1).tolist())
        path_name.extend((keys % width - 1).tolist())
    labels = [str(v) for v in name_values]
    strings: list[str] = []
    for up, name in zip(parent_path, path_name):
        own = labels[name] if name >= 0 else ""
        strings.append(own if up < 0 else strings[up] + "/" + own)
    # two (parent, name) pairs can spell one string (a name holding '/'): one category each
    codes, categories = pd.factorize(np.array(strings, dtype=object))
    return pd.Categorical.from_codes(codes[path], categories=pd.Index(categories, dtype=object))


def _nest_by_counting(group_ids, starts, ends):
    """Parent row and depth of ranges sorted by (group, start, -end), vectorized:
    a range's depth is the number of ranges open at its start, its parent the
    last range one level up that started before it. Exact where ranges nest
    properly (push/pop ranges, and ranges left open at the end of a capture).

    Returns:
        ``(parent, depth, improper)``: ``improper[g]`` is True for a group in
        which some found parent does not contain its child (partial overlaps).
    """
    n = len(starts)
    parent = np.full(n, -1, dtype=np.int64)
    n_groups = int(group_ids.max()) + 1 if n else 0
    if n == 0:
        return parent, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    depth = depths(group_ids, starts, ends)
    for d in range(1, int(depth.max()) + 1):
        children = np.flatnonzero(depth == d)
        candidates = np.flatnonzero(depth == d - 1)
        pos = np.searchsorted(candidates, children) - 1
        parent[children] = np.where(pos >= 0, candidates[np.maximum(pos, 0)], -1)
    p = np.maximum(parent, 0)
    bad = (parent >= 0) & ((group_ids[p] != group_ids) | (starts[p] > starts) | (ends[p] < ends))
    bad |= (parent < 0) & (depth != 0)
    improper = np.zeros(n_groups, dtype=bool)
    improper[group_ids[bad]] = True
    return parent, depth, improper


def depths(group_ids, starts, ends) -> np.ndarray:
    """Ranges open at each range's start, for ranges sorted by (group, start, -end)
    (group ids ascending): the ranges of its group sorted before it, less those
    that ended at or before its start (at equal times an end comes first)."""
    n = len(starts)
    lo = int(min(starts.min(), ends.min()))
    span = int(max(starts.max(), ends.max())) - lo + 1
    rows = np.arange(n, dtype=np.int64)
    sizes = np.bincount(group_ids)
    group_first = np.repeat(np.cumsum(sizes) - sizes, sizes)  # also where the group's ends begin once sorted
    if (int(group_ids.max()) + 1) * span < 2**62:  # one sort of int64 keys: (group, end)
        base = group_ids.astype(np.int64) * span
        ended_keys = np.sort(base + (ends - lo))
        ended = np.searchsorted(ended_keys, base + (starts - lo), side="right") - group_first
        return rows - group_first - ended
    return depths_by_events(group_ids, starts, ends)  # keys too wide for one integer


def depths_by_events(group_ids, starts, ends) -> np.ndarray:
    """:func:`depths` by sorting start and end events (any key width)."""
    n = len(starts)
    rows = np.arange(n, dtype=np.int64)
    ev_group = np.concatenate([group_ids, group_ids])
    ev_time = np.concatenate([starts, ends])
    ev_kind = np.concatenate([np.ones(n, np.int8), np.zeros(n, np.int8)])  # at equal times, ends first
    ev_row = np.concatenate([rows, rows])
    order = np.lexsort((ev_row, ev_kind, ev_time, ev_group))
    open_after = np.cumsum(np.where(ev_kind[order] == 1, 1, -1))
    is_start = ev_kind[order] == 1
    depth = np.empty(n, dtype=np.int64)
    depth[ev_row[order][is_start]] = open_after[is_start] - 1
    return depth


def _nest_by_tightest(group_ids, starts, ends, parent, improper, block: int = 2048):
    """Parents in groups with partial overlaps: the containing range with the
    least slack, (child start − parent start) + (parent end − child end), as
    nsys picks it; depth follows the parents. Quadratic in the group's size,
    so used only where ranges do not nest."""
    parent = parent.copy()
    for g in np.flatnonzero(improper):
        rows = np.flatnonzero(group_ids == g)
        s, e = starts[rows], ends[rows]
        for lo in range(0, len(rows), block):
            cs, ce = s[lo:lo + block, None], e[lo:lo + block, None]
            contains = (s[None, :] <= cs) & (e[None, :] >= ce)
            # identical intervals: the earlier row is the parent (no cycles)
            cols, own = np.arange(len(rows))[None, :], np.arange(lo, lo + len(cs))[:, None]
            contains &= ~((s[None, :] == cs) & (e[None, :] == ce)) | (cols < own)
            contains[np.arange(len(cs)), np.arange(lo, lo + len(cs))] = False
            slack = np.where(contains, (cs - s[None, :]) + (e[None, :] - ce), np.iinfo(np.int64).max)
            best = slack.argmin(axis=1)
            parent[rows[lo:lo + block]] = np.where(contains.any(axis=1), rows[best], -1)
    depth = np.zeros(len(parent), dtype=np.int64)
    cur = parent.copy()
    for _ in range(len(parent)):  # depth = length of the parent chain
        live = cur >= 0
        if not live.any():
            break
        depth[live] += 1
        cur[live] = parent[cur[live]]
    return parent, depth


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
        end_col: if given, the range must also contain this time (the end of
            the CPU op or of the launch call); ``None`` for a point in time.
    """
    result = np.full(len(ops), -1, dtype=np.int64)
    if len(ops) == 0 or len(ranges) == 0:
        return result
    r_start = ranges["start_ns"].to_numpy()
    r_end = ranges["end_ns"].to_numpy()
    r_parent = ranges["parent_range_id"].to_numpy()
    r_ids = ranges["range_id"].to_numpy(dtype=np.int64)
    parent_pos = positions(r_ids, r_parent)
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
        # walk up until the range contains the op (at most the nesting depth)
        while True:
            bad = (cand >= 0) & (r_end[np.maximum(cand, 0)] < t_end)
            if not bad.any():
                break
            cand[bad] = parent_pos[cand[bad]]
        result[op_idx] = np.where(cand >= 0, r_ids[np.maximum(cand, 0)], -1)
    return result


def ancestor_rows(ranges: pd.DataFrame, innermost: np.ndarray) -> list[np.ndarray]:
    """Level by level, the row (position in ``ranges``) of each op's
    ancestor-or-self range, starting from its innermost range (``innermost``:
    a ``range_id`` per op, -1 for none); -1 past the root."""
    ids = ranges["range_id"].to_numpy(dtype=np.int64)
    parent_row = positions(ids, ranges["parent_range_id"].to_numpy(dtype=np.int64))
    levels = []
    cur = positions(ids, np.asarray(innermost, dtype=np.int64))
    while (cur >= 0).any():
        levels.append(cur.copy())
        cur = np.where(cur >= 0, parent_row[np.maximum(cur, 0)], -1)
    return levels
