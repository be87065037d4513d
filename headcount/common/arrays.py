"""Array helpers shared by the stages (parsers, attribution, labels)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of an integer array, by hashing
    (pandas' factorize) rather than sorting every value: the few distinct keys
    are sorted, not the millions of rows.

    Returns:
        ``(keys, inverse)``: the sorted distinct values, and each value's position among them.
    """
    codes, uniques = pd.factorize(np.asarray(values), sort=False)
    order = np.argsort(uniques, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return np.asarray(uniques)[order], rank[codes]


def positions(ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The row of each of ``values`` among ``ids`` (unique integers), -1 where absent.

    Memory follows the rows, never the largest id: NVTX range ids are the
    export's row ids, so one process's ranges of a large export carry ids in
    the tens of millions. Where the ids are dense (their span at most 4× the
    rows) a lookup array over the span is used, else a binary search over the
    sorted ids (16 bytes a row; a hash table held ~4× that at its peak).
    """
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if not len(ids):
        return np.full(len(values), -1, dtype=np.int64)
    low, high = int(ids.min()), int(ids.max())
    span = high - low + 1
    if span <= 4 * len(ids) + 1024 and len(ids) < 2**31:
        lookup = np.full(span, -1, dtype=np.int32)
        lookup[ids - low] = np.arange(len(ids), dtype=np.int32)
        rel = values - low
        inside = (rel >= 0) & (rel < span)
        out = np.full(len(values), -1, dtype=np.int64)
        out[inside] = lookup[rel[inside]]
        return out
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    at = np.minimum(np.searchsorted(ordered, values), len(ids) - 1)
    return np.where(ordered[at] == values, order[at], -1)
