"""How busy the GPU was in each step, and why it was idle (docs/reading-a-report.md § Triage).

Tables in, the ``steps`` table out (:data:`headcount.common.tables.STEPS`); no I/O.
One row per implementation × process × device × step (``step`` null: GPU
work outside every step range, or a recording with no steps at all).

The rules, all on one process's work on one device within one step:

- **window**: first GPU operation's start to the last one's end
  (``window_start_ns`` … ``window_end_ns``); an operation belongs to the
  step its launch call started in (``kernels.step``; work whose launch the
  recording lacks, launched before it began, belongs to no step, and
  without any launch record at all an operation's own start decides).
- **busy** (``gpu_busy_ns``): the union of the intervals of its kernels,
  memcpys and memsets (concurrent streams count once); ``idle_ns`` = window −
  busy, made of the gaps between the union's pieces.
- **each gap** ``[a, b)`` ends when an operation N starts (the earliest at
  ``b``); its launch call ran ``[s, e]`` on thread T. The gap is split:

  - N launched before the GPU ran dry (``e ≤ a``): the whole gap is
    **other**: the GPU had the work and waited for something else (an event
    of another stream or device, another process, its own scheduling
    between kernels);
  - else, ``[a, max(a, s))``, the GPU idle before the CPU began to launch N:
    by the last call thread T finished before ``s`` — a launch call or a
    synchronizing call (:data:`SYNC_CALL`), ending at ``q``. After a launch
    call, the first :data:`CPU_PACE_NS` are **launch-bound** (the CPU was
    launching operator after operator, slower than the GPU ran them). After
    a synchronizing call that kept the CPU waiting ``D`` ns, the first
    ``max(D, CPU_PACE_NS)`` are **sync**: the CPU waited for the GPU, so
    nothing was queued behind the work it waited for, and it lost ``D`` of
    its lead. The rest of the stretch is **host**: the launching thread did
    something else for longer than that (Python, data loading, the
    framework's own work);
  - then ``[max(a, s), e)``, the CPU inside N's launch call, and the first
    *travel allowance* after it (the launch reaching the GPU) →
    **launch-bound**; the GPU idle beyond that with N launched → **other**.
    The allowance is measured: the p90 (:data:`TRAVEL_QUANTILE`) of start −
    launch call end over the row's own operations (its step, process and
    device) that were launched onto an idle stream (``launch_latency_ns``
    set, not ``queue_delay_ns``: :func:`headcount.derive.launch.latency_columns`),
    at most :data:`LAUNCH_TRAVEL_NS`; that ceiling where fewer than
    :data:`MIN_IDLE_LAUNCHES` were (``launch_travel_ns`` says which). Per
    row, so that a trace built a group of steps at a time gives the tables
    the whole trace gives;
  - a gap whose N has no launch record (launched before the recording
    began, or a source without launch calls) is ``idle_unknown_ns``.

  So ``idle_launch_bound_ns + idle_sync_ns + idle_host_ns + idle_other_ns +
  idle_unknown_ns = idle_ns``. ``idle_other_blocked_ns`` is the part of
  ``idle_other_ns`` during which N's launching thread was itself blocked in a
  synchronizing call (the CPU waited for the GPU, the GPU for an event: both
  waited on something outside the recording, such as a server waiting for
  requests); the findings claim no gain for it. Holistic Trace Analysis splits each stream's
  gaps instead ("host wait" when the launch began after the previous kernel
  ended, "kernel wait" for gaps under a threshold, "other"): per stream, a
  kernel waiting for another stream looks idle although the GPU is busy,
  and a synchronization is never named. Here the device is idle only when
  every stream is, and the launching thread's last call says why.

- ``attention_gpu_ns``: the union of the operations attributed to attention
  (``layer_name`` set); ``attention_share_pct`` = that ÷ busy. Null when the
  recording has no attention at all (never 0 for "not found"), and on a CPU
  run, whose attention time is ``attention_cpu_ns`` (the union of its
  attention ranges; ``attention_share_pct`` then its share of the step's wall time).
- ``communication_ns``: the union of collective kernels (NCCL/RCCL by name,
  :data:`COMMUNICATION`) and peer-to-peer copies.
- ``launches``: distinct launch calls of the step's operations (a CUDA graph
  launch is one call for many kernels); ``cpu_launch_cost_p50_ns`` their
  median duration; ``sync_calls``: synchronizing calls of the process that
  started in the step (any thread).
- ``queued_kernels_pct``: of the step's operations whose launch is recorded,
  the share that waited behind earlier work of their stream (the CPU was
  ahead of the GPU there); ``launch_latency_p50_ns``: the median launch
  latency of the others (launched onto an idle stream); ``launch_travel_ns``:
  the travel allowance the split above used (the row's own).

CPU runs (no GPU operation): ``basis`` ``cpu_step``: the window is the step
range itself, attention is the union of its layer ranges, and every GPU
figure is null. ncu: ``basis`` ``kernel_sum``: kernels are replayed one at a
time, so there is no window, busy or idle time; kernel and attention time
are sums of replayed durations.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headcount.common import communication
from headcount.derive import captures, columns, device_view, step_work
from headcount.derive.launch import previous_end, union_length

CPU_PACE_NS = 100_000
"""How long after a launch (or synchronizing) call the launching thread's idle
GPU is still that call's consequence: launching one PyTorch operator takes
the CPU about 5–50 µs, so a thread that launched nothing for longer was busy
with something else (host time)."""

SYNC_CALL = re.compile(
    r"^(?:cuda|cu|hip)(?:Device|Ctx|Stream|Event|Thread)Synchronize"  # explicit waits
    r"|^(?:cuda|cu|hip)Memcpy(?!\w*Async)"  # blocking copies (cudaMemcpy, cuMemcpyDtoH_v2, hipMemcpyWithStream…)
    r"|^(?:cudaFree|cuMemFree|hipFree)(?!Async)"  # frees synchronize the device implicitly
)
"""Runtime/driver calls that block the CPU until GPU work has finished."""


LAUNCH_TRAVEL_NS = 50_000
"""The most a launched operation may take to reach an idle GPU and start, from the end of its launch call: the
travel allowance where too few launches onto an idle stream measure it, and its ceiling where they do (an idle GPU
that starts the work later was waiting for something else). The H100 step measured 2.0 µs p50, 2.7 µs p90
(tests/fixtures/gpu/h100-2026-12-05, sdpa)."""

TRAVEL_QUANTILE = 0.9
"""The quantile of the measured travel (start − launch call end, launches onto an idle stream) that is the allowance:
the longest ordinary launch, not the outliers that waited on another stream's event."""

