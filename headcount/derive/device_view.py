"""The device's view of a window: unions of GPU intervals, how much of a window they cover, and the
gaps between them (docs/reading-a-report.md § Triage).

A step's window is seen from the device: busy is every GPU operation of the device (all streams,
whatever step launched it) inside the window, so that in pipelined work, where the next step's
input copies and collectives run during this step, the device running them is not called idle.
Arrays in, arrays out; times are float64 nanoseconds relative to one origin (exact for 104 days).
"""

from __future__ import annotations

import numpy as np

from headcount.derive.launch import previous_end


def pieces(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of each group's intervals as disjoint pieces: (group, piece start, piece end), sorted by
    group then start (ns). Empty intervals add nothing."""
    if not len(groups):
        empty = np.zeros(0)
        return np.zeros(0, dtype=np.int64), empty, empty
    order = np.lexsort((starts, groups))
    g, s, e = groups[order].astype(np.int64), starts[order].astype(np.float64), ends[order].astype(np.float64)
    lo = float(min(s.min(), e.min()))
    prev = previous_end(g, np.rint(e - lo).astype(np.int64)) + lo
    new = np.isnan(prev) | (s > prev)  # a piece begins where nothing earlier of its group reaches
    piece_g = g[new]
    piece_s = s[new]
    piece_e = np.maximum.reduceat(e, np.flatnonzero(new)) if len(e) else e
    keep = piece_e > piece_s
    return piece_g[keep], piece_s[keep], piece_e[keep]


def covered(union: tuple[np.ndarray, np.ndarray, np.ndarray], groups: np.ndarray, x: np.ndarray,
            y: np.ndarray) -> np.ndarray:
    """For each query interval ``[x, y)`` of group ``groups``: how much of it the group's union
    (:func:`pieces`) covers (ns; 0 where the group has none)."""
    out = np.zeros(len(groups))
    piece_g, piece_s, piece_e = union
    if not len(groups) or not len(piece_g):
        return out
    for group in np.unique(groups):
        mine = np.flatnonzero(groups == group)
        lo, hi = np.searchsorted(piece_g, group, side="left"), np.searchsorted(piece_g, group, side="right")
        if lo == hi:
            continue
        s, e = piece_s[lo:hi], piece_e[lo:hi]
        before = np.r_[0.0, np.cumsum(e - s)]  # union length of the pieces before each one

        def upto(t):  # union length before time t
            k = np.searchsorted(s, t, side="right")
            inside = np.clip(t - s[np.maximum(k - 1, 0)], 0.0, (e - s)[np.maximum(k - 1, 0)])
            return before[k - 1 + (k == 0)] * (k > 0) + np.where(k > 0, inside, 0.0)

        out[mine] = np.maximum(upto(y[mine]) - upto(x[mine]), 0.0)
    return out


def gaps(groups: np.ndarray, start: np.ndarray, end: np.ndarray, end_int: np.ndarray, origin: int,
         launch_start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The gaps between each group's union pieces: (group, gap start ``a``, gap end ``b``, the op that
    ends it). The op ending a gap is the earliest to start at ``b`` (of several: the one whose launch
    call began first)."""
    order = np.lexsort((np.nan_to_num(launch_start, nan=np.inf), start, groups))
    g_o, start_o = groups[order], start[order]
    prev_end = previous_end(g_o, end_int[order] - origin)
    at = np.flatnonzero(~np.isnan(prev_end) & (start_o > prev_end))
    return g_o[at], prev_end[at], start_o[at], order[at]


def in_windows(gap_group: np.ndarray, a: np.ndarray, b: np.ndarray, values: dict[str, np.ndarray],
               row_group: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> dict[str, np.ndarray]:
    """Per window ``[w0, w1]`` of group ``row_group``: the sum of each of ``values`` over the group's gaps
    that lie inside it. A window begins at an operation's start and ends at one's end, so no gap crosses
    its edges: a gap is in or out whole."""
    out = {name: np.zeros(len(row_group)) for name in values}
    for group in np.unique(row_group):
        rows = np.flatnonzero(row_group == group)
        mine = np.flatnonzero(gap_group == group)
        if not len(mine):
            continue
        order = mine[np.argsort(a[mine], kind="stable")]
        lo = np.searchsorted(a[order], w0[rows], side="left")
        hi = np.searchsorted(b[order], w1[rows], side="right")
        hi = np.maximum(hi, lo)
        for name, v in values.items():
            total = np.r_[0.0, np.cumsum(v[order])]
            out[name][rows] = total[hi] - total[lo]
    return out


def overlapping(keys: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """Whether each window ``[w0, w1)`` overlaps another window of the same key. Sorted by start, a window
    overlaps an earlier one where it starts before the latest earlier end, and a later one where it ends
    after the next start."""
    out = np.zeros(len(keys), dtype=bool)
    if len(keys) < 2:
        return out
    order = np.lexsort((w0, keys))
    k, s, e = keys[order].astype(np.int64), w0[order].astype(np.float64), w1[order].astype(np.float64)
    first = np.r_[True, k[1:] != k[:-1]]
    earlier = np.full(len(e), -np.inf)
    earlier[1:] = e[:-1]
    earlier[first] = -np.inf
    block = np.cumsum(first) - 1  # running maximum within each key: lift keys apart by rank
    lift = block * (float(np.nanmax(e) - np.nanmin(s)) + 1.0)
    latest = np.maximum.accumulate(earlier + lift) - lift
    later = np.r_[s[1:], np.inf]
    later[np.r_[first[1:], True]] = np.inf
    out[order] = (s < latest) | (e > later)
    return out
