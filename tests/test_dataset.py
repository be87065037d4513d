"""The Parquet dataset: appendable runs read at once by pandas, pyarrow, polars
and DuckDB; atomic writes; metadata; refusing to clobber."""

from __future__ import annotations

import json

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import inputs_for, llama_model

from headcount import AttentionProfiler, HeadcountError
from headcount.common.tables import TABLES
from headcount.store import dataset


@pytest.fixture(scope="module")
def two_profiles():
    profs = []
    for impl in ("eager", "sdpa"):
        model = llama_model(impl)
        prof = AttentionProfiler(model, metadata={"batch": 2, "seq": 16})
        with prof:
            model(**inputs_for("llama_gqa")).loss.backward()
        prof.get_stats()
        profs.append(prof)
    return profs


def test_append_and_read_everywhere(tmp_path, two_profiles):
    out = tmp_path / "report"
    first, second = two_profiles
    first.save(out)
    with pytest.raises(HeadcountError, match=r"save\(append=True\)"):
        second.save(out)
    second.save(out, append=True)
    run_ids = {first.run_id, second.run_id}

    heads_pd = pd.read_parquet(out / "heads")
    assert set(heads_pd["run_id"].astype(str)) == run_ids
    assert set(heads_pd["implementation"]) == {"eager", "sdpa"}

    arrow = ds.dataset(out / "layers", partitioning="hive").to_table()
    assert set(arrow.column("run_id").to_pylist()) == run_ids
    assert arrow.num_rows == 8

    con = duckdb.connect()
    rows = con.execute(
        f"SELECT run_id, implementation, count(*) FROM read_parquet('{out}/layers/**/*.parquet', hive_partitioning=true) "
        "GROUP BY ALL ORDER BY implementation").fetchall()
    assert [(r[1], r[2]) for r in rows] == [("eager", 4), ("sdpa", 4)]
    joined = con.execute(
        f"SELECT r.implementation, sum(l.duration_ns) FROM read_parquet('{out}/layers/**/*.parquet', hive_partitioning=true) l "
        f"JOIN read_parquet('{out}/runs/**/*.parquet', hive_partitioning=true) r USING (run_id, implementation) GROUP BY ALL").fetchall()
    assert len(joined) == 2 and all(v > 0 for _, v in joined)

    pl_frame = pl.read_parquet(str(out / "kernels" / "**" / "*.parquet"), hive_partitioning=True)
    assert set(pl_frame["run_id"].unique().to_list()) == run_ids

    marker = json.loads((out / "headcount.json").read_text())
    assert marker["runs"] == [first.run_id, second.run_id]
    manifest = json.loads((out / "manifests" / f"run_id={first.run_id}" / "run.json").read_text())
    assert manifest["schema_version"] == marker["schema_version"] and manifest["implementation"] == "eager"
    meta = pq.read_schema(next((out / "heads").glob("*/part-0.parquet"))).metadata
    assert json.loads(meta[b"headcount"])["run_id"] in run_ids


def test_every_file_has_the_fixed_schema(tmp_path, two_profiles):
    out = tmp_path / "report"
    two_profiles[0].save(out)
    optional = {"attention_stats"}  # written only when asked for
    for table, schema in TABLES.items():
        files = list((out / table).glob("run_id=*/part-0.parquet"))
        if table in optional:
            assert not files
            continue
        assert len(files) == 1
        assert pq.read_schema(files[0]).remove_metadata().equals(schema), table


def test_force_replaces(tmp_path, two_profiles):
    out = tmp_path / "report"
    two_profiles[0].save(out)
    two_profiles[1].save(out, force=True)
    assert set(pd.read_parquet(out / "layers")["run_id"].astype(str)) == {two_profiles[1].run_id}
    assert json.loads((out / "headcount.json").read_text())["runs"] == [two_profiles[1].run_id]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the lock is removed on release


