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
    export's row ids, so one process's ranges of a large export can carry ids
    in the tens of millions. A lookup array is used where the ids are dense
    (largest id at most twice the rows), a hash table otherwise.
    """
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if not len(ids):
        return np.full(len(values), -1, dtype=np.int64)
    top = int(ids.max())
    if top < 2 * len(ids) + 1024 and int(ids.min()) >= 0:
        lookup = np.full(top + 1, -1, dtype=np.int64)
        lookup[ids] = np.arange(len(ids))
        inside = (values >= 0) & (values <= top)
        return np.where(inside, lookup[np.clip(values, 0, top)], -1)
    return pd.Index(ids).get_indexer(values).astype(np.int64, copy=False)
