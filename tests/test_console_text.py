"""Names from users' files print as they are: rich markup and emoji codes in
NVTX ranges and file names are text, never styles, links or errors."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from headcount.cli.main import main

H100 = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
PAYLOAD = "[/x][rank0][link=https://e.vil]:fire: "


def test_markup_in_names_prints_verbatim(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that no name is wrapped
    path = tmp_path / "prof[rank0].sqlite"
    shutil.copy(H100, path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE NVTX_EVENTS SET text = ? || text WHERE text IS NOT NULL", (PAYLOAD,))
    out = tmp_path / "r[b]"
    assert main(["parse", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert "prof[rank0].sqlite" in printed.err and "r[b]" in printed.out
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert PAYLOAD.strip() in printed and "\x1b]8;" not in printed  # no terminal hyperlink
    assert main(["query", str(out), "SELECT DISTINCT name FROM ranges ORDER BY name LIMIT 2"]) == 0
    assert PAYLOAD.strip() in capsys.readouterr().out
    assert main(["compare", str(out)]) == 0
