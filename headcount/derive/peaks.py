"""Device peaks for the roofline (docs/architecture.md §6): DRAM bandwidth and dense
tensor/vector FLOP/s per dtype, with where each number comes from.

Peaks are the vendors' datasheet figures (NVIDIA's; AMD's for the MI300X) (dense, i.e. without 2:4 sparsity; the
boost clock). A measured copy ceiling (``scripts/gpu_check.py bandwidth``)
replaces the datasheet bandwidth when given: real kernels never reach the
datasheet figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headcount.common.device import Device


@dataclass(frozen=True)
class DevicePeaks:
    name: str
    dram_gbps: float                  # 1e9 bytes/s
    tflops: dict                      # dtype → dense TFLOP/s (1e12)
    source: str


_A100 = {"float16": 312.0, "bfloat16": 312.0, "float32": 19.5, "tf32": 156.0}
_H100_SXM = {"float16": 989.4, "bfloat16": 989.4, "float32": 66.9, "tf32": 494.7}
_SRC_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021)"
_SRC_BLACKWELL = ("NVIDIA Blackwell datasheet (2024): HGX B200 at 1,000 W, GB200 at 1,200 W, per GPU, dense "
                  "(as tabulated at glennklockwood.com/garden/processors/B200)")
_SRC_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"

# matched in order against the device name torch or the profile reports (lower case)
# (keys that must all appear in the name, in order of precedence: "gb200" before "b200", "h200" before "h20",
# "a100" before "a10", "l40s" before "l40"; an entry of None: a name known to be another GPU than the next match)
DEVICES: list[tuple[tuple[str, ...], DevicePeaks | None]] = [
    (("gb200",), DevicePeaks("GB200 (one B200 GPU of the superchip)", 8000.0,
                             {"float16": 2500.0, "bfloat16": 2500.0, "float32": 90.0, "tf32": 1250.0}, _SRC_BLACKWELL)),
    (("b200",), DevicePeaks("B200 (HGX)", 8000.0, {"float16": 2250.0, "bfloat16": 2250.0, "float32": 80.0, "tf32": 1100.0},
                            _SRC_BLACKWELL)),
    (("h200",), DevicePeaks("H200 SXM 141GB", 4800.0, _H100_SXM, "NVIDIA H200 Tensor Core GPU datasheet (2024)")),
    (("h20",), DevicePeaks("H20 96GB", 4000.0, {"float16": 148.0, "bfloat16": 148.0, "float32": 44.0, "tf32": 74.0},
                           "NVIDIA H20 product brief (2024), as reported by its resellers; not checked against an NVIDIA page")),
    (("h100", "pcie"), DevicePeaks("H100 PCIe 80GB", 2000.0, {"float16": 756.5, "bfloat16": 756.5, "float32": 51.2, "tf32": 378.0}, _SRC_H100)),
    (("h100",), DevicePeaks("H100 SXM 80GB", 3350.0, _H100_SXM, _SRC_H100)),
    (("h800",), DevicePeaks("H800 SXM 80GB", 3350.0, _H100_SXM, "NVIDIA H800 product brief (2023)")),
    (("a100", "80gb", "pcie"), DevicePeaks("A100 80GB PCIe", 1935.0, _A100, _SRC_A100)),
    (("a100", "80gb"), DevicePeaks("A100 80GB SXM", 2039.0, _A100, _SRC_A100)),
    (("a100",), DevicePeaks("A100 40GB", 1555.0, _A100, _SRC_A100)),
    (("a10g",), None),  # AWS's A10G: another part than the A10
    (("a10",), DevicePeaks("A10", 600.0, {"float16": 125.0, "bfloat16": 125.0, "float32": 31.2, "tf32": 62.5},
                           "NVIDIA A10 Tensor Core GPU datasheet (2021)")),
    (("l40s",), DevicePeaks("L40S", 864.0, {"float16": 362.1, "bfloat16": 362.1, "float32": 91.6, "tf32": 183.0},
                            "NVIDIA L40S datasheet (2023)")),
    (("l40",), DevicePeaks("L40", 864.0, {"float16": 181.05, "bfloat16": 181.05, "float32": 90.5, "tf32": 90.5},
                           "NVIDIA L40 GPU datasheet (2022), FP16/BF16 tensor with FP32 accumulate")),
    (("l4",), DevicePeaks("L4", 300.0, {"float16": 121.0, "bfloat16": 121.0, "float32": 30.3, "tf32": 60.0}, "NVIDIA L4 datasheet (2023)")),
    (("4090",), DevicePeaks("GeForce RTX 4090", 1008.0, {"float16": 165.2, "bfloat16": 165.2, "float32": 82.6, "tf32": 82.6},
                            "NVIDIA Ada Lovelace GPU architecture whitepaper v1.1, FP16/BF16 tensor with FP32 accumulate")),
    (("3090",), DevicePeaks("GeForce RTX 3090", 936.0, {"float16": 71.0, "bfloat16": 71.0, "float32": 35.6, "tf32": 35.6},
                            "NVIDIA Ampere GA102 GPU architecture whitepaper v2.0, FP16/BF16 tensor with FP32 accumulate")),
    (("v100", "pcie"), DevicePeaks("V100 PCIe", 900.0, {"float16": 112.0, "float32": 14.0},
                                   "NVIDIA V100 Tensor Core GPU datasheet (2020); no BF16 or TF32 on Volta")),
    (("v100",), DevicePeaks("V100 SXM2", 900.0, {"float16": 125.0, "float32": 15.7},
                            "NVIDIA V100 Tensor Core GPU datasheet (2020); no BF16 or TF32 on Volta")),
    (("mi300x",), DevicePeaks("AMD Instinct MI300X", 5300.0, {"float16": 1307.4, "bfloat16": 1307.4, "float32": 163.4, "tf32": 653.7},
                              "AMD Instinct MI300X data sheet (2023): peak HBM3 bandwidth, peak dense matrix FP16/BF16/TF32/FP32")),
    (("t4",), DevicePeaks("T4", 320.0, {"float16": 65.0, "float32": 8.1},
                          "NVIDIA T4 Tensor Core GPU datasheet (2019); no BF16 or TF32 on Turing")),
]


def peaks_for(device_name: str | None) -> DevicePeaks | None:
    """The table's entry for a device name such as ``NVIDIA H100 80GB HBM3``, or ``None``."""
    if not device_name:
        return None
    name = device_name.lower()
    for keys, peaks in DEVICES:
        if all(k in name for k in keys):
            return peaks  # None for a part the table knows it has no figures for
    return None


