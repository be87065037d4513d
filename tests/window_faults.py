"""Stand-ins for the training window writer's job (:func:`headcount.build.window_writer.write_window`),
run by name in the real worker process (``WindowWriter.target``): they fail, kill the worker or
wait, as the tests of ``test_training.py`` need, and otherwise write the window as the worker does.
Nothing here stands in for the GPU: it stands in for a full disk, a crash and a slow machine."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from headcount.build.window_writer import write_window
from headcount.store.dataset import write_stats


def fail_at_2_die_at_4(recording, out, metadata, attention_stats, append):
    """Step 2's window raises; at step 4's the worker process exits without a word."""
    if recording.run_id.endswith("step0000002"):
        raise RuntimeError("disk full (made up)")
    if recording.run_id.endswith("step0000004"):
        os._exit(3)
    return write_window(recording, out, metadata, attention_stats, append)


def wait_for_go(recording, out, metadata, attention_stats, append):
    """Write the window once a file ``go`` beside the report exists (the test creates it)."""
    flag = Path(out).parent / "go"
    while not flag.exists():
        time.sleep(0.01)
    return write_window(recording, out, metadata, attention_stats, append)


def say_if_torch(recording, out, metadata, attention_stats, append):
    """Write the window, and say whether the worker process has imported torch."""
    lines = write_window(recording, out, metadata, attention_stats, append)
    return [*lines, f"torch imported in the worker: {'torch' in sys.modules}"]


def _lowered() -> bool:
    """Whether this worker runs at a lowered priority (idle, or nice above 0)."""
    return (hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE) or os.getpriority(os.PRIO_PROCESS, 0) > 0


def hold_while_lowered(recording, out, metadata, attention_stats, append):
    """Never finish in a worker at lowered priority (as on a machine whose cores are all busy); write the
    window in one at normal priority."""
    while _lowered():
        time.sleep(0.01)
    return write_window(recording, out, metadata, attention_stats, append)


def commit_then_hold_while_lowered(recording, out, metadata, attention_stats, append):
    """Commit the window (its ``runs`` row only: little CPU time for a worker at lowered priority on a busy
    machine), then never answer in a worker at lowered priority (killed between its commit and its answer);
    a worker at normal priority writes the whole window, a second time if it is given it."""
    if not _lowered():
        return [*write_window(recording, out, metadata, attention_stats, append), "written by a worker at normal priority"]
    write_stats(out, recording.run_id, {}, metadata, append=append)
    while True:
        time.sleep(0.01)


def stage_then_wait(recording, out, metadata, attention_stats, append):
    """Stage the window's first table, say so (a file ``staging`` beside the report), then never finish: the worker
    is in the middle of a write when the test's signal comes."""
    from headcount.store import dataset

    original = dataset.StagedRun.write

    def write(self, name, frame):
        original(self, name, frame)
        (Path(out).parent / "staging").touch()
        while True:
            time.sleep(0.01)

    dataset.StagedRun.write = write
    return write_window(recording, out, metadata, attention_stats, append)
