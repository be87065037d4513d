"""Phase, layer, head, level and step of ranges and of the operations inside them.

Columnar: a recording holds millions of ranges but a few hundred distinct
paths, so a path is parsed once (:func:`headcount.common.naming.parse_path`)
and its labels reach the rows by integer code (pandas Categoricals, which
Arrow writes as dictionary arrays). Nothing here loops over rows in Python.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common.arrays import positions, unique_inverse
from headcount.common.naming import MODULE, PHASES, parse_path

LEVELS = ["phase", "layer", "head", "other", "module"]


def as_categorical(values) -> pd.Categorical:
    """``values`` (strings, possibly Arrow-backed or already categorical) as a Categorical."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        return values.array if isinstance(values, pd.Series) else values
    codes, uniques = pd.factorize(values.array if isinstance(values, pd.Series) else values)
    return pd.Categorical.from_codes(codes, categories=pd.Index(np.asarray(uniques, dtype=object), dtype=object))


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its categorical columns as plain values (in place): for
    tables handed to users in memory, whose sorting and grouping must not
    follow category order."""
    for col in frame.columns[[isinstance(t, pd.CategoricalDtype) for t in frame.dtypes]]:
        frame[col] = frame[col].astype(object)
    return frame


def take_categorical(per_key: list, index: np.ndarray) -> pd.Categorical:
    """Row values from one value per key: ``per_key[index]`` (``None`` and index -1 give null)."""
    codes, uniques = pd.factorize(np.array(per_key, dtype=object))
    taken = np.where(index >= 0, codes[np.maximum(index, 0)] if len(codes) else -1, -1)
    return pd.Categorical.from_codes(taken, categories=pd.Index(np.asarray(uniques, dtype=object), dtype=object))


def take_int(per_key: list, index: np.ndarray) -> pd.arrays.IntegerArray:
    """Row integers from one value per key (``None`` and index -1 give null)."""
    values = np.array([-1 if v is None else v for v in per_key], dtype=np.int64)
    taken = np.where(index >= 0, values[np.maximum(index, 0)] if len(values) else -1, -1)
    missing = (index < 0) | (taken < 0) if len(values) else np.ones(len(index), dtype=bool)
    return pd.arrays.IntegerArray(np.where(missing, 0, taken), missing)


def label_ranges(ranges: pd.DataFrame, steps: pd.DataFrame, ours: np.ndarray | None = None) -> pd.DataFrame:
    """Add ``phase``, ``layer_name``, ``layer``, ``head``, ``level``
    (phase/layer/head/other) and ``step`` to nested ranges, in place.

    Args:
        ranges: :func:`~headcount.attribute.nesting.nest_ranges` output (``path``, ``name``,
            ``range_id``, ``parent_range_id``, ``start_ns``).
        steps: the ``step.N`` ranges (steps are matched by time, :func:`step_of`).
        ours: rows that follow headcount's naming scheme (default: all); the
            others keep null labels and level ``other``.

    Returns:
        ``ranges``.
    """
    n = len(ranges)
    path = as_categorical(ranges["path"])
    name = as_categorical(ranges["name"])
    ours = np.ones(n, dtype=bool) if ours is None else np.asarray(ours, dtype=bool)
    # a range's labels depend on (path, name, ours) only: one key per distinct triple
    width = len(name.categories) + 1
    triple = (path.codes.astype(np.int64) * width + name.codes.astype(np.int64) + 1) * 2 + ours
    keys, inverse = unique_inverse(triple)
    inverse = inverse.reshape(-1)
    key_ours = (keys % 2).astype(bool)
    key_name_code = (keys // 2) % width - 1
    key_path_code = (keys // 2) // width
    phase, layer_name, layer, head, level = [], [], [], [], []
    for p_code, n_code, mine in zip(key_path_code.tolist(), key_name_code.tolist(), key_ours.tolist()):
        label = parse_path(str(path.categories[p_code])) if p_code >= 0 and mine else None
        own = str(name.categories[n_code]) if n_code >= 0 else None
        if label is None:
            phase.append(None), layer_name.append(None), layer.append(None), head.append(None), level.append("other")
            continue
        phase.append(label.phase), layer_name.append(label.layer_name), layer.append(label.layer), head.append(label.head)
        if own is not None and own == label.phase:
            level.append("phase")
        elif own is not None and own == label.layer_name:
            level.append("layer")
        elif label.head is not None and own is not None and own.startswith("head."):
            level.append("head")
        else:
            level.append("other")
    # a range of ours directly under a phase that the naming scheme does not
    # know is a manual layer name (tag_attention(layer="my_block"))
    ids = ranges["range_id"].to_numpy(np.int64)
    parents = ranges["parent_range_id"].to_numpy(np.int64)
    parent_pos = positions(ids, parents)
    phase_codes = np.flatnonzero(name.categories.isin(list(PHASES)))
    parent_is_phase = (parent_pos >= 0) & np.isin(name.codes[np.maximum(parent_pos, 0)], phase_codes)
    level_codes = np.array([LEVELS.index(lv) for lv in level], dtype=np.int8)[inverse] if n else np.zeros(0, np.int8)
    manual = ours & parent_is_phase & (level_codes == LEVELS.index("other"))
    names_per_key = [str(name.categories[c]) if c >= 0 else None for c in key_name_code.tolist()]
    ranges["phase"] = take_categorical(phase, inverse)
    ranges["layer_name"] = take_categorical(layer_name + names_per_key, np.where(manual, inverse + len(keys), inverse))
    ranges["layer"] = take_int(layer, inverse)
    ranges["head"] = take_int(head, inverse)
    ranges["level"] = pd.Categorical.from_codes(np.where(manual, LEVELS.index("layer"), level_codes), categories=LEVELS)
    ranges["step"] = step_of(ranges["start_ns"].to_numpy(np.int64), steps)
    _label_modules(ranges, ours, name, parent_pos)
    return ranges


def _label_modules(ranges: pd.DataFrame, ours: np.ndarray, name: pd.Categorical, parent_pos: np.ndarray) -> None:
    """A range of ours named :data:`~headcount.common.naming.MODULE` gets level ``module`` and the phase and layer of
    the layer range it holds (under its phase range, and the recording's own module range where one nests between)."""
    module_code = np.flatnonzero(name.categories == MODULE)
    if not len(module_code):
        return
    is_module = ours & (name.codes == module_code[0])
    if not is_module.any():
        return
    level = ranges["level"].cat.codes.to_numpy().copy()
    level[is_module] = LEVELS.index("module")
    layer_rows = np.flatnonzero(level == LEVELS.index("layer"))
    holder = parent_pos[layer_rows]
    for _ in range(4):  # up from each layer range (through its phase range) to the nearest module range of ours
        found = (holder >= 0) & is_module[np.maximum(holder, 0)]
        step = (holder >= 0) & ~found
        holder = np.where(step, parent_pos[np.maximum(holder, 0)], holder)
    found = (holder >= 0) & is_module[np.maximum(holder, 0)]
    child, parent = layer_rows[found], holder[found]
    phase = ranges["phase"].cat.codes.to_numpy().copy()
    layer_name = ranges["layer_name"].cat.codes.to_numpy().copy()
    phase[parent], layer_name[parent] = phase[child], layer_name[child]
    ranges["phase"] = pd.Categorical.from_codes(phase, dtype=ranges["phase"].dtype)
    ranges["layer_name"] = pd.Categorical.from_codes(layer_name, dtype=ranges["layer_name"].dtype)
    layer = ranges["layer"].to_numpy(dtype="float64", na_value=np.nan)
    layer[parent] = layer[child]
    ranges["layer"] = pd.array(np.where(np.isnan(layer), pd.NA, layer), dtype="Int64") if len(layer) else ranges["layer"]
    ranges["level"] = pd.Categorical.from_codes(level, categories=LEVELS)


def label_ops(range_ids: np.ndarray, ranges: pd.DataFrame) -> dict[str, object]:
    """The labels of operations from the range each ran in: ``nvtx_path``
    (that range's path), ``phase``, ``layer_name``, ``layer``, ``head``
    (parsed from the path); null where ``range_ids`` is -1.

    Args:
        range_ids: per operation, its innermost range's id (-1: none).
        ranges: the nested ranges (``range_id``, ``path``).
    """
    path = as_categorical(ranges["path"])
    rows = positions(ranges["range_id"].to_numpy(np.int64), range_ids)
    codes = np.where(rows >= 0, np.asarray(path.codes, dtype=np.int64)[np.maximum(rows, 0)], -1) if len(path) else rows
    parsed = [parse_path(str(p)) for p in path.categories]
    return {
        "nvtx_path": pd.Categorical.from_codes(codes, categories=path.categories),
        "phase": take_categorical([p.phase for p in parsed], codes),
        "layer_name": take_categorical([p.layer_name for p in parsed], codes),
        "layer": take_int([p.layer for p in parsed], codes),
        "head": take_int([p.head for p in parsed], codes),
    }


def _step_index(name: str | None) -> int:
    """N of ``step.N`` (a step the user numbered) or ``step#N`` (one the profiler counted); -1 for other names."""
    if name and name.startswith(("step.", "step#")):
        try:
            return int(name[5:])
        except ValueError:
            return -1
    return -1


def step_of(times: np.ndarray, steps: pd.DataFrame) -> pd.arrays.IntegerArray:
    """Step index (from ``step.N`` ranges) whose time span contains each time; null where none.

    Steps are matched by time, not thread: backward work on GPU runs on
    autograd's device thread, outside the main thread's step range.
    """
    result = np.full(len(times), -1, dtype=np.int64)
    if len(steps) and len(times):
        order = steps.sort_values("start_ns")
        starts = order["start_ns"].to_numpy(np.int64)
        ends = order["end_ns"].to_numpy(np.int64)
        index = np.array([_step_index(n) for n in order["name"].astype(object)], dtype=np.int64)
        pos = np.searchsorted(starts, times, side="right") - 1
        ok = (pos >= 0) & (times <= ends[np.maximum(pos, 0)])
        result = np.where(ok, index[np.maximum(pos, 0)], -1)
    missing = result < 0
    return pd.arrays.IntegerArray(np.where(missing, 0, result), missing)
