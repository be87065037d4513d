"""Device-wide samples — nsys GPU metrics (``--gpu-metrics-devices``) and
CUPTI PM sampling — given to the kernels and ranges they resolve: provenance
``sampled``.

nsys: a sample at time t summarizes the interval (t − Δ, t] before it, Δ
being the sampling interval (the median gap between samples of that device
and metric). A kernel running over [start, end] gets the mean of the samples
whose intervals overlap its window, t in [start, end + Δ), where at least
:data:`MIN_WHOLE_SAMPLES` intervals lie wholly inside it (else null: a kernel
shorter than that would get a reading of whatever else ran in the sample).
The values are device-wide percentages: on a GPU running several kernels at
once, each kernel gets the whole device's figure.

PM sampling (:func:`window_totals`): counters and percentages over a
window, from the samples it overlaps, weighted by the overlap, under the
same rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

# headcount column -> nsys metric names (they carry their unit in brackets in newer releases)
SAMPLED = {
    "dram_read_sampled_pct": ("DRAM Read Bandwidth", "DRAM Read Bandwidth [Throughput %]"),
    "dram_write_sampled_pct": ("DRAM Write Bandwidth", "DRAM Write Bandwidth [Throughput %]"),
    "sm_active_sampled_pct": ("SMs Active", "SMs Active [Throughput %]"),
}


MIN_WHOLE_SAMPLES = 4
"""A window (a kernel, a range) gets PM-sampled figures only when at least this many whole samples lie
inside it: its two edge samples, shared with whatever ran before and after, are then at most a third of
what it is given. A shorter window would get a share of its neighbours' samples, which is not a
measurement of it: its figures are null (``pm_whole_samples`` says how many it had)."""


def sampling_interval_ns(samples: pd.DataFrame) -> pd.Series:
    """Median gap between consecutive samples, per (device, metric), in ns."""
    gaps = samples.groupby(["device", "metric"])["timestamp_ns"].diff()
    return gaps.groupby([samples["device"], samples["metric"]]).median()


def apportion(kernels: pd.DataFrame, samples: pd.DataFrame, min_whole: int | None = None) -> pd.DataFrame:
    """Add the :data:`SAMPLED` columns and ``sampling_interval_ns`` to kernels.

    Args:
        kernels: ``device`` (``cuda:N``), ``start_ns``, ``end_ns``.
        samples: ``device`` (N), ``metric``, ``timestamp_ns``, ``value`` (%).
        min_whole: sample intervals that must lie wholly inside a kernel for it to get a figure
            (default :data:`MIN_WHOLE_SAMPLES`; 0: any overlapping sample).

    Returns:
        A copy of ``kernels``; a kernel with no overlapping sample, one the
        samples do not resolve (or a metric not recorded) gets null, never 0.
    """
    min_whole = MIN_WHOLE_SAMPLES if min_whole is None else min_whole
    out = kernels.copy()
    for col in (*SAMPLED, "sampling_interval_ns"):
        out[col] = np.nan
    if samples.empty or kernels.empty:
        return out
    device = pd.to_numeric(out["device"].astype(str).str.removeprefix("cuda:"), errors="coerce").to_numpy()
    start = out["start_ns"].to_numpy(np.int64)
    end = out["end_ns"].to_numpy(np.int64)
    interval = sampling_interval_ns(samples)
    for column, names in SAMPLED.items():
        for (dev, metric), group in samples[samples["metric"].isin(names)].groupby(["device", "metric"]):
            delta = interval.get((dev, metric))
            if delta is None or np.isnan(delta):
                continue
            rows = np.flatnonzero(device == dev)
            t = group["timestamp_ns"].to_numpy(np.int64)
            csum = np.concatenate([[0.0], np.cumsum(group["value"].to_numpy(np.float64))])
            lo = np.searchsorted(t, start[rows], side="left")
            hi = np.searchsorted(t, end[rows] + delta, side="left")
            n = hi - lo
            # intervals (t − Δ, t] wholly inside [start, end]: t in [start + Δ, end]
            whole = np.maximum(np.searchsorted(t, end[rows], side="right") - np.searchsorted(t, start[rows] + delta, side="left"), 0)
            mean = np.where((n > 0) & (whole >= min_whole), (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)
            out.loc[out.index[rows], column] = mean
            out.loc[out.index[rows], "sampling_interval_ns"] = float(delta)
    return out


def unresolved_kernels_notice(kernels: pd.DataFrame) -> str | None:
    """The notice for GPU operations (kernels, copies) that nsys GPU metrics were recorded for but do not resolve
    (:func:`apportion`), or ``None``."""
    if "sampling_interval_ns" not in kernels:
        return None
    sampled = kernels["sampling_interval_ns"].notna()
    values = kernels[[c for c in SAMPLED if c in kernels]].notna().any(axis=1)
    short = int((sampled & ~values).sum())
    if not short:
        return None
    interval = float(kernels.loc[sampled, "sampling_interval_ns"].median())
    return (f"nsys GPU metrics ({interval / 1e3:g} µs samples) do not resolve {short} of {int(sampled.sum())} GPU operations (fewer "
            f"than {MIN_WHOLE_SAMPLES} whole samples inside each): their sampled percentages are null, not the reading of a "
            "sample that held other work; record with a higher nsys --gpu-metrics-frequency, or use --backend ncu for exact counters")



def _relative(values, origin: int) -> np.ndarray:
    """Times (ns) as float64 after ``origin``, null as NaN: exact for whole numbers (an absolute CUPTI time,
    ~1.8e18 ns, is only 256 ns fine as a float64: a 50 µs sample's share would be off by up to 0.5 %)."""
    series = pd.Series(values) if not isinstance(values, pd.Series) else values
    if pd.api.types.is_float_dtype(series.dtype):
        return series.to_numpy(np.float64, na_value=np.nan) - float(origin)
    return (pd.array(series, dtype="Int64") - origin).to_numpy(np.float64, na_value=np.nan)


def _cumulative(s: np.ndarray, e: np.ndarray, values: np.ndarray, t: np.ndarray) -> np.ndarray:
    """∫ of a piecewise-constant rate up to each time in ``t``: each sample [s_i, e_i)
    spreads ``values[i]`` evenly over it; nothing between samples."""
    cum = np.concatenate([[0.0], np.cumsum(values)])
    i = np.searchsorted(s, t, side="right") - 1
    ok = i >= 0
    j = np.maximum(i, 0)
    frac = np.clip((t - s[j]) / np.maximum(e[j] - s[j], 1.0), 0.0, 1.0)
    return np.where(ok, cum[j] + values[j] * frac, 0.0)


def whole_samples(s: np.ndarray, e: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many sample windows [s_i, e_i) lie wholly inside each [start, end] (ns); samples sorted, not overlapping."""
    first = np.searchsorted(s, start, side="left")  # first sample starting at or after the window's start
    last = np.searchsorted(e, end, side="right")  # samples ending at or before the window's end
    count = (last - first).astype(np.float64)
    count[np.isnan(start) | np.isnan(end)] = np.nan
    return np.clip(count, 0, None)


def window_totals(samples: pd.DataFrame, start, end, min_whole: int = MIN_WHOLE_SAMPLES) -> pd.DataFrame:
    """PM-sampled figures over time windows [start, end] (ns, whole numbers or nullable; floats are taken as
    they are, as fine as float64 holds them): counters as
    totals, percentages as time-weighted means, from the samples the window
    overlaps, each weighted by the part of it the window covers; null where
    fewer than ``min_whole`` whole samples lie inside the window (the
    instrument does not resolve it: :data:`MIN_WHOLE_SAMPLES`) and where the
    samples do not cover all of it (before the first, after the last, across a
    gap). ``pm_whole_samples``: the whole samples inside.

    Device-wide: two windows that overlap in time (concurrent kernels) each
    get the whole device's traffic of the overlap. Range windows (first
    kernel start to last kernel end) avoid counting a range's own concurrent
    kernels twice.
    """
    out = pd.DataFrame(index=range(len(start)))
    if samples is None or not len(samples) or not len(start):
        for col in (*PM_COUNTERS.values(), *PM_PERCENTS.values()):
            out[col] = np.nan
        out["pm_whole_samples"] = np.nan if samples is None or not len(samples) else 0.0
        return out
    origin = int(samples["start_ns"].iloc[0])
    s, e = _relative(samples["start_ns"], origin), _relative(samples["end_ns"], origin)
    start, end = _relative(start, origin), _relative(end, origin)
    length = e - s
    covered = _cumulative(s, e, length, end) - _cumulative(s, e, length, start)
    whole = whole_samples(s, e, start, end)
    # the samples must cover the whole window (not past their first or last, not across a gap in sampling): a
    # window they cover in part would get the traffic of that part only, an undercount
    whole_window = covered >= 0.999 * (end - start)
    has = (covered > 0) & ~np.isnan(start) & ~np.isnan(end) & (whole >= min_whole) & whole_window
    for metric, col in PM_COUNTERS.items():
        if metric in samples:
            v = samples[metric].to_numpy(np.float64)
            out[col] = np.where(has, _cumulative(s, e, v, end) - _cumulative(s, e, v, start), np.nan)
        else:
            out[col] = np.nan
    for metric, col in PM_PERCENTS.items():
        if metric in samples:
            v = samples[metric].to_numpy(np.float64) * length
            with np.errstate(divide="ignore", invalid="ignore"):
                out[col] = np.where(has, (_cumulative(s, e, v, end) - _cumulative(s, e, v, start)) / covered, np.nan)
        else:
            out[col] = np.nan
    out["pm_whole_samples"] = whole
    return out


def above_ceiling(samples: pd.DataFrame, ceiling_gbps: float | None) -> dict:
    """Single PM samples whose DRAM traffic over their own window exceeds ``ceiling_gbps`` (GB/s = bytes/ns):
    ``count``, ``samples`` (with DRAM counters), ``max_gbps`` (the highest sample), ``ceiling_gbps``. A figure
    over several samples can stay under the ceiling while single samples do not; they are counted, not hidden."""
    if samples is None or not len(samples) or "dram__bytes_read.sum" not in samples:
        return {"count": 0, "samples": 0, "max_gbps": None, "ceiling_gbps": ceiling_gbps}
    length = (samples["end_ns"] - samples["start_ns"]).to_numpy(np.float64)
    traffic = samples["dram__bytes_read.sum"].to_numpy(np.float64)
    if "dram__bytes_write.sum" in samples:
        traffic = traffic + samples["dram__bytes_write.sum"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        gbps = np.where(length > 0, traffic / length, np.nan)
    known = ~np.isnan(gbps)
    count = int((gbps[known] > ceiling_gbps).sum()) if ceiling_gbps else 0
    return {"count": count, "samples": int(known.sum()), "max_gbps": float(np.nanmax(gbps)) if known.any() else None,
            "ceiling_gbps": ceiling_gbps}


FINER_OWN = "a finer --pm-interval-us"
FINER_TORCH = "a shorter sampling_interval_ms in torch's PerformanceMetricsConfig"


def unresolved_notice(kernels: int, kernels_short: int, ranges: int, ranges_short: int, interval_ns: float | None,
                      finer: str = FINER_OWN) -> str | None:
    """The notice for windows the PM samples do not resolve (:data:`MIN_WHOLE_SAMPLES`), or ``None``; ``finer``:
    how the samples' recorder samples more often."""
    if not kernels_short and not ranges_short:
        return None
    interval = f"{interval_ns / 1e3:g} µs samples" if interval_ns else "PM samples"
    return (f"PM sampling ({interval}) does not resolve {ranges_short} of {ranges} attention ranges and {kernels_short} of "
            f"{kernels} kernels (fewer than {MIN_WHOLE_SAMPLES} whole samples inside each, or not all of it sampled): their "
            "sampled DRAM bytes and "
            "warps active are null, not a share of a neighbour's sample; exact bytes per kernel, layer and head: "
            f"headcount run --backend ncu -o OUT -- python train.py (or {finer})")


def sample_gaps(samples: pd.DataFrame) -> dict:
    """How regular the PM samples were: interval (median window, ns), and the
    gaps between consecutive windows (count, total ns)."""
    if samples is None or not len(samples):
        return {"samples": 0}
    s = samples["start_ns"].to_numpy(np.int64)
    e = samples["end_ns"].to_numpy(np.int64)
    gaps = s[1:] - e[:-1]
    return {"samples": int(len(s)), "median_window_ns": float(np.median(e - s)), "gaps": int((gaps > 0).sum()),
            "gap_total_ns": int(gaps[gaps > 0].sum()), "first_ns": int(s[0]), "last_ns": int(e[-1])}
