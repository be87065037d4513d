"""Device peaks and the roofline class."""

from __future__ import annotations

import pandas as pd
import pytest

from headcount.common.device import limits_for
from headcount.derive import peaks as device_peaks


@pytest.mark.parametrize("name,expect", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM 80GB"), ("NVIDIA H100 PCIe", "H100 PCIe 80GB"), ("NVIDIA H200", "H200 SXM 141GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"), ("NVIDIA H800", "H800 SXM 80GB"),
    ("NVIDIA B200", "B200 (HGX)"), ("NVIDIA GB200", "GB200 (one B200 GPU of the superchip)"), ("NVIDIA H20", "H20 96GB"),
    ("NVIDIA A10", "A10"), ("NVIDIA L40", "L40"), ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
])
def test_device_names_find_their_peaks(name, expect):
    peaks = device_peaks.peaks_for(name)
    assert peaks.name == expect and peaks.dram_gbps > 0 and peaks.tflops["bfloat16"] > 0 and peaks.source


@pytest.mark.parametrize("name,expect", [("Tesla V100-SXM2-32GB", "V100 SXM2"), ("Tesla V100-PCIE-16GB", "V100 PCIe"),
                                         ("Tesla T4", "T4")])
def test_gpus_without_bf16_have_fp16_peaks_only(name, expect):
    peaks = device_peaks.peaks_for(name)
    assert peaks.name == expect and peaks.tflops["float16"] > 0 and "bfloat16" not in peaks.tflops and "no BF16" in peaks.source
    assert device_peaks.ridge(peaks, "bfloat16") is None  # never a guess


def test_unknown_devices_have_no_peaks():
    assert device_peaks.peaks_for("Tesla K80") is None and device_peaks.peaks_for(None) is None
    assert device_peaks.peaks_for("NVIDIA A10G") is None  # not the A10, whose figures it would otherwise take


@pytest.mark.parametrize("cc,warps,blocks,occupancy_128_registers", [("10.0", 64, 32, 25.0), ("12.0", 48, 24, 100 / 3)])
def test_blackwell_occupancy_limits(cc, warps, blocks, occupancy_128_registers):
    import numpy as np

    from headcount.derive import occupancy

    limits = limits_for(cc)
    assert (limits.max_warps, limits.max_blocks) == (warps, blocks)
    # 256 threads, 128 registers: 16 warps fit the 64 Ki registers, 2 blocks of 8 warps
    got = occupancy.theoretical_occupancy_pct(np.array([256, 32]), np.array([128, 16]), np.array([0, 0]), limits)
    assert got[0] == pytest.approx(occupancy_128_registers)
    assert got[1] == pytest.approx(100 * blocks / warps)  # 1-warp blocks: the block limit binds


def test_ridge_point_and_class():
    h100 = device_peaks.peaks_for("NVIDIA H100 80GB HBM3")
    assert device_peaks.ridge(h100, "bfloat16") == pytest.approx(989.4e12 / 3350e9)
    assert device_peaks.ridge(h100, "bfloat16", measured_gbps=3000.0) == pytest.approx(989.4e12 / 3000e9)
    assert device_peaks.ridge(h100, "int4") is None
    # one second each: 3,000 GB/s (90 % of 3,350), 700 TFLOP (71 % of 989), 300 GB/s with 50 TFLOP (9 %, 5 %) on a
    # full grid and on 16 CTAs, and a row with no FLOPs known
    t = pd.DataFrame({"bandwidth_gbps": [3000.0, 100.0, 300.0, 300.0, 300.0], "flop": [1e12, 700e12, 50e12, 50e12, None],
                      "duration_ns": [1e9] * 5, "waves_per_sm": [3.0, 3.0, 3.0, 0.06, 3.0]})
    got = device_peaks.roofline_class(t, "NVIDIA H100 80GB HBM3", "bfloat16")
    assert got.tolist() == ["memory-bound", "compute-bound", "latency-bound", "under-filled", None]
    bandwidth, flop = device_peaks.achieved_pct(t, "NVIDIA H100 80GB HBM3", "bfloat16")
    assert bandwidth[0] == pytest.approx(100 * 3000 / 3350) and flop[1] == pytest.approx(100 * 700 / 989.4)
    assert device_peaks.roofline_class(t, "NVIDIA H100 80GB HBM3", "bfloat16", measured_gbps=400.0)[2] == "memory-bound"  # 75 %
    assert device_peaks.roofline_class(t, None, "bfloat16").isna().all()
    assert device_peaks.roofline_class(t, "NVIDIA H100 80GB HBM3", None).isna().all()


def test_calibrate_cli(tmp_path, capsys):
    from headcount.cli.main import main as cli_main
    from headcount.machine import calibrate

    assert cli_main(["calibrate"]) == 3  # no GPU here
    assert "--device cuda: no CUDA GPU here" in capsys.readouterr().err
    out = tmp_path / "r"
    assert cli_main(["profile", "--steps", "1", "--seq", "16", "--impl", "sdpa", "-o", str(out)]) == 0
    assert cli_main(["calibrate", "--device", "cpu", "--mib", "8", "-o", str(out)]) == 0
    stored = calibrate.load(out)
    assert stored["device"] == "cpu" and stored["copy_ceiling_gbps"] > 0 and stored["bytes"] == 8 << 20
    assert calibrate.load(out, device_name="NVIDIA H100") is None