MIN_IDLE_LAUNCHES = 20
"""Launches onto an idle stream needed (per process and device) to measure the travel allowance."""


GPU_KINDS = ("kernel", "memcpy", "memset")
WORK_COLUMNS = ["kind", "implementation", "pid", "tid", "device", "step", "name", "start_ns", "end_ns", "api_start_ns",
                "api_end_ns", "correlation_id", "layer_name", "launch_latency_ns", "queue_delay_ns", "graph_id"]
"""The kernels table's columns :func:`gpu_steps` reads."""
KEYS = ["implementation", "pid", "device", "step"]
COLUMNS = [
    *KEYS, "basis", "window_start_ns", "window_end_ns", "window_ns", "gpu_busy_ns", "gpu_busy_pct",
    "idle_ns", "idle_launch_bound_ns", "idle_sync_ns", "idle_host_ns", "idle_other_ns", "idle_unknown_ns",
    "idle_other_blocked_ns", "idle_capture_ns", "own_busy_ns", "own_busy_pct", "others_busy_ns", "others_busy_pct",
    "windows_overlap", "kernels", "kernel_ns", "kernel_p50_ns", "memcpy_ns", "memset_ns", "attention_gpu_ns", "attention_cpu_ns", "attention_share_pct",
    "communication_ns", "communication_overlapped_ns", "communication_exposed_ns", "graph_launches", "graph_ops",
    "graph_busy_ns", "launches", "cpu_launch_cost_p50_ns", "sync_calls", "queued_kernels_pct", "launch_latency_p50_ns",
    "launch_travel_ns", "provenance", "note",
]


def sync_calls(runtime: pd.DataFrame) -> pd.DataFrame:
    """The synchronizing calls (:data:`SYNC_CALL`) and the graph-capture calls (:data:`CAPTURE_CALL`) among
    runtime/driver calls (``pid``, ``tid``, ``name``, ``start_ns``, ``end_ns``); ``capture`` says which."""
    if runtime is None or not len(runtime) or "name" not in runtime:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (("pid", object), ("tid", object), ("name", object),
                                                                   ("start_ns", "int64"), ("end_ns", "int64"),
                                                                   ("capture", bool))})
    codes, names = columns.codes(runtime["name"])
    at = np.where(codes >= 0, codes, len(names))  # a call without a name is none
    capture = columns.matches(names, captures.CAPTURE_CALL.pattern)
    rows = (columns.matches(names, SYNC_CALL.pattern) | capture)[at]
    out = runtime.loc[rows, ["pid", "tid", "name", "start_ns", "end_ns"]].reset_index(drop=True)
    for col in ("pid", "tid", "name"):
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    out["capture"] = capture[at][rows]
    return out


