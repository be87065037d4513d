"""Fuzzed inputs (``tests/fuzz_cases.py``), a fixed-seed subset: every damaged
or odd nsys export gets a one-line error or a report whose numbers pass the
plausibility rules (or a notice says what was dropped); never a traceback, a
hang, a changed input or a file beside it. ``benchmarks/fuzz.py`` runs a
thousand cases per format."""

from __future__ import annotations

import fuzz_cases


def test_fuzzed_nsys_exports(tmp_path):
    outcomes = fuzz_cases.run_sqlite_cases(tmp_path, range(40))
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
