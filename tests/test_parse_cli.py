"""``headcount parse`` on nsys SQLite exports: the report, and refusing bad input."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from headcount.cli.main import main

FIX = Path(__file__).parent / "fixtures" / "nsys"
H100 = FIX / "h100x2_pytorch_nsys2026.2.sqlite"
A100 = FIX / "a100x4_cloverleaf_nsys2024.5.sqlite"


def test_parse_two_exports_into_one_report(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["parse", str(H100), str(A100), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "no GPU operation was launched inside an NVTX range" in err  # the A100 capture has no NVTX
    runs = pd.read_parquet(out / "runs")
    assert len(runs) == 2 and set(runs["source"]) == {"nsys"}
    versions = sorted(runs["source_version"])
    assert versions[0].startswith("2024.5") and versions[1] == "2026.2.1.210"
    kernels = pd.read_parquet(out / "kernels")
    assert len(kernels) == 4368 + 1591
    ranges = pd.read_parquet(out / "ranges")
    reference = pd.read_csv(FIX / "h100x2_pytorch_nsys2026.2.nvtx_gpu_proj_trace.csv")
    with_ops = ranges[ranges["gpu_op_count"] > 0]
    assert len(with_ops) == len(reference) == 3242
    assert set(with_ops["duration_basis"]) == {"gpu_projected"}
    # no NVTX naming of ours in that capture: layers fall back to one row per NVTX path
    layers = pd.read_parquet(out / "layers")
    assert len(layers) == with_ops["path"].nunique()
    assert layers["flop"].isna().all() and layers["dram_bytes"].isna().all()
    top = duckdb.sql(f"SELECT layer_name, duration_ns FROM read_parquet('{out}/layers/**/*.parquet', hive_partitioning=true) "
                     "ORDER BY duration_ns DESC LIMIT 1").fetchall()
    assert top and top[0][1] > 0


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
    lines = [l for l in err.splitlines() if l.startswith("headcount: error:")]
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0]
    assert "Traceback" not in err
    assert not out.exists()


def test_directory_that_is_not_a_parquetdir_export(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["parse", str(tmp_path), "-o", str(tmp_path / "r")]) == 2
    assert "not an nsys parquetdir export" in capsys.readouterr().err
