"""A torch.profiler recording's own annotations as ranges: ``record_function`` / ``user_annotation``
(``## forward ##``, ``nccl:all_reduce``, ``DistributedDataParallel.forward``), like foreign NVTX ranges
of an nsys export (domain :data:`~headcount.common.naming.USER_DOMAIN`, level ``other``).

Their GPU work is the work launched inside them on their thread (the rule nsys's
``nvtx_gpu_proj_trace`` applies), attributed apart from headcount's ranges so that an annotation
around a layer takes nothing from the layer. ``duration_ns`` is that work's busy union
(``duration_basis`` ``gpu_busy``; ``gpu_span_ns`` its first start to last end, a span), or the
range's CPU time where it launched nothing (``cpu_range``). Where the trace carries the GPU-side
twin of an annotation (``gpu_user_annotation``: Kineto's own projection onto one stream), its time
is kept beside (``gpu_annotation_ns``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.attribute import attribution, labels, nesting
from headcount.attribute.untagged import CALL_KEY
from headcount.derive import launch


def user_ranges(user: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame, steps: pd.DataFrame,
                annotations: pd.DataFrame | None = None) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The ranges-table rows of the recording's own annotations, and per GPU row (``gpu``'s order) the collective its
    innermost ``nccl:…`` annotation names (``nccl:all_to_all`` → ``all_to_all``; ``None``: none): torch.distributed
    names every collective so, where NCCL's kernel name may say only ``SendRecv`` (an all-to-all, a pipeline's
    all-gather).

    Args:
        user: the annotations, nested (:func:`headcount.attribute.nesting.nest_ranges`), domain ``torch.profiler``.
        gpu: the GPU work (``correlation_id``, ``start_ns``, ``end_ns``, ``kind``).
        runtime: the launch calls (``pid``, ``tid``, ``correlation_id``, ``start_ns``, ``end_ns``).
        steps: the step ranges (for each range's ``step``).
        annotations: the GPU-side annotations (``name``, ``start_ns``, ``end_ns``), if any.
    """
    if not len(user):
        return user, None
    columns = [c for c in ("kind", "name", "correlation_id", "start_ns", "end_ns", "device", "stream") if c in gpu]
    assigned = None
    if CALL_KEY in gpu and CALL_KEY in user:  # a graph replay's annotated regions hold their kernels by key
        assigned = attribution.by_call_key(user, pd.array(gpu[CALL_KEY], dtype="Int64").to_numpy(np.int64, na_value=-1))
    projected, work, _ = attribution.attribute(user, gpu[columns].assign(pid=None), runtime, assigned=assigned)
    if len(work):
        levels = nesting.ancestor_rows(projected, work["range_id"].to_numpy(np.int64))
        figures = launch.per_range(projected, work, levels)
        projected = projected.merge(figures[["range_id", "kernel_busy_ns", "kernel_gap_ns"]], on="range_id", how="left")
    else:
        projected["kernel_busy_ns"] = np.nan
    out = labels.label_ranges(projected, steps, ours=np.zeros(len(projected), dtype=bool))
    span = (pd.to_numeric(out["gpu_end_ns"], errors="coerce") - pd.to_numeric(out["gpu_start_ns"], errors="coerce")).astype("float64")
    busy = pd.to_numeric(out["kernel_busy_ns"], errors="coerce").astype("float64")
    launched = busy.notna().to_numpy(dtype=bool)
    cpu = (out["end_ns"] - out["start_ns"]).astype("float64").to_numpy()
    out["gpu_span_ns"] = span.to_numpy(np.float64, na_value=np.nan)
    out["duration_ns"] = np.where(launched, busy.to_numpy(np.float64, na_value=np.nan), cpu)
    out["duration_basis"] = np.where(launched, "gpu_busy", "cpu_range")
    out["op_count"] = out["gpu_op_count"]
    if annotations is not None and len(annotations):
        out["gpu_annotation_ns"] = _gpu_twins(out, annotations)
    return out, _collective_of(projected, work)


def _collective_of(projected: pd.DataFrame, work: pd.DataFrame) -> np.ndarray | None:
    """Per GPU row, the collective named by its innermost annotation where that is ``nccl:<name>`` (``None`` else)."""
    if not len(work):
        return None
    names = pd.Series(projected["name"].astype(str).to_numpy(), index=projected["range_id"].to_numpy(np.int64))
    named = names[names.str.startswith("nccl:")].str.removeprefix("nccl:")
    if not len(named):
        return None
    return work["range_id"].map(named).astype(object).where(lambda v: v.notna(), None).to_numpy(object)


def _gpu_twins(ranges: pd.DataFrame, annotations: pd.DataFrame) -> np.ndarray:
    """Per range, the duration of the GPU-side annotation of the same name that overlaps its GPU span, the last to start
    before that span ends (Kineto writes one per annotation that launched work; ns, NaN where none)."""
    out = np.full(len(ranges), np.nan)
    starts = pd.to_numeric(ranges["gpu_start_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    ends = pd.to_numeric(ranges["gpu_end_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    for name, twins in annotations.groupby("name", sort=False):
        mine = np.flatnonzero((ranges["name"].astype(str) == str(name)).to_numpy() & ~np.isnan(starts))
        if not len(mine):
            continue
        order = np.argsort(twins["start_ns"].to_numpy(np.float64))
        t0, t1 = twins["start_ns"].to_numpy(np.float64)[order], twins["end_ns"].to_numpy(np.float64)[order]
        k = np.searchsorted(t0, ends[mine], side="right") - 1  # the last twin starting before the range's work ends
        ok = (k >= 0) & (t1[np.maximum(k, 0)] >= starts[mine])  # and overlapping it
        out[mine[ok]] = (t1 - t0)[k[ok]]
    return out