def _last_before(q_thread: np.ndarray, q_time: np.ndarray, c_thread: np.ndarray, c_time: np.ndarray) -> np.ndarray:
    """For each query (thread, time): the index of the call of that thread with the
    latest ``c_time`` ≤ the time (-1: none). Times are whole nanoseconds held as
    float64; one sorted int64 key (thread, time) answers all queries."""
    found = np.full(len(q_thread), -1, dtype=np.int64)
    if not len(q_thread) or not len(c_thread):
        return found
    threads, c_rank = np.unique(c_thread, return_inverse=True)
    lo = float(min(c_time.min(), q_time.min()))
    span = int(max(c_time.max(), q_time.max()) - lo) + 2
    if span * (len(threads) + 1) >= 2**62:  # damaged timestamps spanning centuries: per thread
        for k, t in enumerate(threads):
            mine, calls = np.flatnonzero(q_thread == t), np.flatnonzero(c_rank == k)
            order = calls[np.argsort(c_time[calls], kind="stable")]
            pos = np.searchsorted(c_time[order], q_time[mine], side="right") - 1
            found[mine] = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
        return found
    key = c_rank.astype(np.int64) * span + (c_time - lo).astype(np.int64)
    order = np.argsort(key, kind="stable")
    key = key[order]
    q_rank = np.searchsorted(threads, q_thread)
    known = (q_rank < len(threads)) & (threads[np.minimum(q_rank, len(threads) - 1)] == q_thread)
    pos = np.searchsorted(key, q_rank.astype(np.int64) * span + (q_time - lo).astype(np.int64), side="right") - 1
    same = known & (pos >= 0) & (c_rank[order[np.maximum(pos, 0)]] == q_rank)
    found[same] = order[pos[same]]
    return found


