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
- :func:`rank_tests` adds, for heads measured on their own, the test that
  keeps chance and position out of that verdict: in each call of a layer the
  heads are ranked by time, and a head's summed rank is compared with what
  heads that are alike would give. Head mode draws each call's head order at
  random (:func:`headcount.tagging.tagger.head_order`), so a head's position
  is independent of the head and the test holds whatever the position costs.
  Its p-values are Holm-adjusted over every head of the run (one family of
  claims). Where a table has it, :func:`standout` decides by it (at
  :data:`ALPHA`): it compares heads within each call, so the calls' own
  spread does not hide a head that is slower in every call, and a head that
  happened to go first in a few calls is not called hotter. Where every call
  computed the heads in the same order (a compiled model's traced order, an
  older recording), a head cannot be told from its position and no head is
  compared.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

QUANTILES = (10, 50, 90)
DURATION = [f"duration_per_call_p{q}_ns" for q in QUANTILES]
BANDWIDTH = [f"bandwidth_per_call_p{q}_gbps" for q in QUANTILES]
MIN_CALLS = 2
CALL_BANDWIDTH = "_bandwidth_per_call_gbps"  # the per-instance column per_call reads
VERDICT_MIN_CALLS = 3  # a p10–p90 interval of two calls is their whole range: too thin to call anything hotter
LAYER_MIN_CALLS = 5  # layers have no rank test within a call: their p10–p90 must rest on at least this many calls
ALPHA = 0.01  # chance of calling any head of a run hotter (or cooler) when its heads are alike
RANK_P = ["hotter_p", "cooler_p"]
_EXACT_CALLS = 60  # up to this many calls the rank sum's distribution is convolved exactly; beyond, its normal limit


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


