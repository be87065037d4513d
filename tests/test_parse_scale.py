"""headcount parse at scale: one process at a time, many files at once (worker
processes, a real local Ray), atomic per run, and the columnar labelling.

Inputs are the real nsys exports of tests/fixtures/nsys (see PROVENANCE.md);
no timing is asserted (benchmarks/attribution.py prints the figures).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.attribute.nesting import nest_ranges
from headcount.build.nsys import nsys_pieces
from headcount.cli.main import main
from headcount.parsers import nsys_sqlite

FIX = Path(__file__).parent / "fixtures" / "nsys"
H100 = FIX / "h100x2_pytorch_nsys2026.2.sqlite"  # two processes (pids 111 and 112)
A100 = FIX / "a100x4_cloverleaf_nsys2024.5.sqlite"


def tables(out: Path) -> dict[str, pd.DataFrame]:
    """Every table of a report, run ids dropped, rows in a canonical order."""
    result = {}
    for name in ("ranges", "kernels", "layers", "heads"):
        frame = ds.dataset(out / name, partitioning="hive").to_table().to_pandas()
        frame = frame.drop(columns=["run_id"])
        keys = [c for c in ("start_ns", "range_id", "correlation_id", "phase", "layer", "head", "duration_ns") if c in frame.columns]
        result[name] = frame.sort_values(keys, kind="stable").reset_index(drop=True) if len(frame) else frame
    return result


def inputs(out: Path) -> list[str]:
    """The input file of each run of a report (its manifests), by name."""
    return sorted(Path(json.loads(p.read_text())["input"]).name for p in out.glob("manifests/*/run.json"))


def assert_same(a: dict, b: dict) -> None:
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_dtype=False, check_categorical=False)


def test_one_process_at_a_time_gives_the_one_read_tables(tmp_path, monkeypatch):
    """A large export is read per process (an SQL filter per process); the
    tables must equal those of the one-pass read of the same file."""
    whole = tmp_path / "whole"
    assert main(["parse", str(H100), "-o", str(whole)]) == 0
    monkeypatch.setattr(nsys_sqlite, "STREAM_ROWS", 0)  # as if the export were larger than the one-read limit
    plan = nsys_sqlite.plan_export(H100)
    assert plan.processes == [111, 112] and plan.nvtx_rows[111] + plan.nvtx_rows[112] > 0
    per_process = tmp_path / "per-process"
    assert main(["parse", str(H100), "-o", str(per_process)]) == 0
    a, b = tables(whole), tables(per_process)
    assert len(a["ranges"]) > 0 and (a["ranges"]["gpu_op_count"] > 0).any()
    assert_same(a, b)


def test_pieces_of_processes_equal_the_whole_projection():
    """nsys_pieces over the processes one by one = the projection of the whole timeline."""
    export = nsys_sqlite.read_export(H100)
    parts = list(nsys_sqlite.by_process(export))
    assert len(parts) == 2 and sum(len(p.ranges) for p in parts) == len(export.ranges)
    from headcount.attribute.attribution import project_gpu

    whole, _ = project_gpu(export.ranges, export.runtime, export.gpu)
    pieces = pd.concat([frame for name, frame in nsys_pieces(parts, devices=export.devices) if name == "ranges"])
    cols = ["range_id", "gpu_start_ns", "gpu_end_ns", "gpu_op_count", "parent_range_id", "depth"]
    left = whole[cols].sort_values("range_id").reset_index(drop=True)
    right = pieces[cols].sort_values("range_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right, check_dtype=False)
    assert (whole.set_index("range_id")["path"].astype(str) == pieces.set_index("range_id")["path"].astype(str)
            .reindex(whole["range_id"])).all()


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    files = []
    for i, src in enumerate([H100, A100, H100]):
        files.append(d / f"rank{i}.sqlite")
        shutil.copy(src, files[-1])
    return files


def test_jobs_2_gives_the_tables_of_jobs_1(tmp_path, three_ranks, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["parse", *map(str, three_ranks), "-o", str(one), "--jobs", "1"]) == 0
    assert main(["parse", *map(str, three_ranks), "-o", str(two), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert "[3/3]" in err
    a, b = tables(one), tables(two)
    assert len(a["kernels"]) > 0
    assert_same(a, b)
    assert inputs(two) == ["rank0.sqlite"] * 2 + ["rank1.sqlite"] + ["rank2.sqlite"] * 2  # the H100 exports: a run per process


@pytest.mark.parametrize("per_process_reads", [False, True])
def test_one_export_split_across_workers_gives_the_tables_of_one_worker(tmp_path, monkeypatch, capsys, per_process_reads):
    """A large export is sharded by process id across the workers (each shard
    read at once, or, for a very large export, one process at a time); each
    shard writes its own pieces of the run, the parent its layers, heads and runs."""
    from headcount.build import batch

    one, split = tmp_path / "one", tmp_path / "split"
    assert main(["parse", str(H100), "-o", str(one), "--jobs", "1"]) == 0
    monkeypatch.setattr(batch, "SHARD_ROWS", 1)  # as if the export were large
    if per_process_reads:
        monkeypatch.setattr(nsys_sqlite, "STREAM_ROWS", 0)
    assert main(["parse", str(H100), "-o", str(split), "--jobs", "2"]) == 0
    assert "2 shards in parallel" in capsys.readouterr().err
    assert sorted(p.name for p in (split / "ranges").glob("*/*.parquet")) == ["part-s0.parquet", "part-s1.parquet"]
    assert_same(tables(one), tables(split))
    assert inputs(split) == [H100.name] * 2  # a run per process


def test_ranges_left_open_end_alike_in_a_split_parse(tmp_path, monkeypatch, capsys):
    """A capture cut mid-step leaves ranges open; nsys ends them at the export's
    last NVTX timestamp. A shard reads only its processes, so it asks the whole
    export for that timestamp (only because a range of its own is open): the
    tables equal one worker's, the open ranges' ends included."""
    import sqlite3

    from headcount.build import batch

    cut = tmp_path / "cut.sqlite"
    shutil.copy(H100, cut)
    con = sqlite3.connect(cut)
    # cut only process 111 early: its open ranges must end at process 112's last timestamp
    pid111 = "((globalTid >> 24) & 16777215) = 111"
    lo, hi = con.execute(f"SELECT min(start), max(end) FROM NVTX_EVENTS WHERE eventType = 59 AND {pid111}").fetchone()
    at = lo + (hi - lo) // 2
    con.execute(f"DELETE FROM NVTX_EVENTS WHERE eventType = 59 AND start > ? AND {pid111}", (at,))
    opened = con.execute(f"UPDATE NVTX_EVENTS SET end = NULL WHERE eventType = 59 AND end > ? AND {pid111}", (at,)).rowcount
    con.commit()
    con.close()
    assert opened > 0
    one, split = tmp_path / "one", tmp_path / "split"
    assert main(["parse", str(cut), "-o", str(one), "--jobs", "1"]) == 0
    monkeypatch.setattr(batch, "SHARD_ROWS", 1)
    assert main(["parse", str(cut), "-o", str(split), "--jobs", "2"]) == 0
    assert "2 shards in parallel" in capsys.readouterr().err
    a, b = tables(one), tables(split)
    last = nsys_sqlite.last_nvtx(cut)
    open_rows = b["ranges"][(b["ranges"]["pid"] == 111) & (b["ranges"]["end_ns"] == last)]
    assert len(open_rows) >= opened and (open_rows["start_ns"] <= at).all()
    assert_same(a, b)


def test_a_failed_file_in_a_parallel_parse_writes_nothing(tmp_path, three_ranks, capsys):
    bad = tmp_path / "rank9.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)  # an SQLite header and nothing after it
    out = tmp_path / "out"
    assert main(["parse", str(three_ranks[0]), str(bad), str(three_ranks[1]), "-o", str(out), "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("headcount: error:"))
    assert str(bad) in line and "nothing was written" in line
    assert not out.exists()


def test_keep_going_commits_the_others_and_names_the_failed_file(tmp_path, three_ranks, capsys):
    bad = tmp_path / "rank9.sqlite"
    bad.write_bytes(b"not sqlite at all")
    out = tmp_path / "out"
    assert main(["parse", str(three_ranks[0]), str(bad), str(three_ranks[1]), "-o", str(out), "--jobs", "2", "--keep-going"]) == 1
    err = capsys.readouterr().err
    assert any(str(bad) in line and line.startswith("headcount: error:") for line in err.splitlines())
    assert "1 of 3 files failed" in err
    assert inputs(out) == ["rank0.sqlite"] * 2 + ["rank1.sqlite"]
    assert not [p for p in out.iterdir() if p.name.startswith(".staging-")]


def test_ray_executor_gives_the_tables_of_a_local_parse(tmp_path, three_ranks, monkeypatch):
    """A real Ray started on this machine (no RAY_ADDRESS): one task per file, nsys exports and a
    directory of torch.profiler rank traces (Holistic Trace Analysis's ``trace_dir``) alike."""
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    traces = tmp_path / "traces"
    traces.mkdir()
    kineto = Path(__file__).parent / "fixtures" / "kineto"
    for rank, name in enumerate(("h100_bert-small_sdpa_kineto.json.gz", "h100_qwen1.5-0.5b_kineto.json.gz")):
        shutil.copy(kineto / name, traces / f"rank{rank}.json.gz")
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    files = [*map(str, three_ranks[:2]), str(traces)]
    assert main(["parse", *files, "-o", str(local), "--jobs", "1"]) == 0
    assert main(["parse", *files, "-o", str(on_ray), "--executor", "ray"]) == 0
    assert_same(tables(local), tables(on_ray))
    assert inputs(on_ray) == ["rank0.json.gz", "rank0.sqlite", "rank0.sqlite", "rank1.json.gz", "rank1.sqlite"]


def test_jobs_must_be_positive(tmp_path, capsys):
    assert main(["parse", str(H100), "-o", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert "--jobs 0" in capsys.readouterr().err


def _naive_paths(ranges: pd.DataFrame) -> list[str]:
    """The path of each range by walking its parents: the definition."""
    by_id = ranges.set_index("range_id")
    out = []
    for rid in ranges["range_id"]:
        names = []
        while rid >= 0:
            names.append(str(by_id.at[rid, "name"]))
            rid = by_id.at[rid, "parent_range_id"]
        out.append("/".join(reversed(names)))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30), st.sampled_from(["a", "b", "a/b", "fwd", "layer.0"])),
                min_size=1, max_size=40))
