"""The real nsys (2023.4.4, CPU-only recording) sees headcount's NVTX ranges.

Records ``tests/workloads/tagged_llama.py`` (tiny Llama, head mode, 2 steps of
forward + backward) with ``nsys profile --trace=nvtx``, exports SQLite and
checks the ranges against what the naming scheme promises (docs/architecture.md §2).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from nsight import nsight_bin

WORKLOAD = Path(__file__).parent / "workloads" / "tagged_llama.py"
STEPS, LAYERS, HEADS = 2, 2, 4


@pytest.fixture(scope="module")
def nsys_rep_path(tmp_path_factory):
    nsys = nsight_bin("nsys")
    tmp = tmp_path_factory.mktemp("nsys")
    rep = tmp / "tagged"
    subprocess.run([nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(rep), "--force-overwrite", "true",
                    sys.executable, str(WORKLOAD), str(STEPS)], check=True, capture_output=True, timeout=300)
    return Path(str(rep) + ".nsys-rep")


@pytest.fixture(scope="module")
def nsys_sqlite_path(nsys_rep_path):
    nsys = nsight_bin("nsys")
    sqlite_path = nsys_rep_path.with_suffix(".sqlite")
    subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(sqlite_path), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    return sqlite_path


@pytest.fixture(scope="module")
def nsys_ranges(nsys_sqlite_path):
    con = sqlite3.connect(nsys_sqlite_path)
    domains = {d: name for d, name in con.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = 75")}
    rows = con.execute(
        "SELECT e.start, e.end, e.globalTid, e.domainId, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
        "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 ORDER BY e.globalTid, e.start, e.end DESC"
    ).fetchall()
    return [(start, end, tid, domains.get(dom), name) for start, end, tid, dom, name in rows]


def _paths(ranges, domain):
    """Nesting by containment on each thread, from the raw nsys rows."""
    out = []
    stack = []
    for start, end, tid, dom, name in ranges:
        if dom != domain:
            continue
        while stack and (stack[-1][2] != tid or end > stack[-1][1]):
            stack.pop()
        path = (stack[-1][3] + "/" if stack else "") + name
        stack.append((start, end, tid, path))
        out.append((path, start, end, tid))
    return out


def test_domain_and_names(nsys_ranges):
    domains = {dom for *_, dom, _ in nsys_ranges}
    assert {"headcount", "headcount.step"} <= domains
    names = {name for *_, dom, name in nsys_ranges if dom == "headcount"}
    assert names == {"fwd", "bwd", "layer.0", "layer.1", *(f"head.{h}" for h in range(HEADS))}
    assert not any("/" in n or ":" in n for n in names)


def test_one_range_per_layer_head_phase_step(nsys_ranges):
    counts = Counter(path for path, *_ in _paths(nsys_ranges, "headcount"))
    for phase in ("fwd", "bwd"):
        assert counts[phase] == STEPS * LAYERS
        for layer in range(LAYERS):
            assert counts[f"{phase}/layer.{layer}"] == STEPS
            for head in range(HEADS):
                assert counts[f"{phase}/layer.{layer}/head.{head}"] == STEPS
    assert sum(counts.values()) == STEPS * 2 * LAYERS * (2 + HEADS)  # nothing else, no stray nesting


def test_backward_ranges_follow_forward_in_each_step(nsys_ranges):
    steps = sorted((s, e) for s, e, _, dom, name in nsys_ranges if dom == "headcount.step")
    assert len(steps) == STEPS
    paths = _paths(nsys_ranges, "headcount")
    for step_start, step_end in steps:
        inside = [(p, s) for p, s, e, _ in paths if step_start <= s and e <= step_end]
        fwd = [s for p, s in inside if p == "fwd"]
        bwd = [s for p, s in inside if p == "bwd"]
        assert len(fwd) == LAYERS and len(bwd) == LAYERS
        assert max(fwd) < min(bwd)
        # backward visits layers in reverse order
        bwd_layers = [p for p, s in sorted(inside, key=lambda x: x[1]) if p.startswith("bwd/") and p.count("/") == 1]
        assert bwd_layers == [f"bwd/layer.{i}" for i in reversed(range(LAYERS))]


def test_cpu_only_capture_parses_into_ranges(nsys_sqlite_path):
    """An export with NVTX ranges but no CUDA activity: a ranges table, no GPU work."""
    from headcount.build import tables_from_nsys
    from headcount.parsers.nsys_sqlite import read_export

    export = read_export(nsys_sqlite_path)
    assert export.gpu.empty
    tables = tables_from_nsys(export, "cpu-run")
    ranges = tables["ranges"]
    ours = ranges[ranges["domain"] == "headcount"]
    assert set(ours["level"]) == {"phase", "layer", "head"}
    assert (ours["gpu_op_count"] == 0).all() and tables["kernels"].empty
    assert set(ours.loc[ours.level == "head", "step"]) == {0, 1}


def test_parse_nsys_rep_with_the_nsys_on_path(nsys_rep_path, tmp_path, monkeypatch, capsys):
    import pandas as pd

    from headcount.cli.main import main

    monkeypatch.setenv("HEADCOUNT_NSYS", nsight_bin("nsys"))
    out = tmp_path / "r"
    assert main(["parse", str(nsys_rep_path), "-o", str(out)]) == 0
    ranges = pd.read_parquet(out / "ranges")
    # all domains of a thread nest together, as in nsys: the step range leads the path
    assert (ranges["path"] == "step.0/bwd/layer.1/head.3").sum() == 1
    assert (ranges["path"].str.endswith("bwd/layer.1/head.3")).sum() == STEPS
    assert "no GPU operation was launched" in capsys.readouterr().err

    monkeypatch.setenv("HEADCOUNT_NSYS", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere
    assert main(["parse", str(nsys_rep_path), "-o", str(tmp_path / "r2")]) == 3  # a missing tool: exit 3, as for headcount run
    assert "no nsys on PATH" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def test_damaged_nsys_rep(tmp_path, monkeypatch, capsys):
    from headcount.cli.main import main

    monkeypatch.setenv("HEADCOUNT_NSYS", nsight_bin("nsys"))
    bad = tmp_path / "bad.nsys-rep"
    bad.write_bytes(b"\x00" * 4096)
    assert main(["parse", str(bad), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "nsys could not export the report" in err and str(bad) in err
    assert not (tmp_path / "r").exists()


def test_real_parquetdir_export_equals_sqlite_export(nsys_rep_path, nsys_sqlite_path, tmp_path):
    from headcount.parsers.nsys_sqlite import read_export

    nsys = nsight_bin("nsys")
    pqdir = tmp_path / "pq"
    subprocess.run([nsys, "export", "--type", "parquetdir", "-o", str(pqdir), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    import pandas as pd

    a, b = read_export(pqdir).ranges, read_export(nsys_sqlite_path).ranges
    assert len(a) == STEPS * 2 * LAYERS * (2 + HEADS) + STEPS  # headcount ranges + step ranges
    pd.testing.assert_frame_equal(a, b, check_dtype=False)  # range ids included: rowid = row position


@pytest.mark.parametrize("per_process_reads", [False, True])
def test_parquetdir_split_across_workers_equals_the_sqlite_parse(nsys_rep_path, nsys_sqlite_path, tmp_path, monkeypatch,
                                                                  per_process_reads):
    """The shard and per-process SQL filters also hold on DuckDB's view of a
    real parquetdir export (unsigned ids there): same tables as the SQLite export parsed whole."""
    import pandas as pd
    import pyarrow.dataset as ds

    from headcount import batch
    from headcount.cli.main import main
    from headcount.parsers import nsys_sqlite

    nsys = nsight_bin("nsys")
    pqdir = tmp_path / "pq"
    subprocess.run([nsys, "export", "--type", "parquetdir", "-o", str(pqdir), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    whole = tmp_path / "whole"
    assert main(["parse", str(nsys_sqlite_path), "-o", str(whole), "--jobs", "1"]) == 0
    monkeypatch.setattr(batch, "SHARD_ROWS", 1)
    if per_process_reads:
        monkeypatch.setattr(nsys_sqlite, "STREAM_ROWS", 0)
    split = tmp_path / "split"
    assert main(["parse", str(pqdir), "-o", str(split), "--jobs", "2"]) == 0
    assert list((split / "ranges").glob("*/part-s*.parquet"))  # it was split (one process: one shard holds it)
    for name in ("ranges", "kernels", "layers", "heads"):
        a = ds.dataset(whole / name, partitioning="hive").to_table().to_pandas().drop(columns=["run_id"])
        b = ds.dataset(split / name, partitioning="hive").to_table().to_pandas().drop(columns=["run_id"])
        keys = [c for c in ("range_id", "correlation_id", "phase", "layer", "head") if c in a.columns]
        a, b = (f.sort_values(keys).reset_index(drop=True) for f in (a, b))
        assert len(a) > 0 or name != "ranges"  # a CPU-only capture: ranges, no GPU work
        pd.testing.assert_frame_equal(a, b, check_dtype=False)
