"""Windows of a training run built and written off the training loop (issue 29).

A profiled window's recording (:class:`~headcount.build.in_process.Recording`: the trace
file, the call log, the device) is handed to a worker process that builds its
tables (:func:`~headcount.build.in_process.tables_from_recording`, the path the API takes)
and appends them to the dataset (:func:`~headcount.store.dataset.write_stats`,
the same staged commit: a report is never half-written). The loop goes on as
soon as torch's profiler has stopped.

- Worker processes started with the writer (fresh interpreters that import
  the build and never torch: :func:`main`), kept for the whole run, each fed
  one window at a time, oldest first.
- Where the platform has an idle priority (Linux ``SCHED_IDLE``), windows go
  first to a worker at that priority: it takes only CPU time nothing else
  wants, so it does not compete with a loop that keeps every core busy.
  Where no core is ever idle it gets next to nothing, and windows wait. When
  a window is due and the queue is full, the oldest waiting one goes to a
  second worker, at the lowest ordinary priority (nice 19): it gets a small
  share of a busy core (a few per cent beside a loop thread), so the window
  moves on without the loop paying a whole build for it (a worker at the
  loop's own priority cost it about 0.15 s of CPU a window; figures in
  docs/reading-a-report.md). A full queue whose low-priority worker is busy
  skips the window with a notice. At :meth:`WindowWriter.close` (the loop
  is over) the windows left go to these two while they are free, and to a
  worker at normal priority, started then; a window whose worker gets no CPU
  time (a machine busy with other work) is taken from it and given to that
  one (an unprivileged process cannot raise its priority back).
- The loop never blocks: a window goes to the worker as a file name (the job
  is pickled beside it), and :meth:`WindowWriter.poll` only reads answers that
  are there. At most ``capacity`` windows wait besides those being written;
  :meth:`WindowWriter.full` tells the caller to skip the next one (with a
  notice) rather than wait.
- A window that fails, or whose worker dies, is lost alone:
  :meth:`WindowWriter.close` names it and the cause; a fresh worker takes the
  next window.
- The workers ignore Ctrl-C (the terminal sends it to the whole process
  group): the window in hand is finished, and a worker ends when the
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
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable

import pandas as pd

from headcount.build.in_process import Recording, tables_from_recording
from headcount.common.errors import HeadcountError, notice
from headcount.store.dataset import listed_runs, recover, write_stats

WRITE_WINDOW = "headcount.build.window_writer:write_window"
# what the build imports on first use, imported before the worker says it is ready (not during the training loop)
WARM_UP = ("headcount.parsers.kineto_json", "headcount.parsers.cupti_records", "pyarrow.pandas_compat")
STARVED_CHECK_S = 0.5  # at close(): how often the progress of the workers at lowered priority is checked
STARVED_SHARE = 0.25  # of a core, below which one is deemed starved (its window then goes to one at normal priority)
LOW_NICE = 19  # the low-priority worker's nice value: the lowest share an ordinary process gets
READY_TIMEOUT_S = 300  # its imports take a third of a second on an idle machine; a loaded one may be far slower
ENTRY = "import sys; from headcount.build.window_writer import main; main(sys.argv[1:])"  # not -m: no second copy of this module


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


def idle_priority() -> bool:
    """Put every thread of this process at the kernel's idle priority (Linux ``SCHED_IDLE``; threads made
    later inherit it): it then runs only on CPU time nothing else wants. Irreversible for an unprivileged
    process. Returns whether it could (False where the platform has no such class, e.g. macOS)."""
    if not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"):
        return False
    try:
        for thread in os.listdir("/proc/self/task"):
            os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return False
    return True


def low_priority() -> bool:
    """Put every thread of this process at the lowest ordinary priority (nice 19; threads made later
    inherit it): it gets a small share of a core that other processes keep busy. Irreversible for an
    unprivileged process. Returns whether it could."""
    threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [0]  # Linux: nice is per thread
    try:
        for thread in threads:
            os.setpriority(os.PRIO_PROCESS, int(thread), LOW_NICE)
    except (OSError, AttributeError):
        return False
    return True


LOWER = {"idle": idle_priority, "low": low_priority}  # how a worker of each kind lowers its priority


def serve(inbox: Connection, outbox: Connection, priority: str = "normal") -> None:
    """The worker's loop: warm up (at normal priority: the training process waits for it), move to
    ``priority`` (``idle``, ``low`` or ``normal``: :data:`LOWER`), say it is ready (and whether its
    priority was lowered), then for each job file received, run it and answer; returns when the
    training process closes the pipe."""
    for module in WARM_UP:
        importlib.import_module(module)
    outbox.send(("ready", os.getpid(), priority in LOWER and LOWER[priority]()))
    while True:
        try:
            path = inbox.recv()
        except EOFError:
            return
        began = time.process_time()
        status, value = _run(path)
        outbox.send((status, value, time.process_time() - began))


def main(argv: list[str]) -> None:
    """Entry of the worker process (:data:`ENTRY`): the file descriptors of its two pipes, jobs in, answers
    out, and its priority (``idle``, ``low`` or ``normal``). Ctrl-C is the training process's to handle
    (a terminal sends it to the whole group); SIGTERM and SIGHUP (``kill``, ``timeout``, a scheduler, a closed
    terminal) stop the window in hand with its staging removed (never a half-written report), exit 128 + the signal."""
    from headcount.common import stopping

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stopping.handled():
            serve(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False), priority=argv[2])
    except stopping.Stopped as exc:
        sys.exit(stopping.exit_status(exc))


class _Worker:
    """The worker process and its two pipes, seen from the training process."""

    def __init__(self, priority: str):
        self.lowered = False  # whether it runs at the lower priority it was started for: it says so when ready
        job_read, job_write = os.pipe()
        answer_read, answer_write = os.pipe()
        # the same modules as here (a package found through sys.path edits too), torch never imported
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen([sys.executable, "-c", ENTRY, str(job_read), str(answer_write),
                                             priority],
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
            self.lowered = self.answers.recv()[2]
        except EOFError:
            code = self.process.wait()
            raise HeadcountError(f"the window writer process did not start (exit code {code}); its error is above",
                                 hint=hint) from None

    def answer(self) -> tuple[str, object, float | None] | None:
        """The answer to the job in hand, ``(status, value, CPU seconds)`` (``None``: not yet; never waits);
        ``("died", exit code, None)`` when the process ended without one."""
        if not self.answers.poll():
            return None
        try:
            return self.answers.recv()
        except (EOFError, OSError):
            return "died", self.process.wait(), None

    def kill(self) -> None:
        """End it now, its job in hand unfinished (its staging is left to :func:`~headcount.store.dataset.recover`)."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """Close the pipes: the worker ends once its job in hand is done."""
        self.jobs.close()
        self.answers.close()
        self.process.wait()


@dataclass
class _Queued:
    job: _Job
    kind: str | None = None  # the worker writing it ("idle", "low", "normal"); None while it waits


@dataclass
class WindowWriter:
    """Writes windows in worker processes, never blocking the caller (see the module docstring).

    Where the platform has an idle priority (Linux): a worker at idle priority writes the windows; one
    at low priority (nice 19) takes the oldest waiting window when a new one is due and the queue is
    full; they start with the writer (about a third of a second of imports each, at once, before the
    training loop). :meth:`close` adds a worker at normal priority where they cannot write what is left.
    Elsewhere, or with ``idle=False``, one worker at normal priority, started with the writer.

    Attributes:
        capacity: windows that may wait besides those being written.
        idle: write windows at idle priority first (see above); ``False``: one worker, at the loop's priority.
        target: the function a worker runs for a window, ``module:name``, called as :func:`write_window`
            (tests stand in one that fails; the worker imports it, from the same ``sys.path`` as here).
        written_by: the kind of worker (``idle``, ``low``, ``normal``) that wrote each window, by step, in the order
            written (:attr:`written`: the steps); failed: ``(step, cause)`` of those that were not.
        cpu_seconds: CPU time a worker spent on each window it answered for, by step.

    Raises:
        HeadcountError: a worker process did not start.
    """

    capacity: int = 2
    idle: bool = True
    target: str = WRITE_WINDOW
    failed: list[tuple[int, str]] = field(default_factory=list)
    cpu_seconds: dict[int, float] = field(default_factory=dict)
    written_by: dict[int, str] = field(default_factory=dict)
    _queue: list[_Queued] = field(default_factory=list)
    _workers: dict[str, _Worker | None] = field(default_factory=dict)  # by kind; None: to be started when needed
    _jobs_dir: str | None = None
    _failures_said: int = 0  # close() says each failure once

    def __post_init__(self):
        remove_stale_jobs()
        lowered = self.idle and hasattr(os, "SCHED_IDLE")
        self._workers = self._start(("idle", "low") if lowered else ("normal",))
        if lowered and not all(worker.lowered for worker in self._workers.values()):
            for worker in self._workers.values():  # refused here (a restricted container): one at normal priority
                worker.stop()
            self._workers = self._start(("normal",))

    @staticmethod
    def _start(kinds: tuple[str, ...]) -> dict[str, "_Worker"]:
        starting = {kind: _Worker(kind) for kind in kinds}  # they import at once
        try:
            for worker in starting.values():
                worker.ready()
        except HeadcountError:
            for worker in starting.values():
                worker.kill()
                worker.stop()
            raise
        return starting

    @property
    def written(self) -> list[int]:
        """Steps whose windows were written, in the order they were."""
        return list(self.written_by)

    @property
    def pending(self) -> int:
        """Windows submitted and not yet answered for (being written or waiting)."""
        return len(self._queue)

    @property
    def processes(self) -> dict[str, subprocess.Popen]:
        """The worker processes running, by kind (``idle``, ``low``, ``normal``)."""
        return {kind: worker.process for kind, worker in self._workers.items() if worker is not None}

    @property
    def in_hand(self) -> dict[str, int]:
        """The step of the window each worker is writing, by its kind."""
        return {queued.kind: queued.job.step for queued in self._queue if queued.kind is not None}

    @property
    def waiting(self) -> int:
        """Windows submitted and not yet handed to a worker."""
        return sum(queued.kind is None for queued in self._queue)

    def full(self) -> bool:
        """Whether a new window would exceed :attr:`capacity` (then skip it: :meth:`submit` never waits).
        When it would, the oldest waiting window first goes to the worker at low priority, if it is free."""
        if self.waiting >= self.capacity and "low" in self._workers and self._holding("low") is None:
            self._hand(self._waiting_first(), "low")
        return self.waiting >= self.capacity

    def submit(self, step: int, recording: Recording, out: Path, metadata: dict, attention_stats: pd.DataFrame | None,
               append: bool) -> None:
        """Queue a window (the caller checked :meth:`full`); :meth:`poll` hands it to a worker when one is free.
        The recording's file is the writer's from now on (moved into its folder: the recorder may clean
        up its own, at the program's exit too, before the window is written); removed once written or lost.
        A file that cannot be moved loses its window (in :attr:`failed`, said at :meth:`close`): a training
        run never stops for its profile.
        """
        if self._jobs_dir is None:  # private (0700): recordings and call logs; the owner's pid names it (remove_stale_jobs)
            self._jobs_dir = tempfile.mkdtemp(prefix=f"{JOBS_PREFIX}{os.getpid()}-")
        taken = Path(self._jobs_dir) / f"step{step}-{Path(recording.path).name}"
        try:
            shutil.move(recording.path, taken)
        except OSError as exc:
            self.failed.append((step, f"{recording.path}: cannot hand the recording to the window writer "
                                      f"({exc.strerror or exc}); check free space in the temporary directory (TMPDIR)"))
            return
        job = _Job(step, dataclasses.replace(recording, path=taken), Path(out), metadata, attention_stats, append, self.target)
        self._queue.append(_Queued(job))  # handed to a worker by the next poll()

    def poll(self) -> list[str]:
        """Collect the answers that are there and hand the first worker that is free the oldest waiting
        window; returns the notices of windows written since the last call. Never waits."""
        said = self._collect(timeout=0)
        first = "idle" if "idle" in self._workers else "normal"
        if self._holding(first) is None and self.waiting:
            self._hand(self._waiting_first(), first)
        return said

    def close(self, say: Callable[[str], None] = notice) -> None:
        """Wait for every queued window, saying each as it is written and each failure with its cause;
        then end the workers. The loop is over: waiting windows go to the workers at lowered priority
        while they are free, the rest to one at normal priority (started now); a worker at lowered
        priority finishes the window it holds where it gets CPU time, else (a machine busy with other
        work) that window is taken from it (:meth:`_take_back`) and written at normal priority."""
        for line in self.poll():
            say(line)
        total, said_done = len(self._queue), 0
        while self._queue:
            # the lowered ones first (on a machine left idle they run as fast, with no start), while they live:
            # one taken back is not restarted; a worker at normal priority for the rest
            for kind in (*LOWER, "normal"):
                if self.waiting and self._holding(kind) is None and (kind == "normal" or self._workers.get(kind) is not None):
                    self._hand(self._waiting_first(), kind)
            lowered = {kind: self._workers[kind] for kind in LOWER if self._holding(kind) is not None}
            began = time.monotonic()
            before = {kind: _cpu_seconds(worker.process.pid) for kind, worker in lowered.items()}
            done = len(self.written)
            for line in self._collect(timeout=STARVED_CHECK_S if lowered else None):
                say(line)
            for step in self.written[done:]:
                said_done += 1
                say(f"window of step {step} written ({said_done} of {total} waiting at close)")
            elapsed = time.monotonic() - began
            for kind, worker in lowered.items():
                if self._holding(kind) is None or elapsed < STARVED_CHECK_S:
                    continue
                after = _cpu_seconds(worker.process.pid)
                if before[kind] is None or after is None or after - before[kind] < STARVED_SHARE * elapsed:
                    for line in self._take_back(kind):
                        say(line)
        for kind, worker in self._workers.items():
            if worker is not None and worker.lowered:
                worker.kill()  # it holds nothing; at lowered priority, on a busy machine, even its exit would take long
            if worker is not None:
                worker.stop()
            self._workers[kind] = None
        for step, cause in self.failed[self._failures_said:]:
            say(f"the window of step {step} was not written: {cause}")
        self._failures_said = len(self.failed)
        if self._jobs_dir is not None:
            shutil.rmtree(self._jobs_dir, ignore_errors=True)
            self._jobs_dir = None

    def _holding(self, kind: str) -> _Queued | None:
        return next((queued for queued in self._queue if queued.kind == kind), None)

    def _waiting_first(self) -> _Queued:
        return next(queued for queued in self._queue if queued.kind is None)

    def _hand(self, queued: _Queued, kind: str) -> None:
        """Give a window to the worker of that kind (a fresh one where the last died). Where no worker
        starts, the window is lost with the cause (the training loop goes on)."""
        path = Path(self._jobs_dir) / f"step{queued.job.step}.pickle"
        with open(path, "wb") as file:
            pickle.dump(queued.job, file, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            if self._workers.get(kind) is None:  # the last one died on its window, or close() ended it
                self._workers[kind] = self._started(kind)
            try:
                self._workers[kind].jobs.send(str(path))  # a file name: the pipe never fills, the loop never waits on it
            except OSError:  # it died between windows (e.g. the kernel's OOM killer): a fresh one takes this window
                self._workers[kind].process.wait()
                self._workers[kind] = self._started(kind)
                self._workers[kind].jobs.send(str(path))
        except HeadcountError as exc:
            self._workers[kind] = None
            self._queue.remove(queued)
            self._let_go(queued)
            self.failed.append((queued.job.step, exc.one_line()))
            return
        queued.kind = kind

    def _started(self, kind: str) -> _Worker:
        worker = _Worker(kind)
        worker.ready()
        return worker

    def _collect(self, timeout: float | None) -> list[str]:
        """Finish the windows whose workers answered, waiting up to ``timeout`` seconds for one (``None``:
        until one answers); returns their notices."""
        holding = {kind: queued for kind in self._workers if (queued := self._holding(kind)) is not None}
        if not holding:
            return []
        if timeout != 0:
            wait([self._workers[kind].answers for kind in holding], timeout)
        said: list[str] = []
        for kind, queued in holding.items():
            answer = self._workers[kind].answer()
            if answer is not None:
                said += self._finish(queued, answer)
        return said

    def _take_back(self, kind: str) -> list[str]:
        """Take its window from a worker at lowered priority (``kind``) that gets no CPU time: end it, and
        put the window back first in line, unless it was written (its answer came in the meantime, or its
        commit went through: completed by :func:`~headcount.store.dataset.recover` where the kill
        interrupted it)."""
        queued, worker = self._holding(kind), self._workers[kind]
        worker.kill()
        self._workers[kind] = None
        answer = worker.answer()  # sent just before the kill, or ("died", …)
        worker.stop()
        if answer[0] != "died":
            return self._finish(queued, answer)
        recover(queued.job.out)
        if queued.job.recording.run_id in listed_runs(queued.job.out):
            return self._finish(queued, ("ok", [], None))
        self._queue.remove(queued)
        queued.kind = None
        self._queue.insert(0, queued)
        return []

    def _let_go(self, queued: _Queued) -> None:
        """Remove a window's files (its job and its recording)."""
        for path in (Path(self._jobs_dir, f"step{queued.job.step}.pickle"), queued.job.recording.path):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _finish(self, queued: _Queued, answer: tuple[str, object, float | None]) -> list[str]:
        """A window a worker answered for (or died on): its result, or why it has none; its files let go."""
        self._queue.remove(queued)
        self._let_go(queued)
        step = queued.job.step
        status, value, seconds = answer
        if seconds is not None:
            self.cpu_seconds[step] = seconds
        if status == "died":
            self._workers[queued.kind] = None
            self.failed.append((step, f"its worker process died (exit code {value})"))
            return []
        if status == "failed":
            self.failed.append((step, value))
            return []
        self.written_by[step] = queued.kind
        return [f"step {step}: {line}" for line in value]


JOBS_PREFIX = "headcount-windows-"  # then the training process's pid: what each writer's jobs folder is named


def remove_stale_jobs(say: Callable[[str], None] = notice) -> list[Path]:
    """Remove the jobs folders (windows not yet written: their recordings and call logs) that a training process
    stopped before its writer's close (SIGTERM, SIGKILL, a closed terminal: no ``finally`` runs) left in the
    temporary directory: those whose process is gone. Said in one line each; returns what was removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{JOBS_PREFIX}*-*"):
        pid = folder.name[len(JOBS_PREFIX):].split("-")[0]
        if not pid.isdigit() or _alive(int(pid)) or not folder.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
            say(f"removed {folder}: the windows a stopped training process (PID {pid}) had not written yet")
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive, and not ours to remove
        return True
    return True


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has had, in seconds, from ``/proc`` (``None``: gone or unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
