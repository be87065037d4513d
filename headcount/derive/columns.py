"""Big columns as integer codes and relative times: what :mod:`headcount.derive.steps` and the modules beside it
work on (a large export's process holds a million operations; text is looked at once per distinct value)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def codes(values) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes (-1: null) and the distinct values of a column, categorical or
    not, without a Python object per row (a large export's kernels are categorical)."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        return np.asarray(cat.codes, dtype=np.int64), np.asarray(cat.categories, dtype=object)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def combine(*parts: tuple[np.ndarray, int]) -> np.ndarray:
    """One int64 per row from several codes (each ``(codes, number of distinct values)``,
    -1 for null): equal exactly where every part is equal."""
    out = np.zeros(len(parts[0][0]), dtype=np.int64)
    for codes, n in parts:
        out = out * (n + 1) + (codes + 1)
    return out


def matches(uniques: np.ndarray, pattern, case: bool = True) -> np.ndarray:
    """Per distinct name (plus a last False for null), whether it matches ``pattern``."""
    return np.append(pd.Series(uniques, dtype=object).astype(str).str.contains(pattern, case=case, regex=True).to_numpy(dtype=bool), False)


def relative(values, origin: int) -> np.ndarray:
    """A time column less ``origin`` (float64 ns, NaN for null)."""
    numbers = pd.to_numeric(values, errors="coerce")
    if pd.api.types.is_integer_dtype(numbers.dtype):  # subtracted as integers: float64 would round to 256 ns first
        return (pd.array(numbers, dtype="Int64") - origin).to_numpy(np.float64, na_value=np.nan)
    return (numbers.astype("Float64") - origin).to_numpy(np.float64, na_value=np.nan)
