"""``AttentionProfiler``: the facade users hold.

It wires the stages together and holds no logic of its own: tag
(:mod:`headcount.collector.tagging`), record (a source from
:mod:`headcount.collector`), parse, attribute and derive
(:mod:`headcount.pipeline`), report (:mod:`headcount.reports`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from headcount.collector.tagging import MODES, AttentionTagger
from headcount.collector.torch_source import TorchRecorder
from headcount.errors import HeadcountError
from headcount.parsers.kineto import load_trace
from headcount.pipeline import tables_from_events
from headcount.reports import dataset
from headcount.reports.metadata import new_run_id, run_metadata

BACKENDS = ("auto", "torch")


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
        backend: ``auto`` (torch.profiler; the only source so far) or ``torch``.
        run_id: identifier of this run in the report (generated when omitted).
        trace_dir: keep the raw torch.profiler trace there (a temporary
            directory by default).
        metadata: extra run metadata (model config, batch, …) for the report.

    Raises:
        HeadcountError: unknown mode or backend.
    """

    def __init__(self, model=None, mode: str = "layer", backend: str = "auto", run_id: str | None = None,
                 trace_dir: str | Path | None = None, metadata: dict | None = None):
        if mode not in MODES:
            raise HeadcountError(f"unknown mode {mode!r}", hint="use mode='layer' or mode='head'")
        if backend not in BACKENDS:
            raise HeadcountError(f"unknown or unavailable backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
        self.model = model
        self.mode = mode
        self.backend = "torch" if backend == "auto" else backend
        self.run_id = run_id or new_run_id()
        self.metadata = dict(metadata or {})
        self._trace_dir = trace_dir
        self._tagger: AttentionTagger | None = None
        self._recorder: TorchRecorder | None = None
        self._stats: dict[str, pd.DataFrame] | None = None
        self.trace_path: Path | None = None

    # ------------------------------------------------------------------ recording
    def __enter__(self) -> "AttentionProfiler":
        self._stats = None
        models = [self.model] if self.model is not None else []
        self._tagger = AttentionTagger(models, mode=self.mode, auto=self.model is None)
        self._recorder = TorchRecorder(self._trace_dir)
        self._tagger.activate()
        try:
            self._recorder.start()
        except BaseException:
            self._tagger.deactivate()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.trace_path = self._recorder.stop()
        finally:
            self._tagger.deactivate()

    # ------------------------------------------------------------------ results
    @property
    def implementation(self) -> str:
        """The attention implementation the session ran (from the model config or the calls)."""
        impls = {c.shape.implementation for c in (self._tagger.calls if self._tagger else []) if c.shape is not None}
        if len(impls) == 1:
            return impls.pop()
        config = getattr(self.model, "config", None)
        return getattr(config, "_attn_implementation", None) or ("mixed" if impls else "unknown")

    def get_stats(self) -> dict[str, pd.DataFrame]:
        """The run's tables as DataFrames.

        Returns:
            ``attention_breakdown`` (one row per phase × layer, × head in head
            mode), ``layers``, ``heads``, ``ranges``, ``kernels``.

        Raises:
            HeadcountError: called before the profiled block ran, or nothing was tagged.
        """
        if self._stats is None:
            if self.trace_path is None:
                raise HeadcountError("no profile recorded yet", hint="call get_stats() after the `with profiler:` block")
            events = load_trace(self.trace_path)
            self._stats = tables_from_events(events, self._tagger.calls, self.implementation, self.run_id)
            if self._recorder is not None:
                self._recorder.cleanup()
        return self._stats

    def run_metadata(self) -> dict:
        """Metadata of this run as stored in the report."""
        return run_metadata(
            self.run_id, self.backend, self._recorder.version if self._recorder else None, self.mode,
            {"implementation": self.implementation, **self.metadata},
        )

    def runs_table(self) -> pd.DataFrame:
        """One-row ``runs`` table of this session."""
        meta = self.run_metadata()
        return runs_row(meta)

    def save(self, out: str | Path, append: bool = False, force: bool = False) -> Path:
        """Write the report (Parquet dataset, see :mod:`headcount.reports.dataset`).

        Raises:
            HeadcountError: the directory already holds a report (without
                ``append``/``force``), is not writable, or nothing was tagged.
        """
        stats = self.get_stats()
        tables = {name: stats[name] for name in ("kernels", "ranges", "layers", "heads")}
        tables["runs"] = self.runs_table()
        return dataset.write_run(out, self.run_id, tables, self.run_metadata(), append=append, force=force)


def runs_row(meta: dict) -> pd.DataFrame:
    """The ``runs`` table row of one run's metadata."""
    device = meta.get("device") or {}
    config = meta.get("model_config")
    return pd.DataFrame([{
        "run_id": meta["run_id"],
        "implementation": meta.get("implementation"),
        "source": meta.get("source"),
        "source_version": meta.get("source_version"),
        "mode": meta.get("mode"),
        "model": meta.get("model"),
        "model_config": json.dumps(config, sort_keys=True, default=str) if config is not None else None,
        "batch": meta.get("batch"),
        "seq": meta.get("seq"),
        "dtype": meta.get("dtype"),
        "steps": meta.get("steps"),
        "backward": meta.get("backward"),
        "device_kind": device.get("kind"),
        "device_name": device.get("name"),
        "torch": meta.get("torch"),
        "transformers": meta.get("transformers"),
        "tool_version": meta.get("tool_version"),
        "schema_version": meta.get("schema_version"),
        "command_line": " ".join(meta.get("command_line") or []),
        "start_time": meta.get("start_time"),
    }])
