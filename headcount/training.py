"""Profiling during training: every N steps, appended to one dataset, with
per-head attention statistics tracked for drift.

- :class:`StepProfiler` for a plain training loop::

      sp = StepProfiler(model, "out/", every=100)
      for step, batch in enumerate(loader):
          with sp.step(step):
              model(**batch).loss.backward()
          optimizer.step()
      sp.close()  # waits for the windows still being written (at exit, if not called)

- :class:`HeadcountCallback` for ``transformers.Trainer`` (the same, driven
  by the trainer's step events)::

      Trainer(..., callbacks=[HeadcountCallback("out/", every=100)])

Each profiled step is its own run (``<id>-step<N>``) in the dataset; its
``attention_stats`` rows carry the global step, and the ``drift`` table
compares each head's normalized entropy with the first profiled step. A
head whose normalized entropy moved more than ``drift_threshold`` (heads
turning uniform, or collapsing onto one token) is warned about once.

The loop does not wait for a window's tables: once torch's profiler has
stopped, the recording goes to a worker process that builds and appends it
(:mod:`headcount.build.window_writer`, started with the profiler, before the
loop): on Linux at idle priority, so that it takes only CPU time the loop
leaves, and by a second worker at low priority (nice 19: a small share of
a busy core) when ``queue`` windows wait and another is due; a window due
while both are busy and the queue is full is skipped with a notice.
``close()`` (``on_train_end``; at exit when neither ran) waits for them,
with a worker at normal priority for what they cannot finish. Drift warnings
need only the attention statistics, gathered in the loop: they come at once.
"""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from pathlib import Path

import pandas as pd

from headcount.api import AttentionProfiler, resolve_backend
from headcount.build.window_writer import WindowWriter
from headcount.common.errors import notice
from headcount.store.metadata import new_run_id

DRIFT_COLUMNS = ["step", "baseline_step", "layer_name", "layer", "head", "baseline_normalized_entropy",
                 "normalized_entropy", "change", "alert"]


class HeadDriftWarning(UserWarning):
    """A head's attention statistics moved past the threshold."""


