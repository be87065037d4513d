"""``AttentionProfiler``: the facade users hold.

It wires the stages together and holds no logic of its own: tag
(:mod:`headcount.tagging.tagger`), record (a source from
:mod:`headcount.collector`), parse, attribute and derive
(:mod:`headcount.build`), report (:mod:`headcount.reports`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headcount.build.in_process import Recording, tables_from_recording
from headcount.build.shared import NO_ATTENTION, implementation_of
from headcount.build.sources import RECORDERS
from headcount.collector import Recorder, cupti_load, cupti_source, pm_sampler
from headcount.collector.compile_watch import CompileWatch
from headcount.collector.torch_source import TorchRecorder
from headcount.common import env
from headcount.common.device import Device
from headcount.common.errors import HeadcountError, notice
from headcount.common.naming import STEP_DOMAIN
from headcount.store import dataset
from headcount.store.metadata import device_info, new_run_id, run_metadata, runs_row
from headcount.tagging.ranges import CorrelatedEmitter, RangeEmitter
from headcount.tagging.tagger import MODES, AttentionTagger

BACKENDS = ("auto", *RECORDERS)


def resolve_backend(backend: str) -> tuple[str, str | None]:
    """The source a backend name means here, and why ``auto`` chose it.

    ``auto`` is ``cupti`` where a GPU, its driver and cupti-python are usable,
    ``torch`` otherwise.

    Raises:
        HeadcountError: unknown backend.
    """
    if backend not in BACKENDS:
        raise HeadcountError(f"unknown or unavailable backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend, None
    usable, why = cupti_load.probe()
    if usable:
        return "cupti", f"backend auto: cupti ({why})"
    return "torch", f"backend auto: torch (cupti unavailable: {why})"


def require_backend(backend: str) -> None:
    """Check that ``backend`` can record here before any model is loaded (``cupti``:
    a driver and cupti-python; the others need nothing).

    Raises:
        HeadcountError: it cannot (exit code 3: the environment).
    """
    if backend == "cupti":
        cupti_load.require()


def prepare_process(backend: str) -> str | None:
    """What a backend needs done before the process's first NVTX call (``cupti``:
    NVTX ranges also become CUPTI marker records); returns what was injected, or ``None``."""
    return cupti_load.enable_nvtx_injection() if backend == "cupti" else None


class AttentionProfiler:
    """Profile the attention of a model, per layer and (in head mode) per head.

    Example::

        prof = AttentionProfiler(model, mode="layer")
        with prof:
            out = model(**inputs, labels=labels)
            out.loss.backward()
        prof.get_stats()["attention_breakdown"]
        prof.save("out/")

    With no model, every transformers model that runs inside the ``with``
    block is tagged.

    Args:
        model: the model to tag (``None``: any transformers model that runs).
        mode: ``layer`` (the model runs as in production; per-head figures are
            apportioned) or ``head`` (attention computed head by head, each
            head measured on its own).
        backend: ``cupti`` (in-process CUPTI: kernels, launch latency,
            occupancy, PM-sampled DRAM traffic; needs an NVIDIA GPU, a CUDA
            13.0+ driver and cupti-python), ``torch`` (torch.profiler; any
            machine) or ``auto`` (cupti where usable, else torch; the choice
            is printed on stderr and kept in :attr:`backend`).
        run_id: identifier of this run in the report (generated when omitted).
        trace_dir: keep the raw recording there (torch: ``trace.json``, cupti:
            ``cupti-records.jsonl.gz``; a temporary directory by default).
        metadata: extra run metadata (model config, batch, …) for the report.
        strict: a source that cannot start raises (instead of a one-line
            notice, with the block then running unprofiled and
            :meth:`get_stats` saying why nothing was recorded).
        pm_sampling: on a GPU, also sample DRAM traffic and warps active device-wide: cupti (cupti-python
            ≥ 13.3), or torch where its torch.profiler has a PM-sampling route (``headcount doctor``); a
            notice where unavailable.
        pm_interval_ns: PM sampling interval, GPU nanoseconds; 0 (the default): cupti, the finest CUPTI
            accepts of 5, 10, 20, 50 µs (docs/cupti.md); torch, 20 µs.
        recorder: a ready recorder to use instead of building one (tests
            stand a replay of recorded CUPTI records in for the GPU this way).
        attention_stats: also compute per-head attention statistics
            (entropy, max attention, top-k mass, effective tokens; see
            :mod:`headcount.tagging.attention_stats`) into
            ``get_stats()["attention_stats"]``; ``True`` or the collector's
            options (``{"rows": 64, "top_k": 5, "every": 1}``). Off by default:
            it launches work of its own.
        schedule: which steps to record, as torch.profiler takes it: a
            callable from step number to ``torch.profiler.ProfilerAction``,
            e.g. ``torch.profiler.schedule(wait=1, warmup=1, active=2,
            repeat=1)``. Steps are counted by :meth:`step` calls. Only the
            ``RECORD``/``RECORD_AND_SAVE`` steps are recorded (and tagged);
            a warm-up step runs as a ``wait`` step does, untouched (the
            recorder starts with the first active step). ``None``: every
            step from :meth:`start` to :meth:`stop` is recorded.
        on_ready: called with the profiler when an active window ends (its
            last active step done, or :meth:`stop` inside the window), as
            torch.profiler's ``on_trace_ready``: ``get_stats()`` and
            ``save()`` then give that window's tables. Each window is a run
            of its own (``run_id``: ``<run_id>.<window>`` from the second
            window on).

    Raises:
        HeadcountError: unknown mode or backend; a ``schedule`` that is not callable.
    """

    def __init__(self, model=None, mode: str = "layer", backend: str = "auto", run_id: str | None = None,
                 trace_dir: str | Path | None = None, metadata: dict | None = None, strict: bool = False,
                 pm_sampling: bool = True, pm_interval_ns: int = pm_sampler.DEFAULT_PM_INTERVAL_NS, recorder=None,
                 attention_stats: bool | dict = False, schedule=None, on_ready=None):
        if mode not in MODES:
            raise HeadcountError(f"unknown mode {mode!r}", hint="use mode='layer' or mode='head'")
        if recorder is not None:
            self.backend, why = recorder.name, None
        else:
            self.backend, why = resolve_backend(backend)
        if why:
            notice(why)
        if schedule is not None and not callable(schedule):
            raise HeadcountError(f"schedule={schedule!r} is not callable",
                                 hint="pass torch.profiler.schedule(wait=…, warmup=…, active=…), or a function of the step number")
        self.strict = strict
        self.attention_stats = attention_stats
        self.pm_sampling = pm_sampling
        self.pm_interval_ns = pm_interval_ns
        self._given_recorder = recorder
        self.model = model
        self.mode = mode
        self.metadata = dict(metadata or {})
        self._trace_dir = trace_dir
        self.schedule = schedule
        self.on_ready = on_ready
        self.step_num = 0
        self._started = False
        self._recording = False
        self._open_step = None  # (name, token, start_ns) of the step range now open
        self._windows = 0
        self._base_run_id = run_id or new_run_id()
        self._window = _Window(self._base_run_id, 0)

    # ------------------------------------------------------------------ the current window, as users and tests read it
    @property
    def run_id(self) -> str:
        """This window's run id (``<run_id>.<window>`` from the second window on)."""
        return self._window.run_id

    @property
    def trace_path(self) -> Path | None:
        """The recording of this window (``None`` until it ends)."""
        return self._window.trace_path

    @property
    def failure(self) -> HeadcountError | None:
        """Why this window recorded nothing (its source did not start), else ``None``."""
        return self._window.failure

    @property
    def collector_info(self) -> dict | None:
        """The cupti collector's facts of this window (after :meth:`get_stats`)."""
        return self._window.collector_info

    @property
    def collector_stats(self) -> dict | None:
        """The cupti recorder's own counts and timings of this window, as it keeps them while recording (records by
        kind, call ids chosen, correlation ids pushed, ``timings_ms`` of its start and stop parts); ``None`` for
        other sources."""
        return getattr(self._window.recorder, "stats", None)

    @property
    def compiled_steps(self) -> list[int]:
        """Steps left out of the figures because torch.compile compiled during them."""
        return self._window.compiled_steps

    @property
    def _tagger(self) -> AttentionTagger | None:
        return self._window.tagger

    @property
    def _recorder(self) -> Recorder | None:
        return self._window.recorder

    # ------------------------------------------------------------------ recording
    def _new_recorder(self) -> Recorder:
        if self._given_recorder is not None:
            return self._given_recorder
        if self.backend == "cupti":
            return cupti_source.CuptiRecorder(pm_sampling=self.pm_sampling, pm_interval_ns=self.pm_interval_ns,
                                              record_dir=self._trace_dir)
        where = env.of_model(self.model) if self.model is not None else None
        return TorchRecorder(self._trace_dir, cuda=None if where is None else where.type == "cuda", pm_sampling=self.pm_sampling,
                             pm_interval_ns=self.pm_interval_ns)

    def _observe(self, window: "_Window") -> None:
        """Attach the attention-statistics collector to the window's tagger (when asked)."""
        if self.attention_stats and window.tagger is not None:
            from headcount.tagging.live_stats import AttentionStatsCollector

            options = self.attention_stats if isinstance(self.attention_stats, dict) else {}
            window.stats_collector = AttentionStatsCollector(**options)
            window.tagger.observer = window.stats_collector.observe

    def start(self) -> "AttentionProfiler":
        """Start profiling (what entering ``with profiler:`` does). Steps are
        counted from 0; without a ``schedule``, recording starts now.

        Raises:
            HeadcountError: already started; with ``strict``, a source that cannot start.
        """
        if self._started:
            raise HeadcountError("the profiler is already started", hint="call stop() (or leave the `with` block) first")
        self._started = True
        self.step_num = 0
        self._windows = 0
        self._window = _Window(self._base_run_id, 0)
        if self._active(0):
            self._begin()
        return self

    def stop(self) -> None:
        """Stop profiling (what leaving ``with profiler:`` does): the open
        step ends, the recording stops, ``on_ready`` is called for a window
        still open. Stopping a profiler that is not started does nothing."""
        if not self._started:
            return
        self._started = False
        if self._recording:
            self._end()

    def __enter__(self) -> "AttentionProfiler":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def _action(self, step: int) -> str:
        """The schedule's action for ``step`` by name (``RECORD`` for every step without a schedule)."""
        if self.schedule is None:
            return "RECORD"
        action = self.schedule(step)
        return getattr(action, "name", str(action))

    def _active(self, step: int) -> bool:
        return self._action(step) in ("RECORD", "RECORD_AND_SAVE")

    def _window_ends(self, step: int) -> bool:
        return self._action(step) == "RECORD_AND_SAVE"

    def _begin(self) -> None:
        """Start a recording window: the recorder and the tagger, and the step range."""
        previous = self._window  # kept until this window holds a call (an empty one gives it back: _end)
        run_id = f"{self._base_run_id}.{self._windows}" if self._windows else self._base_run_id
        self._windows += 1
        window = self._window = _Window(run_id, self.step_num, previous=previous)
        models = [self.model] if self.model is not None else []
        try:
            recorder = window.recorder = self._new_recorder()
            if recorder.correlates_ranges:  # the source first: the ranges push their ids into its running session
                recorder.start()
            log = recorder.range_log if recorder.correlates_ranges else None
            window.tagger = AttentionTagger(models, mode=self.mode, auto=self.model is None, range_log=log)
            window.step_emitter = (CorrelatedEmitter(log, domain=STEP_DOMAIN) if log is not None
                                   else RangeEmitter(domain=STEP_DOMAIN))
            window.tagger.activate()
            if not recorder.correlates_ranges:
                try:
                    recorder.start()
                except BaseException:
                    window.tagger.deactivate()
                    raise
        except HeadcountError as err:
            if self.strict:
                raise
            window.failure, window.tagger, window.step_emitter = err, None, None
            notice(f"{self.backend} source did not start, the block runs unprofiled: {err.one_line()}")
        self._observe(window)
        window.watch = CompileWatch().start() if window.failure is None else None
        self._print_notices()
        self._recording = True
        self._open(f"step#{self.step_num}")

    def _end(self) -> None:
        """Close the step range, stop the recorder and the tagger, call ``on_ready``."""
        self._close()
        self._recording = False
        window = self._window
        if window.failure is not None:
            return
        window.watch.stop()
        try:
            window.trace_path = window.recorder.stop()
        finally:
            window.tagger.deactivate()
        self._print_notices()
        if not window.tagger.calls and self._windows > 1:  # e.g. a window the schedule opened at the loop's last prof.step()
            notice(f"recording window {self._windows} (from step {window.start_step}) ended with no attention call in it: "
                   "dropped" + (", on_ready not called" if self.on_ready is not None else ""))
            window.recorder.cleanup()
            self._window = window.previous  # the previous window's tables stay readable
            self._windows -= 1
            return
        self._drop(window.previous)
        window.previous = None  # not held once this window holds calls
        if self.on_ready is not None:
            self.on_ready(self)

    def _drop(self, window: "_Window | None") -> None:
        """Let an earlier window go once a later one holds calls: its recording is removed,
        with a notice when nobody read it (no ``on_ready``, no :meth:`get_stats`)."""
        if window is None or window.recorder is None or window.failure is not None or window.trace_path is None:
            return
        if window.stats is None and self.on_ready is None:
            notice(f"recording window {self._windows - 1} was not read before window {self._windows} recorded and is "
                   "dropped: pass on_ready= to read or save each window")
        if window.recorder is not self._window.recorder:  # a recorder given to the profiler serves every window
            window.recorder.cleanup()

    def _print_notices(self) -> None:
        """Print the recorder's notices not printed yet."""
        window = self._window
        lines = (window.recorder.notices if window.recorder is not None else []) if window.failure is None else []
        for line in lines[window.notices_printed:]:
            notice(line)
        window.notices_printed = len(lines)

    def _open(self, name: str) -> None:
        emitter = self._window.step_emitter
        if emitter is not None:
            self._open_step = (name, emitter.push(name), time.perf_counter_ns())

    def _close(self, counted_only: bool = False) -> None:
        """Close the open step range (``counted_only``: only a ``step#N`` one the profiler opened)."""
        if self._open_step is None or (counted_only and not self._open_step[0].startswith("step#")):
            return
        name, token, start = self._open_step
        self._open_step = None
        index = int(name[5:])
        self._window.step_times.append((index, start, time.perf_counter_ns()))
        self._window.step_emitter.pop(token)

    def step(self, index: int | None = None) -> "_Step":
        """Mark a step, in either of two habits:

        - ``prof.step()`` at the end of each step, as with torch.profiler:
          the step counted so far (``step#N`` ranges, ``N`` from 0 at
          :meth:`start`) ends and the next begins; with a ``schedule``, this
          is where recording starts and stops;
        - ``with prof.step(i):`` around one step, numbered by you (``step.i``).

        Either gives the ``step`` column of every table.

        Raises:
            HeadcountError: the profiler is not started (outside ``with`` / before :meth:`start`).
        """
        if not self._started:
            raise HeadcountError("prof.step() outside the profiled block",
                                 hint="call it inside `with profiler:` (or between start() and stop())")
        if index is None:
            return self._advance(self.step_num + 1)
        window = self._window
        if self._open_step is not None and self._open_step[0] == "step#0" and not window.step_times:
            # the implicit first step opened at start() is no step: the user numbers them
            window.void_steps.append("step#0")
            window.step_emitter.pop(self._open_step[1])
            self._open_step = None
        self._close(counted_only=True)
        handle = _Step(self, None)
        if self._recording:
            self._open(f"step.{index}")
            handle.range = self._open_step
        return handle

    def _advance(self, to: int) -> "_Step":
        """The step after ``self.step_num`` begins: the schedule decides whether it is recorded."""
        ending = self.step_num
        self._close()
        self.step_num = to
        if self._recording and (self._window_ends(ending) or not self._active(to)):
            self._end()
        if self._active(to):
            if self._recording:
                self._open(f"step#{to}")
            else:
                self._begin()
        return _Step(self, None)

    def _compiled_steps(self) -> list[int]:
        """Steps during which torch.compile compiled (kept out of the figures
        when other steps did not), with a notice either way."""
        window = self._window
        watch = window.watch
        if watch is None or not watch.compiled:
            return []
        took = f" ({watch.seconds:.1f} s)" if watch.timed else ""
        hint = "run one untimed step of the compiled model first (inside the profiler, or before it under headcount.tag with the same mode)"
        compiled = [i for i, start, end in window.step_times if watch.overlaps(start, end)]
        if compiled and len(compiled) < len(window.step_times):
            notice(f"torch.compile compiled during step(s) {', '.join(map(str, compiled))}{took}: left out of layers, "
                   f"heads and the breakdown (their rows stay in ranges and kernels); {hint}")
            return compiled
        notice(f"torch.compile compiled inside the profiled block{took}: the figures include compilation time; {hint}")
        return []

    # ------------------------------------------------------------------ results
    @property
    def implementation(self) -> str:
        """The attention implementation the session ran (from the model config or the calls)."""
        config = getattr(self.model, "config", None)
        return implementation_of(self._tagger.calls if self._tagger else [], getattr(config, "_attn_implementation", None))

    def get_stats(self) -> dict[str, pd.DataFrame]:
        """The run's tables as DataFrames.

        Returns:
            ``attention_breakdown`` (one row per phase × layer, × head in head
            mode), ``layers``, ``heads``, ``ranges``, ``kernels``, ``steps``
            (how busy the GPU was per step and why it idled) and ``findings``
            (what stands out, ranked). A block in which nothing was tagged
            gives kernels, steps and findings, with a notice.

        Raises:
            HeadcountError: called before the profiled block ran, or nothing was recorded.
        """
        window = self._window
        if window.stats is None:
            window.stats = self._built(window)  # raises as recording() does when nothing was recorded
        return window.stats

    def recording(self) -> Recording:
        """This window's recording with everything its build needs, picklable (a worker process can build it:
        :func:`headcount.build.in_process.tables_from_recording`).

        Raises:
            HeadcountError: nothing was recorded, or the window has not ended.
        """
        window = self._window
        if window.failure is not None:
            raise HeadcountError(f"nothing was recorded: {window.failure.message}", hint=window.failure.hint,
                                 exit_code=window.failure.exit_code)
        if window.trace_path is None:
            raise HeadcountError("no profile recorded yet", hint="call get_stats() after the `with profiler:` block")
        device = self.device_info()
        window.compiled_steps = self._compiled_steps()
        return Recording(window.recorder.writes, window.trace_path, window.tagger.calls, window.run_id, self.implementation,
                         window.recorder.device_limits or device.limits(), device, window.tagger.emitter.use_nvtx,
                         tuple(window.compiled_steps), tuple(window.void_steps))

    def attention_statistics(self) -> pd.DataFrame | None:
        """The window's per-head attention statistics (with ``attention_stats=``), else ``None``."""
        window = self._window
        if window.stats_collector is None:
            return None
        return window.stats_collector.table(run_id=window.run_id, implementation=self.implementation)

    def discard_recording(self) -> None:
        """Remove this window's recording files (once its tables are built, here or elsewhere)."""
        if self._window.recorder is not None:
            self._window.recorder.cleanup()

    def _built(self, window: "_Window") -> dict[str, pd.DataFrame]:
        """The window's recording built (:func:`headcount.build.in_process.tables_from_recording`), its notices said."""
        built = tables_from_recording(self.recording())
        window.collector_info = built.info or None
        for line in built.notices:
            notice(line)
        stats = built.tables
        if not len(stats["layers"]):
            notice(f"{NO_ATTENTION} (no attention call was tagged in the profiled block: run a transformers model, or a "
                   "function decorated with headcount.tag_attention, inside `with profiler:`)")
        statistics = self.attention_statistics()
        if statistics is not None:
            stats["attention_stats"] = statistics
        self.discard_recording()
        return stats

    def device_info(self) -> Device:
        """Where the profiled work ran: the device of the profiled model's
        parameters (with no model given: of the first model tagged), the CPU
        when there is none. Never merely a GPU this machine has."""
        models = [self.model] if self.model is not None else (self._tagger.models if self._tagger else [])
        where = next((d for d in map(env.of_model, models) if d is not None), None)
        return device_info(where)

    def run_metadata(self) -> dict:
        """Metadata of this run as stored in the report."""
        window = self._window
        extra = {"implementation": self.implementation, **self.metadata}
        if window.watch is not None and window.watch.compiled:
            extra["compiled_during_profile"] = {"steps_left_out": window.compiled_steps,
                                                "seconds": round(window.watch.seconds, 3) if window.watch.timed else None}
        if window.collector_info:
            extra["collector"] = window.collector_info
        if window.tagger is not None and window.tagger.paths:
            extra["tagged_through"] = dict(window.tagger.paths)  # model class → "attention interface" | "module hooks"
        return run_metadata(window.run_id, self.backend, window.recorder.version if window.recorder else None, self.mode,
                            extra, device=self.device_info())

    def runs_table(self) -> pd.DataFrame:
        """One-row ``runs`` table of this session."""
        meta = self.run_metadata()
        return runs_row(meta)

    def save(self, out: str | Path, append: bool = False, force: bool = False) -> Path:
        """Write the report (Parquet dataset, see :mod:`headcount.store.dataset`).

        Raises:
            HeadcountError: the directory already holds a report (without
                ``append``/``force``), is not writable, or nothing was recorded.
        """
        stats = self.get_stats()
        return dataset.write_stats(out, self.run_id, stats, self.run_metadata(), append=append, force=force)


