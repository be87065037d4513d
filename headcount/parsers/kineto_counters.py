"""PM samples in a torch.profiler trace: the counter events torch 2.15 writes for
``PerformanceMetricsConfig`` (Kineto's CUPTI PM sampling and Cuspy alike), as the
PM-sample table headcount's own sampler gives (:func:`headcount.parsers.cupti_records.pm_samples_frame`).

Both writers emit one event per metric per sample, stamped at the sample's start, with no end::

    {"ph": "C", "name": <metric>, "pid": "GPU <n> Counters", "ts": <µs>, "args": {"": <value>}}

(Kineto adds ``"cat": "hardware_counters"`` and a ``tid``). A sample's window is therefore
[its stamp, the next stamp) on its device; the last one, and one followed by a gap of more than
:data:`GAP_FACTOR` intervals, gets the median interval. The interval is the samples' median spacing.

Metrics read (``METRICS``, the names torch users pass; :data:`RECOMMENDED` is the set to ask for):

- ``dram__bytes_read.sum``, ``dram__bytes_write.sum``: bytes over the sample (measured);
- ``…sum.per_second``: a rate, times the sample's window (measured, converted with the window);
- ``dram__bytes_read.sum.pct_of_peak_sustained_elapsed`` (and write), ``dram__read_throughput…pct…``
  (Cuspy shows it as ``HBM Read (%)``): % of the device's peak DRAM bandwidth, times that peak and the
  window — a conversion the notice names, with the peak it used;
- ``sm__warps_active.avg.pct_of_peak_sustained_elapsed``: warps active, % (device-wide).

Cuspy puts its environment counters (power, clocks) and per-kernel cycles on the same track; they and
any metric not listed are left out, named in a notice.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

RECOMMENDED = ["dram__bytes_read.sum", "dram__bytes_write.sum", "sm__warps_active.avg.pct_of_peak_sustained_elapsed"]
"""The metrics to pass to ``torch.profiler.PerformanceMetricsConfig``: what headcount's own PM sampler records."""

GAP_FACTOR = 1.5  # a spacing over this many intervals is a gap in sampling (the sample before it gets one interval)

_READ, _WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
_WARPS = "sm__warps_active.avg.pct_of_peak_sustained_elapsed"
# metric as written → (headcount's column key, how its value becomes that key's unit)
METRICS = {
    _READ: (_READ, "total"), _WRITE: (_WRITE, "total"),
    _READ + ".per_second": (_READ, "per_second"), _WRITE + ".per_second": (_WRITE, "per_second"),
    _READ + ".pct_of_peak_sustained_elapsed": (_READ, "pct_of_peak"),
    _WRITE + ".pct_of_peak_sustained_elapsed": (_WRITE, "pct_of_peak"),
    "dram__read_throughput.avg.pct_of_peak_sustained_elapsed": (_READ, "pct_of_peak"),
    "dram__write_throughput.avg.pct_of_peak_sustained_elapsed": (_WRITE, "pct_of_peak"),
    "HBM Read (%)": (_READ, "pct_of_peak"), "HBM Write (%)": (_WRITE, "pct_of_peak"),  # Cuspy's labels of the two above
    _WARPS: (_WARPS, "percent"),
}
assert {key for key, _ in METRICS.values()} <= {*PM_COUNTERS, *PM_PERCENTS}

_TRACK = re.compile(r"GPU (\d+) Counters$")


def counter_rows(events: list) -> list[tuple]:
    """``(device, metric, ts µs, value)`` of the GPU counter events among decoded trace events
    (:mod:`headcount.parsers.kineto_json`); a counter on another track (a CPU counter) is not one."""
    rows = []
    for ev in events:
        if ev.ph != "C":
            continue
        track = _TRACK.match(ev.pid) if isinstance(ev.pid, str) else None
        if track is None or ev.ts is None:
            continue
        value = ev.args.counter if ev.args is not None else None
        rows.append((int(track.group(1)), str(ev.name), float(ev.ts), value))
    return rows


def pm_samples(rows: list[tuple], peak_gbps: float | None = None, peak_basis: str | None = None) -> tuple[pd.DataFrame | None, list[str]]:
    """The trace's PM samples as ``start_ns``, ``end_ns`` and one column per metric key
    (:data:`headcount.common.nsight.PM_COUNTERS` in bytes over the sample, :data:`~headcount.common.nsight.PM_PERCENTS`
    in %), from :func:`counter_rows`; and the notices on what was converted or left out. ``peak_gbps``: the
    device's peak DRAM bandwidth (GB/s) that % of peak metrics are converted with, ``peak_basis`` where it came
    from (``None``: such metrics are left out, with a notice).

    ``None`` when the trace has no metric headcount reads (or too few samples to know their interval).
    Samples of one device only: the device with the most (others named in a notice).
    """
    if not rows:
        return None, []
    frame = pd.DataFrame(rows, columns=["device", "metric", "ts_us", "value"])
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    notices = []
    devices = frame["device"].value_counts()
    if len(devices) > 1:
        notices.append(f"PM samples of {len(devices)} GPUs in the trace: those of GPU {devices.index[0]} read "
                       f"(the one with the most), GPU {', '.join(str(d) for d in devices.index[1:])} left out")
    frame = frame[frame["device"] == devices.index[0]]
    left = sorted(set(frame["metric"]) - set(METRICS))
    if left:
        notices.append(f"GPU counters headcount does not read left out: {', '.join(left)} "
                       f"(PM metrics it reads: docs/cli.md § PM samples in a torch trace)")
    frame = frame[frame["metric"].isin(list(METRICS))]
    if not len(frame):
        return None, notices
    frame["start_ns"] = np.rint(frame["ts_us"].to_numpy(np.float64) * 1e3).astype(np.int64)
    # a sample is one stamp; several metrics written for it share it
    wide = frame.pivot_table(index="start_ns", columns="metric", values="value", aggfunc="last").sort_index()
    start = wide.index.to_numpy(np.int64)
    if len(start) < 2:
        notices.append("one PM sample in the trace: its window (the spacing of samples) is unknown; sampled figures are null")
        return None, notices
    spacing = np.diff(start)
    interval = float(np.median(spacing))
    end = np.append(np.where(spacing > GAP_FACTOR * interval, start[:-1] + interval, start[1:]), start[-1] + interval).astype(np.int64)
    window_ns = (end - start).astype(np.float64)
    out = pd.DataFrame({"start_ns": start, "end_ns": end})
    peak, basis = peak_gbps, peak_basis
    converted = []
    for metric in wide.columns:
        key, unit = METRICS[metric]
        values = wide[metric].to_numpy(np.float64)
        if unit == "per_second":
            values = values * window_ns / 1e9
        elif unit == "pct_of_peak":
            if peak is None:
                notices.append(f"{metric}: % of peak DRAM bandwidth, and the trace's device has no known peak to convert it "
                               "with: left out (record dram__bytes_read.sum / dram__bytes_write.sum instead)")
                continue
            values = values / 100.0 * peak * window_ns  # GB/s = bytes per ns
            converted.append(metric)
        if key in out and unit != "total":
            continue  # the counter itself is there: it is the measurement
        out[key] = values
    if converted:
        notices.append(f"PM samples {', '.join(converted)} are % of peak: converted to bytes with the device's peak DRAM "
                       f"bandwidth ({peak:,.0f} GB/s, {basis}); record {_READ} and {_WRITE} for bytes as counted")
    if not any(key in out for key in (*PM_COUNTERS, *PM_PERCENTS)):
        return None, notices
    return out, notices

