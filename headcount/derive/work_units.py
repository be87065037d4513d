"""The repeated unit of work a recording without steps still has: a block, a layer, a micro-batch.

Tables in, tables out; no I/O.

A training or serving loop that records no step ranges still repeats itself,
and its own ranges say so: ``FSDP::pre_forward (blocks.9._checkpoint_wrapped_module)``,
``nn.Module: LlamaDecoderLayer_12``, ``layers.3``, ``Block 7``. A **unit** is
such a range family: names equal but for one index (:func:`template`, the
index as ``{N}``), at one nesting depth. Its instances on one thread, in start
order, walk the index by one (``blocks.3`` → ``blocks.4``: one pass through the
stack; ``blocks.23`` → ``blocks.22`` in a backward pass); each consecutive pair
gives one **period**: the next instance's start minus this one's (ns, the
range's own clock, the CPU thread's). The period is the unit's time as the user
waits for it: it holds the unit's work *and* whatever runs between two units,
and it is right for hook ranges too (FSDP's ``pre_forward`` lasts 0.2 ms but
opens a 17 ms block). It is a span, not busy time. A pass's last instance has
no next one: no period.

Ranges with no index can be a unit too (``micro_batch``, ``train_step``):
outermost ranges (depth 0) of one name that are no operators (no ``::``, no
``emit_nvtx`` suffix), their period start to next start on the thread. An
indexed unit is preferred; among those present on both sides of a diff with at
least :data:`MIN_PERIODS` periods each, :func:`common_unit` takes the coarsest
(the largest median period: a block before its sub-layers), then the one with
more periods.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

MIN_PERIODS = 3
"""The fewest periods a side needs for a unit to stand for its whole work."""

_INDEX = re.compile(r"(?<=[._ #(\[:])(\d+)(?=[._ )\]]|$)")
"""An index inside a module path or instance name: ``blocks.9.``, ``Layer_12``, ``Block 7``, ``#3``, ``[2]``."""

PERIOD_COLUMNS = ["unit", "depth", "pid", "tid", "index", "start_ns", "period_ns"]


def base_name(name: str) -> str:
    """A range name without the per-instance suffixes PyTorch's ``emit_nvtx`` adds (``, op_id = 12``, ``, seq = 3``)."""
    return str(name).split(", ", 1)[0]


def templates(name: str) -> list[tuple[str, int]]:
    """Each way to read ``name`` as an indexed unit: ``(template, index)`` per index in it, the index as ``{N}``.

    ``encoder.block.9.layer.0`` gives ``encoder.block.{N}.layer.0`` (index 9) and ``encoder.block.9.layer.{N}`` (0).
    """
    base = base_name(name)
    return [(base[:m.start()] + "{N}" + base[m.end():], int(m.group(1))) for m in _INDEX.finditer(base)]


def _unindexed(name: str) -> bool:
    base = base_name(name)
    return "::" not in base and base == str(name) and not _INDEX.search(base) and bool(base.strip())


def periods(ranges: pd.DataFrame) -> pd.DataFrame:
    """Every unit's periods in one run's ranges.

    Args:
        ranges: rows with ``name``, ``depth``, ``pid``, ``tid``, ``start_ns`` (ns): a report's ``ranges``
            table of one run, its own ranges (level ``other``), not headcount's; optionally ``suffixed`` (bool: the
            name had an ``emit_nvtx`` suffix, already cut off).

    Returns:
        :data:`PERIOD_COLUMNS`: per unit (template, or the name itself for an unindexed unit), depth and thread,
        one row per period (ns); ``index`` null for an unindexed unit.
    """
    if not len(ranges):
        return pd.DataFrame(columns=PERIOD_COLUMNS)
    names = pd.unique(ranges["name"].astype(str))
    readings = []
    for n in names:
        readings += [(n, t, i) for t, i in templates(n)]
    frames = []
    if readings:
        table = pd.DataFrame(readings, columns=["name", "unit", "index"])
        hits = ranges[["name", "depth", "pid", "tid", "start_ns"]].astype({"name": str}).merge(table, on="name")
        frames.append(_indexed_periods(hits))
    plain = [n for n in names if _unindexed(n)]
    if plain:
        top = ranges[(ranges["depth"] == 0) & ranges["name"].astype(str).isin(plain)]
        if "suffixed" in top:  # an operator's emit_nvtx range, its suffix already cut off: no unit
            top = top[~top["suffixed"].astype(bool)]
        frames.append(_plain_periods(top[["name", "depth", "pid", "tid", "start_ns"]].astype({"name": str})))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=PERIOD_COLUMNS)


def _indexed_periods(hits: pd.DataFrame) -> pd.DataFrame:
    hits = hits.sort_values(["unit", "depth", "pid", "tid", "start_ns"], kind="stable").reset_index(drop=True)
    same = ((hits[["unit", "depth", "pid", "tid"]].shift(-1) == hits[["unit", "depth", "pid", "tid"]]).all(axis=1)).to_numpy()
    step = (hits["index"].shift(-1) - hits["index"]).abs().to_numpy()
    keep = same & (step == 1)
    out = hits.loc[keep, ["unit", "depth", "pid", "tid", "index", "start_ns"]].copy()
    out["period_ns"] = (hits["start_ns"].shift(-1) - hits["start_ns"]).to_numpy()[keep].astype("float64")
    return out.reset_index(drop=True)


