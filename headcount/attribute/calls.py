"""Pair range instances with the attention calls the tagger logged.

The tagger logs one :class:`~headcount.call_log.CallLog` per layer
range (and per head range in head mode), in the order it opens them. A
layer's ranges of one phase never overlap on one thread, so the k-th range
instance of ``(phase, layer, head)`` in time order is the k-th log entry with
that key. Ranges without a log entry (captured by a tool the tagger did not
log for, or manual ``attention_range`` blocks) keep null shapes.
"""

from __future__ import annotations

import pandas as pd

SHAPE_COLUMNS = [
    "implementation", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "v_head_dim",
    "dtype", "dtype_bytes", "causal", "mask_elements", "mask_dtype_bytes", "mask_per_head", "sliding_window",
]


def calls_frame(calls) -> pd.DataFrame:
    """The tagger's log as a table: phase, layer_name, head, kv_head, model, signal, found_as, numbered_by, seq and shape columns."""
    rows = []
    for log in calls:
        row = {"phase": log.phase, "layer_name": log.layer_name, "head": log.head, "kv_head": log.kv_head, "model": log.model,
               "signal": log.signal, "found_as": log.found_as, "numbered_by": log.numbered_by}
        shape = log.shape
        for col in SHAPE_COLUMNS:
            row[col] = getattr(shape, col) if shape is not None else None
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["phase", "layer_name", "head", "kv_head", "model", "signal", "found_as", "numbered_by", *SHAPE_COLUMNS])
    frame["head"] = frame["head"].astype("Int64")
    frame["kv_head"] = frame["kv_head"].astype("Int64")
    frame["seq"] = frame.groupby(["phase", "layer_name", frame["head"].fillna(-1)], sort=False).cumcount()
    return frame


def attach_calls(attention_ranges: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Join call shapes onto attention ranges (layer or head ranges).

    Args:
        attention_ranges: ranges with ``phase``, ``layer_name``, ``head``, ``start_ns``.
        calls: output of :func:`calls_frame`.

    Returns:
        ``attention_ranges`` with ``kv_head``, ``model`` and the shape columns added.
    """
    ranges = attention_ranges.copy()
    head_key = ranges["head"].fillna(-1)
    ranges = ranges.assign(_h=head_key).sort_values("start_ns", kind="stable")
    ranges["seq"] = ranges.groupby(["phase", "layer_name", "_h"], sort=False).cumcount()
    calls = calls.assign(_h=calls["head"].fillna(-1)).drop(columns=["head"])
    merged = ranges.merge(calls, on=["phase", "layer_name", "_h", "seq"], how="left", suffixes=("", "_call"))
    return merged.drop(columns=["_h", "seq"]).sort_values("range_id", kind="stable").reset_index(drop=True)
