"""Spread over the calls of a row, and when a difference between heads is real.

Tables in, tables out; no I/O.

- :func:`per_call` gives, per group of range instances (one instance = one
  attention call), the 10th, 50th and 90th percentiles of its duration
  (``duration_per_call_p10_ns`` …) and of its time-derived bandwidth
  (``bandwidth_per_call_p10_gbps`` …: the call's DRAM bytes — sampled where
  sampled, else the analytic minimum — over its own duration). Percentiles
  interpolate linearly between calls (numpy's and DuckDB's
  ``quantile_cont`` rule); they are null where a row has fewer than two calls.
- :func:`standout` applies the rule the report uses before it calls a
  head hotter (or cooler) than the others of its layer: its p10–p90 interval
  over calls must not overlap the interval of the layer's median head
  (the head whose median time per call is the layer's median). Otherwise the
  heads are "within noise", and the noise is stated as the median head's
  half-width (p90 − p10) / 2 relative to its median. Rows of fewer than
  :data:`VERDICT_MIN_CALLS` calls are not compared at all.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

QUANTILES = (10, 50, 90)
DURATION = [f"duration_per_call_p{q}_ns" for q in QUANTILES]
BANDWIDTH = [f"bandwidth_per_call_p{q}_gbps" for q in QUANTILES]
MIN_CALLS = 2
CALL_BANDWIDTH = "_bandwidth_per_call_gbps"  # the per-instance column per_call reads
VERDICT_MIN_CALLS = 3  # a p10–p90 interval of two calls is their whole range: too thin to call anything hotter


def call_bandwidth_gbps(ranges: pd.DataFrame) -> pd.Series:
    """Bandwidth of each range instance, GB/s (= bytes/ns): its sampled DRAM
    bytes, else its analytic minimum, over its duration; null where either is
    unknown or the duration is not positive."""
    nan = pd.Series(np.nan, index=ranges.index)
    sampled = (ranges["dram_read_sampled_bytes"] + ranges["dram_write_sampled_bytes"]) if "dram_read_sampled_bytes" in ranges else nan
    analytic = ranges["analytic_min_bytes"] if "analytic_min_bytes" in ranges else nan
    data = sampled.astype("float64").where(sampled.notna(), analytic.astype("float64"))
    duration = ranges["duration_ns"].astype("float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        return (data / duration).where(duration > 0)


def per_call(grouped) -> dict[str, np.ndarray]:
    """Percentiles over the calls (range instances) of each group.

    Args:
        grouped: range instances grouped by the row's keys, with ``duration_ns``
            and :data:`CALL_BANDWIDTH` (:func:`call_bandwidth_gbps`).

    Returns:
        :data:`DURATION` and :data:`BANDWIDTH` columns in the groups' order;
        null where a group has fewer than :data:`MIN_CALLS` calls with a value.
    """
    out = {}
    for column, names in (("duration_ns", DURATION), (CALL_BANDWIDTH, BANDWIDTH)):
        values = grouped[column]
        count = values.count().to_numpy()
        for q, name in zip(QUANTILES, names):
            out[name] = np.where(count >= MIN_CALLS, values.quantile(q / 100).to_numpy(dtype="float64"), np.nan)
    return out


def relative_half_width(p10, p50, p90) -> float:
    """(p90 − p10) / 2 / p50, or nan when unknown."""
    if any(v is None or pd.isna(v) for v in (p10, p50, p90)) or not p50:
        return float("nan")
    return (float(p90) - float(p10)) / 2.0 / float(p50)


def standout(rows: pd.DataFrame, key: str = "head") -> pd.DataFrame:
    """The rule for "head X is hotter than the others" (or layer X, with ``key="layer"``).

    Args:
        rows: the rows compared with each other — the heads of one layer, or
            the layers of one phase (one run and implementation) — with
            ``key`` and :data:`DURATION`.

    Returns:
        One row per head (``key``): ``verdict`` (``hotter``, ``cooler``,
        ``within noise`` or ``unknown`` where the spread is unknown or too
        thin: fewer than :data:`VERDICT_MIN_CALLS` calls), ``vs_median_pct`` (its median time per call over the
        median head's, minus 1, in %), ``noise_pct`` (the median head's
        relative half-width, in %) and ``reference`` (the median head).
    """
    lo, mid, hi = DURATION
    rows = rows.dropna(subset=[mid]).sort_values([mid, key]).reset_index(drop=True)
    if len(rows) < 2:
        return pd.DataFrame(columns=[key, "verdict", "vs_median_pct", "noise_pct", "reference"])
    ref = rows.iloc[(len(rows) - 1) // 2]
    noise = 100.0 * relative_half_width(ref[lo], ref[mid], ref[hi])
    enough = rows["calls"].fillna(0).astype("float64") >= VERDICT_MIN_CALLS if "calls" in rows else pd.Series(True, index=rows.index)
    known = rows[lo].notna() & rows[hi].notna() & pd.notna(ref[lo]) & pd.notna(ref[hi]) & enough & bool(enough.iloc[(len(rows) - 1) // 2])
    verdict = np.where(~known, "unknown",
                       np.where(rows[lo] > ref[hi], "hotter", np.where(rows[hi] < ref[lo], "cooler", "within noise")))
    return pd.DataFrame({
        key: rows[key].to_numpy(),
        "verdict": verdict,
        "vs_median_pct": 100.0 * (rows[mid].to_numpy(dtype="float64") / float(ref[mid]) - 1.0),
        "noise_pct": noise,
        "reference": ref[key],
    })