def _plain_periods(top: pd.DataFrame) -> pd.DataFrame:
    top = top.rename(columns={"name": "unit"}).sort_values(["unit", "pid", "tid", "start_ns"], kind="stable").reset_index(drop=True)
    same = ((top[["unit", "pid", "tid"]].shift(-1) == top[["unit", "pid", "tid"]]).all(axis=1)).to_numpy()
    out = top.loc[same, ["unit", "depth", "pid", "tid", "start_ns"]].copy()
    out["index"] = np.nan
    out["period_ns"] = (top["start_ns"].shift(-1) - top["start_ns"]).to_numpy()[same].astype("float64")
    return out.reindex(columns=PERIOD_COLUMNS).reset_index(drop=True)


def common_unit(base: pd.DataFrame, new: pd.DataFrame, prefer: tuple[str, int] | None = None) -> tuple[str, int] | None:
    """The unit both sides' :func:`periods` share that stands for their whole work, as ``(unit, depth)``; ``None``: none.

    Indexed units first; among them (else among unindexed ones) those with at least :data:`MIN_PERIODS` periods
    on each side (and an indexed unit's periods starting at as many different indices); the largest median period of the two sides' smaller one, then the most periods, then the name.
    """
    if not len(base) or not len(new):
        return None
    def stats(p):
        return p.groupby(["unit", "depth"]).agg(n=("period_ns", "size"), median=("period_ns", "median"),
                                                 indexed=("index", lambda s: bool(s.notna().any())),
                                                 indices=("index", "nunique"))
    both = stats(base).merge(stats(new), left_index=True, right_index=True, suffixes=("_b", "_n"))
    both = both[(both["n_b"] >= MIN_PERIODS) & (both["n_n"] >= MIN_PERIODS)]
    # an indexed unit walks its index (blocks 3, 4, 5 …): one that repeats a single step (``block.16.layer.0`` → ``.1``
    # in every pass) is a part of one block, not the stack's unit
    both = both[(~both["indexed_b"] | (both["indices_b"] >= MIN_PERIODS)) & (~both["indexed_n"] | (both["indices_n"] >= MIN_PERIODS))]
    if not len(both):
        return None
    both = both.assign(indexed=both["indexed_b"] & both["indexed_n"], median=both[["median_b", "median_n"]].min(axis=1),
                       n=both[["n_b", "n_n"]].min(axis=1)).reset_index()
    if prefer is not None and ((both["unit"] == prefer[0]) & (both["depth"] == prefer[1])).any():
        return prefer
    best = both.sort_values(["indexed", "median", "n", "unit"], ascending=[False, False, False, True], kind="stable").iloc[0]
    return str(best["unit"]), int(best["depth"])


def common_instances(base: pd.DataFrame, new: pd.DataFrame) -> dict | None:
    """The unit's spans over the indices both sides' spans start at (two windows that hold blocks 3–18 and 9–22:
    9–18), where each side has at least :data:`MIN_PERIODS` there: ``{"indices", "base_spans", "new_spans",
    "base_median_ns", "new_median_ns", "change_pct"}``; ``None`` for an unindexed unit or too few in common."""
    both = set(base["index"].dropna()) & set(new["index"].dropna())
    b, n = base[base["index"].isin(both)], new[new["index"].isin(both)]
    if len(b) < MIN_PERIODS or len(n) < MIN_PERIODS:
        return None
    mb, mn = float(b["period_ns"].median()), float(n["period_ns"].median())
    return {"indices": coverage(b), "base_spans": int(len(b)), "new_spans": int(len(n)), "base_median_ns": mb,
            "new_median_ns": mn, "change_pct": 100.0 * (mn / mb - 1.0) if mb else float("nan")}


def coverage(p: pd.DataFrame) -> str:
    """The indices a unit's periods start at, as ``3–18`` (``–`` for an unindexed unit)."""
    idx = p["index"].dropna()
    if not len(idx):
        return "–"
    lo, hi = int(idx.min()), int(idx.max())
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def indexless(name: str) -> str:
    """A range name with every index read as ``{N}`` and no ``emit_nvtx`` suffix: the row ``headcount diff`` compares
    ``FSDP::pre_forward (blocks.3…)`` … ``(blocks.23…)`` in."""
    return _INDEX.sub("{N}", base_name(name))


def kernel_time(spans: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """Per span (:func:`periods` rows), the summed duration (ns) of the kernels launched from the span's thread inside
    it (their launch call's start within [start, start + period)): the GPU work the unit asked for, measured — a sum,
    not busy time (kernels of several streams can overlap). 0 for a span that launched none; NaN where the span's
    thread launched no recorded kernel at all (a CPU program).

    Args:
        kernels: ``pid``, ``tid``, ``api_start_ns``, ``duration_ns`` of the run's kernels (launch calls known).
    """
    out = np.full(len(spans), np.nan)
    if not len(spans) or not len(kernels):
        return out
    k = kernels.dropna(subset=["api_start_ns", "duration_ns"]).astype({"tid": str, "pid": str})
    for (pid, tid), at in spans.assign(_row=np.arange(len(spans))).astype({"tid": str, "pid": str}).groupby(["pid", "tid"]):
        mine = k[(k["pid"] == pid) & (k["tid"] == tid)].sort_values("api_start_ns")
        if not len(mine):
            continue
        starts = mine["api_start_ns"].to_numpy(np.float64)
        total = np.concatenate([[0.0], np.cumsum(mine["duration_ns"].to_numpy(np.float64))])
        lo = np.searchsorted(starts, at["start_ns"].to_numpy(np.float64), side="left")
        hi = np.searchsorted(starts, (at["start_ns"] + at["period_ns"]).to_numpy(np.float64), side="left")
        out[at["_row"].to_numpy()] = total[hi] - total[lo]
    return out
