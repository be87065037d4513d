"""nsys SQLite exports: reading, and projecting NVTX ranges onto the GPU
exactly as nsys's own ``nvtx_gpu_proj_trace`` report does."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nsight import nsight_bin

from headcount.attribute.attribution import project_gpu
from headcount.common.errors import HeadcountError
from headcount.parsers.nsys_sqlite import last_nvtx, nsys_name, read_export
from headcount.parsers.options import ReadOptions

FIX = Path(__file__).parent / "fixtures" / "nsys"
H100 = FIX / "h100x2_pytorch_nsys2026.2.sqlite"
A100 = FIX / "a100x4_cloverleaf_nsys2024.5.sqlite"


def _compare(projected: pd.DataFrame, reference: pd.DataFrame, work: pd.DataFrame) -> None:
    # nsys adds one nameless row for the GPU work launched outside every range
    outside = reference[reference["RangeId"].isna()]
    launched = work[work["api_start_ns"].notna()]
    expected_outside = int((launched["range_id"] < 0).sum())
    assert (int(outside["NumGPUOps"].sum()) if len(outside) else 0) == expected_outside
    reference = reference[reference["RangeId"].notna()].astype({"RangeId": "int64"})
    mine = projected[projected["gpu_op_count"] > 0].set_index("range_id")
    ref = reference.set_index("RangeId")
    assert set(mine.index) == set(ref.index)
    j = ref.join(mine, how="inner")
    assert (j["Projected Start:ts_ns"] == j["gpu_start_ns"]).all()
    assert (j["Projected Duration:dur_ns"] == j["gpu_end_ns"] - j["gpu_start_ns"]).all()
    assert (j["NumGPUOps"] == j["gpu_op_count"]).all()
    assert (j["ParentId"].fillna(-1).astype("int64") == j["parent_range_id"]).all()
    assert (j["Lvl"] == j["depth"]).all()
    assert (j["NumChild"] == j["child_count"]).all()
    assert (j["Name"] == nsys_name(j)).all()
    assert (j["PID"].astype(str) == j["pid"]).all() and (j["TID"].astype(str) == j["tid"]).all()
    assert (j["Orig Start:ts_ns"] == j["start_ns"]).all()
    assert (j["Orig Duration:dur_ns"] == j["end_ns"] - j["start_ns"]).all()


def test_h100x2_projection_equals_nsys_reference_for_every_range():
    export = read_export(H100)
    projected, work = project_gpu(export.ranges, export.runtime, export.gpu)
    reference = pd.read_csv(FIX / "h100x2_pytorch_nsys2026.2.nvtx_gpu_proj_trace.csv")
    assert len(reference) == 3242
    _compare(projected, reference, work)
    # two processes, two GPUs: no op is ever attributed to another process's range
    by_id = projected.set_index("range_id")
    attributed = work[work["range_id"] >= 0]
    assert (by_id.loc[attributed["range_id"], "pid"].to_numpy() == attributed["pid"].to_numpy()).all()
    assert set(export.gpu["pid"]) == {"111", "112"} and export.gpu["device"].nunique() == 2


def _live_reference(sqlite_path: Path) -> pd.DataFrame:
    report = nsight_bin("nsys-report")
    out = subprocess.run([report, "nvtx_gpu_proj_trace", str(sqlite_path)], capture_output=True, text=True, timeout=300, check=True)
    return pd.read_csv(io.StringIO(out.stdout))


def test_live_nsys_report_on_a_truncated_capture(tmp_path):
    """Run nsys's reference report live on an export cut on purpose, as when a
    capture stops mid-step: every range open at the cut has no end (it extends
    to the last NVTX timestamp), nothing starts after the cut, and launch calls
    that straddle range ends stay in."""
    cut_export = tmp_path / "cut.sqlite"
    shutil.copy(H100, cut_export)
    con = sqlite3.connect(cut_export)
    lo, hi = con.execute("SELECT min(start), max(end) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()
    cut = lo + (hi - lo) * 2 // 3
    con.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 59 AND start > ?", (cut,))
    open_at_cut = con.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE eventType = 59 AND end > ?", (cut,)).rowcount
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start > ?", (cut,))
    con.commit()
    con.close()
    export = read_export(cut_export)
    assert export.ranges["end_missing"].sum() == open_at_cut > 0
    projected, work = project_gpu(export.ranges, export.runtime, export.gpu)
    reference = _live_reference(cut_export)
    assert len(reference) > 100
    _compare(projected, reference, work)


def test_a100x4_no_nvtx():
    export = read_export(A100)
    assert export.ranges.empty
    gpu = export.gpu
    assert (gpu["kind"] == "kernel").sum() == 1312 and (gpu["kind"] == "memcpy").any()
    assert export.meta.get("EXPORT_PRODUCT_VERSION", "").startswith("2024.5")
    projected, work = project_gpu(export.ranges, export.runtime, gpu)
    assert projected.empty and (work["range_id"] == -1).all()
    assert work["api_start_ns"].notna().mean() > 0.99  # launches found within each process


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("not a database"), "not an SQLite file"),
    (lambda p: p.write_bytes(H100.read_bytes()[:300_000]), "damaged or truncated"),
    (lambda p: sqlite3.connect(p).execute("CREATE TABLE t (x)").connection.commit(), "neither NVTX ranges nor GPU activity"),
])
def test_bad_sqlite_inputs(tmp_path, make, message):
    path = tmp_path / "bad.sqlite"
    make(path)
    with pytest.raises(HeadcountError, match=message) as info:
        read_export(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(HeadcountError, match="no such file"):
        read_export(tmp_path / "none.sqlite")


def test_columns_whose_first_rows_are_null(tmp_path):
    """SQLite columns have no fixed type: NULL ends and names in the first
    rows, text names later, must read the same as the original."""
    path = tmp_path / "nulls.sqlite"
    shutil.copy(H100, path)
    con = sqlite3.connect(path)
    first = [r[0] for r in con.execute("SELECT rowid FROM NVTX_EVENTS ORDER BY rowid LIMIT 3000")]
    con.execute("UPDATE NVTX_EVENTS SET text = NULL, textId = NULL, end = NULL WHERE rowid <= 3000")
    con.execute("UPDATE NVTX_EVENTS SET text = 'named', textId = NULL WHERE rowid > 10000")
    con.commit()
    con.close()
    ranges = read_export(path).ranges.set_index("range_id")
    assert (ranges.loc[ranges.index > 10000, "name"] == "named").all()
    assert ranges.loc[first, "name"].isna().all() and ranges.loc[first, "end_missing"].all()
    assert ranges.loc[ranges.index > 3000, "name"].notna().all()


def test_reading_in_two_halves_gives_the_same_tables(monkeypatch):
    import headcount.parsers.nsys_sqlite as reader

    whole = read_export(H100).ranges
    monkeypatch.setattr(reader, "SPLIT_ROWS", 1000)
    halves = read_export(H100).ranges
    pd.testing.assert_frame_equal(whole, halves)
    # as many parts as reader threads (ReadOptions), one thread: one part
    pd.testing.assert_frame_equal(whole, read_export(H100, options=ReadOptions(threads=3)).ranges)
    pd.testing.assert_frame_equal(whole, read_export(H100, options=ReadOptions(threads=1)).ranges)


def test_a_schema_headcount_does_not_know_is_said_as_such(tmp_path):
    """The engine's "no such column" reaches the user as a schema headcount does not know, not as damage
    (it was wrapped twice, and the second wrapping said "damaged or truncated")."""
    path = tmp_path / "odd.sqlite"
    with sqlite3.connect(path) as con:
        con.execute('CREATE TABLE NVTX_EVENTS (eventType INTEGER, "end" INTEGER)')
        con.execute("INSERT INTO NVTX_EVENTS VALUES (59, 10)")
    with pytest.raises(HeadcountError, match="an export schema headcount does not know .*no such column: start"):
        last_nvtx(path)


def test_parquetdir_export_gives_the_same_projection(tmp_path):
    """The H100×2 tables written as a parquetdir (one Parquet file per table,
    converted here with pyarrow from the SQLite export; nsys itself writes the
    same layout — the real nsys parquetdir is checked in test_nsys.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pqdir = tmp_path / "export"
    pqdir.mkdir()
    con = sqlite3.connect(H100)
    for table in ("NVTX_EVENTS", "StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                  "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "META_DATA_EXPORT"):
        frame = pd.read_sql_query(f"SELECT * FROM {table} ORDER BY rowid", con)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), pqdir / f"{table}.parquet")
    con.close()
    export = read_export(pqdir)
    sqlite_export = read_export(H100)
    pd.testing.assert_frame_equal(export.ranges, sqlite_export.ranges, check_dtype=False)
    projected, work = project_gpu(export.ranges, export.runtime, export.gpu)
    _compare(projected, pd.read_csv(FIX / "h100x2_pytorch_nsys2026.2.nvtx_gpu_proj_trace.csv"), work)


