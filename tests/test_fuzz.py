"""Fuzzed inputs (``tests/fuzz_cases.py``), a fixed-seed subset of each format
(nsys SQLite, ncu CSV, Kineto JSON, .ncu-rep): every damaged or odd file gets a one-line error or a report whose numbers pass the
plausibility rules (or a notice says what was dropped); never a traceback, a
hang, a changed input or a file beside it. ``benchmarks/fuzz.py`` runs a
thousand cases per format."""

from __future__ import annotations

import fuzz_cases
import pandas as pd
import pytest


@pytest.mark.parametrize("run, cases", [(fuzz_cases.run_sqlite_cases, 40), (fuzz_cases.run_csv_cases, 40),
                                        (fuzz_cases.run_kineto_cases, 40), (fuzz_cases.run_ncurep_cases, 12)],
                         ids=["nsys-sqlite", "ncu-csv", "kineto-json", "ncu-rep"])
def test_fuzzed_inputs(tmp_path, monkeypatch, run, cases):
    monkeypatch.setattr(fuzz_cases, "TIMEOUT_S", 1800)  # a hang is still caught; a loaded machine is not one
    outcomes = run(tmp_path, range(cases))
    bad = [o for o in outcomes if o.kind not in ("error", "accepted")]
    assert not bad, "\n".join(f"{o.kind} {o.mutation}: {o.detail}" for o in bad)
    kinds = {o.kind for o in outcomes}
    assert kinds == {"error", "accepted"}  # the subset holds both: refused files and files read despite damage


