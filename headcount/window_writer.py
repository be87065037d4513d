"""Windows of a training run built and written off the training loop (issue 29).

A profiled window's recording (:class:`~headcount.build.Recording`: the trace
file, the call log, the device) is handed to a worker process that builds its
tables (:func:`~headcount.build.tables_from_recording`, the path the API takes)
and appends them to the dataset (:func:`~headcount.reports.dataset.write_stats`,
the same staged commit: a report is never half-written). The loop goes on as
soon as torch's profiler has stopped.

- One worker process, started with the writer (a fresh interpreter that
  imports the build and never torch: :func:`main`), kept for the whole run,
  fed one window at a time, in order.
  Not forked from the training process: after a fork every page the loop
  writes is copied while the child lives (measured: the next step of a CPU
  model 3–6× slower), and a forked CUDA process is no place to work in.
- The loop never blocks: a window goes to the worker as a file name (the job
  is pickled beside it), and :meth:`WindowWriter.poll` only reads answers that
  are there. At most ``capacity`` windows wait or run; :meth:`WindowWriter.full`
  tells the caller to skip the next one (with a notice) rather than wait.
- A window that fails, or whose worker dies, is lost alone:
  :meth:`WindowWriter.close` names it and the cause; a fresh worker takes the
  next window.
- The worker ignores Ctrl-C (the terminal sends it to the whole process
  group): the window in hand is finished, and the worker ends when the
  training process closes its pipe or exits.
- :meth:`WindowWriter.close` waits, saying each window as it is written.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

import pandas as pd

from headcount.build import Recording, tables_from_recording
from headcount.errors import HeadcountError, notice
from headcount.reports.dataset import write_stats

WRITE_WINDOW = "headcount.window_writer:write_window"
# what the build imports on first use, imported before the worker says it is ready (not during the training loop)
WARM_UP = ("headcount.parsers.kineto", "headcount.parsers.cupti_records", "pyarrow.pandas_compat")
READY_TIMEOUT_S = 300  # its imports take a third of a second on an idle machine; a loaded one may be far slower
ENTRY = "import sys; from headcount.window_writer import main; main(sys.argv[1:])"  # not -m: no second copy of this module


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


@dataclass
class _Job:
    """One window for the worker (what is pickled: ``target`` names the function, ``module:name``)."""

    step: int
    recording: Recording
    out: Path
    metadata: dict
    attention_stats: pd.DataFrame | None
    append: bool
    target: str = WRITE_WINDOW


def _run(path: str) -> tuple[str, object]:
    """Run the job pickled at ``path``; ``("ok", notices)`` or ``("failed", one line)``."""
    try:
        with open(path, "rb") as file:
            job = pickle.load(file)
        module, name = job.target.split(":")
        target = getattr(importlib.import_module(module), name)
        return "ok", target(job.recording, job.out, job.metadata, job.attention_stats, job.append)
    except HeadcountError as exc:
        return "failed", exc.one_line()
    except Exception as exc:  # noqa: BLE001 - anything: the training process says it and goes on
        return "failed", f"{type(exc).__name__}: {exc}"


def serve(inbox: Connection, outbox: Connection) -> None:
    """The worker's loop: say it is ready, then for each job file received, run it and answer; returns
    when the training process closes the pipe."""
    for module in WARM_UP:
        importlib.import_module(module)
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            path = inbox.recv()
        except EOFError:
            return
        began = time.process_time()
        status, value = _run(path)
        outbox.send((status, value, time.process_time() - began))


def main(argv: list[str]) -> None:
    """Entry of the worker process (:data:`ENTRY`): the file descriptors of its two pipes, jobs in, answers out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))


class _Worker:
    """The worker process and its two pipes, seen from the training process."""

    def __init__(self):
        job_read, job_write = os.pipe()
        answer_read, answer_write = os.pipe()
        # the same modules as here (a package found through sys.path edits too), torch never imported
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen([sys.executable, "-c", ENTRY, str(job_read), str(answer_write)],
                                            pass_fds=(job_read, answer_write), env=env, stdin=subprocess.DEVNULL)
        finally:
            os.close(job_read)
            os.close(answer_write)
        self.jobs = Connection(job_write, readable=False)
        self.answers = Connection(answer_read, writable=False)

    def ready(self) -> None:
        """Wait for the worker to say it is ready.

        Raises:
            HeadcountError: it ended before (its error is on stderr, above), or said nothing for
                :data:`READY_TIMEOUT_S`.
        """
        hint = "or pass background=False to write each window in the training loop"
        if not self.answers.poll(READY_TIMEOUT_S):
            self.process.kill()
            self.process.wait()
            raise HeadcountError(f"the window writer process did not start within {READY_TIMEOUT_S} s", hint=hint)
        try:
            self.answers.recv()
        except EOFError:
            code = self.process.wait()
            raise HeadcountError(f"the window writer process did not start (exit code {code}); its error is above",
                                 hint=hint) from None

    def answer(self, wait: bool) -> tuple[str, object, float | None] | None:
        """The answer to the job in hand, ``(status, value, CPU seconds)`` (``None``: not yet, when not
        waiting); ``("died", exit code, None)`` when the process ended without one."""
        if not wait and not self.answers.poll():
            return None
        try:
            return self.answers.recv()
        except (EOFError, OSError):
            return "died", self.process.wait(), None

    def stop(self) -> None:
        """Close the pipes: the worker ends once its job in hand is done."""
        self.jobs.close()
        self.answers.close()
        self.process.wait()


@dataclass
class _Queued:
    job: _Job
    sent: bool = False


