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
A change in the number of calls is reported as such (``base_calls``,
``new_calls``, ``calls_changed``), never folded into the time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_CALLS = 3
MIN_CHANGE_PCT = 5.0
"""The default; ``headcount diff --min-change PCT`` sets another (a noisy machine: larger)."""

CHANGE_COLUMNS = [
    "level", "name", "phase", "layer", "head", "verdict", "base_calls", "new_calls", "calls_changed",
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
