"""The help texts a user copies from: every example line is valid shell, the DuckDB one runs, ``query --help``
names every view, and ``parse`` says which recordings it reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from headcount.common.tables import TABLES

FIXTURE = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "headcount", *args, "--help"], capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _commands(text: str) -> list[str]:
    """The example lines: a command, then (after two or more spaces) what it does."""
    lines = [line.strip() for line in text.splitlines() if line.startswith("  ") and re.match(r"\s+(headcount|python|ncu|nsys) ", line)]
    return [re.split(r"\s{3,}", line)[0] if not line.startswith("python") else line for line in lines]


def test_every_example_of_the_main_help_is_valid_shell():
    commands = _commands(_help())
    assert any(c.startswith("python -c") and "duckdb" in c for c in commands)
    for command in commands:
        checked = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, f"{command!r}: {checked.stderr.strip()}"


def test_the_duckdb_example_runs_on_a_report(tmp_path):
    subprocess.run([sys.executable, "-m", "headcount", "parse", str(FIXTURE), "-o", str(tmp_path / "headcount-report")],
                   check=True, capture_output=True, timeout=300)
    line = next(c for c in _commands(_help()) if c.startswith("python -c") and "duckdb" in c)
    done = subprocess.run(["bash", "-c", line.replace("python ", f"{sys.executable} ", 1)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "layer_name" in done.stdout  # the heads table, shown


def test_query_help_names_every_view_and_parse_names_torch_profiler():
    views = re.search(r"views: ([^(]+)\(", _help("query")).group(1)
    assert {v.strip() for v in views.split(",")} == set(TABLES)
    assert "torch.profiler" in re.search(r"parse\s+(.+)", _help()).group(1)