def test_paths_by_code_equal_the_joined_names(spans):
    """Paths numbered by (parent path, name) spell the same strings as joining
    the names of the ancestors, also where a name holds '/'."""
    ranges = pd.DataFrame({"pid": "1", "tid": "1", "domain": None,
                           "name": [n for _, _, n in spans],
                           "start_ns": [s for s, _, _ in spans],
                           "end_ns": [s + d for s, d, _ in spans]})
    nested = nest_ranges(ranges)
    assert list(nested["path"].astype(str)) == _naive_paths(nested)
    assert nested["path"].cat.categories.is_unique


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 15)), min_size=1, max_size=60))
def test_depth_by_one_sort_equals_depth_by_events(spans):
    """The one-sort depth count agrees with the event sweep, ties and zero-length ranges included."""
    from headcount.attribute.nesting import depths, depths_by_events

    frame = pd.DataFrame(spans, columns=["group", "start", "length"])
    frame["end"] = frame["start"] + frame["length"]
    frame = frame.sort_values(["group", "start", "end"], ascending=[True, True, False], kind="stable")
    groups = frame["group"].rank(method="dense").astype(np.int64).to_numpy() - 1
    starts, ends = frame["start"].to_numpy(np.int64), frame["end"].to_numpy(np.int64)
    assert (depths(groups, starts, ends) == depths_by_events(groups, starts, ends)).all()