@dataclass
class WindowWriter:
    """Writes windows in a worker process, one at a time, never blocking the caller (see the module docstring).

    The worker starts with the writer (about a third of a second of imports, before the training loop).

    Attributes:
        capacity: windows that may wait or run at once.
        target: the function the worker runs for a window, ``module:name``, called as :func:`write_window`
            (tests stand in one that fails; the worker imports it, from the same ``sys.path`` as here).
        written: steps whose windows were written; failed: ``(step, cause)`` of those that were not.
        cpu_seconds: CPU time the worker spent on each window it answered for, by step (what the
            training loop gives up when the machine has no core to spare).

    Raises:
        HeadcountError: the worker process did not start.
    """

    capacity: int = 2
    target: str = WRITE_WINDOW
    written: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    cpu_seconds: dict[int, float] = field(default_factory=dict)
    _queue: list[_Queued] = field(default_factory=list)
    _worker: _Worker | None = None
    _jobs_dir: str | None = None
    _failures_said: int = 0  # close() says each failure once

    def __post_init__(self):
        self._worker = self._started()

    def full(self) -> bool:
        """Whether a new window would exceed :attr:`capacity` (then skip it: :meth:`submit` never waits)."""
        self.poll()
        return len(self._queue) >= self.capacity

    def submit(self, step: int, recording: Recording, out: Path, metadata: dict, attention_stats: pd.DataFrame | None,
               append: bool) -> None:
        """Queue a window (the caller checked :meth:`full`); it goes to the worker when the worker is free.
        The recording's file is the writer's from now on (moved into its folder: the recorder may clean
        up its own, at the program's exit too, before the window is written); removed once written or lost.
        A file that cannot be moved loses its window (in :attr:`failed`, said at :meth:`close`): a training
        run never stops for its profile.
        """
        if self._jobs_dir is None:
            self._jobs_dir = tempfile.mkdtemp(prefix="headcount-windows-")  # private (0700): recordings and call logs
        taken = Path(self._jobs_dir) / f"step{step}-{Path(recording.path).name}"
        try:
            shutil.move(recording.path, taken)
        except OSError as exc:
            self.failed.append((step, f"{recording.path}: cannot hand the recording to the window writer "
                                      f"({exc.strerror or exc}); check free space in the temporary directory (TMPDIR)"))
            return
        job = _Job(step, dataclasses.replace(recording, path=taken), Path(out), metadata, attention_stats, append, self.target)
        self._queue.append(_Queued(job))
        self.poll()

    def poll(self) -> list[str]:
        """Collect the answer that is there and send the next window; returns the notices of windows written
        since the last call. Never waits."""
        said: list[str] = []
        while self._queue:
            answer = self._answer(self._queue[0], wait=False)
            if answer is None:
                break
            said += self._finish(self._queue.pop(0), answer)
        return said

    def close(self, say: Callable[[str], None] = notice) -> None:
        """Wait for every queued window, saying each as it is written and each failure with its cause;
        then end the worker."""
        for line in self.poll():
            say(line)
        total = len(self._queue)
        for done in range(1, total + 1):
            queued = self._queue[0]
            for line in self._finish(self._queue.pop(0), self._answer(queued, wait=True)):
                say(line)
            if queued.job.step in self.written:
                say(f"window of step {queued.job.step} written ({done} of {total} waiting at close)")
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        for step, cause in self.failed[self._failures_said:]:
            say(f"the window of step {step} was not written: {cause}")
        self._failures_said = len(self.failed)
        if self._jobs_dir is not None:
            shutil.rmtree(self._jobs_dir, ignore_errors=True)
            self._jobs_dir = None

    def _started(self) -> _Worker:
        worker = _Worker()
        worker.ready()
        return worker

    def _answer(self, queued: _Queued, wait: bool) -> tuple[str, object, float | None] | None:
        """The answer for the window first in line, sending it first when it was not (``None``: not yet)."""
        if not queued.sent:
            refused = self._send(queued)
            if refused is not None:
                return refused
        return self._worker.answer(wait)

    def _send(self, queued: _Queued) -> tuple[str, str, None] | None:
        """Hand the window to the worker (a fresh one where the last died); ``("failed", why, None)`` when
        no worker starts (the window is lost, the training loop goes on)."""
        path = Path(self._jobs_dir) / f"step{queued.job.step}.pickle"
        with open(path, "wb") as file:
            pickle.dump(queued.job, file, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            if self._worker is None:  # the last one died on its window
                self._worker = self._started()
            try:
                self._worker.jobs.send(str(path))  # a file name: the pipe never fills, the loop never waits on it
            except OSError:  # it died between windows (e.g. the kernel's OOM killer): a fresh one takes this window
                self._worker.process.wait()
                self._worker = self._started()
                self._worker.jobs.send(str(path))
        except HeadcountError as exc:
            self._worker = None
            return "failed", exc.one_line(), None
        queued.sent = True
        return None

    def _finish(self, queued: _Queued, answer: tuple[str, object, float | None]) -> list[str]:
        """A window the worker answered for (or died on): its result, or why it has none; its files let go."""
        step = queued.job.step
        for path in (Path(self._jobs_dir, f"step{step}.pickle"), queued.job.recording.path):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        status, value, seconds = answer
        if seconds is not None:
            self.cpu_seconds[step] = seconds
        if status == "died":
            self._worker = None
            self.failed.append((step, f"its worker process died (exit code {value})"))
            return []
        if status == "failed":
            self.failed.append((step, value))
            return []
        self.written.append(step)
        return [f"step {step}: {line}" for line in value]


