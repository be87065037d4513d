"""Several headcount processes writing one report at once: the commit lock,
the marker rewritten under it, the first-write race (real processes, the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

TRACE = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"


def _parse(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "headcount.cli.main", "parse", str(TRACE), "-o", str(out), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _runs_on_disk(out: Path) -> dict[str, set]:
    return {t: {p.name[len("run_id="):] for p in (out / t).glob("run_id=*")} for t in ("kernels", "ranges", "layers", "runs", "manifests")}


def test_concurrent_appends_lose_nothing(tmp_path):
    """10 rounds of 3 writers appending at once, then one of 4: every run each
    writer reported is listed once in the marker and present in every table;
    none is partial."""
    out = tmp_path / "report"
    first = _parse(out)
    assert first.wait() == 0, first.stderr.read()
    for writers_in_round in [3] * 10 + [4]:
        writers = [_parse(out, "--append") for _ in range(writers_in_round)]
        for w in writers:
            assert w.wait() == 0, w.stderr.read()
    marker = json.loads((out / "headcount.json").read_text())["runs"]
    assert len(marker) == 35 and len(set(marker)) == 35
    assert all(runs == set(marker) for runs in _runs_on_disk(out).values())
    runs = pd.read_parquet(out / "runs")
    assert sorted(runs["run_id"].astype(str)) == sorted(marker)  # one runs row each, no duplicate
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".headcount.lock"]


def test_two_first_writes_one_wins_the_other_says_so(tmp_path):
    """5 rounds of 2 writers to a new directory at once: one report with one
    run; the other writer fails with one line and leaves nothing behind."""
    for round_ in range(5):
        out = tmp_path / f"new-{round_}"
        writers = [_parse(out) for _ in range(2)]
        codes = [w.wait() for w in writers]
        errors = [w.stderr.read() for w in writers]
        assert sorted(codes) == [0, 2], errors
        refused = errors[codes.index(2)]
        lines = [ln for ln in refused.splitlines() if ln.startswith("headcount: error")]
        assert len(lines) == 1 and "already holds a headcount report" in lines[0], refused
        marker = json.loads((out / "headcount.json").read_text())["runs"]
        assert len(marker) == 1 and all(runs == set(marker) for runs in _runs_on_disk(out).values())
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".headcount.lock"]