def _classify(gaps: dict[str, np.ndarray], calls: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Split each gap (``a``, ``b``; ``s``, ``e`` the launch call of the op
    ending it, on ``thread``, -1: unknown; ``travel``: its travel allowance) into launch-bound, sync, host, other
    and unknown nanoseconds (the rules of the module docstring), given the
    launching threads' ``calls`` (``thread``, ``end``, ``sync``, ``blocked``)."""
    a, b, s, e = gaps["a"], gaps["b"], gaps["s"], gaps["e"]
    unknown = np.isnan(s) | np.isnan(e) | (gaps["thread"] < 0)
    queued = ~unknown & (e <= a)  # launched before the GPU ran dry: it waited on something else
    late = ~unknown & ~queued
    c = np.where(late, np.clip(s, a, b), a)  # the GPU idle before the CPU began launching the op: [a, c)
    returned = np.where(late, np.clip(e, c, b), a)  # [c, returned): inside the launch call
    travel = np.where(late, np.minimum(b - returned, gaps["travel"]), 0.0)
    other = np.where(queued, b - a, np.where(late, b - returned - travel, 0.0))
    launch = np.where(late, returned - c + travel, 0.0)
    before = c - a
    asked = np.flatnonzero(late & (before > 0))
    # the last call the launching thread finished before it began launching the op
    last = np.full(len(a), -1, dtype=np.int64)
    last[asked] = _last_before(gaps["thread"][asked], s[asked], calls["thread"], calls["end"])
    hit = last >= 0
    at = np.maximum(last, 0)
    was_sync = hit & calls["sync"][at] if len(calls["sync"]) else hit & False
    lost = np.where(hit, calls["blocked"][at], 0.0) if len(calls["blocked"]) else np.zeros(len(a))
    q = np.where(hit, calls["end"][at], np.nan) if len(calls["end"]) else np.full(len(a), np.nan)
    caused = np.where(hit, np.clip(q + np.maximum(CPU_PACE_NS, lost) - a, 0.0, before), 0.0)
    return {
        "idle_launch_bound_ns": launch + np.where(was_sync, 0.0, caused),
        "idle_sync_ns": np.where(was_sync, caused, 0.0),
        "idle_host_ns": before - caused,
        "idle_other_ns": other,
        "idle_unknown_ns": np.where(unknown, b - a, 0.0),
        "idle_other_blocked_ns": _blocked(np.where(queued, a, returned + travel), b, other, gaps["thread"], calls),
    }


def _blocked(a: np.ndarray, b: np.ndarray, other: np.ndarray, thread: np.ndarray, calls: dict[str, np.ndarray]) -> np.ndarray:
    """Of each gap's "other" stretch ``[a, b)`` (``other`` ns long: the next operation launched, the GPU
    waiting), the part during which its launching thread was itself blocked in a synchronizing call: the CPU
    waited for the GPU and the GPU for an event, so both waited on something outside the recording (a request,
    another process, a collective's peer); ns. Only stretches longer than :data:`CPU_PACE_NS` are looked at."""
    out = np.zeros(len(a))
    sync = np.flatnonzero(calls["sync"]) if len(calls["sync"]) else np.zeros(0, dtype=np.int64)
    long = np.flatnonzero(other > CPU_PACE_NS)
    if not len(sync) or not len(long):
        return out
    by_thread = {}  # a thread is in one call at a time: its calls sorted by start are sorted by end too
    for t in np.unique(calls["thread"][sync]):
        mine = sync[calls["thread"][sync] == t]
        order = np.argsort(calls["end"][mine] - calls["blocked"][mine], kind="stable")
        by_thread[t] = ((calls["end"][mine] - calls["blocked"][mine])[order], calls["end"][mine][order])
    for i in long:
        if thread[i] not in by_thread:
            continue
        starts, ends = by_thread[thread[i]]
        lo, hi = np.searchsorted(ends, a[i], side="right"), np.searchsorted(starts, b[i], side="left")
        overlap = np.minimum(ends[lo:hi], b[i]) - np.maximum(starts[lo:hi], a[i])
        out[i] = min(float(overlap[overlap > 0].sum()), other[i])
    return out


def _first_rows(groups: np.ndarray, n: int) -> np.ndarray:
    """The first row of each group code 0..n-1."""
    first = np.full(n, -1, dtype=np.int64)
    first[groups[::-1]] = np.arange(len(groups) - 1, -1, -1)
    return first


def _launching_process(pid: np.ndarray, device: np.ndarray) -> np.ndarray:
    """Each op's launching process (codes); an op without a launch record (launched before
    the recording began) is given its device's process where the device served one only."""
    missing = pid < 0
    if not missing.any():
        return pid
    known = pd.DataFrame({"device": device[~missing], "pid": pid[~missing]}).drop_duplicates()
    per_device = known.groupby("device")["pid"]
    sole = per_device.first()[per_device.size() == 1]
    filled = pd.Series(device[missing]).map(sole).fillna(-1).to_numpy(np.int64)
    out = pid.copy()
    out[missing] = filled
    return out


def gpu_steps(work: pd.DataFrame, syncs: pd.DataFrame | None = None, attention_found: bool = True) -> pd.DataFrame:
    """The ``steps`` rows of GPU work (see the module docstring).

    Columnar: per-row work is on integer codes and float64 arrays (a large
    export's process holds a million operations); text is looked at once per
    distinct value.

    Args:
        work: the GPU rows of a kernels table (``kind`` kernel/memcpy/memset,
            ``implementation``, ``pid`` (the launching process), ``tid`` (the
            launching thread), ``device``, ``step``, ``name``, ``start_ns``,
            ``end_ns``, ``api_start_ns``, ``api_end_ns``, ``correlation_id``,
            ``layer_name``).
        syncs: synchronizing calls (:func:`sync_calls`) with their ``step``.
        attention_found: the recording has attention calls (else attention figures are null).

    Returns:
        The steps table's rows (:data:`COLUMNS`, no ``run_id``), ``basis`` ``gpu_window``.
    """
    picked = _gpu_rows(work)
    calls_seen = syncs
    if syncs is not None and "capture" in syncs:  # the capture calls mark capture spans; they explain no other gap
        syncs = syncs[~syncs["capture"].to_numpy(dtype=bool)].reset_index(drop=True)
    if picked is None:
        return pd.DataFrame(columns=COLUMNS)
    work, kind_of, device_codes, devices = picked
    # times relative to the first operation: float64 is exact to the nanosecond for 104 days from it, while
    # CUPTI's absolute timestamps (~1.7e18 ns) are not (their float64 spacing is 256 ns)
    start_int = work["start_ns"].to_numpy(np.int64)
    end_int = np.maximum(work["end_ns"].to_numpy(np.int64), start_int)
    origin = int(start_int.min())
    start, end = (start_int - origin).astype(np.float64), (end_int - origin).astype(np.float64)
    s = columns.relative(work["api_start_ns"], origin) if "api_start_ns" in work else np.full(len(work), np.nan)
    e = columns.relative(work["api_end_ns"], origin) if "api_end_ns" in work else np.full(len(work), np.nan)
    correlation = (pd.to_numeric(work["correlation_id"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
                   if "correlation_id" in work else np.full(len(work), np.nan))
    impl_codes, impls = columns.codes(work["implementation"]) if "implementation" in work else (np.zeros(len(work), np.int64), np.array(["unknown"], dtype=object))
    pid_codes, pids = columns.codes(work["pid"])
    tid_codes, tids = columns.codes(work["tid"]) if "tid" in work else (np.full(len(work), -1), np.array([], dtype=object))
    step_codes, step_values = columns.codes(pd.array(work["step"], dtype="Int64") if "step" in work else pd.array([pd.NA] * len(work), dtype="Int64"))
    name_codes, names = columns.codes(work["name"])
    pid_codes = _launching_process(pid_codes, device_codes)

    # the launching thread of each op, as one integer (-1: unknown)
    thread = np.where((pid_codes >= 0) & (tid_codes >= 0), columns.combine((pid_codes, len(pids)), (tid_codes, len(tids))), -1)
    g, n, first_row, out = _step_groups(impl_codes, impls, pid_codes, pids, device_codes, devices, step_codes, step_values)
    allowance, idle, queued = _travel_allowance(work, start, s, e, g)
    own, first, last = _own_busy(g, n, start, end, start_int, end_int, origin)
    device_group = columns.combine((impl_codes, len(impls)), (device_codes, len(devices)))  # the device seen whole
    del impl_codes, step_codes  # a large process's copies: freed before the rest
    row_device, w0, w1 = device_group[first_row], (first - origin).astype(np.float64), (last - origin).astype(np.float64)
    gap_group, a, b, at = device_view.gaps(device_group, start, end, end_int, origin, s)
    gaps = {"a": a, "b": b, "s": s[at], "e": e[at], "thread": thread[at], "travel": allowance[at]}
    one, calls = _launch_calls(s, e, thread, correlation, pid_codes, pids, tid_codes, tids, syncs, origin)
    causes = _classify(gaps, calls)
    causes.update(captures.capture_share(causes, a, b, pid_codes[at], pids, calls_seen, origin))
    for name, values in device_view.in_windows(gap_group, a, b, causes, row_device, w0, w1).items():
        out[name] = values
    busy = device_view.covered(device_view.pieces(device_group, start, end), row_device, w0, w1)
    _work_columns(out, work, kind_of, name_codes, names, g, n, start, end, first, last, busy, attention_found)
    step_work.own_columns(out, own, busy, work, kind_of, name_codes, names, g, n, start, end, device_group, row_device)
    _launch_columns(out, work, syncs, g, n, one, s, e, idle, queued, allowance, first_row)
    step_work.graph_columns(out, work, g, n, s, thread, correlation, start, end)
    step_work.overlap_note(out, w0, w1)
    return out.reindex(columns=COLUMNS)


def _own_busy(g, n, start, end, start_int, end_int, origin):
    """Per row: its own busy time (the union of its ops, ns) and its window's start and end (absolute ns)."""
    order = np.lexsort((start, g))
    g_o, start_o, end_o = g[order], start[order], end[order]
    prev_end = previous_end(g_o, end_int[order] - origin)
    piece = np.maximum(end_o - np.where(np.isnan(prev_end), start_o, np.maximum(start_o, prev_end)), 0.0)
    busy = np.bincount(g_o, weights=piece, minlength=n)
    bounds = np.flatnonzero(np.r_[True, g_o[1:] != g_o[:-1]])  # each group's first row (groups 0..n-1, in order)
    first = start_int[order][bounds]  # rows are sorted by start within a group
    last = np.maximum.reduceat(end_int[order], bounds)
    return busy, first, last


def _gpu_rows(work: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`gpu_steps`'s GPU rows of ``work`` (only the columns read), each row's kind, its device's code and the
    distinct devices; ``None`` where there are none."""
    kind_codes, kinds = columns.codes(work["kind"])
    kind_of = np.append(np.array([str(k) for k in kinds], dtype=object), None)[np.where(kind_codes >= 0, kind_codes, len(kinds))]
    device_codes, devices = columns.codes(work["device"])
    keep = np.isin(kind_of, GPU_KINDS) & (device_codes >= 0)
    if not keep.any():
        return None
    if not keep.all():  # CPU operators beside the GPU work (torch source): the GPU rows of the columns read, one copy
        rows = np.flatnonzero(keep)
        work = work.iloc[rows, [work.columns.get_loc(c) for c in WORK_COLUMNS if c in work]]
        kind_of, device_codes = kind_of[rows], device_codes[rows]
    return work, kind_of, device_codes, devices


def _step_groups(impl_codes, impls, pid_codes, pids, device_codes, devices, step_codes,
                 step_values) -> tuple[np.ndarray, int, np.ndarray, pd.DataFrame]:
    """Each op's row of the steps table (``g``: one per implementation × process × device × step, 0..n-1), the
    number of rows, each row's first op, and the rows' keys (``implementation``, ``pid``, ``device``, ``step``)."""
    group_key = columns.combine((impl_codes, len(impls)), (pid_codes, len(pids)), (device_codes, len(devices)), (step_codes, len(step_values)))
    g, _ = pd.factorize(group_key)
    g = g.astype(np.int64)
    n = int(g.max()) + 1
    first_row = _first_rows(g, n)

    def value(uniques, codes):
        return [None if c < 0 else uniques[c] for c in codes[first_row]]

    out = pd.DataFrame({"implementation": value(impls, impl_codes), "pid": [None if v is None else str(v) for v in value(pids, pid_codes)],
                        "device": value(devices, device_codes),
                        "step": pd.array([None if v is None or pd.isna(v) else int(v) for v in value(step_values, step_codes)], dtype="Int64")})
    return g, n, first_row, out


def _launch_calls(s, e, thread, correlation, pid_codes, pids, tid_codes, tids, syncs, origin) -> tuple[np.ndarray, dict]:
    """What each launching thread did: one op per launch call (``one``), and the calls :func:`_classify` reads, its
    launch calls (one per thread and correlation id) and its synchronizing calls."""
    launched = np.flatnonzero(~np.isnan(s) & ~np.isnan(e) & (thread >= 0))
    by_call = launched[np.lexsort((s[launched], np.nan_to_num(correlation[launched], nan=-1.0), thread[launched]))]
    distinct = np.r_[True, (thread[by_call][1:] != thread[by_call][:-1]) | (correlation[by_call][1:] != correlation[by_call][:-1])
                     | (s[by_call][1:] != s[by_call][:-1])] if len(by_call) else np.zeros(0, dtype=bool)
    one = by_call[distinct]  # one row per launch call (a graph launch runs many kernels)
    calls = {"thread": thread[one], "end": e[one], "sync": np.zeros(len(one), dtype=bool), "blocked": np.zeros(len(one))}
    if syncs is not None and len(syncs):
        pairs = pd.DataFrame({"p": pid_codes[launched], "t": tid_codes[launched], "thread": thread[launched]}).drop_duplicates()
        thread_of = {(str(pids[p]), str(tids[t])): k for p, t, k in pairs.itertuples(index=False)}
        sync_thread = np.array([thread_of.get((str(p), str(t)), -1) for p, t in zip(syncs["pid"], syncs["tid"])], dtype=np.int64)
        mine = sync_thread >= 0  # a synchronizing thread that launched nothing here explains no gap
        calls = {"thread": np.r_[calls["thread"], sync_thread[mine]], "end": np.r_[calls["end"], columns.relative(syncs["end_ns"], origin)[mine]],
                 "sync": np.r_[calls["sync"], np.ones(int(mine.sum()), dtype=bool)],
                 "blocked": np.r_[calls["blocked"], (syncs["end_ns"] - syncs["start_ns"]).to_numpy(np.float64)[mine]]}
    return one, calls


def _work_columns(out, work, kind_of, name_codes, names, g, n, start, end, first, last, busy, attention_found) -> None:
    """Fill ``out``'s window, busy, kernel, copy, attention and communication columns."""
    out["basis"] = "gpu_window"
    out["window_start_ns"] = pd.array(first, dtype="Int64")
    out["window_end_ns"] = pd.array(last, dtype="Int64")
    out["window_ns"] = (last - first).astype(np.float64)
    out["gpu_busy_ns"] = busy
    with np.errstate(divide="ignore", invalid="ignore"):
        out["gpu_busy_pct"] = np.where(out["window_ns"] > 0, 100.0 * busy / out["window_ns"], np.nan)
    out["idle_ns"] = out["window_ns"] - busy
    duration = end - start
    kernel = kind_of == "kernel"
    out["kernels"] = np.bincount(g[kernel], minlength=n).astype(np.int64)
    for kind, col in (("kernel", "kernel_ns"), ("memcpy", "memcpy_ns"), ("memset", "memset_ns")):
        sel = kind_of == kind
        total = np.bincount(g[sel], weights=duration[sel], minlength=n)
        out[col] = np.where(np.bincount(g[sel], minlength=n) > 0, total, np.nan)
    out["kernel_p50_ns"] = pd.Series(duration[kernel]).groupby(g[kernel]).median().reindex(range(n)).to_numpy(np.float64)
    att = work["layer_name"].notna().to_numpy() if "layer_name" in work else np.zeros(len(work), dtype=bool)
    out["attention_gpu_ns"] = union_length(g[att], start[att], end[att], n) if attention_found else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        out["attention_share_pct"] = np.where(busy > 0, 100.0 * out["attention_gpu_ns"] / busy, np.nan)
    comm = step_work.communication_rows(kind_of, name_codes, names)
    out["communication_ns"] = union_length(g[comm], start[comm], end[comm], n)


def _launch_columns(out, work, syncs, g, n, one, s, e, idle, queued, allowance, first_row) -> None:
    """Fill ``out``'s launch, sync-call, queueing, latency and travel columns, provenance and note."""
    out["launches"] = np.bincount(g[one], minlength=n).astype(np.int64)
    out["cpu_launch_cost_p50_ns"] = pd.Series(e[one] - s[one]).groupby(g[one]).median().reindex(range(n)).to_numpy(np.float64)
    out["sync_calls"] = _sync_counts(out, syncs)
    launched_ops = idle | queued
    with np.errstate(divide="ignore", invalid="ignore"):
        counted = np.bincount(g[launched_ops], minlength=n)
        out["queued_kernels_pct"] = np.where(counted > 0, 100.0 * np.bincount(g[queued], minlength=n) / counted, np.nan)
    latency = pd.to_numeric(work["launch_latency_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan) \
        if "launch_latency_ns" in work else np.full(len(work), np.nan)
    out["launch_latency_p50_ns"] = pd.Series(latency[idle]).groupby(g[idle]).median().reindex(range(n)).to_numpy(np.float64)
    out["launch_travel_ns"] = allowance[first_row]
    out["provenance"] = "measured"
    out["note"] = np.where(out["launches"] == 0, "no launch call recorded for this work: idle time cannot be split by cause", None)


def _travel_allowance(work: pd.DataFrame, start: np.ndarray, s: np.ndarray, e: np.ndarray,
                      g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op: the travel allowance of its row ``g`` (ns; the module docstring), and whether it was launched onto an
    idle stream (``launch_latency_ns`` set) or waited behind earlier work (``queue_delay_ns`` set), with its launch
    call known. Times relative, float64 (exact differences)."""
    def column(name):
        return (pd.to_numeric(work[name], errors="coerce").to_numpy(np.float64, na_value=np.nan) if name in work
                else np.full(len(work), np.nan))

    known = ~np.isnan(s) & ~np.isnan(e)
    idle = known & ~np.isnan(column("launch_latency_ns"))
    queued = known & ~np.isnan(column("queue_delay_ns"))
    allowance = np.full(int(g.max()) + 1 if len(g) else 0, float(LAUNCH_TRAVEL_NS))
    if idle.sum() >= MIN_IDLE_LAUNCHES:
        travel = pd.Series(start[idle] - e[idle]).groupby(g[idle])
        measured = travel.quantile(TRAVEL_QUANTILE)[travel.size() >= MIN_IDLE_LAUNCHES].clip(0.0, LAUNCH_TRAVEL_NS)
        allowance[measured.index.to_numpy(np.int64)] = measured.to_numpy(np.float64)
    return allowance[g], idle, queued


def _sync_counts(rows: pd.DataFrame, syncs: pd.DataFrame | None) -> np.ndarray:
    """Synchronizing calls of each row's process that started in its step (null: calls not recorded)."""
    if syncs is None:
        return pd.array([pd.NA] * len(rows), dtype="Int64")
    if not len(syncs):
        return np.zeros(len(rows), dtype=np.int64)
    step = pd.array(syncs["step"], dtype="Int64") if "step" in syncs else pd.array([pd.NA] * len(syncs), dtype="Int64")
    calls = pd.DataFrame({"pid": syncs["pid"].astype(str).to_numpy(), "step": step.fillna(-1).to_numpy(np.int64)})
    counts = calls.groupby(["pid", "step"]).size()
    keys = pd.MultiIndex.from_arrays([rows["pid"].astype(str).to_numpy(),
                                      pd.array(rows["step"], dtype="Int64").fillna(-1).to_numpy(np.int64)])
    return counts.reindex(keys, fill_value=0).to_numpy(np.int64)


def cpu_steps(steps: pd.DataFrame, attention: pd.DataFrame, implementation: str, attention_found: bool = True,
              ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``steps`` rows of a CPU run: one per step range, or one for the whole
    recording (its operators' first start to last end) when it has no steps.

    Args:
        steps: the step ranges (``name`` ``step.N``/``step#N``, ``pid``, ``start_ns``, ``end_ns``, and
            ``step``: the index each names (null: not a numbered step)).
        attention: the attention ranges of level ``layer`` (``start_ns``, ``end_ns``, ``step``).
        ops: the CPU operators (``pid``, ``start_ns``, ``end_ns``), for a recording without steps.
    """
    if not len(steps):
        if ops is None or not len(ops):
            return pd.DataFrame(columns=COLUMNS)
        pid = ops["pid"].astype(str).mode()
        steps = pd.DataFrame({"name": [None], "pid": [pid.iloc[0] if len(pid) else None],
                              "start_ns": [int(ops["start_ns"].min())], "end_ns": [int(ops["end_ns"].max())],
                              "step": pd.array([pd.NA], dtype="Int64")})
        attention = attention.assign(step=pd.array([pd.NA] * len(attention), dtype="Int64"))
    index = pd.array(steps["step"], dtype="Int64")
    out = pd.DataFrame({"implementation": implementation, "pid": steps["pid"].astype(str).to_numpy(), "device": "cpu",
                        "step": index, "basis": "cpu_step",
                        "window_start_ns": pd.array(steps["start_ns"].to_numpy(np.int64), dtype="Int64"),
                        "window_end_ns": pd.array(steps["end_ns"].to_numpy(np.int64), dtype="Int64")})
    out["window_ns"] = (steps["end_ns"] - steps["start_ns"]).to_numpy(np.float64)
    if attention_found and len(attention):
        if out["step"].isna().all():  # the whole recording: every attention range
            codes = pd.Series(np.zeros(len(attention)))
        else:
            codes = pd.Series(pd.array(attention["step"], dtype="Int64")).map({s: i for i, s in enumerate(out["step"]) if pd.notna(s)})
        ok = codes.notna().to_numpy()
        out["attention_cpu_ns"] = union_length(codes[ok].to_numpy(np.int64), attention["start_ns"].to_numpy(np.float64)[ok],
                                               attention["end_ns"].to_numpy(np.float64)[ok], len(out))
    else:
        out["attention_cpu_ns"] = 0.0 if attention_found else np.nan
    out["attention_gpu_ns"] = np.nan  # no GPU ran: CPU time never goes in a GPU column
    with np.errstate(divide="ignore", invalid="ignore"):
        out["attention_share_pct"] = np.where(out["window_ns"] > 0, 100.0 * out["attention_cpu_ns"] / out["window_ns"], np.nan)
    out["provenance"] = "measured"
    out["note"] = ("CPU run: no GPU, so no busy or idle figures; attention_cpu_ns is the union of the step's attention ranges "
                   "on the CPU and attention_share_pct its share of the step's wall time")
    return out.reindex(columns=COLUMNS)


def kernel_sum_steps(kernels: pd.DataFrame, implementation: str = "unknown") -> pd.DataFrame:
    """The one ``steps`` row of an ncu recording per device: kernel counts and
    summed replayed durations; no window, busy or idle figure (ncu replays
    kernels one at a time)."""
    if not len(kernels):
        return pd.DataFrame(columns=COLUMNS)
    k = kernels.assign(_device=kernels["device"].astype(object) if "device" in kernels else None)
    found = "layer_name" in k and k["layer_name"].notna().any()
    rows = []
    for device, g in k.groupby("_device", dropna=False, sort=True):
        d = pd.to_numeric(g["duration_ns"], errors="coerce").astype("float64")
        att = g["layer_name"].notna().to_numpy() if "layer_name" in g else np.zeros(len(g), dtype=bool)
        total = d.sum(min_count=1)
        attention = d[att].sum() if found else np.nan
        rows.append({"implementation": implementation, "pid": None, "device": None if pd.isna(device) else device, "step": pd.NA,
                     "basis": "kernel_sum", "kernels": len(g), "kernel_ns": total, "kernel_p50_ns": d.median(),
                     "attention_gpu_ns": attention,
                     "attention_share_pct": 100.0 * attention / total if total and not pd.isna(total) else np.nan,
                     "communication_ns": d[np.array([communication.kind_of(str(v)) is not None for v in g["name"]], dtype=bool)].sum(),
                     "provenance": "measured",
                     "note": "ncu replays kernels one at a time: no timeline, so no window, busy or idle figures; kernel and "
                             "attention time are sums of the replayed durations"})
    out = pd.DataFrame(rows).reindex(columns=COLUMNS)
    out["step"] = pd.array(out["step"], dtype="Int64")
    return out
