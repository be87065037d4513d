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


def codes_of(values: pd.Series) -> tuple[np.ndarray, list]:
    """``(codes, distinct values)`` of a column, code -1 for null: a categorical's own codes over the categories its
    rows use, else pandas' factorize — never a Python object per row (millions of categorical names or ids cost
    seconds as ``astype(str)``/``astype(object)``)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        used = values.cat.remove_unused_categories()
        return used.cat.codes.to_numpy(), list(used.cat.categories)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, list(uniques)


def per_text(values: pd.Series, f) -> np.ndarray:
    """``f`` of each value's text — as ``values.astype(str)`` gives it, a missing value NaN — called once per
    distinct value (:func:`codes_of`).

    Returns:
        An object array aligned with ``values``.
    """
    codes, distinct = codes_of(values)
    results = np.empty(len(distinct) + 1, dtype=object)
    for i, value in enumerate(distinct):
        results[i] = f(str(value))
    if (codes < 0).any():  # code -1: a missing value
        results[-1] = f(np.nan)
    return results[codes]


def distinct_text(values: pd.Series) -> list:
    """The distinct values of ``values.astype(str)`` (a missing value as NaN), in no particular order (:func:`codes_of`)."""
    codes, distinct = codes_of(values)
    return [str(v) for v in distinct] + ([np.nan] if (codes < 0).any() else [])


def equals(values: pd.Series, text: str) -> np.ndarray:
    """Which of ``values`` are ``text`` (a missing value is not), as a bool array: a categorical compares its codes,
    an Arrow text column in Arrow, rather than one Python object made per row."""
    return np.asarray((values == text).fillna(False), dtype=bool)
