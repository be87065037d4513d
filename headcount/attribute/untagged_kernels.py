"""Attention calls found by kernel names (:func:`_kernel_calls`), for :func:`headcount.attribute.untagged.find_calls`:
kernels launched outside every call found by operators or modules, one call per run of attention kernels
(spanning its launch calls), and inside CUDA/HIP graph replays, one call per run of attention kernels among
the replay's kernels, those kernels assigned to it by name. Takes the events table and the calls found so far;
gives :class:`~headcount.attribute.untagged_calls._Call` s and what was found in replays (:class:`_Replays`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headcount.attribute.untagged_calls import _Call, _Spans
from headcount.common import signals

_KERNEL_NAME_CHARS = 80

_GRAPH_LAUNCH = re.compile(r"[Gg]raph_?Launch")
"""A runtime call that replays a CUDA/HIP graph (``cudaGraphLaunch``, ``hipGraphLaunch``, ``cuGraphLaunch``)."""


@dataclass
class _Replays:
    """What :func:`_kernel_calls` found inside graph replays."""

    launches: int = 0          # graph launches holding attention kernels
    calls: int = 0             # calls found in them
    attention_kernels: int = 0  # their attention kernels (companions included)
    kernels: int = 0           # every kernel of those replays
    unlaunched: int = 0        # attention kernels with neither a launch nor a replay in the recording


@dataclass
class _Kernels:
    """The recording's kernels as :func:`_kernel_calls` reads them: per kernel (in events order), its
    name and what it is to a call, and its launch call (``a_s``, ``a_e``: 0 where none is recorded)."""

    rows: np.ndarray       # positions in the events table
    names: np.ndarray
    row_of: dict           # kernel name → its signal row (None: not an attention kernel)
    hit: np.ndarray        # an attention kernel
    prologue: np.ndarray   # a prologue, whose attention kernel comes a few kernels later
    joins: np.ndarray      # joins a run: attention, prologue or companion
    launched: np.ndarray   # its launch call is in the recording
    in_graph: np.ndarray   # replayed from a CUDA/HIP graph
    starts: np.ndarray
    lpid: np.ndarray
    ltid: np.ndarray
    a_s: np.ndarray
    a_e: np.ndarray
    corr: np.ndarray
    held: np.ndarray | None = None  # launched inside a call already found (set by :func:`_kernel_calls`)


def _kernel_calls(events: pd.DataFrame, calls: list[_Call], replays: _Replays) -> list[_Call]:
    """Calls found by kernel names, launched outside every call found so far.

    Outside graphs, a run of attention kernels launched one after another on a
    thread (no other kernel launched between them, one phase) is one call,
    spanning its launch calls. Inside a graph replay (the kernels of one
    ``…GraphLaunch``, or kernels with a ``graph node id``) every kernel shares
    the one launch call, so the launch cannot be the call: each run of
    attention kernels among the replay's kernels (in GPU order) is one call,
    and those kernels are assigned to it by name (``_Call.replayed``), never
    the replay's other kernels."""
    kernels = _kernels(events, replays)
    if kernels is None:
        return []
    spans = _Spans()
    for c in calls:
        spans.add((c.pid, c.tid), c.start, c.end)
    kernels.held = np.zeros(len(kernels.names), dtype=bool)  # launched inside a call already found: that call's
    for i in np.flatnonzero(kernels.joins & kernels.launched):
        kernels.held[i] = spans.holds((kernels.lpid[i], kernels.ltid[i]), int(kernels.a_s[i]), int(kernels.a_e[i]))
    out = _single_calls(kernels, spans)
    out += _replay_calls(kernels, spans, replays)
    return out


