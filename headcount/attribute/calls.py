"""Pair range instances with the attention calls the tagger logged.

The tagger logs one :class:`~headcount.common.call_log.CallLog` per layer
range (and per head range in head mode), in the order it opens them. A
layer's ranges of one phase never overlap on one thread, so the k-th range
instance of ``(phase, layer, head)`` in time order is the k-th log entry with
that key. Ranges without a log entry (captured by a tool the tagger did not
log for, or manual ``attention_range`` blocks) keep null shapes.
"""

from __future__ import annotations

import numpy as np
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
        if shape is None:
            row["implementation"] = getattr(log, "implementation", None)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["phase", "layer_name", "head", "kv_head", "model", "signal", "found_as", "numbered_by", *SHAPE_COLUMNS])
    frame["head"] = frame["head"].astype("Int64")
    frame["kv_head"] = frame["kv_head"].astype("Int64")
    frame["seq"] = frame.groupby(["phase", "layer_name", frame["head"].fillna(-1)], sort=False).cumcount()
    return frame


def attach_calls(attention_ranges: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Join call shapes onto attention ranges (layer or head ranges).

    Args:
        attention_ranges: ranges with ``range_id``, ``phase``, ``layer_name``, ``head``, ``start_ns``.
        calls: output of :func:`calls_frame`.

    Returns:
        ``attention_ranges`` with ``kv_head``, ``model`` and the shape columns
        added (a column both have: the call's with the suffix ``_call``),
        in ``range_id`` order.
    """
    # paired in plain Python: a profiled window has tens to thousands of ranges, where a pandas
    # groupby and merge on four keys cost several milliseconds of fixed overhead each
    def keys(frame: pd.DataFrame) -> list[tuple]:
        return list(zip(frame["phase"], frame["layer_name"], frame["head"].fillna(-1).astype("int64")))

    logged = {(*key, seq): row for row, (key, seq) in enumerate(zip(keys(calls), calls["seq"]))}
    ranges = attention_ranges.sort_values("range_id", kind="stable").reset_index(drop=True)
    seen: dict[tuple, int] = {}
    row_of = np.full(len(ranges), -1, dtype=np.int64)
    range_keys = keys(ranges)
    for i in np.argsort(ranges["start_ns"].to_numpy(), kind="stable"):  # the k-th instance in time order
        key = range_keys[i]
        k = seen[key] = seen.get(key, -1) + 1
        row_of[i] = logged.get((*key, k), -1)
    shapes = calls.drop(columns=["phase", "layer_name", "head", "seq"])
    shapes = shapes.reindex(row_of).reset_index(drop=True)  # -1: no logged call, null shapes (as a left join)
    shapes.columns = [f"{c}_call" if c in ranges.columns else c for c in shapes.columns]
    for key in ("phase", "layer_name"):  # typed as a join on them would (a categorical joined on plain text: text)
        if ranges[key].dtype != calls[key].dtype:
            ranges[key] = ranges[key].astype(object)
    return pd.concat([ranges, shapes], axis=1)
