"""The training window writer stopped (issue 58): a training process with a :class:`headcount.training.StepProfiler`
ended by SIGTERM or SIGHUP — to its whole process group (``timeout``, a closed terminal) while a worker is in the middle
of a write, or to the training process alone (``kill``) — leaves no process running, no staging folder in the report,
and its unwritten windows' files only until the next writer starts, which removes them with a notice.

Each point is an event of the program (a line it printed, a file the worker made), never a wall-clock delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from test_stop_signals import _assert_nothing_left

from headcount.build import window_writer

TESTS = Path(__file__).resolve().parent
TRAIN = """
import sys, torch
from conftest import llama_model
from headcount.training import StepProfiler
model = llama_model('sdpa')
ids = torch.randint(0, 128, (2, 16))
sp = StepProfiler(model, sys.argv[1], every=2, queue=8, writer_priority="normal")
if sys.argv[2] != "-":
    sp.writer.target = sys.argv[2]
for step in range(100000):
    with sp.step(step):
        model(input_ids=ids, labels=ids).loss.backward()
    print(f"step {step}", flush=True)
"""


def _train(tmp_path: Path, target: str) -> tuple[subprocess.Popen, Path, Path]:
    """Start the training script in a session of its own (as from a terminal), its TMPDIR its own."""
    script, out, tmp = tmp_path / "train.py", tmp_path / "out", tmp_path / "tmp"
    script.write_text(TRAIN)
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(out), target], cwd=TESTS, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(TESTS), "TMPDIR": str(tmp)})
    return proc, out, tmp


def _wait_for(check, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300  # a bound on a loaded machine, not a timing
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} never came:\n{proc.stdout.read()}")
        time.sleep(0.05)


def _assert_report_whole(out: Path) -> None:
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")] if out.exists() else True
    if (out / "runs").exists():
        assert len(pd.read_parquet(out / "runs")) >= 1  # every listed window reads back


def _swept(tmp: Path, pid: int, monkeypatch) -> None:
    """The next writer's start removes the dead process's jobs folder and says so."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    left = sorted(p.name for p in tmp.glob(f"{window_writer.JOBS_PREFIX}{pid}-*"))
    assert left, "the stopped process left no jobs folder: nothing to sweep"
    said = []
    removed = window_writer.remove_stale_jobs(say=said.append)
    assert sorted(p.name for p in removed) == left and len(said) == len(left)
    assert all(f"(PID {pid})" in line for line in said)
    assert not list(tmp.glob(f"{window_writer.JOBS_PREFIX}{pid}-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_group_mid_write_removes_the_staging_and_ends_every_worker(tmp_path, sig, monkeypatch):
    """SIGTERM or SIGHUP to the process group while a worker has staged part of a window: the worker removes its
    staging before it ends; the training process ends; nothing runs, nothing half-written stays."""
    proc, out, tmp = _train(tmp_path, "window_faults:stage_then_wait")
    _wait_for(lambda: (tmp_path / "staging").exists(), "the worker's staging", proc)
    assert list(out.glob(".staging-*"))  # the write is under way
    os.killpg(proc.pid, sig)
    proc.wait(timeout=300)
    _assert_nothing_left(proc.pid)
    assert not list(out.glob(".staging-*")), sorted(p.name for p in out.iterdir())
    _assert_report_whole(out)
    _swept(tmp, proc.pid, monkeypatch)


def test_sigterm_to_the_training_process_alone_lets_the_window_in_hand_finish(tmp_path, monkeypatch):
    """SIGTERM to the training process only (``kill PID``): it dies at once (Python's default; headcount installs no
    handler in the user's program); the worker finishes the window it holds, whole, and ends with the pipe."""
    proc, out, tmp = _train(tmp_path, "-")
    for line in proc.stdout:
        if line.strip() == "step 6":
            break
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=300) == -signal.SIGTERM
    _assert_nothing_left(proc.pid)
    assert not list(out.glob(".staging-*")) if out.exists() else True
    _assert_report_whole(out)
    _swept(tmp, proc.pid, monkeypatch)