def _kernels(events: pd.DataFrame, replays: _Replays) -> _Kernels | None:
    """The kernels of ``events`` and their launch calls (counting in ``replays`` the attention kernels
    launched before the recording began); ``None`` where no kernel name is an attention kernel's."""
    kind = events["kind"].astype(object)
    kernel_rows = np.flatnonzero((kind == "kernel").to_numpy())
    if not len(kernel_rows):
        return None
    kernels = events.iloc[kernel_rows]
    names = kernels["name"].astype(str).to_numpy(object)
    distinct = pd.unique(names)
    row_of = {n: signals.match("kernel", n) for n in distinct}
    if not any(r is not None for r in row_of.values()):
        return None
    companion = {n for n in distinct if row_of[n] is None and signals.match("companion", n) is not None}
    prologue_names = {n for n in distinct if row_of[n] is None and signals.match("prologue", n) is not None}
    hit = np.array([row_of[n] is not None for n in names], dtype=bool)
    prologue = np.array([n in prologue_names for n in names], dtype=bool)
    joins = hit | prologue | np.array([n in companion for n in names], dtype=bool)
    runtime = events[(kind == "runtime").to_numpy() & events["correlation_id"].notna().to_numpy()]
    runtime = runtime.sort_values("start_ns", kind="stable").drop_duplicates("correlation_id")
    by_corr = pd.DataFrame({"correlation_id": pd.array(kernels["correlation_id"], dtype="Int64")}).merge(
        pd.DataFrame({"correlation_id": pd.array(runtime["correlation_id"], dtype="Int64"), "lpid": runtime["pid"].to_numpy(object),
                      "ltid": runtime["tid"].to_numpy(object), "a_s": pd.array(runtime["start_ns"], dtype="Int64"),
                      "a_e": pd.array(runtime["end_ns"], dtype="Int64"), "api": runtime["name"].astype(str).to_numpy(object)}),
        on="correlation_id", how="left")
    launched = by_corr["a_s"].notna().to_numpy()
    replays.unlaunched += int((hit & ~launched).sum())
    api = by_corr["api"].to_numpy(object)
    graph_api = {a: bool(_GRAPH_LAUNCH.search(a)) for a in pd.unique(api[launched])}
    node = (pd.array(kernels["graph_node_id"], dtype="Int64").to_numpy(np.int64, na_value=0)
            if "graph_node_id" in kernels else np.zeros(len(kernels), np.int64))
    in_graph = launched & ((node > 0) | np.array([graph_api.get(a, False) for a in api], dtype=bool))
    starts = kernels["start_ns"].to_numpy(np.int64)
    lpid, ltid = by_corr["lpid"].to_numpy(object), by_corr["ltid"].to_numpy(object)
    a_s = pd.array(by_corr["a_s"], dtype="Int64").to_numpy(np.int64, na_value=0)
    a_e = pd.array(by_corr["a_e"], dtype="Int64").to_numpy(np.int64, na_value=0)
    corr = pd.array(kernels["correlation_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    return _Kernels(kernel_rows, names, row_of, hit, prologue, joins, launched, in_graph, starts, lpid, ltid, a_s, a_e, corr)


def _runs(kernels: _Kernels, order):
    """Runs of attention kernels of one phase among ``order`` (positions, in order; a companion
    joins the run before it, any other kernel ends it)."""
    joins, held, hit, prologue, names = kernels.joins, kernels.held, kernels.hit, kernels.prologue, kernels.names
    run, phase, waiting, since = [], None, None, 0
    for i in order:
        if waiting is not None and (i < 0 or not joins[i] or held[i]) and since < signals.PROLOGUE_REACH:
            since += 1  # between a prologue and its attention kernel: neither part of the call nor an end to it
            continue
        waiting = None
        if i < 0:  # kernels skipped between (none of them attention): the run ends
            if run:
                yield run, phase
            run, phase = [], None
        elif hit[i] and not held[i]:
            this = "bwd" if signals.BACKWARD_KERNEL.search(names[i]) else "fwd"
            if run and phase is not None and this != phase:  # the other phase: a call of its own
                yield run, phase
                run = []
            run.append(i)  # to the run of its phase, or to the prologue waiting for it (phase None)
            phase = this
        elif prologue[i] and not held[i]:
            if run:
                yield run, phase
            run, phase, waiting, since = [i], None, i, 0
        elif joins[i] and not held[i] and run and phase is not None:
            run.append(i)
        elif run:
            if phase is not None:
                yield run, phase
            run, phase = [], None
    if run and phase is not None:
        yield run, phase


def _single_calls(kernels: _Kernels, spans: _Spans) -> list[_Call]:
    """Calls outside graphs: each run of attention kernels launched one after another on a thread
    (:func:`_runs`), spanning its launch calls (added to ``spans``)."""
    launched, in_graph, joins, prologue, hit = kernels.launched, kernels.in_graph, kernels.joins, kernels.prologue, kernels.hit
    lpid, ltid, a_s, a_e, starts = kernels.lpid, kernels.ltid, kernels.a_s, kernels.a_e, kernels.starts
    names, row_of = kernels.names, kernels.row_of
    out: list[_Call] = []
    # outside graphs: each thread's launches in order; only the neighbourhood of attention kernels matters
    single = np.flatnonzero(launched & ~in_graph)
    if len(single) and (joins[single]).any():
        frame = pd.DataFrame({"pid": lpid[single], "tid": ltid[single], "a_s": a_s[single], "k": starts[single], "i": single})
        frame = frame.sort_values(["a_s", "k"], kind="stable")
        for (pid, tid), part in frame.groupby(["pid", "tid"], sort=False):
            order = part["i"].to_numpy()
            near = np.flatnonzero(joins[order])
            reach = np.flatnonzero(prologue[order])  # a prologue's attention kernel may come a few kernels later
            keep = np.unique(np.concatenate([near, np.minimum(near + 1, len(order) - 1),
                                             *(np.minimum(reach + k, len(order) - 1) for k in range(1, signals.PROLOGUE_REACH + 2))]))
            for run, phase in _runs(kernels, order[keep] if len(keep) == len(order) else _with_breaks(order, keep)):
                main = next(i for i in run if hit[i])
                start, end = int(a_s[run[0]]), int(max(a_e[i] for i in run))
                if spans.overlaps((pid, tid), start, end):  # a run across another call: its first attention launch alone
                    run, start, end = [main], int(a_s[main]), int(a_e[main])
                spans.add((pid, tid), start, end)
                out.append(_Call(pid, tid, start, end, phase, "kernel", row_of[names[main]], names[main][:_KERNEL_NAME_CHARS]))
    return out


def _replay_calls(kernels: _Kernels, spans: _Spans, replays: _Replays) -> list[_Call]:
    """Calls inside graph replays: each run of attention kernels among a replay's kernels (in GPU order), a
    slice of the replay's launch call, its kernels theirs by name (``_Call.replayed``); counted in ``replays``."""
    in_graph, joins, hit, names, row_of = kernels.in_graph, kernels.joins, kernels.hit, kernels.names, kernels.row_of
    lpid, ltid, a_s, a_e, starts, corr = kernels.lpid, kernels.ltid, kernels.a_s, kernels.a_e, kernels.starts, kernels.corr
    kernel_rows = kernels.rows
    out: list[_Call] = []
    # graph replays holding attention: one launch call (pid, correlation) for all the replay's kernels
    graph = np.flatnonzero(in_graph)
    keys = pd.Series(list(zip(lpid[graph], corr[graph])), dtype=object) if len(graph) else pd.Series([], dtype=object)
    with_attention = set(keys[joins[graph]]) if len(graph) else set()
    for key, part in pd.Series(graph).groupby(keys.to_numpy(), sort=False) if with_attention else ():
        if key not in with_attention:
            continue
        members = sorted(part.to_numpy().tolist(), key=lambda i: starts[i])
        found = list(_runs(kernels, members))
        if not found:
            continue
        pid, tid, lo_ns, hi_ns = lpid[members[0]], ltid[members[0]], int(a_s[members[0]]), int(a_e[members[0]])
        replays.launches += 1
        replays.calls += len(found)
        replays.attention_kernels += sum(len(run) for run, _ in found)
        replays.kernels += len(members)
        # each call a slice of the launch call's time on its thread: disjoint ranges that nest as tags do
        width = max(3, (hi_ns - lo_ns) // len(found))
        for n, (run, phase) in enumerate(found):
            lo, main = lo_ns + n * width, next(i for i in run if hit[i])
            out.append(_Call(pid, tid, lo + 1, lo + width - 2, phase, "kernel", row_of[names[main]],
                             names[main][:_KERNEL_NAME_CHARS], replayed=[int(kernel_rows[i]) for i in run]))
        spans.add((pid, tid), lo_ns, max(hi_ns, lo_ns + width * len(found)))
    return out


def _with_breaks(order: np.ndarray, keep: np.ndarray) -> list:
    """``order`` at the positions ``keep``, with ``-1`` (no kernel: ends a run) where positions were skipped."""
    out, last = [], -2
    for k in keep.tolist():
        if k != last + 1:
            out.append(-1)
        out.append(int(order[k]))
        last = k
    return out
