"""Many inputs (issue 58): a directory's every recording parsed or named as skipped, the CUPTI collector's own
records parsed on a machine without a GPU, and every run named by what it came from (``runs.path``, ``size_bytes``,
``sha256``, ``source``, ``rank``), in the table, the console headers and ``headcount query``; notes several runs
share said once."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from headcount.reports.compare import grouped

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
RECORDS = FIXTURES / "gpu" / "h100-2026-12-05" / "records-layer" / "sdpa" / "cupti-records.jsonl.gz"
IN_THE_FOLDER = {  # name in the folder → the real recording copied there
    "run.sqlite": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.sqlite",
    "run.nsys-rep": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.nsys-rep",  # beside its export: skipped
    "other.nsys-rep": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.nsys-rep",  # on its own: exported and read
    "raw.csv": FIXTURES / "ncu" / "rtx2080ti_two_kernels.raw.C.csv",
    "stats.csv": FIXTURES / "nsys" / "h100x2_pytorch_nsys2026.2.nvtx_gpu_proj_trace.csv",  # no ncu ID column: skipped
    "kernels.ncu-rep": FIXTURES / "ncu" / "rtx2080ti_two_kernels.ncu-rep",
    "rank0.json.gz": FIXTURES / "kineto" / "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz",
    "cupti-7/cupti-records.jsonl.gz": RECORDS,
}


def _headcount(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headcount.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def folder_report(tmp_path_factory):
    """``headcount parse mix -o out`` of a folder holding every format, and what it printed."""
    from tests.nsight import nsight_bin

    base = tmp_path_factory.mktemp("many")
    mix = base / "mix"
    for name, source in IN_THE_FOLDER.items():
        (mix / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, mix / name)
    (mix / "README.txt").write_text("notes\n")
    (mix / "plots").mkdir()
    os.environ["HEADCOUNT_NSYS"] = nsight_bin("nsys")
    try:
        done = _headcount(["parse", "mix", "-o", "out"], base)
    finally:
        del os.environ["HEADCOUNT_NSYS"]
    assert done.returncode == 0, done.stderr
    return base, done


def test_every_recording_of_a_directory_is_parsed_or_named_as_skipped(folder_report):
    base, done = folder_report
    runs = pd.read_parquet(base / "out" / "runs")
    read = {"mix/run.sqlite", "mix/other.nsys-rep", "mix/raw.csv", "mix/kernels.ncu-rep", "mix/rank0.json.gz",
            "mix/cupti-7/cupti-records.jsonl.gz"}
    assert set(runs["path"]) == read and len(runs) == len(read)
    skipped = [line for line in done.stderr.splitlines() if ": skipped " in line]
    assert sorted(skipped) == sorted([
        "headcount: mix: skipped 1 file, of a kind no source reads: README.txt",
        "headcount: mix: skipped 1 file, nsys reports whose SQLite export beside them is read instead (run.sqlite): run.nsys-rep",
        "headcount: mix: skipped 1 file, CSV that is no ncu export (no ID column: an nsys stats report?): stats.csv",
        "headcount: mix: skipped 1 directory, holding no nsys parquetdir export, cupti records or torch trace (not descended into): plots/",
    ])


def test_runs_name_their_recording_by_path_size_hash_source_and_rank(folder_report):
    base, _ = folder_report
    runs = pd.read_parquet(base / "out" / "runs").set_index("path")
    for path in runs.index:
        data = (base / path).read_bytes()
        assert runs.loc[path, "size_bytes"] == len(data) and runs.loc[path, "sha256"] == hashlib.sha256(data).hexdigest(), path
    assert runs["source"].to_dict() == {"mix/run.sqlite": "nsys", "mix/other.nsys-rep": "nsys", "mix/raw.csv": "ncu",
                                        "mix/kernels.ncu-rep": "ncu", "mix/rank0.json.gz": "torch",
                                        "mix/cupti-7/cupti-records.jsonl.gz": "cupti"}
    assert runs.loc["mix/rank0.json.gz", "rank"] == 0 and runs.drop("mix/rank0.json.gz")["rank"].isna().all()
    assert runs["damaged"].isna().all()  # every recording read whole


def test_query_tells_the_runs_apart(folder_report):
    base, _ = folder_report
    done = _headcount(["query", "out", "SELECT path, source, rank FROM runs ORDER BY path", "--csv", "-"], base)
    assert done.returncode == 0, done.stderr
    rows = list(csv.reader(done.stdout.strip().splitlines()))
    assert rows[0] == ["path", "source", "rank"] and len(rows) == 7 and len({r[0] for r in rows[1:]}) == 6


def test_console_headers_name_the_file_and_rank(folder_report):
    base, _ = folder_report
    done = _headcount(["report", "out"], base)
    assert done.returncode == 0, done.stderr
    headers = [line for line in done.stdout.splitlines() if line.startswith("── Run ")]
    assert len(headers) == 6
    assert any("(rank0.json.gz, rank 0 of 2)" in h for h in headers) and any("(cupti-records.jsonl.gz)" in h for h in headers)


def test_cupti_records_parse_into_the_kernels_they_hold():
    """The H100 records parsed here, against a count of their ``kernel`` records by hand."""
    with gzip.open(RECORDS, "rt") as fh:
        header = json.loads(fh.readline())
        kernels = [r for r in map(json.loads, fh) if r.get("kind") == "kernel"]
    assert header["format"] and len(kernels) == 1746
    busy_ns = sum(r["end"] - r["start"] for r in kernels)
    from headcount.build.parse_file import from_cupti_records
    from headcount.parsers.options import ReadOptions

    parsed = from_cupti_records(RECORDS, "r", ReadOptions())
    table = parsed.tables["kernels"]
    mine = table[table["kind"].astype(str) == "kernel"]
    assert len(mine) == 1746 and int(mine["duration_ns"].sum()) == busy_ns
    assert "1746 kernels" in parsed.lines[0] and parsed.run["pid"] == header["pid"]


def test_notes_several_runs_share_are_one_line():
    said = [("a", "vllm", "no speed-up"), ("b", "sdpa", "no speed-up"), ("b", "eager", "no speed-up"),
            ("c", None, "other"), *[(f"r{k}", "sdpa", "no speed-up") for k in range(5)]]
    assert grouped(said) == ["7 runs: no speed-up (runs a (vllm), b (sdpa, eager), r0 (sdpa), r1 (sdpa), … 3 more)",
                             "run c: other"]


def test_a_wide_result_prints_one_block_per_row(folder_report):
    """``SELECT *`` of kernels (75 columns) is unreadable as a table: one ``column  value`` line each, nulls counted."""
    base, _ = folder_report
    done = _headcount(["query", "out", "SELECT * FROM kernels ORDER BY source = 'ncu' DESC, run_id, name LIMIT 12"], base)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("── row ") for line in lines) == 10  # 10 rows by default in this layout
    assert any(line.split() == ["name", "kernel_A(double", "*,", "int,", "int)"] for line in lines)
    from headcount.common.tables import KERNELS

    assert len(KERNELS) + 1 == 75  # the schema's columns and run_id
    assert lines[-1].startswith("12 rows, first 10 shown; 75 columns, one block per row")
    narrow = _headcount(["query", "out", "SELECT path, source FROM runs", "--layout", "table"], base)
    assert "── row" not in narrow.stdout and "┃ path" in narrow.stdout


def test_the_console_keeps_nvtx_domains_and_shortens_long_range_names(tmp_path):
    """The real CPU nsys export, its first range moved into a ``TensorRT`` domain (a domain-create event, as nvtx
    writes one) and its second named with a DLProf-style 600-character dict: the console shows
    ``TensorRT:<name>`` and the long name shortened; the ranges table keeps both in full."""
    import sqlite3

    path = tmp_path / "domains.sqlite"
    shutil.copy(IN_THE_FOLDER["run.sqlite"], path)
    long_name = "{" + ", ".join(f"'op_{k}': 'aten::linear'" for k in range(24)) + "}"
    with sqlite3.connect(path) as con:
        first, second = [r[0] for r in con.execute("SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY start LIMIT 2")]
        tid, start = con.execute("SELECT globalTid, start FROM NVTX_EVENTS WHERE rowid = ?", (first,)).fetchone()
        con.execute("INSERT INTO NVTX_EVENTS (start, eventType, domainId, text, globalTid) VALUES (?, 75, 7, 'TensorRT', ?)",
                    (start - 1, tid))
        con.execute("UPDATE NVTX_EVENTS SET domainId = 7 WHERE rowid = ?", (first,))
        con.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = ?", (long_name, second))
    assert _headcount(["parse", str(path), "-o", "out"], tmp_path).returncode == 0
    ranges = pd.read_parquet(tmp_path / "out" / "ranges")
    assert (ranges["domain"] == "TensorRT").sum() == 1 and (ranges["name"] == long_name).sum() == 1
    printed = _headcount(["report", "out"], tmp_path).stdout
    name = ranges.loc[ranges["domain"] == "TensorRT", "name"].iloc[0]
    assert f"TensorRT:{name}" in printed
    assert long_name not in printed and f"({len(long_name):,} characters)" in printed
