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
    on_disk = _runs_on_disk(out)
    assert all(runs == set(marker) for runs in on_disk.values()), {t: (runs ^ set(marker)) for t, runs in on_disk.items()}
    runs = pd.read_parquet(out / "runs")
    assert sorted(runs["run_id"].astype(str)) == sorted(marker)  # one runs row each, no duplicate
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


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
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_claim_is_never_seen_unheld_by_another_writers_recovery(tmp_path, monkeypatch):
    """Another writer's recover() at the worst moment of a claim, just before its lock is taken (forced
    here; on a loaded machine it happened now and then): the staging directory survives, claimed. It
    used to be removed, files and all, and the run then missed tables although every writer succeeded."""
    import os

    from headcount.store import dataset

    out = tmp_path / "r"
    out.mkdir()
    real_flock = dataset.fcntl.flock
    recovered = []

    def flock_after_a_recovery(fd, operation):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/" + dataset.CLAIM) and not recovered:
            recovered.append("under way")  # once (recover() itself tests claims with flock)
            (out / ".staging-a-dead-writers").mkdir()  # what the other writer's recover() is there to remove
            dataset.recover(out)
        return real_flock(fd, operation)

    monkeypatch.setattr(dataset.fcntl, "flock", flock_after_a_recovery)
    with dataset.Claim(out, ["run1"]):
        assert recovered and not (out / ".staging-a-dead-writers").exists()  # the recovery ran, in between
        assert dataset._claimed(out / ".staging-run1")
        assert sorted(p.name for p in out.iterdir()) == [".staging-run1"]  # nothing else of the claim (its lock let go)
    assert [p.name for p in out.iterdir()] == []  # released: the unused staging and the lock removed
