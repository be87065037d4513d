"""Before and after, per call, against the noise (``headcount diff``).

Tables in, tables out; no I/O.

**The rule** (:func:`verdict`). Each side of a row is the distribution of its
per-call durations (per-step times for steps): its 10th, 50th and 90th
percentiles (linear interpolation, as :mod:`headcount.derive.spread`) and its
number of calls.

- ``inconclusive``: fewer than :data:`MIN_CALLS` calls on either side (a
  p10–p90 interval of one or two calls is no spread at all);
- ``regression``: the new p10–p90 interval lies wholly above the base's
  (new p10 > base p90) **and** the median grew by more than
  :data:`MIN_CHANGE_PCT` (5 %, or ``--min-change``);
- ``improvement``: the mirror image (new p90 < base p10 and the median fell
  by more than :data:`MIN_CHANGE_PCT`);
- ``unchanged``: otherwise — the two spreads overlap, or the intervals are
  disjoint but the medians lie within :data:`MIN_CHANGE_PCT` of each other
  (very steady kernels, whose spread is thinner than what differs between
  two processes of the same program: clocks, caches, the machine's load);
- ``added`` / ``removed``: the row exists on one side only.

The same percentiles are the layers table's ``duration_per_call_p10_ns`` …,
so the rule also applies where a report kept no per-call rows (ncu reports
have no range instances).

``change_pct`` is the change of the median per call, in %: new ÷ base − 1.

**The whole work** (:func:`shift`): what the user waits for — the time per
step, or the period of a repeated unit (:mod:`headcount.derive.work_units`) —
is judged on its samples, not on disjoint p10–p90 intervals: a window of real
training holds outliers (a collective that waited, a garbage collection) that
widen the interval without moving the bulk. ``regression`` when the one-sided
Mann–Whitney U test (scipy) finds the new samples larger at
:data:`ALPHA` (or, too few for the test to reach it, every new sample lies
above every base one) **and** the median grew by more than the least change;
``improvement`` the mirror image; ``inconclusive`` under :data:`MIN_CALLS`
samples a side; ``unchanged`` otherwise.
A change in the number of calls is reported as such (``base_calls``,
``new_calls``, ``calls_changed``), never folded into the time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_CALLS = 3
ALPHA = 0.01
"""The significance of :func:`shift`'s rank test (one-sided): one false alarm in a hundred identical pairs at most."""
MIN_CHANGE_PCT = 5.0
"""The default; ``headcount diff --min-change PCT`` sets another (a noisy machine: larger)."""

CHANGE_COLUMNS = [
    "rank", "level", "name", "shape", "phase", "layer", "head", "verdict", "base_calls", "new_calls", "calls_changed",
    "base_p10_ns", "base_p50_ns", "base_p90_ns", "new_p10_ns", "new_p50_ns", "new_p90_ns", "change_pct",
]


def verdict(base: tuple, new: tuple, base_calls: int, new_calls: int, min_change_pct: float = MIN_CHANGE_PCT) -> tuple[str, float]:
    """The module docstring's rule on two summaries.

    Args:
        base, new: ``(p10, p50, p90)`` of each side (ns).
        base_calls, new_calls: the calls (or steps) behind them.
        min_change_pct: the least change of the median (%) that can be a regression or improvement.

    Returns:
        ``(verdict, change_pct)``; ``change_pct`` NaN where a median is unknown or zero.
    """
    if not base_calls and new_calls:
        return "added", np.nan
    if base_calls and not new_calls:
        return "removed", np.nan
    (b10, b50, b90), (n10, n50, n90) = base, new
    change = 100.0 * (n50 / b50 - 1.0) if b50 and np.isfinite(b50) and np.isfinite(n50) else np.nan
    if base_calls < MIN_CALLS or new_calls < MIN_CALLS or not all(np.isfinite(v) for v in (b10, b90, n10, n90)):
        return "inconclusive", change
    if n10 > b90 and change > min_change_pct:
        return "regression", change
    if n90 < b10 and change < -min_change_pct:
        return "improvement", change
    return "unchanged", change


def summary_row(base: tuple, new: tuple, base_calls: int, new_calls: int, level: str,
                min_change_pct: float = MIN_CHANGE_PCT) -> dict:
    """The change columns of one row from the two sides' summaries."""
    v, change = verdict(base, new, base_calls, new_calls, min_change_pct)
    return {"level": level, "verdict": v, "base_calls": base_calls, "new_calls": new_calls,
            "calls_changed": bool(base_calls != new_calls),
            "base_p10_ns": base[0], "base_p50_ns": base[1], "base_p90_ns": base[2],
            "new_p10_ns": new[0], "new_p50_ns": new[1], "new_p90_ns": new[2], "change_pct": change}


