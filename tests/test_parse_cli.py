"""``headcount parse`` on nsys SQLite exports: the report, and refusing bad input."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from headcount.cli.main import main
from headcount.common.device import Device

FIX = Path(__file__).parent / "fixtures" / "nsys"
H100 = FIX / "h100x2_pytorch_nsys2026.2.sqlite"
A100 = FIX / "a100x4_cloverleaf_nsys2024.5.sqlite"


def test_parse_two_exports_into_one_report(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["parse", str(H100), str(A100), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "no GPU operation was launched inside an NVTX range" in err  # the A100 capture has no NVTX
    runs = pd.read_parquet(out / "runs")
    # the H100 export's two processes (ranks) ran GPU work: a run each (as `headcount run` makes them); the A100's one
    assert len(runs) == 3 and set(runs["source"]) == {"nsys"}
    assert sorted(runs["pid"].dropna().astype(int)) == [111, 112] and runs["run_id"].str.endswith(("-pid111", "-pid112")).sum() == 2
    versions = sorted(runs["source_version"])
    assert versions[0].startswith("2024.5") and versions[1:] == ["2026.2.1.210"] * 2
    kernels = pd.read_parquet(out / "kernels")
    assert len(kernels) == 4368 + 1591
    ranges = pd.read_parquet(out / "ranges")
    reference = pd.read_csv(FIX / "h100x2_pytorch_nsys2026.2.nvtx_gpu_proj_trace.csv")
    with_ops = ranges[ranges["gpu_op_count"] > 0]
    assert len(with_ops) == len(reference) == 3242
    assert set(with_ops["duration_basis"]) == {"gpu_busy"}
    # no NVTX naming of ours in that capture: the ranges stay ranges, never posed as layers
    assert not (out / "layers").exists() or len(pd.read_parquet(out / "layers")) == 0
    assert set(ranges["level"]) == {"other"} and ranges["layer_name"].isna().all()
    top = duckdb.sql(f"SELECT name, duration_ns FROM read_parquet('{out}/ranges/**/*.parquet', hive_partitioning=true) "
                     "ORDER BY duration_ns DESC NULLS LAST LIMIT 1").fetchall()
    assert top and top[0][1] > 0


H200 = FIX / "h200_nvfuser_nsys2024.6.sqlite"
NCU = Path(__file__).parent / "fixtures" / "ncu"


def test_parsed_recordings_keep_their_device_and_not_this_machines_versions(tmp_path, capsys):
    out = tmp_path / "r"
    files = [A100, H200, NCU / "rtx2080ti_two_kernels.ncu-rep", NCU / "h800_flash_fwd_raw.C.csv"]
    assert main(["parse", *map(str, files), "-o", str(out)]) == 0
    runs = pd.read_parquet(out / "runs").sort_values("device_name")
    assert runs["device_name"].tolist() == ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 2080 Ti", "NVIDIA H200", "NVIDIA H800"]
    assert runs["device_compute_capability"].tolist() == ["8.0", "7.5", "9.0", "9.0"]
    assert runs["device_sm_count"].tolist() == [108, 68, 132, 132]
    bandwidth = dict(zip(runs["device_name"], runs["device_memory_bandwidth_gbps"]))
    assert bandwidth["NVIDIA H200"] == pytest.approx(4916.736) and bandwidth["NVIDIA A100-SXM4-80GB"] == pytest.approx(2039.04)
    # the recorded program's versions are not in these files: null, never the parsing machine's
    assert runs["torch"].isna().all() and runs["transformers"].isna().all()
    from headcount import __version__
    assert (runs["tool_version"] == __version__).all()

    kernels = pd.read_parquet(out / "kernels").merge(runs[["run_id", "device_name"]], on="run_id")
    a100 = kernels[(kernels["device_name"] == "NVIDIA A100-SXM4-80GB") & (kernels["kind"] == "kernel")]
    assert len(a100) == 1312 and a100["theoretical_occupancy_pct"].notna().mean() >= 0.9
    assert a100["theoretical_occupancy_pct"].between(0, 100, inclusive="right").all()
    h200 = kernels[(kernels["device_name"] == "NVIDIA H200") & (kernels["kind"] == "kernel")]
    assert h200["theoretical_occupancy_pct"].notna().all()


def test_occupancy_of_a_parsed_kernel_by_hand():
    """One A100 kernel of the fixture, worked by hand from TARGET_INFO_GPU's limits."""
    from headcount.derive import occupancy
    from headcount.parsers.nsys_sqlite import read_export

    export = read_export(A100)
    device = export.devices.set_index("device").loc[0]
    assert (device["max_warps_per_sm"], device["max_blocks_per_sm"], device["shared_memory_per_sm"]) == (64, 32, 167936)
    limits = Device.from_target_info(device).limits()
    # 128 threads (4 warps), 32 registers, no shared memory: 32 × 32 = 1,024 registers per warp, 16 per
    # sub-partition → 64 warps by registers, 64 by the SM's warps, 32 blocks × 4 warps = 128 → 64 warps: 100 %
    assert occupancy.theoretical_occupancy_pct([128], [32], [0], limits)[0] == 100.0
    # 256 threads, 128 registers: 4,096 per warp → 4 warps per sub-partition, 16 in all → 2 blocks of 8 warps: 25 %
    assert occupancy.theoretical_occupancy_pct([256], [128], [0], limits)[0] == 25.0


def test_report_of_someone_elses_ranges_summarises_them_as_ranges(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["parse", str(H100), str(H200), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Ranges by name (NVTX ranges and torch.profiler annotations, not headcount's)" in printed and "aten::copy_" in printed
    assert "None" not in printed and "unknown)" not in printed
    page = (out / "report.html").read_text()
    assert "Ranges by name: NVTX ranges that are not headcount" in page and "KernelExecutor::runFusion" in page
    assert "Bottlenecks" not in page


@pytest.mark.parametrize("name, content, message", [
    ("notes.txt", b"hello", ".txt input is not supported yet"),
    ("bad.sqlite", b"not sqlite at all", "not an SQLite file"),
    ("cut.sqlite", H100.read_bytes()[:400_000], "damaged or truncated"),
])
def test_bad_inputs_write_nothing(tmp_path, capsys, name, content, message):
    bad = tmp_path / name
    bad.write_bytes(content)
    out = tmp_path / "r"
    # the good file first: still nothing may be written
    assert main(["parse", str(H100), str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("headcount: error:")]
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0]
    assert "Traceback" not in err
    assert not out.exists()


def test_directory_that_is_not_a_parquetdir_export(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["parse", str(tmp_path), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: a directory with no recording headcount reads in it (of a kind no source reads: notes.txt" in err