def test_crash_mid_write_leaves_the_previous_report(tmp_path, two_profiles, monkeypatch):
    out = tmp_path / "report"
    two_profiles[0].save(out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    calls = {"n": 0}
    real = pq.ParquetWriter.write_table

    def failing(self, table, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(self, table, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    with pytest.raises(HeadcountError, match="No space left"):
        two_profiles[1].save(out, append=True)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert set(pd.read_parquet(out / "layers")["run_id"].astype(str)) == {two_profiles[0].run_id}


def test_refuses_foreign_and_unwritable_directories(tmp_path, two_profiles):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(HeadcountError, match="holds no headcount report"):
        two_profiles[0].save(foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(HeadcountError, match="not a directory"):
        two_profiles[0].save(a_file)
    with pytest.raises(HeadcountError, match="not a directory"):
        two_profiles[0].save(a_file / "sub")
    with pytest.raises(HeadcountError, match="cannot write|permission denied"):
        two_profiles[0].save("/proc/headcount-report")
    with pytest.raises(HeadcountError, match="contradict"):
        dataset.check_output(tmp_path / "new", append=True, force=True)


def test_a_report_of_another_schema_is_refused_before_any_work(tmp_path, two_profiles):
    """A report written by an older headcount (other columns) is not appended to: pandas reads a dataset with the
    columns of one of its files, so mixing would hide the new columns. The check is the first thing each command does
    (check_output), and save refuses too; --force replaces it."""
    out = tmp_path / "report"
    two_profiles[0].save(out)
    marker = json.loads((out / dataset.MARKER).read_text())
    (out / dataset.MARKER).write_text(json.dumps({**marker, "schema_version": "1.5"}))
    with pytest.raises(HeadcountError, match=r"holds a report of schema 1\.5, this headcount writes"):
        dataset.check_output(out, append=True)
    with pytest.raises(HeadcountError, match="holds a report of schema 1.5"):
        two_profiles[1].save(out, append=True)
    two_profiles[1].save(out, force=True)
    assert len(pd.read_parquet(out / "runs")) == 1


def test_no_zeros_for_unmeasured_columns(tmp_path, two_profiles):
    out = tmp_path / "report"
    two_profiles[0].save(out)
    kernels = pd.read_parquet(out / "kernels")
    for col in ("dram_read_bytes", "achieved_occupancy_pct", "launch_latency_ns"):
        assert kernels[col].isna().all(), col
    layers = pd.read_parquet(out / "layers")
    assert layers["dram_bytes_measured"].isna().all() and layers["roofline_class"].isna().all()


class _Killed(BaseException):
    """Stands for the writing process being killed at that instant: no
    ``except`` of headcount's catches it (``finally`` blocks still run, where
    a kill would close the files and release the locks as well)."""


def _commit_killed_at(monkeypatch, k: int) -> int:
    """Arm a kill at the ``k``-th rename, replace, unlink or rmtree that a
    commit makes (0: never); returns how many such operations it made."""
    import os
    import shutil

    seen = {"n": 0, "armed": False}
    real_commit = dataset.commit

    def counted(fn):
        def wrapper(*a, **kw):
            if seen["armed"]:
                seen["n"] += 1
                if seen["n"] == k:
                    raise _Killed()
            return fn(*a, **kw)
        return wrapper

    def armed_commit(*a, **kw):
        seen["armed"] = True
        try:
            return real_commit(*a, **kw)
        finally:
            seen["armed"] = False

    for name in ("rename", "replace", "unlink"):
        monkeypatch.setattr(os, name, counted(getattr(os, name)))
    monkeypatch.setattr(shutil, "rmtree", counted(shutil.rmtree))
    monkeypatch.setattr(dataset, "commit", armed_commit)
    return seen


def _state(out) -> tuple[list[str], dict[str, set]]:
    """The runs the marker lists, and the runs each table (and manifests) holds on disk."""
    marker = json.loads((out / "headcount.json").read_text())["runs"]
    held = {t: {p.name[len("run_id="):] for p in (out / t).glob("run_id=*")} for t in ("kernels", "ranges", "layers", "heads", "runs",
                                                                                         "manifests")}
    return marker, held


@pytest.mark.parametrize("how", ["append", "force"])
def test_a_commit_killed_at_any_step_is_completed_or_undone_by_the_next_command(tmp_path, two_profiles, monkeypatch, how):
    """Killed at every rename/replace/unlink/rmtree of ``--append`` and ``--force``:
    after the next headcount command (``query``) the directory is exactly the
    old or the new complete report, read alike by headcount, pandas, pyarrow
    and DuckDB, with nothing of the commit left behind."""
    from headcount.cli.main import main

    first, second = two_profiles
    probe = tmp_path / "probe"
    first.save(probe)
    seen = _commit_killed_at(monkeypatch, 0)
    second.save(probe, **{how: True})
    steps = seen["n"]
    monkeypatch.undo()
    assert steps >= 8  # the journal, each table's rename, the marker, the clean-up
    old, new = [first.run_id], ([first.run_id, second.run_id] if how == "append" else [second.run_id])
    outcomes = set()
    for k in range(1, steps + 1):
        out = tmp_path / f"{how}-{k}"
        first.save(out)
        _commit_killed_at(monkeypatch, k)
        with pytest.raises(_Killed):
            second.save(out, **{how: True})
        monkeypatch.undo()
        assert main(["query", str(out), "SELECT run_id FROM runs"]) == 0  # the next command
        marker, held = _state(out)
        assert marker in (old, new), (k, marker)
        assert all(runs == set(marker) for runs in held.values()), (k, held)
        assert set(pd.read_parquet(out / "layers")["run_id"].astype(str)) == set(marker)
        assert set(ds.dataset(out / "heads", partitioning="hive").to_table().column("run_id").to_pylist()) == set(marker)
        assert {r[0] for r in duckdb.sql(f"SELECT DISTINCT run_id FROM read_parquet('{out}/runs/**/*.parquet', "
                                         "hive_partitioning=true)").fetchall()} == set(marker)
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], k
        outcomes.add(tuple(marker))
    assert outcomes == {tuple(old), tuple(new)}  # killed before the journal: the old report; after it: the new one


def test_the_runs_of_one_file_are_committed_together_at_any_kill(tmp_path, two_profiles, monkeypatch):
    """An export of two processes (the H100×2 nsys export) is two runs, staged side by side under the file's one
    staging id. Killed at every rename, replace, unlink or rmtree of its ``--append`` commit, the next command leaves
    the old report or the new one with both processes' runs, never one of them, and nothing staged behind."""
    from pathlib import Path

    from headcount.cli.main import main

    export = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
    first = two_profiles[0]
    probe = tmp_path / "probe"
    first.save(probe)
    seen = _commit_killed_at(monkeypatch, 0)
    assert main(["parse", str(export), "-o", str(probe), "--append", "--jobs", "1"]) == 0
    steps = seen["n"]
    monkeypatch.undo()
    marker, held = _state(probe)
    assert marker[0] == first.run_id and len(marker) == 3 and [m.rsplit("-", 1)[1] for m in marker[1:]] == ["pid111", "pid112"]
    assert all(runs == set(marker) for runs in held.values()), held
    assert steps >= 8
    for k in range(1, steps + 1):
        out = tmp_path / f"append-{k}"
        first.save(out)
        _commit_killed_at(monkeypatch, k)
        with pytest.raises(_Killed):
            main(["parse", str(export), "-o", str(out), "--append", "--jobs", "1"])
        monkeypatch.undo()
        assert main(["query", str(out), "SELECT run_id FROM runs"]) == 0  # the next command
        marker, held = _state(out)
        assert len(marker) in (1, 3), (k, marker)
        assert all(runs == set(marker) for runs in held.values()), (k, held)
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], k


def test_a_write_refused_by_a_first_writer_that_won_leaves_its_report_and_lock(tmp_path):
    """Two first writers of a new directory: the one whose commit is refused (the other committed while it
    staged) removes only what it staged, never the winner's report or the lock file the writers share."""
    from headcount.store.dataset import LOCK, MARKER, Staged, StagedRun, write_run, write_runs
    from headcount.store.metadata import new_run_id

    out = tmp_path / "new"
    mine, theirs = new_run_id(), new_run_id()
    frame = pd.DataFrame({"name": ["k"], "duration_ns": [1.0]})

    def stage() -> Staged:
        with StagedRun(out, mine, {"run_id": mine}) as staged:
            staged.write("kernels", frame)
        write_run(out, theirs, {"kernels": frame}, {"run_id": theirs})  # the other writer wins meanwhile
        return Staged([mine])

    with pytest.raises(HeadcountError, match="already holds a headcount report"):
        write_runs(out, [mine], stage)
    assert (out / MARKER).exists() and not (out / LOCK).exists()  # the refused writer released (and removed) the lock
    assert json.loads((out / MARKER).read_text())["runs"] == [theirs]
    assert not list(out.glob(".staging-*"))
