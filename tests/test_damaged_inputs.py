"""Unreadable, cut and foreign recordings, as a user meets them (issue 58): one line naming the file, the cause and
what to do, exit 2, nothing written; a cut recording is refused unless ``--salvage``, which keeps what could be read
and says what was lost in the report (``runs.damaged``).

Unreadable for real: root reads a mode-000 file, so as root the command runs under ``setpriv`` with the capabilities
that let it (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``) dropped from its bounding set."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
NCU_REP = FIXTURES / "gpu" / "h100-2026-12-05" / "interrupt-ncu" / "run.ncu-rep"  # 5 kernels of an H100
RECORDS = FIXTURES / "gpu" / "h100-2026-12-05" / "records-layer" / "sdpa" / "cupti-records.jsonl.gz"
KINETO = FIXTURES / "kineto" / "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"
UNREADABLE = {  # name in the test folder → the real recording copied there and made mode 000
    "kernels.ncu-rep": NCU_REP,
    "run.nsys-rep": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.nsys-rep",
    "run.sqlite": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.sqlite",
    "trace.json.gz": KINETO,
    "raw.csv": FIXTURES / "ncu" / "rtx2080ti_two_kernels.raw.C.csv",
    "cupti-records.jsonl.gz": RECORDS,
}


def _headcount(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``headcount ARGS`` in a subprocess, as a user without the right to read what is not theirs."""
    command = [sys.executable, "-m", "headcount.cli.main", *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv cannot be made unable to read a mode-000 file")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _one_line_error(done: subprocess.CompletedProcess, starts: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"headcount: error: {starts}"), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_an_unreadable_recording_of_any_format_is_one_line(tmp_path, name):
    path = tmp_path / name
    shutil.copy(UNREADABLE[name], path)
    path.chmod(0)
    line = _one_line_error(_headcount(["parse", name, "-o", "out"], tmp_path), f"{name}: permission denied")
    assert f"chmod a+r {name}" in line
    assert not (tmp_path / "out").exists()


def test_an_unreadable_directory_is_one_line(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(KINETO, folder / "rank0.json.gz")
    folder.chmod(0)
    try:
        line = _one_line_error(_headcount(["parse", "traces", "-o", "out"], tmp_path), "traces: permission denied")
    finally:
        folder.chmod(0o755)
    assert "chmod a+rx traces" in line and not (tmp_path / "out").exists()


@pytest.fixture
def cut_report(tmp_path) -> Path:
    """The H100 report cut at 130,000 of its 151,091 bytes: 3 of its 5 kernels whole, a 4th cut (its block's header read)."""
    path = tmp_path / "cut.ncu-rep"
    path.write_bytes(NCU_REP.read_bytes()[:130_000])
    return path


def test_a_cut_ncu_rep_is_refused_and_salvaged_only_when_asked(tmp_path, cut_report):
    line = _one_line_error(_headcount(["parse", cut_report.name, "-o", "out"], tmp_path), "cut.ncu-rep: damaged or truncated .ncu-rep")
    assert "the file ends at byte 130,000" in line and "1 of at least 4 kernel records unreadable" in line
    assert "--salvage` keeps the 3 readable kernels" in line and not (tmp_path / "out").exists()
    done = _headcount(["parse", cut_report.name, "-o", "out", "--salvage"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "damaged: 1 of at least 4 kernel records unreadable, dropped" in done.stderr
    whole = _headcount(["parse", str(NCU_REP), "-o", "whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr
    kept, every = pd.read_parquet(tmp_path / "out" / "kernels"), pd.read_parquet(tmp_path / "whole" / "kernels")
    assert len(every) == 5 and list(kept["name"]) == list(every["name"].iloc[:3])  # the kernels before the cut, as they were
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert runs["damaged"].iloc[0].startswith("1 of at least 4 kernel records unreadable")


def test_a_cut_trace_is_salvaged_to_its_last_whole_event_with_the_count_said(tmp_path):
    raw = gzip.open(KINETO).read()
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(raw)[:300_000])
    line = _one_line_error(_headcount(["parse", "cut.json.gz", "-o", "out"], tmp_path), "cut.json.gz: truncated torch.profiler trace")
    assert "--salvage" in line
    done = _headcount(["parse", "cut.json.gz", "-o", "out", "--salvage"], tmp_path)
    assert done.returncode == 0, done.stderr
    said = next(line for line in done.stderr.splitlines() if "damaged:" in line)
    events = int(said.split("): its ")[1].split(" events")[0])
    assert 0 < events < raw.count(b'"ph"')  # fewer than the whole trace holds, and some
    report = _headcount(["report", "out"], tmp_path)
    assert "salvaged from a damaged recording: the file is cut" in report.stdout


def test_a_foreign_nsys_rep_is_explained_before_nsys_is_quoted(tmp_path, nsight_path):
    (tmp_path / "random.nsys-rep").write_bytes(bytes(range(256)) * 400)
    line = _one_line_error(_headcount(["parse", "random.nsys-rep", "-o", "out"], tmp_path),  # nsys: on PATH (nsight_path)
                           "random.nsys-rep: nsys could not open it as a report: damaged, truncated or not an .nsys-rep")
    said = line.split("(nsys said: ", 1)[1]
    assert "Dynamic exception type" not in said and ".cpp(" not in said and "Throw in function" not in said
    assert not (tmp_path / "out").exists()


def test_cut_cupti_records_are_refused(tmp_path):
    (tmp_path / "cupti-records.jsonl.gz").write_bytes(RECORDS.read_bytes()[:500_000])
    line = _one_line_error(_headcount(["parse", "cupti-records.jsonl.gz", "-o", "out"], tmp_path),
                           "cupti-records.jsonl.gz: unreadable or truncated CUPTI records file")
    assert "record it again" in line and not (tmp_path / "out").exists()
