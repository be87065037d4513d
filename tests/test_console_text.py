"""Names from users' files print as they are: rich markup and emoji codes in
NVTX ranges and file names are text, never styles, links or errors."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("args", [["doctor", "--json"], ["doctor"], ["--help"]])
def test_a_reader_that_leaves_early_gets_no_traceback(args):
    """``headcount doctor --json | head -1``: the pipe closes before headcount writes."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "headcount", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait() in (0, 1)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_output_to_a_file_is_not_wrapped_at_80_columns(monkeypatch):
    """Piped or redirected, a long line (an NVTX path, a message) stays one line,
    and a table is as wide as its cells, not cut at 80 columns."""
    import io

    from rich.table import Table

    from headcount.reports import terminal

    monkeypatch.delenv("COLUMNS", raising=False)
    sink = io.StringIO()
    out = terminal.console(file=sink)
    path = "fwd/" + "/".join(f"block_{i}.attention_module" for i in range(12))
    out.print(f"the program exited with status 3: {path}")
    table = Table()
    table.add_column("range")
    table.add_row(path)
    out.print(table)
    lines = sink.getvalue().splitlines()
    assert lines[0] == f"the program exited with status 3: {path}"
    assert any(path in line for line in lines[1:])


def test_debug_works_after_the_subcommand_too(tmp_path, capsys):
    from headcount.cli.main import main

    for argv in (["--debug", "profile", "--model", "/nope"], ["profile", "--model", "/nope", "--debug"]):
        assert main([*argv, "-o", str(tmp_path / "r")]) == 2
        assert "Traceback" in capsys.readouterr().err
    assert main(["profile", "--model", "/nope", "-o", str(tmp_path / "r")]) == 2
    assert "Traceback" not in capsys.readouterr().err
