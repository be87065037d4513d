"""Device-wide GPU-metrics samples (nsys ``--gpu-metrics-devices``) apportioned
to each kernel's time window: provenance ``sampled``.

A sample at time t summarizes the interval (t − Δ, t] before it, Δ being the
sampling interval (the median gap between samples of that device and metric).
A kernel running over [start, end] gets the mean of the samples whose
intervals overlap its window: t in [start, end + Δ). The values are
device-wide percentages: on a GPU running several kernels at once, each
kernel gets the whole device's figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# headcount column -> nsys metric names (they carry their unit in brackets in newer releases)
SAMPLED = {
    "dram_read_sampled_pct": ("DRAM Read Bandwidth", "DRAM Read Bandwidth [Throughput %]"),
    "dram_write_sampled_pct": ("DRAM Write Bandwidth", "DRAM Write Bandwidth [Throughput %]"),
    "sm_active_sampled_pct": ("SMs Active", "SMs Active [Throughput %]"),
}


def sampling_interval_ns(samples: pd.DataFrame) -> pd.Series:
    """Median gap between consecutive samples, per (device, metric), in ns."""
    gaps = samples.groupby(["device", "metric"])["timestamp_ns"].diff()
    return gaps.groupby([samples["device"], samples["metric"]]).median()


def apportion(kernels: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Add the :data:`SAMPLED` columns and ``sampling_interval_ns`` to kernels.

    Args:
        kernels: ``device`` (``cuda:N``), ``start_ns``, ``end_ns``.
        samples: ``device`` (N), ``metric``, ``timestamp_ns``, ``value`` (%).

    Returns:
        A copy of ``kernels``; a kernel with no overlapping sample (or a metric
        not recorded) gets null, never 0.
    """
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
            mean = np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)
            out.loc[out.index[rows], column] = mean
            out.loc[out.index[rows], "sampling_interval_ns"] = float(delta)
    return out