def overall(changes: pd.DataFrame) -> str:
    """A verdict over rows: ``regression`` if any compared row regressed, ``improvement`` if
    some improved and none regressed, ``unchanged`` if every compared row is unchanged,
    ``inconclusive`` if no row could be compared."""
    compared = changes[changes["verdict"].isin(["regression", "improvement", "unchanged"])]
    if not len(compared):
        return "inconclusive"
    if (compared["verdict"] == "regression").any():
        return "regression"
    if (compared["verdict"] == "improvement").any():
        return "improvement"
    return "unchanged"


def shift(base: np.ndarray, new: np.ndarray, min_change_pct: float = MIN_CHANGE_PCT) -> tuple[str, float, float]:
    """The module docstring's whole-work rule on two sides' samples (ns).

    Returns:
        ``(verdict, change_pct, p_value)``: the change of the median (%), and the p-value of the one-sided
        rank test in the direction of that change (NaN where not tested).
    """
    from scipy.stats import mannwhitneyu

    base, new = np.asarray(base, dtype="float64"), np.asarray(new, dtype="float64")
    base, new = base[np.isfinite(base)], new[np.isfinite(new)]
    if not len(base) and len(new):
        return "added", np.nan, np.nan
    if len(base) and not len(new):
        return "removed", np.nan, np.nan
    b50, n50 = float(np.median(base)), float(np.median(new))
    if not b50 and not n50 and len(base) >= MIN_CALLS and len(new) >= MIN_CALLS:
        return "unchanged", 0.0, np.nan  # none on either side (no capture idle in any step): nothing moved
    change = 100.0 * (n50 / b50 - 1.0) if b50 else np.nan
    if len(base) < MIN_CALLS or len(new) < MIN_CALLS or not np.isfinite(change):
        return "inconclusive", change, np.nan
    p = float(mannwhitneyu(new, base, alternative="greater" if change >= 0 else "less").pvalue)
    # with few samples (4 steps a side: p ≥ 1/70) the test cannot reach ALPHA: samples wholly apart then say it
    if (p < ALPHA or new.min() > base.max()) and change > min_change_pct:
        return "regression", change, p
    if (p < ALPHA or new.max() < base.min()) and change < -min_change_pct:
        return "improvement", change, p
    return "unchanged", change, p


def shift_row(base: np.ndarray, new: np.ndarray, level: str, min_change_pct: float = MIN_CHANGE_PCT) -> dict:
    """The change columns of a whole-work row from the two sides' samples (ns), with ``p_value``."""
    v, change, p = shift(base, new, min_change_pct)
    def q(x, at):
        x = np.asarray(x, dtype="float64")
        x = x[np.isfinite(x)]
        return float(np.percentile(x, at)) if len(x) else np.nan
    return {"level": level, "verdict": v, "base_calls": int(np.isfinite(np.asarray(base, dtype="float64")).sum()),
            "new_calls": int(np.isfinite(np.asarray(new, dtype="float64")).sum()),
            "calls_changed": False, "change_pct": change, "p_value": p,
            **{f"base_p{at}_ns": q(base, at) for at in (10, 50, 90)}, **{f"new_p{at}_ns": q(new, at) for at in (10, 50, 90)}}


MODE_GAP = 3.0
"""Calls of one row whose shapes are unknown split into duration modes where sorted durations jump by more than this factor."""


def modes(values: np.ndarray) -> np.ndarray:
    """Per value (ns), its duration mode (1 = the fastest), where nothing else tells calls of different shapes apart:
    sorted durations cut where one is more than :data:`MODE_GAP` × the one before and each part holds at least two
    calls. NaN values get mode 0."""
    v = np.asarray(values, dtype="float64")
    out = np.zeros(len(v), dtype=np.int64)
    ok = np.flatnonzero(np.isfinite(v) & (v > 0))
    if len(ok) < 4:
        out[ok] = 1
        return out
    order = ok[np.argsort(v[ok], kind="stable")]
    sorted_v = v[order]
    cuts = [i for i in range(2, len(sorted_v) - 1) if sorted_v[i] > MODE_GAP * sorted_v[i - 1]]
    cuts = [c for j, c in enumerate(cuts) if c - (cuts[j - 1] if j else 0) >= 2]
    labels = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(len(sorted_v)), side="right") + 1
    out[order] = labels
    return out
