"""A step's own work beside the device's (docs/reading-a-report.md § Triage): its own busy time and the
neighbours' in its window, its communication overlapped by compute and exposed, its graph replays, and a note
where step windows overlap. Columns of the ``steps`` table, filled in place by :func:`headcount.derive.steps.gpu_steps`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common import communication
from headcount.derive import columns, device_view
from headcount.derive.launch import union_length


def own_columns(out, own, busy, work, kind_of, name_codes, names, g, n, start, end, device_group, row_device) -> None:
    """Fill ``out``'s columns of the step's own work (``own_busy_ns``, and the device's other work in its window) and
    of its communication (overlapped by the device's compute, exposed)."""
    out["own_busy_ns"] = own
    out["others_busy_ns"] = np.maximum(busy - own, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        window = out["window_ns"].to_numpy(np.float64)
        out["own_busy_pct"] = np.where(window > 0, 100.0 * own / window, np.nan)
        out["others_busy_pct"] = np.where(window > 0, 100.0 * out["others_busy_ns"] / window, np.nan)
    comm = communication_rows(kind_of, name_codes, names)
    compute = (kind_of == "kernel") & ~comm
    comm_union = device_view.pieces(g[comm], start[comm], end[comm])
    overlapped = device_view.covered(device_view.pieces(device_group[compute], start[compute], end[compute]),
                                     row_device[comm_union[0]], comm_union[1], comm_union[2])
    out["communication_overlapped_ns"] = np.bincount(comm_union[0], weights=overlapped, minlength=n)
    out["communication_exposed_ns"] = np.maximum(out["communication_ns"].to_numpy(np.float64)
                                                 - out["communication_overlapped_ns"].to_numpy(np.float64), 0.0)


def communication_rows(kind_of: np.ndarray, name_codes: np.ndarray, names: np.ndarray) -> np.ndarray:
    """Which ops are communication: kernels named in :data:`headcount.common.communication.SIGNALS`, and peer-to-peer
    copies."""
    name_at = np.where(name_codes >= 0, name_codes, len(names))
    kernel_hit = np.append(np.array([communication.kind_of(str(v)) is not None for v in names], dtype=bool), False)
    return ((kind_of == "kernel") & kernel_hit[name_at]) | ((kind_of == "memcpy") & columns.matches(names, "PtoP|peer", case=False)[name_at])


def graph_columns(out, work, g, n, s, thread, correlation, start, end) -> None:
    """Fill ``out``'s graph-replay columns: launch calls that ran a CUDA/HIP graph (one call, several ops, or ops
    carrying a graph id), the ops they ran and those ops' busy union (ns). Columnar: one sort of the launched ops."""
    known = np.flatnonzero(~np.isnan(s) & (thread >= 0))
    corr = np.nan_to_num(correlation, nan=-1.0)
    order = known[np.lexsort((s[known], corr[known], thread[known]))]
    new = np.r_[True, (thread[order][1:] != thread[order][:-1]) | (corr[order][1:] != corr[order][:-1])
                | (s[order][1:] != s[order][:-1])] if len(order) else np.zeros(0, dtype=bool)
    call_sorted = np.cumsum(new) - 1  # one id per launch call
    call = np.full(len(s), -1, dtype=np.int64)
    call[order] = call_sorted
    graph = np.zeros(len(s), dtype=bool)
    if len(order):
        graph[order] = np.bincount(call_sorted)[call_sorted] > 1
    if "graph_id" in work:
        graph |= pd.to_numeric(work["graph_id"], errors="coerce").notna().to_numpy(dtype=bool)
    launched = graph & (call >= 0)
    pairs = np.unique(g[launched].astype(np.int64) * (int(call.max()) + 2) + call[launched]) if launched.any() else np.zeros(0, np.int64)
    out["graph_launches"] = np.bincount(pairs // (int(call.max()) + 2), minlength=n).astype(np.int64) if len(pairs) \
        else np.zeros(n, dtype=np.int64)
    out["graph_ops"] = np.bincount(g[graph], minlength=n).astype(np.int64)
    out["graph_busy_ns"] = union_length(g[graph], start[graph], end[graph], n)


def overlap_note(out: pd.DataFrame, w0: np.ndarray, w1: np.ndarray) -> None:
    """Say so on each step whose window overlaps another step's of its process and device."""
    stepped = out["step"].notna().to_numpy(dtype=bool)
    key = pd.factorize(pd.Series(list(zip(out["implementation"].astype(str), out["pid"].astype(str), out["device"].astype(str)))))[0]
    hit = np.zeros(len(out), dtype=bool)
    hit[stepped] = device_view.overlapping(key[stepped], w0[stepped], w1[stepped])
    out["windows_overlap"] = hit
    words = ("this step's window overlaps a neighbouring step's (pipelined work): busy and idle are the device's over the "
             "window, every stream and every step's work; own_busy_ns is this step's own work")
    note = out["note"].astype(object)
    out["note"] = np.where(hit, np.where(note.isna(), words, note.astype(str) + "; " + words), note)
