"""Device peaks and the roofline class."""

from __future__ import annotations

import pandas as pd
import pytest

from headcount.derive import devices


@pytest.mark.parametrize("name,expect", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM 80GB"), ("NVIDIA H100 PCIe", "H100 PCIe 80GB"), ("NVIDIA H200", "H200 SXM 141GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"), ("NVIDIA H800", "H800 SXM 80GB"),
])
def test_device_names_find_their_peaks(name, expect):
    peaks = devices.peaks_for(name)
    assert peaks.name == expect and peaks.dram_gbps > 0 and peaks.tflops["bfloat16"] > 0 and peaks.source


def test_unknown_devices_have_no_peaks():
    assert devices.peaks_for("Tesla K80") is None and devices.peaks_for(None) is None


def test_ridge_point_and_class():
    h100 = devices.peaks_for("NVIDIA H100 80GB HBM3")
    assert devices.ridge(h100, "bfloat16") == pytest.approx(989.4e12 / 3350e9)
    assert devices.ridge(h100, "bfloat16", measured_gbps=3000.0) == pytest.approx(989.4e12 / 3000e9)
    assert devices.ridge(h100, "int4") is None
    t = pd.DataFrame({"intensity_flop_per_byte": [10.0, 400.0, None]})
    got = devices.roofline_class(t, "NVIDIA H100 80GB HBM3", "bfloat16")
    assert got.tolist() == ["memory-bound", "compute-bound", None]
    assert devices.roofline_class(t, "NVIDIA H100 80GB HBM3", "float32").tolist()[:2] == ["memory-bound", "compute-bound"]  # ridge 20
    assert devices.roofline_class(t, None, "bfloat16").isna().all()
    assert devices.roofline_class(t, "NVIDIA H100 80GB HBM3", None).isna().all()


def test_calibrate_cli(tmp_path, capsys):
    from headcount import calibrate
    from headcount.cli.main import main as cli_main

    assert cli_main(["calibrate"]) == 3  # no GPU here
    assert "--device cuda: no CUDA GPU here" in capsys.readouterr().err
    out = tmp_path / "r"
    assert cli_main(["profile", "--steps", "1", "--seq", "16", "--impl", "sdpa", "-o", str(out)]) == 0
    assert cli_main(["calibrate", "--device", "cpu", "--mib", "8", "-o", str(out)]) == 0
    stored = calibrate.load(out)
    assert stored["device"] == "cpu" and stored["copy_ceiling_gbps"] > 0 and stored["bytes"] == 8 << 20
    assert calibrate.load(out, device_name="NVIDIA H100") is None
