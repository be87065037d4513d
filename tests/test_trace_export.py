"""``headcount export --format trace``: a report's runs as trace-event JSON,
read back as JSON and by Holistic Trace Analysis (the real package)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest

from headcount.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures"
H100_TRACE = FIXTURES / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"  # a real H100 torch.profiler trace


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "report"
    assert main(["parse", str(H100_TRACE), "-o", str(out)]) == 0
    return out


def _trace(folder: Path) -> tuple[Path, dict]:
    (path,) = folder.glob("*/trace.json")
    return path, json.loads(path.read_text())


def test_gpu_run_has_every_kernel_launch_arrow_and_range(gpu_report, tmp_path, capsys):
    assert main(["export", str(gpu_report), "--format", "trace", "-o", str(tmp_path / "t")]) == 0
    path, doc = _trace(tmp_path / "t")
    assert str(path) in capsys.readouterr().out
    events = doc["traceEvents"]
    kernels = pd.read_parquet(gpu_report / "kernels")
    ranges = pd.read_parquet(gpu_report / "ranges")
    gpu = kernels[kernels["kind"] != "op"]
    by_cat = pd.Series([e.get("cat") for e in events]).value_counts().to_dict()
    assert by_cat.get("kernel", 0) + by_cat.get("gpu_memcpy", 0) + by_cat.get("gpu_memset", 0) == len(gpu)
    assert by_cat["cpu_op"] == (kernels["kind"] == "op").sum()
    launched = gpu[gpu["correlation_id"].notna() & gpu["api_start_ns"].notna()]
    assert by_cat["cuda_runtime"] == len(launched)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(ends) == set(launched["correlation_id"].astype(int))
    for cid, end in ends.items():  # each arrow ends on its kernel's stream at its start
        row = launched[launched["correlation_id"] == cid].iloc[0]
        assert (end["tid"], end["ts"]) == (int(row["stream"]), round(int(row["start_ns"]) / 1000, 3))
        assert starts[cid]["ts"] == round(int(row["api_start_ns"]) / 1000, 3)
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert set(ranges["path"]) <= names
    assert doc["distributedInfo"]["rank"] == 0 and doc["headcount"]["source"] == "torch"


def test_holistic_trace_analysis_reads_it(gpu_report, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    main(["export", str(gpu_report), "-o", str(tmp_path / "t")])
    path, _ = _trace(tmp_path / "t")
    analysis = hta.TraceAnalysis(trace_dir=str(path.parent))
    trace = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    cats = pd.Series([symbols[i] for i in trace["cat"]]).value_counts()
    kernels = pd.read_parquet(gpu_report / "kernels")
    assert cats["kernel"] == (kernels["kind"] == "kernel").sum()
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    gpu = kernels[kernels["kind"] != "op"]
    busy = breakdown["compute_time(us)"].iloc[0] + breakdown["non_compute_time(us)"].iloc[0]
    total = (gpu["end_ns"].max() - gpu["start_ns"].min()) / 1000
    assert 0 < busy <= total + 1 and breakdown["kernel_time(us)"].iloc[0] == pytest.approx(total, abs=2)


def test_a_cpu_run_has_its_ops_ranges_and_steps(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    report = tmp_path / "r"
    assert main(["profile", "--impl", "sdpa", "--steps", "2", "--batch", "1", "--seq", "16", "-o", str(report)]) == 0
    assert main(["export", str(report)]) == 0  # default: REPORT/traces/
    path, doc = _trace(report / "traces")
    events = doc["traceEvents"]
    steps = sorted(e["name"] for e in events if e["name"].startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1"]
    layers = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert {"fwd/layer.0", "bwd/layer.3"} <= layers
    # HTA counts iterations by ProfilerStep#N and, as for torch.profiler traces, leaves the last one out
    assert hta.TraceAnalysis(trace_dir=str(path.parent)).t.get_iterations() == [0]
    assert main(["query", str(report), "SELECT 1"]) == 0  # the traces folder does not disturb the report


def test_unknown_run_and_no_timeline_are_one_line(gpu_report, tmp_path, capsys):
    assert main(["export", str(gpu_report), "--run", "nope", "-o", str(tmp_path / "t")]) == 2
    assert "no run nope" in capsys.readouterr().err
    ncu = tmp_path / "ncu"
    assert main(["parse", str(FIXTURES / "ncu" / "h800_flash_fwd_raw.C.csv"), "-o", str(ncu)]) == 0
    capsys.readouterr()
    assert main(["export", str(ncu), "-o", str(tmp_path / "t2")]) == 2
    err = capsys.readouterr().err
    assert "no run has a timeline to export" in err and "ncu measures kernels one at a time" in err
    assert not (tmp_path / "t2").exists() or not any((tmp_path / "t2").iterdir())