def _rank_sum_tails(calls: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """P(S ≥ s) and P(S ≤ s) for s = 0 … calls·heads, S the sum of ``calls``
    independent ranks, each uniform over 1 … ``heads``."""
    one = np.r_[0.0, np.full(heads, 1.0 / heads)]
    pmf = np.array([1.0])
    for _ in range(calls):
        pmf = np.convolve(pmf, one)
    return np.clip(pmf[::-1].cumsum()[::-1], 0.0, 1.0), np.clip(pmf.cumsum(), 0.0, 1.0)


def _rank_p(total: np.ndarray, calls: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-sided p-values of summed ranks: (as high or higher, as low or lower) than ``total``,
    for heads that are alike. Mid-ranks of ties are rounded towards the middle (conservative)."""
    hot, cool = np.full(len(total), np.nan), np.full(len(total), np.nan)
    for n, h in {(int(n), int(h)) for n, h in zip(calls, heads)}:
        at = (calls == n) & (heads == h)
        if n <= _EXACT_CALLS:
            upper, lower = _rank_sum_tails(n, h)
            hot[at] = upper[np.floor(total[at]).astype(np.int64)]
            cool[at] = lower[np.ceil(total[at]).astype(np.int64)]
        else:  # the sum of many uniform ranks is normal; its tails are thinner than the normal's (conservative)
            mean, sd = n * (h + 1) / 2.0, np.sqrt(n * (h * h - 1) / 12.0)
            hot[at] = 0.5 * _erfc((np.floor(total[at]) - 0.5 - mean) / sd / np.sqrt(2.0))
            cool[at] = 0.5 * _erfc((mean - np.ceil(total[at]) - 0.5) / sd / np.sqrt(2.0))
    return hot, cool


def _erfc(x: np.ndarray) -> np.ndarray:
    return np.array([math.erfc(v) for v in np.asarray(x, dtype="float64")])


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of the p-values ``p`` (one family; nulls stay null)."""
    out = np.full(len(p), np.nan)
    known = np.flatnonzero(~np.isnan(p))
    if not len(known):
        return out
    order = known[np.argsort(p[known], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def rank_tests(head_ranges: pd.DataFrame, keys: list[str], layer_keys: list[str]) -> pd.DataFrame:
    """Per head (``keys``): how its time ranks among the heads of each of its calls.

    Args:
        head_ranges: head range instances with ``parent_range_id`` (the layer
            call they belong to), ``start_ns`` and ``duration_ns``.
        keys: a head row's keys; ``layer_keys``: a layer row's.

    Returns:
        ``keys`` + ``positions_seen`` (the distinct places, in the order its call
        computed them, the head took over its calls) and :data:`RANK_P`: the
        Holm-adjusted p-values (over every head and both directions) of its
        summed rank over the calls where its layer computed all its heads,
        against heads that are alike. Null with fewer than
        :data:`VERDICT_MIN_CALLS` such calls, and for every head of a layer
        whose calls all computed the heads in one order.
    """
    r = head_ranges[[*keys, "parent_range_id", "start_ns", "duration_ns"]].dropna(subset=["parent_range_id", "duration_ns"])
    r = r.assign(
        _rank=r.groupby("parent_range_id")["duration_ns"].rank(method="average"),
        _position=r.groupby("parent_range_id")["start_ns"].rank(method="first"),
        _heads=r.groupby("parent_range_id")["duration_ns"].transform("size"),
    )
    full = r["_heads"] == r.groupby(layer_keys, dropna=False)["_heads"].transform("max")
    grouped = r[full].groupby(keys, dropna=False, sort=True)
    out = pd.DataFrame({"positions_seen": r.groupby(keys, dropna=False, sort=True)["_position"].nunique()})
    out = out.join(pd.DataFrame({"_calls": grouped.size(), "_total": grouped["_rank"].sum(),
                                 "_heads": grouped["_heads"].max()})).reset_index()
    varied = out.groupby(layer_keys, dropna=False)["positions_seen"].transform("max") > 1
    tested = varied & (out["_calls"].fillna(0) >= VERDICT_MIN_CALLS) & (out["_heads"].fillna(0) >= 2)
    hot, cool = np.full(len(out), np.nan), np.full(len(out), np.nan)
    if tested.any():
        at = tested.to_numpy()
        hot[at], cool[at] = _rank_p(out.loc[tested, "_total"].to_numpy(dtype="float64"),
                                    out.loc[tested, "_calls"].to_numpy(dtype="int64"), out.loc[tested, "_heads"].to_numpy(dtype="int64"))
    adjusted = holm(np.r_[hot, cool])
    out["hotter_p"], out["cooler_p"] = adjusted[:len(out)], adjusted[len(out):]
    return out[[*keys, "positions_seen", *RANK_P]]


def standout(rows: pd.DataFrame, key: str = "head", min_calls: int = VERDICT_MIN_CALLS) -> pd.DataFrame:
    """The rule for "head X is hotter than the others" (or layer X, with ``key="layer"``).

    Args:
        rows: the rows compared with each other — the heads of one layer, or
            the layers of one phase (one run and implementation) — with
            ``key`` and :data:`DURATION`; heads also with ``positions_seen``
            and :data:`RANK_P` (:func:`rank_tests`) where the table has them.

    Returns:
        One row per head (``key``): ``verdict`` (``hotter``, ``cooler``,
        ``within noise`` or ``unknown``), ``why`` (what left it unknown:
        ``calls`` where the spread is unknown or too thin, fewer than
        :data:`VERDICT_MIN_CALLS` calls; ``order`` where every call computed
        the heads in one order), ``vs_median_pct`` (its median time per call
        over the median head's, minus 1, in %), ``noise_pct`` (the median
        head's relative half-width, in %), ``p`` (the rank test's adjusted
        p-value in the verdict's direction, where tested) and ``reference``
        (the median head), ``widest_pct`` (the widest relative half-width among the rows, in %: the spread the
        verdicts saw). ``min_calls``: the calls a row needs to be compared (layers: :data:`LAYER_MIN_CALLS`).
        Where the rows carry the rank test, hotter
        (cooler) is its verdict at :data:`ALPHA`, in the direction of the
        medians; else the p10–p90 intervals must lie apart.
    """
    lo, mid, hi = DURATION
    rows = rows.dropna(subset=[mid]).sort_values([mid, key]).reset_index(drop=True)
    if len(rows) < 2:
        return pd.DataFrame(columns=[key, "verdict", "why", "vs_median_pct", "noise_pct", "p", "reference", "widest_pct"])
    ref = rows.iloc[(len(rows) - 1) // 2]
    noise = 100.0 * relative_half_width(ref[lo], ref[mid], ref[hi])
    enough = rows["calls"].fillna(0).astype("float64") >= max(min_calls, VERDICT_MIN_CALLS) if "calls" in rows else pd.Series(True, index=rows.index)
    known = rows[lo].notna() & rows[hi].notna() & pd.notna(ref[lo]) & pd.notna(ref[hi]) & enough & bool(enough.iloc[(len(rows) - 1) // 2])
    above, below = (rows[lo] > ref[hi]).to_numpy(), (rows[hi] < ref[lo]).to_numpy()
    why = np.where(known, None, "calls").astype(object)
    p = np.full(len(rows), np.nan)
    if all(c in rows for c in ("positions_seen", *RANK_P)):
        if known.any() and not (rows["positions_seen"].fillna(1) > 1).any():
            known, why = pd.Series(False, index=rows.index), np.where(known, "order", why).astype(object)
        # the rank test compares heads within each call, so the calls' own spread (tens of percent on a CPU) does
        # not hide a head that is slower in every call; its sign must agree with the medians'
        hot_p, cool_p = rows["hotter_p"].to_numpy(dtype="float64"), rows["cooler_p"].to_numpy(dtype="float64")
        slower = (rows[mid] > ref[mid]).to_numpy()
        p = np.where(slower, hot_p, cool_p)
        above, below = slower & (hot_p <= ALPHA), ~slower & (cool_p <= ALPHA)  # a null p (untested) is no claim
    verdict = np.where(~known, "unknown", np.where(above, "hotter", np.where(below, "cooler", "within noise")))
    return pd.DataFrame({
        key: rows[key].to_numpy(),
        "verdict": verdict,
        "why": why,
        "vs_median_pct": 100.0 * (rows[mid].to_numpy(dtype="float64") / float(ref[mid]) - 1.0),
        "noise_pct": noise,
        "p": p,
        "reference": ref[key],
        "widest_pct": 100.0 * float(np.nanmax([relative_half_width(a, b, c) for a, b, c in zip(rows[lo], rows[mid], rows[hi])]
                                                + [np.nan])) if len(rows) else np.nan,
    })