def gpu_name(device: Device | None) -> str | None:
    """The GPU name of a run's device, ``None`` for a CPU or unknown device
    (so that a CPU run is never classified against a GPU's peaks)."""
    return device.name if device is not None and device.is_gpu else None


def ceiling_gbps(device: Device | None, measured_gbps: float | None = None) -> float | None:
    """The DRAM bandwidth ceiling to use (GB/s): a measured copy ceiling when
    given, else the memory bandwidth the recording reports for its device
    (nsys's ``TARGET_INFO_GPU.memoryBandwidth``), else ``None`` (the
    datasheet's, via :func:`peaks_for`)."""
    if measured_gbps:
        return float(measured_gbps)
    value = device.memory_bandwidth_gbps if device is not None else None
    return float(value) if value else None


def ridge(peaks: DevicePeaks, dtype: str, measured_gbps: float | None = None) -> float | None:
    """FLOP per byte where the roofline bends: peak FLOP/s ÷ bandwidth (the
    measured ceiling when given)."""
    tflops = peaks.tflops.get(dtype)
    if tflops is None:
        return None
    return tflops * 1e12 / ((measured_gbps or peaks.dram_gbps) * 1e9)


def achieved_pct(table: pd.DataFrame, device_name: str | None, dtype: str | None,
                 measured_gbps: float | None = None) -> tuple[pd.Series, pd.Series]:
    """Each row's achieved fraction of the device's two ceilings, in percent: ``bandwidth_gbps`` of
    the DRAM ceiling (the measured copy ceiling when given), and FLOP/s (``flop`` over
    ``duration_ns``) of the dense peak for ``dtype``; NaN where the device, the dtype or the
    row's figures are unknown."""
    nan = pd.Series(np.nan, index=table.index, dtype="float64")
    peaks = peaks_for(device_name)
    if peaks is None:
        return nan, nan.copy()
    figure = {c: pd.to_numeric(table[c], errors="coerce").astype("float64") if c in table else nan
              for c in ("bandwidth_gbps", "flop", "duration_ns")}
    bandwidth = 100.0 * figure["bandwidth_gbps"] / (measured_gbps or peaks.dram_gbps)
    tflops = peaks.tflops.get(dtype) if dtype else None
    seconds = figure["duration_ns"].where(figure["duration_ns"] > 0) * 1e-9
    flop = 100.0 * figure["flop"] / seconds / (tflops * 1e12) if tflops else nan.copy()
    return bandwidth, flop


def roofline_class(table: pd.DataFrame, device_name: str | None, dtype: str | None,
                   measured_gbps: float | None = None) -> pd.Series:
    """Which ceiling each row is up against, from how near it came to each (:func:`achieved_pct`),
    with Nsight Compute's own threshold (:data:`headcount.derive.bound.LATENCY_PCT`, 60 %):
    ``memory-bound`` or ``compute-bound`` where the nearer ceiling is reached to 60 % or more;
    else ``latency-bound``, or ``under-filled`` where the row's main kernel fills less than one
    wave of CTAs per SM (``waves_per_sm`` < 1). Null where the device, the dtype or a figure is
    unknown (never a guess)."""
    from headcount.derive.bound import LATENCY_PCT, WAVES

    out = pd.Series([None] * len(table), index=table.index, dtype=object)
    bandwidth, flop = achieved_pct(table, device_name, dtype, measured_gbps)
    known = (bandwidth.notna() & flop.notna()).to_numpy()
    if not known.any():
        return out
    b, f = bandwidth.to_numpy(np.float64), flop.to_numpy(np.float64)
    waves = (pd.to_numeric(table["waves_per_sm"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
             if "waves_per_sm" in table else np.full(len(table), np.nan))
    verdict = np.where(np.maximum(b, f) >= LATENCY_PCT, np.where(b >= f, "memory-bound", "compute-bound"),
                       np.where(waves < WAVES, "under-filled", "latency-bound"))
    out[known] = verdict[known]
    return out
