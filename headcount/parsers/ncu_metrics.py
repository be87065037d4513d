"""What headcount reads from an Nsight Compute result, whatever the file.

Both ncu readers (CSV and ``.ncu-rep`` through ``ncu_report``) reduce each
profiled kernel to ``{metric name: (value, unit)}`` and call
:func:`kernels_frame`, so the two paths give identical tables by
construction of this one step; the tests check the readers up to it.

Units are normalized to base units (ns, bytes, %, counts) from the unit ncu
names (``usecond``, ``Mbyte``, …; SI prefixes, powers of 1000). A metric
whose value is ``nan``, ``inf``, ``no data`` or empty stays null, never 0,
and the kernel row is marked ``incomplete`` (ncu's "incomplete result");
counters that were simply not collected are listed in ``missing_metrics``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from headcount.common.device import Device
from headcount.common.nsight import COLLECTED, DEVICE_NAME, DISPLAY_NAMES, METRICS, NCU_TABLE  # noqa: F401 (the readers' names)

# counters a headcount report needs; ``missing_metrics`` names those not collected
CORE = ("duration_ns", "achieved_occupancy_pct")

_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_MISSING = {"", "nan", "-nan", "inf", "-inf", "no data", "n/a", "nan%"}


def unit_factor(unit: str | None) -> float:
    """Factor from ``unit`` to headcount's base unit (ns for time, bytes for
    data, 1 for %, counts and anything else)."""
    unit = (unit or "").strip()
    base = unit.partition("/")[0]  # "byte/block", "register/thread": the numerator decides
    if base in _TIME:
        factor = _TIME[base]
    elif base.endswith("byte") and base[:-4] in _SCALE:
        factor = _SCALE[base[:-4]]
    else:
        factor = 1.0
    return factor


def to_float(value) -> float | None:
    """A metric value as a finite float, or ``None`` (nan, inf, no data, empty)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    text = str(value).strip()
    if text.lower() in _MISSING:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_REPEATED = ("name", "grid", "block", "nvtx_path", "device_name", "missing_metrics")
_IDENTITY = ("ncu_id", "name", "pid", "device", "stream", "grid", "block", "nvtx_path", "device_name")