_SMALL = None


def _small_export(tmp_dir: Path) -> bytes:
    """A small real export (the H100×2 file cut down to its first 400 NVTX rows
    and the launches they hold), as bytes to mutate."""
    global _SMALL
    if _SMALL is None:
        path = tmp_dir / "small.sqlite"
        shutil.copy(H100, path)
        con = sqlite3.connect(path)
        con.execute("DELETE FROM NVTX_EVENTS WHERE rowid > 400")
        hi = con.execute("SELECT max(end) FROM NVTX_EVENTS").fetchone()[0]
        for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            con.execute(f"DELETE FROM {table} WHERE start > ?", (hi,))
        con.commit()
        con.execute("VACUUM")
        con.close()
        _SMALL = path.read_bytes()
    return _SMALL


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_sqlite_gives_tables_or_a_clear_error(tmp_path, data):
    """Truncated or byte-flipped exports: either the reader's tables or one
    HeadcountError naming the file, never another exception."""
    blob = bytearray(_small_export(tmp_path))
    cut = data.draw(st.integers(0, len(blob)))
    blob = blob[:cut]
    for pos, byte in data.draw(st.lists(st.tuples(st.integers(0, max(len(blob) - 1, 0)), st.integers(0, 255)), max_size=8)):
        if pos < len(blob):
            blob[pos] = byte
    path = tmp_path / "mutated.sqlite"
    path.write_bytes(bytes(blob))
    try:
        export = read_export(path)
    except HeadcountError as exc:
        assert str(path) in str(exc)
    else:
        assert all(isinstance(getattr(export, name), pd.DataFrame) for name in ("ranges", "runtime", "gpu"))
        assert (export.ranges["end_ns"] >= 0).all() if len(export.ranges) else True


def test_live_nsys_report_with_partially_overlapping_start_end_ranges(tmp_path):
    """Start/end ranges may overlap without nesting. Here 40 are added to the
    H100×2 export on the threads that launch work, each starting halfway
    through a push/pop range and ending after it; nsys's report, run live,
    gives parents by least slack and counts a launch for every range that
    contains it."""
    path = tmp_path / "overlap.sqlite"
    shutil.copy(H100, path)
    con = sqlite3.connect(path)
    base = con.execute("""SELECT start, end, globalTid FROM NVTX_EVENTS WHERE eventType = 59 AND end - start > 1000
                          ORDER BY start LIMIT 400""").fetchall()[::10]
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 60, ?, ?)",
                    [(s + (e - s) // 2, e + (e - s), f"overlap.{i}", g) for i, (s, e, g) in enumerate(base)])
    con.commit()
    con.close()
    export = read_export(path)
    projected, work = project_gpu(export.ranges, export.runtime, export.gpu)
    assert not projected["nested"].all()  # the overlapping path is exercised
    _compare(projected, _live_reference(path), work)