def drift_table(history: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Each head's normalized entropy at the latest step against the first.

    Args:
        history: ``attention_stats`` rows of several steps (``step``, ``layer_name``, ``head``, ``normalized_entropy``).
        threshold: absolute change that raises an alert.
    """
    if not len(history):
        return pd.DataFrame(columns=DRIFT_COLUMNS)
    first, last = history["step"].min(), history["step"].max()
    keys = ["layer_name", "layer", "head"]
    base = history[history["step"] == first][[*keys, "normalized_entropy"]].rename(columns={"normalized_entropy": "baseline_normalized_entropy"})
    now = history[history["step"] == last][[*keys, "normalized_entropy"]]
    table = now.merge(base, on=keys, how="left")
    table["change"] = table["normalized_entropy"] - table["baseline_normalized_entropy"]
    table["alert"] = table["change"].abs() > threshold
    table["step"], table["baseline_step"] = last, first
    return table[DRIFT_COLUMNS]


class StepProfiler:
    """Profile every ``every``-th step of a training loop into ``out``.

    Args:
        model: the model.
        out: report directory (created, or appended to).
        every: profile steps 0, every, 2·every, … (without ``schedule``)
        schedule: instead of ``every``, which steps to profile, as
            torch.profiler takes it: ``torch.profiler.schedule(wait=…,
            warmup=…, active=…, repeat=…, skip_first=…)`` (or any function of
            the step number returning a ``ProfilerAction``): the ``active``
            steps are profiled, each as a run of its own; wait and warm-up
            steps run untouched.
        mode, backend: as :class:`~headcount.AttentionProfiler`.
        attention_stats: also track per-head attention statistics (cheap: 32 sampled rows a call).
        drift_threshold: change of normalized entropy that raises a :class:`HeadDriftWarning`.
        background: build and write each window in a worker process (the loop does not wait);
            ``False``: in the loop, as :meth:`AttentionProfiler.save` does.
        queue: windows that may wait in the background besides those being written (a window due
            while that many wait is skipped, with a notice).
        writer_priority: ``"idle"`` (Linux; elsewhere ``"normal"``): windows are written by a worker at
            idle priority, on CPU time the loop leaves idle, and by a second worker at low priority (nice 19)
            only when the queue is full (see :class:`~headcount.build.window_writer.WindowWriter`); ``"normal"``: by
            one worker that shares the CPU with the loop as an equal (every window written as it comes).

    Raises:
        ValueError: ``every`` below 1, a ``schedule`` that is not callable, an unknown ``writer_priority``.
        HeadcountError: an unknown backend; the background writer's process did not start.
    """

    def __init__(self, model, out: str | Path, every: int = 100, mode: str = "layer", backend: str = "auto",
                 attention_stats: bool | dict = True, drift_threshold: float = 0.15, schedule=None, background: bool = True,
                 queue: int = 2, writer_priority: str = "idle"):
        if every < 1:
            raise ValueError("every must be at least 1")
        if writer_priority not in ("idle", "normal"):
            raise ValueError(f"writer_priority={writer_priority!r}: pass 'idle' (the default) or 'normal'")
        if schedule is not None and not callable(schedule):
            raise ValueError(f"schedule={schedule!r} is not callable: pass torch.profiler.schedule(wait=…, warmup=…, active=…)")
        self.schedule = schedule
        self.model = model
        self.out = Path(out)
        self.every = every
        self.mode = mode
        self.backend, why = resolve_backend(backend)  # once, before the loop (probing for a GPU takes a while)
        if why:
            notice(why)
        self.attention_stats = {"rows": 32} if attention_stats is True else attention_stats
        self.drift_threshold = drift_threshold
        self.base_id = new_run_id()
        self.history = pd.DataFrame()
        self.alerted: set[tuple] = set()
        self._baseline: tuple[int, dict] | None = None  # (first profiled step, normalized entropy by head)
        self.profiled: list[int] = []  # steps recorded (and, in the background, handed to the writer)
        # per profiled step, the loop's wall time (ms) spent starting the window, stopping it (the collector's parts
        # in "collector") and handing it over: what a window costs the loop beyond the profiled step itself
        self.window_ms: dict[int, dict] = {}
        self.skipped: list[int] = []  # steps due while the writer was full
        self.writer = WindowWriter(capacity=queue, idle=writer_priority == "idle") if background else None
        # windows queued when the program ends without close() are written all the same
        self._at_exit = weakref.finalize(self, self.writer.close) if self.writer is not None else None
        self._prof: AttentionProfiler | None = None
        self._step = None

    def due(self, step: int) -> bool:
        """Whether ``step`` is profiled (the schedule's active steps, else every ``every``-th)."""
        if self.schedule is not None:
            action = self.schedule(step)
            return getattr(action, "name", str(action)) in ("RECORD", "RECORD_AND_SAVE")
        return step % self.every == 0

    def start(self, step: int) -> None:
        """Begin profiling ``step`` (when it is due); hand the writer its next window when it is free."""
        if self.writer is not None and self.writer.pending:
            for line in self.writer.poll():  # every step: an idle-priority worker may finish a window at any time
                notice(line)
        if self._prof is not None or not self.due(step):
            return
        if self.writer is not None and self.writer.full():
            self.skipped.append(step)
            lowered = any(kind != "normal" for kind in self.writer.processes)
            notice(f"step {step} not profiled: {self.writer.capacity} earlier windows are waiting to be written "
                   f"(the loop does not wait for them; queue= gives more room"
                   + (", writer_priority='normal' writes every window at the loop's expense" if lowered else "") + ")")
            return
        self._step = step
        began = time.perf_counter()
        self._prof = AttentionProfiler(self.model, mode=self.mode, backend=self.backend, run_id=f"{self.base_id}-step{step:07d}",
                                       attention_stats=self.attention_stats, metadata={"global_step": step})
        self._prof.__enter__()
        self.window_ms[step] = {"start": round((time.perf_counter() - began) * 1e3, 3)}

    def stop(self) -> None:
        """End the profiled step: write its run, update the drift."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        began = time.perf_counter()
        prof.__exit__(None, None, None)
        spent = self.window_ms.setdefault(self._step, {})
        spent["stop"] = round((time.perf_counter() - began) * 1e3, 3)
        spent["collector"] = dict((prof.collector_stats or {}).get("timings_ms") or {})
        if prof.failure is not None:
            return
        began = time.perf_counter()
        statistics = prof.attention_statistics()
        if statistics is not None:
            statistics["step"] = self._step
            self.history = pd.concat([self.history, statistics], ignore_index=True)
        if self.writer is not None:
            # append: two workers may write windows out of order (an existing report is appended to in any case)
            self.writer.submit(self._step, prof.recording(), self.out, prof.run_metadata(), statistics, True)
            prof.discard_recording()  # the rest of the recorder's folder: the writer has the recording
            for line in self.writer.poll():
                notice(line)
        else:
            prof.save(self.out, append=bool(self.profiled) or (self.out / "headcount.json").exists())
        spent["handed_over"] = round((time.perf_counter() - began) * 1e3, 3)  # statistics, and the writer given the window
        self.profiled.append(self._step)
        self._warn(statistics)

    def _warn(self, statistics: pd.DataFrame | None) -> None:
        """Warn once per head whose normalized entropy moved past the threshold since the first profiled
        step: :func:`drift_table`'s arithmetic on this window's rows, without building the table in the loop."""
        if statistics is None or not len(statistics):
            return
        keys = zip(statistics["layer_name"].tolist(), statistics["layer"].tolist(), statistics["head"].tolist())
        now = dict(zip(keys, statistics["normalized_entropy"].tolist()))
        if self._baseline is None:
            self._baseline = (self._step, now)
            return
        first, baseline = self._baseline
        for (layer_name, layer, head), value in now.items():
            base = baseline.get((layer_name, layer, head))
            if base is None or (layer_name, head) in self.alerted or not abs(value - base) > self.drift_threshold:
                continue
            self.alerted.add((layer_name, head))
            warnings.warn(f"headcount: {layer_name} head {head}: normalized attention entropy {base:.3f} at step {first} "
                          f"→ {value:.3f} at step {self._step} (threshold {self.drift_threshold})", HeadDriftWarning, stacklevel=3)

    def drift(self) -> pd.DataFrame:
        """The drift table so far (see :func:`drift_table`)."""
        return drift_table(self.history, self.drift_threshold)

    @contextlib.contextmanager
    def step(self, step: int):
        """Profile the block when ``step`` is due."""
        self.start(step)
        try:
            yield
        finally:
            self.stop()

    def close(self) -> None:
        """Wait for the windows still being written (saying each, and each failure with its cause), then
        write the final drift table beside the dataset (``drift.parquet``)."""
        self.stop()
        if self._at_exit is not None:
            self._at_exit()  # the writer's close(), once
            self._at_exit = weakref.finalize(self, self.writer.close)  # for windows of steps profiled after this
        if len(self.history):  # even when no window could be written: the statistics were gathered in the loop
            self.out.mkdir(parents=True, exist_ok=True)
            self.drift().to_parquet(self.out / "drift.parquet", index=False)


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class HeadcountCallback(_callback_base()):
    """``transformers.Trainer`` callback: a :class:`StepProfiler` driven by
    the trainer (profiles from ``on_step_begin`` to ``on_step_end``: the
    forward, backward and optimizer step of one global step)."""

    def __init__(self, out: str | Path, every: int = 100, **options):
        self.out = out
        self.every = every
        self.options = options
        self.profiler: StepProfiler | None = None

    def _profiler(self, model) -> StepProfiler:
        if self.profiler is None:
            self.profiler = StepProfiler(model, self.out, self.every, **self.options)
        return self.profiler

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._profiler(model)  # before the first step: the writer's worker starts here, not in the loop

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self._profiler(model).start(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.stop()

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.close()