@dataclass
class _Window:
    """One recording window of a profiler: from its start (or a schedule's first
    active step) to its end, everything it recorded and built.

    Attributes:
        run_id: the window's run (the profiler's run id; ``<run_id>.<n>`` from the second window on).
        start_step: the step it began at.
        previous: the window before, kept until this one holds a call (an empty window gives it back).
        recorder, tagger, step_emitter: what records it (``None`` where the source did not start).
        failure: why it recorded nothing (its source did not start).
        trace_path: the recording, once the window ended.
        stats: its tables, once built (:meth:`AttentionProfiler.get_stats`).
        step_times: ``(step, start, end)`` in ``perf_counter_ns``.
        void_steps: step ranges that are no step (the implicit first step, when the user numbers them).
        watch: whether torch.compile compiled inside it.
        stats_collector: the attention-statistics collector, when asked for.
        notices_printed: how many of the recorder's notices were printed.
        collector_info: the cupti collector's facts (after the build).
        compiled_steps: steps left out because torch.compile compiled during them.
    """

    run_id: str
    start_step: int
    previous: "_Window | None" = None
    recorder: Recorder | None = None
    tagger: AttentionTagger | None = None
    step_emitter: RangeEmitter | None = None
    failure: HeadcountError | None = None
    trace_path: Path | None = None
    stats: dict[str, pd.DataFrame] | None = None
    step_times: list[tuple[int, int, int]] = field(default_factory=list)
    void_steps: list[str] = field(default_factory=list)
    watch: CompileWatch | None = None
    stats_collector: object | None = None
    notices_printed: int = 0
    collector_info: dict | None = None
    compiled_steps: list[int] = field(default_factory=list)





class _Step:
    """What :meth:`AttentionProfiler.step` returns: nothing to do for a plain
    call; as a context manager, the end of the user's numbered step."""

    def __init__(self, profiler: AttentionProfiler, range_):
        self.profiler = profiler
        self.range = range_

    def __enter__(self) -> "_Step":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        prof = self.profiler
        if self.range is not None and prof._open_step is self.range:
            prof._close()
