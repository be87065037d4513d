"""Rows that break physics, dropped and said (one rule for every timeline a parser reads)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def drop_implausible(frame: pd.DataFrame, what: str, notices: list[str]) -> pd.DataFrame:
    """``frame`` without rows that break physics: no start time, or an end before
    the start (a range left open, ``end_missing``, is not one); one line on what
    was dropped goes into ``notices`` (``what`` names the rows, e.g. "GPU operations")."""
    if not len(frame) or "start_ns" not in frame:
        return frame
    start = pd.to_numeric(frame["start_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    end = pd.to_numeric(frame["end_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    no_start = np.isnan(start) | (start < 0)
    backwards = ~no_start & ~np.isnan(end) & (end < start)
    if "end_missing" in frame:
        backwards &= ~frame["end_missing"].to_numpy(dtype=bool)
    bad = no_start | backwards | (np.isnan(end) & ~frame.get("end_missing", pd.Series(False, index=frame.index)).to_numpy(dtype=bool))
    if not bad.any():
        return frame
    reasons = [f"{int(n)} {why}" for n, why in ((no_start.sum(), "without a start time"), (backwards.sum(), "ending before they start"),
                                                  ((bad & ~no_start & ~backwards).sum(), "without an end time")) if n]
    notices.append(f"{int(bad.sum())} {what} dropped as implausible ({', '.join(reasons)})")
    return frame[~bad].reset_index(drop=True)
