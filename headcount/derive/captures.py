"""Graph captures: their spans, and the idle time they explain (docs/reading-a-report.md § Triage: capture).

While a process records work into a CUDA/HIP graph (``…StreamBeginCapture`` … ``…StreamEndCapture``, then
``…GraphInstantiate``), the captured work does not run: a GPU idle then is no idle time to win back in a
step. :func:`capture_share` takes it out of a gap's causes as ``idle_capture_ns``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headcount.derive import columns, device_view

CAPTURE_CALL = re.compile(r"^(?:cuda|cu|hip)(?:Stream(?:Begin|End)Capture|Graph(?:Instantiate|ExecUpdate))")
"""Runtime/driver calls that capture a CUDA/HIP graph or make it runnable: while the CPU records the work, the GPU
runs none of it."""


def capture_spans(calls: pd.DataFrame | None) -> pd.DataFrame:
    """The graph-capture spans of :func:`headcount.derive.steps.sync_calls`' capture rows: each thread's ``…StreamBeginCapture`` to its next
    ``…StreamEndCapture`` (a capture the recording does not close runs to the last call's end), and every
    instantiation or update of a captured graph on its own; ``pid``, ``start_ns``, ``end_ns``."""
    empty = pd.DataFrame({"pid": pd.Series(dtype=object), "start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64")})
    if calls is None or not len(calls) or "capture" not in calls or not calls["capture"].any():
        return empty
    rows = calls[calls["capture"].to_numpy(dtype=bool)].sort_values("start_ns", kind="stable")
    spans = []
    for (pid, _tid), mine in rows.groupby(["pid", "tid"], dropna=False, sort=False):
        begun = None
        for name, start, end in zip(mine["name"].astype(str), mine["start_ns"], mine["end_ns"]):
            if "BeginCapture" in name:
                begun = start if begun is None else begun
            elif "EndCapture" in name:
                spans.append((pid, begun if begun is not None else start, end))
                begun = None
            else:
                spans.append((pid, start, end))
        if begun is not None:
            spans.append((pid, begun, int(mine["end_ns"].max())))
    return pd.DataFrame(spans, columns=["pid", "start_ns", "end_ns"]).astype({"start_ns": "int64", "end_ns": "int64"}) \
        if spans else empty


def capture_share(causes: dict[str, np.ndarray], a: np.ndarray, b: np.ndarray, gap_pid: np.ndarray, pids: np.ndarray,
                   syncs: pd.DataFrame | None, origin: int) -> dict[str, np.ndarray]:
    """Take out of each gap's causes the time its process spent capturing a graph (:func:`capture_spans`):
    ``idle_capture_ns``, taken from host, other, sync, launch-bound and unknown time in that order (the GPU had
    nothing to run while the CPU recorded work into a graph: no gain to claim)."""
    spans = capture_spans(syncs)
    captured = np.zeros(len(a))
    if len(spans) and len(a):
        code = {str(p): k for k, p in enumerate(pids)}
        span_pid = np.array([code.get(str(p), -2) for p in spans["pid"]], dtype=np.int64)
        union = device_view.pieces(span_pid, columns.relative(spans["start_ns"], origin), columns.relative(spans["end_ns"], origin))
        captured = device_view.covered(union, np.where(gap_pid >= 0, gap_pid, -2), a, b)
    left = captured.copy()
    out = {"idle_capture_ns": captured}
    for cause in ("idle_host_ns", "idle_other_ns", "idle_sync_ns", "idle_launch_bound_ns", "idle_unknown_ns"):
        taken = np.minimum(causes[cause], left)
        out[cause] = causes[cause] - taken
        left = left - taken
    out["idle_other_blocked_ns"] = np.minimum(causes["idle_other_blocked_ns"], out["idle_other_ns"])
    return out