def test_invalid_utf8_and_odd_values_are_said(tmp_path, capsys):
    """Text that is not UTF-8 and text in integer columns are data, read and said."""
    import shutil
    import sqlite3

    from headcount.cli.main import main

    path = tmp_path / "odd.sqlite"
    shutil.copy(fuzz_cases.NSYS_BASE, path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE NVTX_EVENTS SET text = CAST(X'FF41' AS TEXT) WHERE rowid IN (SELECT rowid FROM NVTX_EVENTS "
                    "WHERE text IS NOT NULL LIMIT 2)")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = '12abc' WHERE rowid = 1")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = start - 5 WHERE rowid = 2")
    assert main(["parse", str(path), "-o", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "strings were not UTF-8" in err and "were not integers" in err
    assert "1 GPU operations dropped as implausible (1 ending before they start)" in err


def test_a_fifo_is_refused_at_once(tmp_path, capsys):
    import os

    from headcount.cli.main import main

    fifo = tmp_path / "trace.sqlite"
    os.mkfifo(fifo)
    assert main(["parse", str(fifo), "-o", str(tmp_path / "r")]) == 2  # returns: nothing was opened for reading
    assert "not a regular file" in capsys.readouterr().err


def test_a_wal_export_in_a_read_only_directory_parses_untouched(tmp_path):
    """Read-only for real: root ignores a directory's mode, so as root the
    directory is bind-mounted read-only in a mount namespace of its own."""
    import hashlib
    import os
    import shlex
    import shutil
    import sqlite3
    import subprocess
    import sys

    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "wal.sqlite"
    shutil.copy(fuzz_cases.NSYS_BASE, path)
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode=WAL")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    parse = [sys.executable, "-m", "headcount", "parse", str(path), "-o", str(tmp_path / "r")]
    probe = f"touch {shlex.quote(str(folder / 'probe'))} 2>/dev/null && exit 99"
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("root without unshare(1): cannot make a directory read-only")
        mount = f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(folder))} && mount -o remount,ro,bind {shlex.quote(str(folder))}"
        command = ["unshare", "-m", "sh", "-c", f"{mount} || exit 98; {probe}; exec {shlex.join(parse)}"]
    else:
        os.chmod(folder, 0o555)
        command = ["sh", "-c", f"{probe}; exec {shlex.join(parse)}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    finally:
        os.chmod(folder, 0o755)
    if done.returncode == 98:
        pytest.skip(f"no read-only bind mount here: {done.stderr.strip()}")
    assert done.returncode != 99, "the directory was writable: the test would prove nothing"
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["wal.sqlite"]  # no -shm, no -wal
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_an_aborting_ncu_rep_reader_is_one_line(tmp_path, monkeypatch, capsys):
    """The .ncu-rep reader runs in a child process, so a C++ abort in it is one
    error line. The child here is a stand-in that aborts as NVIDIA's reader
    does on a damaged report (its message, then SIGABRT)."""
    import shutil
    import stat

    from headcount.cli.main import main
    from headcount.parsers import ncu_rep

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'F1203 check.cpp:42] Check failed: count >= 0' >&2\nkill -ABRT $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(ncu_rep.sys, "executable", str(fake))
    report = tmp_path / "damaged.ncu-rep"
    shutil.copy(fuzz_cases.FIXTURES / "ncu" / "rtx2080ti_two_kernels.ncu-rep", report)
    assert main(["parse", str(report), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged .ncu-rep: the reader aborted (signal SIGABRT: F1203 check.cpp:42] Check failed" in err[0]


def test_schema_drift_is_named_as_such(tmp_path, capsys):
    import shutil
    import sqlite3

    from headcount.cli.main import main

    path = tmp_path / "drift.sqlite"
    shutil.copy(fuzz_cases.NSYS_BASE, path)
    with sqlite3.connect(path) as con:
        con.execute('ALTER TABLE NVTX_EVENTS RENAME COLUMN "start" TO "startNs"')
        con.execute("DROP TABLE StringIds")
    assert main(["parse", str(path), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "an export schema headcount does not know (" in err and "no such column: e.start" in err


def test_text_in_packed_integer_columns_is_missing_not_its_leading_digits(tmp_path):
    """SQLite's CAST reads '12abc' as 12; device, registers, shared memory and
    grid are packed in SQL, where such text must read as missing."""
    import shutil
    import sqlite3

    from headcount.parsers.nsys_sqlite import read_export

    path = tmp_path / "odd.sqlite"
    shutil.copy(fuzz_cases.NSYS_BASE, path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = '7abc', registersPerThread = '40x', "
                    "gridX = '3z', staticSharedMemory = '9q' WHERE rowid = 1")
        start = con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 1").fetchone()[0]
    gpu = read_export(path).gpu
    odd = gpu[(gpu["start_ns"] == start) & (gpu["kind"] == "kernel")]
    assert len(odd) == 1
    row = odd.iloc[0]
    assert pd.isna(row["device"]) and pd.isna(row["registers_per_thread"]) and pd.isna(row["shared_memory_bytes"])
    assert pd.isna(row["grid"])
    others = gpu[(gpu["kind"] == "kernel") & (gpu["start_ns"] != start)]
    assert others["device"].notna().all() and others["registers_per_thread"].notna().all()


@pytest.mark.parametrize("name", sorted(fuzz_cases.TRUNCATION_BASES))
def test_a_cut_recording_is_refused_without_salvage_and_said_with_it(tmp_path, monkeypatch, name):
    """Real recordings of every format cut at 3 of the 20 points ``benchmarks/fuzz.py`` cuts them at (early, middle,
    late): refused without ``--salvage``; with it refused or read with a ``damaged:`` notice, never silently."""
    if name == ".nsys-rep":
        from tests.nsight import nsight_bin

        monkeypatch.setenv("HEADCOUNT_NSYS", nsight_bin("nsys"))
    monkeypatch.setattr(fuzz_cases, "TIMEOUT_S", 1800)
    plain = fuzz_cases.run_truncation_cases(tmp_path / "plain", name, only=[2, 10, 18])
    assert [o.kind for o in plain] == ["error"] * 3, "\n".join(f"{o.kind} {o.mutation}: {o.detail}" for o in plain)
    salvaged = fuzz_cases.run_truncation_cases(tmp_path / "salvaged", name, only=[2, 10, 18], salvage=True)
    bad = [o for o in salvaged if o.kind not in ("error", "accepted")]
    assert len(salvaged) == 3 and not bad, "\n".join(f"{o.kind} {o.mutation}: {o.detail}" for o in bad)