def kernels_frame(kernels: Iterable[dict], source: str) -> pd.DataFrame:
    """Normalize ncu kernels.

    Args:
        kernels: one dict per profiled kernel: identity fields (``ncu_id``,
            ``name``, ``pid``, ``device``, ``stream``, ``grid``, ``block``,
            ``nvtx_path``) and ``metrics``: ``{ncu metric: (value, unit)}`` with
            values already parsed to float or ``None``. Consumed one at a time
            (a generator keeps a large file's kernels from being held twice):
            each becomes one tuple, its repeated strings (names, grids) shared.

    Returns:
        The kernels table (schema of :data:`headcount.common.tables.KERNELS`),
        plus ``incomplete`` and ``missing_metrics``; empty when ``kernels`` is.
    """
    rows, odd_units, strings = [], {}, {}
    for k in kernels:
        metrics = k["metrics"]
        row = [k.get(key) for key in _IDENTITY]
        row = [strings.setdefault(v, v) if isinstance(v, str) else v for v in row]
        missing, broken = [], False
        for column, names in METRICS.items():
            present = next((n for n in names if n in metrics), None)
            value = None
            if present is not None:
                raw, unit = metrics[present]
                if raw is not None and not unit_known(column, unit):  # never a number scaled by a guess
                    odd_units.setdefault((column, str(unit).strip()), 0)
                    odd_units[(column, str(unit).strip())] += 1
                    raw = None
                broken |= raw is None
                value = None if raw is None else raw * unit_factor(unit)
            elif column in CORE:
                missing.append(names[0])
            row.append(value)
        missing_metrics = ",".join(missing) or None
        rows.append((*row, broken, strings.setdefault(missing_metrics, missing_metrics)))
    if not rows:
        return pd.DataFrame()
    # column by column: from_records goes through one object matrix and peaks at ~5× the rows
    names = [*_IDENTITY, *METRICS, "incomplete", "missing_metrics"]
    columns = dict(zip(names, map(list, zip(*rows))))
    del rows
    for col in _REPEATED:  # one copy of each kernel name (a templated name runs to kilobytes), not one per kernel
        columns[col] = _categorical(columns[col])
    frame = pd.DataFrame(columns)
    del columns
    frame["source"] = source
    frame["kind"] = "kernel"
    static, dynamic = frame.pop("shared_memory_static_bytes"), frame.pop("shared_memory_dynamic_bytes")
    frame["shared_memory_bytes"] = (static + dynamic).astype("Float64")
    for col in ("duration_ns", "registers_per_thread", "ncu_id", "stream", "block_threads"):
        values = pd.to_numeric(frame[col], errors="coerce")
        frame[col] = values.where(values.abs() < 2**62).round().astype("Int64")  # a 30-digit ID is no ID
    total = frame["dram_read_bytes"] + frame["dram_write_bytes"]
    frame["dram_bytes"] = frame["dram_bytes"].where(frame["dram_bytes"].notna(), total)
    for col in ("dram_bytes", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "l1_bytes", "dram_throughput_pct", "achieved_occupancy_pct",
                "theoretical_occupancy_pct", "tensor_pipe_pct", "shared_memory_config_bytes", "sm_throughput_pct",
                "memory_throughput_pct", "waves_per_sm"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Float64")
    frame["device"] = frame["device"].map(_device)
    frame["pid"] = frame["pid"].map(_pid)
    frame = _plausible(frame)
    if odd_units:
        frame.attrs["notices"] = [*frame.attrs.get("notices", []), "values in units headcount does not know read as missing, "
                                  "their kernels marked incomplete: " + ", ".join(f"{n} {col} in '{unit}'" for (col, unit), n in odd_units.items())]
    return frame


def _categorical(values: list) -> pd.Categorical:
    """``values`` (strings or None) as a Categorical, factorized here: pandas'
    own factorization first copies every string into a string array."""
    index: dict = {}
    codes = np.fromiter((-1 if v is None or v != v else index.setdefault(v, len(index)) for v in values), np.int64, len(values))
    return pd.Categorical.from_codes(codes, categories=pd.Index(list(index), dtype=object))


def unit_known(column: str, unit: str | None) -> bool:
    """Whether ``unit`` is one headcount can convert for ``column`` (times for
    ``_ns``, byte multiples for ``_bytes``, ``%`` for ``_pct``; no unit is
    taken as the base unit; other columns are counts and not checked)."""
    unit = (unit or "").strip()
    if not unit:
        return True
    base = unit.partition("/")[0]
    if column.endswith("_ns"):
        return base in _TIME
    if column.endswith("_bytes"):
        return base.endswith("byte") and base[:-4] in _SCALE
    if column.endswith("_pct"):
        return unit == "%"
    return True


def _device(d) -> str | None:
    value = to_float(d)
    return None if value is None or value < 0 or value != int(value) else f"cuda:{int(value)}"


def _pid(p) -> str | None:
    value = to_float(p)
    return None if value is None or value < 0 or value != int(value) else str(int(value))


_PCT = ("dram_throughput_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct", "tensor_pipe_pct", "sm_throughput_pct",
        "memory_throughput_pct")
_NON_NEGATIVE = ("duration_ns", "dram_bytes", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "l1_bytes", "shared_memory_bytes",
                 "registers_per_thread", "waves_per_sm")


def _plausible(frame: pd.DataFrame) -> pd.DataFrame:
    """Values that break physics (a percentage outside [0, 100], a negative
    duration, byte count or register count) become null and mark their kernel
    ``incomplete``; a kernel ID seen twice keeps its first row. What was done
    is said once, in ``frame.attrs["notices"]``."""
    duplicated = frame["ncu_id"].notna() & frame["ncu_id"].duplicated()
    if duplicated.any():
        frame = frame[~duplicated].reset_index(drop=True)
    notices, flagged = [], pd.Series(False, index=frame.index)
    for cols, bad_of, what in ((_PCT, lambda v: (v < 0) | (v > 100), "outside [0, 100] %"),
                               (_NON_NEGATIVE, lambda v: v < 0, "negative")):
        for col in cols:
            if col not in frame:
                continue
            bad = bad_of(pd.to_numeric(frame[col], errors="coerce")).fillna(False).astype(bool)
            if bad.any():
                frame.loc[bad, col] = pd.NA
                flagged |= bad
                notices.append(f"{int(bad.sum())} {col} {what}")
    if flagged.any():
        frame["incomplete"] = frame["incomplete"].astype(bool) | flagged
    said = []
    if notices:
        said.append(f"implausible values dropped, their kernels marked incomplete: {', '.join(notices)}")
    if duplicated.any():
        said.append(f"{int(duplicated.sum())} rows repeating a kernel ID dropped")
    frame.attrs["notices"] = said
    return frame


def run_device(kernels: pd.DataFrame) -> Device | None:
    """The run metadata's ``device`` for ncu kernels: the GPU its report names
    (``device__attribute_display_name`` and the compute capability and SM
    count attributes of the first kernel that has them); ``None`` when the
    export carries no device attributes (ncu's details page, old exports)."""
    if "device_name" not in kernels or not kernels["device_name"].notna().any():
        return None
    first = kernels[kernels["device_name"].notna()].iloc[0]

    def num(col):  # a device attribute: a small non-negative integer, else unknown
        v = to_float(first.get(col))
        return int(v) if v is not None and 0 <= v < 2**31 and v == int(v) else None

    return Device.from_ncu(str(first["device_name"]), num("device_cc_major"), num("device_cc_minor"), num("device_sm_count"))
