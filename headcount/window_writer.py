"""Windows of a training run built and written off the training loop (issue 29).

A profiled window's recording (:class:`~headcount.build.Recording`: the trace
file, the call log, the device) is handed to a worker process that builds its
tables (:func:`~headcount.build.tables_from_recording`, the path the API takes)
and appends them to the dataset (:func:`~headcount.reports.dataset.write_stats`,
the same staged commit: a report is never half-written). The loop goes on as
soon as torch's profiler has stopped.

- One worker at a time, a fresh process per window, forked from the training
  process (as PyTorch's DataLoader forks its workers): nothing to import, no
  re-run of the user's script, and the worker never calls into torch (the build
  imports none). Windows are written one after the other, in order.
- At most ``capacity`` windows wait or run; :meth:`WindowWriter.full` tells the
  caller to skip the next one (with a notice) rather than wait.
- A worker that fails or dies loses only its window: :meth:`WindowWriter.close`
  names it and the cause; the other windows are written.
- Nothing blocks except :meth:`WindowWriter.close`, which waits, saying each
  window as it is written.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from headcount.build import Recording, tables_from_recording
from headcount.errors import HeadcountError, notice
from headcount.reports.dataset import write_stats


def write_window(recording: Recording, out: Path, metadata: dict, attention_stats: pd.DataFrame | None,
                 append: bool) -> list[str]:
    """Build one window and append it to ``out`` (what the worker runs); returns the build's notices.

    Raises:
        HeadcountError: the recording cannot be read or the report cannot be written.
    """
    built = tables_from_recording(recording)
    stats = dict(built.tables)
    if attention_stats is not None:
        stats["attention_stats"] = attention_stats
    meta = {**metadata, **({"collector": built.info} if built.info else {})}
    write_stats(out, recording.run_id, stats, meta, append=append)
    return list(built.notices)


def _work(job: "_Job", conn) -> None:
    """The worker process: run the job, send back its notices or its failure, one line."""
    try:
        target = job.target or write_window  # looked up in the worker: what the module holds when it forked
        conn.send(("ok", target(job.recording, job.out, job.metadata, job.attention_stats, job.append)))
    except HeadcountError as exc:
        conn.send(("failed", exc.one_line()))
    except BaseException as exc:  # noqa: BLE001 - anything: the parent says it and goes on
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


@dataclass
class _Job:
    step: int
    recording: Recording
    out: Path
    metadata: dict
    attention_stats: pd.DataFrame | None
    append: bool
    done: Callable[[], None] | None  # called once the window is written or lost (its recording's files let go)
    target: Callable | None = None
    process: Any = None
    conn: Any = None
    started: float = 0.0


@dataclass
class WindowWriter:
    """Writes windows in a worker process, one at a time, never blocking the caller (see the module docstring).

    Attributes:
        capacity: windows that may wait or run at once.
        written: steps whose windows were written; failed: ``(step, cause)`` of those that were not.
    """

    capacity: int = 2
    written: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    _queue: list[_Job] = field(default_factory=list)

    def full(self) -> bool:
        """Whether a new window would exceed :attr:`capacity` (then skip it: :meth:`submit` never waits)."""
        self.poll()
        return len(self._queue) >= self.capacity

    def submit(self, step: int, recording: Recording, out: Path, metadata: dict, attention_stats: pd.DataFrame | None,
               append: bool, done: Callable[[], None] | None = None, target: Callable | None = None) -> None:
        """Queue a window (the caller checked :meth:`full`); starts it when no other runs. ``done`` is
        called once it is written or lost (e.g. ``AttentionProfiler.discard_recording``)."""
        self._queue.append(_Job(step, recording, Path(out), metadata, attention_stats, append, done, target))
        self.poll()

    def poll(self) -> list[str]:
        """Collect a finished worker and start the next; returns the notices of windows written since the last call."""
        said: list[str] = []
        while self._queue:
            job = self._queue[0]
            if job.process is None:
                self._start(job)
                break
            if job.process.is_alive():
                break
            said += self._finish(job)
            self._queue.pop(0)
        return said

    def close(self, say: Callable[[str], None] = notice) -> None:
        """Wait for every queued window, saying each as it is written and each failure with its cause."""
        total = len(self._queue)
        done = 0
        for line in self.poll():
            say(line)
        while self._queue:
            job = self._queue[0]
            if job.process is None:
                self._start(job)
            job.process.join()
            lines = self._finish(job)
            self._queue.pop(0)
            done += 1
            for line in lines:
                say(line)
            if job.step in self.written:
                say(f"window of step {job.step} written ({done} of {total} waiting at close)")
        for step, cause in self.failed:
            say(f"the window of step {step} was not written: {cause}")

    def _start(self, job: _Job) -> None:
        ctx = mp.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        job.conn, job.started = receive, time.perf_counter()
        job.process = ctx.Process(target=_work, args=(job, send), name=f"headcount-window-{job.step}", daemon=True)
        job.process.start()
        send.close()

    def _finish(self, job: _Job) -> list[str]:
        """A worker that ended: its result, or why it has none; the window's files let go."""
        job.process.join()
        try:
            result = job.conn.recv() if job.conn.poll() else None
        except EOFError:  # the worker died before it sent anything
            result = None
        job.conn.close()
        if job.done is not None:
            job.done()
        if result is None:
            self.failed.append((job.step, f"its worker process died (exit code {job.process.exitcode})"))
            return []
        status, value = result
        if status == "failed":
            self.failed.append((job.step, value))
            return []
        self.written.append(job.step)
        return [f"step {job.step}: {line}" for line in value]