@settings(max_examples=80, deadline=None)
@given(st.sets(st.integers(0, 10**12), max_size=50), st.lists(st.integers(-2, 10**12), max_size=30), st.booleans())
def test_positions_of_ids_dense_or_sparse(ids, probes, dense):
    """Row of an id by lookup array (dense ids) or hash table (sparse ids): both equal a dict."""
    from headcount.common.arrays import positions

    ids = sorted(ids) if not dense else list(range(len(ids)))
    ids = np.array(ids[::-1], dtype=np.int64)  # any order
    probes = np.array([*probes, *ids[:3]], dtype=np.int64)
    row = {int(v): i for i, v in enumerate(ids)}
    assert positions(ids, probes).tolist() == [row.get(int(p), -1) for p in probes]


def test_range_ids_far_apart_project_as_near_ones():
    """Range ids are the export's row ids: a process of a large export carries
    ids in the tens of millions. Its projection must not depend on them (and
    no array is sized by the largest id: the benchmark's --widen checks memory)."""
    from headcount.attribute.attribution import project_gpu

    export = nsys_sqlite.read_export(H100)
    near, _ = project_gpu(export.ranges, export.runtime, export.gpu)
    shift = 10**12
    far, _ = project_gpu(export.ranges.assign(range_id=export.ranges["range_id"] + shift), export.runtime, export.gpu)
    cols = ["range_id", "parent_range_id", "depth", "gpu_op_count", "gpu_start_ns", "gpu_end_ns", "child_count"]
    far = far[cols].copy()
    far["range_id"] -= shift
    far["parent_range_id"] = np.where(far["parent_range_id"] >= 0, far["parent_range_id"] - shift, -1)
    pd.testing.assert_frame_equal(near[cols].reset_index(drop=True), far.reset_index(drop=True), check_dtype=False)
    assert (near["gpu_op_count"] > 0).any()


def test_one_small_file_says_no_worker_processes(tmp_path, capsys):
    """A file too small to split is parsed in the command's own process, and the
    command does not claim otherwise (it used to announce `--jobs` workers)."""
    assert main(["parse", str(H100), "-o", str(tmp_path / "r"), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert "worker processes" not in err and "shards in parallel" not in err
    from headcount.build import batch

    assert batch.split([(str(H100), "r")], 2).workers == 1
    assert batch.split([(str(H100), "a"), (str(A100), "b")], 2).workers == 2
