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
