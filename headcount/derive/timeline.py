"""How busy the GPU was in each step, and why it was idle (docs/reading-a-report.md § Triage).

Tables in, the ``steps`` table out (:data:`headcount.tables.STEPS`); no I/O.
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
    :data:`LAUNCH_TRAVEL_NS` after it (the launch reaching the GPU) →
    **launch-bound**; the GPU idle beyond that with N launched → **other**;
  - a gap whose N has no launch record (launched before the recording
    began, or a source without launch calls) is ``idle_unknown_ns``.

  So ``idle_launch_bound_ns + idle_sync_ns + idle_host_ns + idle_other_ns +
  idle_unknown_ns = idle_ns``. Holistic Trace Analysis splits each stream's
  gaps instead ("host wait" when the launch began after the previous kernel
  ended, "kernel wait" for gaps under a threshold, "other"): per stream, a
  kernel waiting for another stream looks idle although the GPU is busy,
  and a synchronization is never named. Here the device is idle only when
  every stream is, and the launching thread's last call says why.

- ``attention_gpu_ns``: the union of the operations attributed to attention
  (``layer_name`` set); ``attention_share_pct`` = that ÷ busy. Null when the
  recording has no attention at all (never 0 for "not found").
- ``communication_ns``: the union of collective kernels (NCCL/RCCL by name,
  :data:`COMMUNICATION`) and peer-to-peer copies.
- ``launches``: distinct launch calls of the step's operations (a CUDA graph
  launch is one call for many kernels); ``cpu_launch_cost_p50_ns`` their
  median duration; ``sync_calls``: synchronizing calls of the process that
  started in the step (any thread).

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
"""How long a launched operation may take to reach an idle GPU and start (a
few µs on NVIDIA and AMD GPUs): an idle GPU that starts it later was waiting
for something else."""

COMMUNICATION = re.compile(r"nccl|rccl", re.IGNORECASE)
"""Kernel names of collective communication (NCCL, RCCL)."""

GPU_KINDS = ("kernel", "memcpy", "memset")
KEYS = ["implementation", "pid", "device", "step"]
COLUMNS = [
    *KEYS, "basis", "window_start_ns", "window_end_ns", "window_ns", "gpu_busy_ns", "gpu_busy_pct",
    "idle_ns", "idle_launch_bound_ns", "idle_sync_ns", "idle_host_ns", "idle_other_ns", "idle_unknown_ns",
    "kernels", "kernel_ns", "kernel_p50_ns", "memcpy_ns", "memset_ns", "attention_gpu_ns", "attention_share_pct",
    "communication_ns", "launches", "cpu_launch_cost_p50_ns", "sync_calls", "provenance", "note",
]


def sync_calls(runtime: pd.DataFrame) -> pd.DataFrame:
    """The synchronizing calls (:data:`SYNC_CALL`) among runtime/driver calls
    (``pid``, ``tid``, ``name``, ``start_ns``, ``end_ns``)."""
    if runtime is None or not len(runtime) or "name" not in runtime:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (("pid", object), ("tid", object), ("name", object),
                                                                   ("start_ns", "int64"), ("end_ns", "int64"))})
    names = pd.Series(pd.Categorical(runtime["name"].astype(object)))
    codes = names.cat.codes.to_numpy()
    hit = np.append(names.cat.categories.to_series().astype(str).str.contains(SYNC_CALL).to_numpy(dtype=bool), False)
    rows = hit[np.where(codes >= 0, codes, len(hit) - 1)]  # a call without a name (code -1) is none
    out = runtime.loc[rows, ["pid", "tid", "name", "start_ns", "end_ns"]].reset_index(drop=True)
    for col in ("pid", "tid", "name"):
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    return out


def _intervals(start: np.ndarray, end: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by (group, start): the end of the union so far before
    each row (nan at a group's first row) and the union's length per row's
    contribution (so that a group's sum is its union's length)."""
    frame = pd.DataFrame({"g": group, "e": end})
    prev = frame.groupby("g", sort=False)["e"].cummax().groupby(frame["g"], sort=False).shift(1).to_numpy(np.float64)
    begin = np.where(np.isnan(prev), start, np.maximum(start, prev))
    return prev, np.maximum(end - begin, 0.0)


def _union(start: np.ndarray, end: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    """Per group code (0..n-1): the length of the union of its intervals."""
    out = np.zeros(n)
    if not len(start):
        return out
    order = np.lexsort((start, group))
    _, piece = _intervals(start[order], end[order], group[order])
    np.add.at(out, group[order], piece)
    return out


def _classify(gaps: pd.DataFrame, cpu_calls: pd.DataFrame) -> dict[str, np.ndarray]:
    """Split each gap (``a``, ``b``; ``s``, ``e`` the launch call of the op
    ending it, on ``thread``) into launch-bound, sync, host, other and unknown
    nanoseconds (the rules of the module docstring)."""
    a, b = gaps["a"].to_numpy(np.float64), gaps["b"].to_numpy(np.float64)
    s, e = gaps["s"].to_numpy(np.float64), gaps["e"].to_numpy(np.float64)
    unknown = np.isnan(s) | np.isnan(e) | pd.isna(gaps["thread"]).to_numpy()
    queued = ~unknown & (e <= a)  # launched before the GPU ran dry: it waited on something else
    late = ~unknown & ~queued
    c = np.where(late, np.clip(s, a, b), a)  # the GPU idle before the CPU began launching the op: [a, c)
    returned = np.where(late, np.clip(e, c, b), a)  # [c, returned): inside the launch call
    travel = np.where(late, np.minimum(b - returned, LAUNCH_TRAVEL_NS), 0.0)
    other = np.where(queued, b - a, np.where(late, b - returned - travel, 0.0))
    launch = np.where(late, returned - c + travel, 0.0)
    before = c - a
    q = np.full(len(gaps), np.nan)
    was_sync = np.zeros(len(gaps), dtype=bool)
    lost = np.zeros(len(gaps))
    asked = late & (before > 0)
    if asked.any() and len(cpu_calls):
        # the last call the launching thread finished before it began launching the op
        query = pd.DataFrame({"thread": gaps["thread"].to_numpy()[asked], "t": s[asked], "row": np.flatnonzero(asked)})
        query = query.sort_values("t", kind="stable")
        calls = cpu_calls.dropna(subset=["thread"]).sort_values("t", kind="stable")
        found = pd.merge_asof(query, calls, on="t", by="thread", direction="backward", allow_exact_matches=True)
        rows = found["row"].to_numpy(np.int64)
        q[rows] = found["end"].to_numpy(np.float64)
        was_sync[rows] = found["sync"].astype("boolean").fillna(False).to_numpy(bool)
        lost[rows] = found["blocked"].fillna(0.0).to_numpy(np.float64)
    caused = np.where(np.isnan(q), 0.0, np.clip(q + np.maximum(CPU_PACE_NS, lost) - a, 0.0, before))
    return {
        "idle_launch_bound_ns": launch + np.where(was_sync, 0.0, caused),
        "idle_sync_ns": np.where(was_sync, caused, 0.0),
        "idle_host_ns": before - caused,
        "idle_other_ns": other,
        "idle_unknown_ns": np.where(unknown, b - a, 0.0),
    }


def _thread_key(pid: pd.Series, tid: pd.Series) -> np.ndarray:
    p = pid.astype(object).where(pid.notna(), None).to_numpy()
    t = tid.astype(object).where(tid.notna(), None).to_numpy()
    return np.array([None if x is None or y is None else f"{x}/{y}" for x, y in zip(p, t)], dtype=object)


def _launching_process(w: pd.DataFrame) -> pd.Series:
    """Each op's launching process; an op without a launch record (launched before
    the recording began) is given its device's process where the device served one only."""
    pid = w["pid"].astype(object).where(w["pid"].notna(), None)
    if pid.notna().all():
        return pid
    known = w[pid.notna()].groupby("device")["pid"].unique()
    sole = {d: p[0] for d, p in known.items() if len(p) == 1}
    return pid.where(pid.notna(), w["device"].map(sole))


def _group_codes(frame: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Integer code per row for its (implementation, pid, device, step), and the groups' keys."""
    keys = frame[KEYS].astype(object).where(frame[KEYS].notna(), None)
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
    return codes.astype(np.int64), pd.DataFrame(list(uniques), columns=KEYS) if len(uniques) else pd.DataFrame(columns=KEYS)


def gpu_steps(work: pd.DataFrame, syncs: pd.DataFrame | None = None, attention_found: bool = True) -> pd.DataFrame:
    """The ``steps`` rows of GPU work (see the module docstring).

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
    work = work[work["kind"].astype(object).isin(GPU_KINDS).to_numpy() & work["device"].notna().to_numpy()]
    if not len(work):
        return pd.DataFrame(columns=COLUMNS)
    # times relative to the first operation: float64 is exact to the nanosecond for 104 days from it, while
    # CUPTI's absolute timestamps (~1.7e18 ns) are not (their float64 spacing is 256 ns)
    origin = int(work["start_ns"].min())

    def rel(values) -> np.ndarray:
        return (pd.to_numeric(values, errors="coerce").astype("Float64") - origin).to_numpy(np.float64, na_value=np.nan)

    w = pd.DataFrame({
        "implementation": work["implementation"].astype(object).to_numpy(),
        "pid": work["pid"].astype(object).to_numpy(),
        "device": work["device"].astype(object).to_numpy(),
        "step": pd.array(work["step"], dtype="Int64") if "step" in work else pd.array([pd.NA] * len(work), dtype="Int64"),
        "kind": work["kind"].astype(object).to_numpy(),
        "name": work["name"].astype(object).to_numpy(),
        "start": rel(work["start_ns"]),
        "end": rel(work["end_ns"]),
        "start_int": work["start_ns"].to_numpy(np.int64),
        "end_int": np.maximum(work["end_ns"].to_numpy(np.int64), work["start_ns"].to_numpy(np.int64)),
        "s": rel(work["api_start_ns"]) if "api_start_ns" in work else np.full(len(work), np.nan),
        "e": rel(work["api_end_ns"]) if "api_end_ns" in work else np.full(len(work), np.nan),
        "correlation": pd.to_numeric(work["correlation_id"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
        if "correlation_id" in work else np.full(len(work), np.nan),
        "thread": _thread_key(work["pid"], work["tid"]) if "tid" in work else np.full(len(work), None, dtype=object),
        "attention": work["layer_name"].notna().to_numpy() if "layer_name" in work else np.zeros(len(work), dtype=bool),
    })
    w["end"] = np.maximum(w["end"], w["start"])
    w["pid"] = _launching_process(w)
    group, keys = _group_codes(w)
    n = len(keys)
    w["g"] = group
    w = w.sort_values(["g", "start", "s"], kind="stable", na_position="last").reset_index(drop=True)
    g = w["g"].to_numpy(np.int64)
    start, end = w["start"].to_numpy(), w["end"].to_numpy()
    prev_end, piece = _intervals(start, end, g)
    busy = np.zeros(n)
    np.add.at(busy, g, piece)
    # the window's bounds from the integer timestamps (exact where float64 is not)
    first_int = w.groupby("g")["start_int"].min().reindex(range(n)).to_numpy(np.int64)
    last_int = w.groupby("g")["end_int"].max().reindex(range(n)).to_numpy(np.int64)
    first, last = first_int.astype(np.float64), last_int.astype(np.float64)

    gap_rows = np.flatnonzero(~np.isnan(prev_end) & (start > prev_end))
    gaps = pd.DataFrame({"g": g[gap_rows], "a": prev_end[gap_rows], "b": start[gap_rows], "s": w["s"].to_numpy()[gap_rows],
                         "e": w["e"].to_numpy()[gap_rows], "thread": w["thread"].to_numpy()[gap_rows]})
    # what each launching thread did: its launch calls (one per correlation id) and its synchronizing calls
    launches = w.dropna(subset=["s", "e"]).drop_duplicates(["thread", "correlation", "s"])
    cpu_calls = pd.DataFrame({"thread": launches["thread"].to_numpy(), "t": launches["e"].to_numpy(np.float64),
                              "end": launches["e"].to_numpy(np.float64), "sync": False, "blocked": 0.0})
    if syncs is not None and len(syncs):
        cpu_calls = pd.concat([cpu_calls, pd.DataFrame({
            "thread": _thread_key(syncs["pid"], syncs["tid"]), "t": rel(syncs["end_ns"]),
            "end": rel(syncs["end_ns"]), "sync": True,
            "blocked": (syncs["end_ns"] - syncs["start_ns"]).to_numpy(np.float64)})], ignore_index=True)
    cpu_calls["sync"] = cpu_calls["sync"].astype(bool)
    parts = _classify(gaps, cpu_calls)
    out = keys.copy()
    for name, values in parts.items():
        total = np.zeros(n)
        np.add.at(total, gaps["g"].to_numpy(np.int64), values)
        out[name] = total
    out["basis"] = "gpu_window"
    out["window_start_ns"] = pd.array(first_int, dtype="Int64")
    out["window_end_ns"] = pd.array(last_int, dtype="Int64")
    out["window_ns"] = last - first
    out["gpu_busy_ns"] = busy
    with np.errstate(divide="ignore", invalid="ignore"):
        out["gpu_busy_pct"] = np.where(out["window_ns"] > 0, 100.0 * busy / out["window_ns"], np.nan)
    out["idle_ns"] = out["window_ns"] - busy
    duration = end - start
    kinds = w["kind"].to_numpy()
    by_group = pd.DataFrame({"g": g, "d": duration, "kind": kinds})
    kernel = kinds == "kernel"
    out["kernels"] = pd.Series(kernel).groupby(g).sum().reindex(range(n), fill_value=0).to_numpy(np.int64)
    for kind, col in (("kernel", "kernel_ns"), ("memcpy", "memcpy_ns"), ("memset", "memset_ns")):
        sel = by_group[by_group["kind"] == kind]
        out[col] = sel.groupby("g")["d"].sum().reindex(range(n)).to_numpy(np.float64)
    out["kernel_p50_ns"] = by_group[kernel].groupby("g")["d"].median().reindex(range(n)).to_numpy(np.float64)
    att = w["attention"].to_numpy(bool)
    out["attention_gpu_ns"] = _union(start[att], end[att], g[att], n) if attention_found else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        out["attention_share_pct"] = np.where(busy > 0, 100.0 * out["attention_gpu_ns"] / busy, np.nan)
    names = w["name"].astype(str)
    comm = (kernel & names.str.contains(COMMUNICATION).to_numpy()) | ((kinds == "memcpy") & names.str.contains("PtoP|peer", case=False).to_numpy())
    out["communication_ns"] = _union(start[comm], end[comm], g[comm], n)
    calls = w.dropna(subset=["s", "e"]).drop_duplicates(["g", "thread", "correlation", "s"])
    out["launches"] = calls.groupby("g").size().reindex(range(n), fill_value=0).to_numpy(np.int64)
    out["cpu_launch_cost_p50_ns"] = (calls["e"] - calls["s"]).groupby(calls["g"]).median().reindex(range(n)).to_numpy(np.float64)
    out["sync_calls"] = _sync_counts(out, syncs)
    out["provenance"] = "measured"
    no_launch = out["launches"] == 0
    out["note"] = np.where(no_launch, "no launch call recorded for this work: idle time cannot be split by cause", None)
    return out.reindex(columns=COLUMNS)


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
        steps: the step ranges (``name`` ``step.N``/``step#N``, ``pid``, ``start_ns``, ``end_ns``).
        attention: the attention ranges of level ``layer`` (``start_ns``, ``end_ns``, ``step``).
        ops: the CPU operators (``pid``, ``start_ns``, ``end_ns``), for a recording without steps.
    """
    from headcount.attribute.labels import step_of

    if not len(steps):
        if ops is None or not len(ops):
            return pd.DataFrame(columns=COLUMNS)
        pid = ops["pid"].astype(str).mode()
        steps = pd.DataFrame({"name": [None], "pid": [pid.iloc[0] if len(pid) else None],
                              "start_ns": [int(ops["start_ns"].min())], "end_ns": [int(ops["end_ns"].max())]})
        attention = attention.assign(step=pd.array([pd.NA] * len(attention), dtype="Int64"))
    index = step_of(steps["start_ns"].to_numpy(np.int64), steps) if steps["name"].notna().all() else \
        pd.array([pd.NA] * len(steps), dtype="Int64")
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
        out["attention_gpu_ns"] = _union(attention["start_ns"].to_numpy(np.float64)[ok], attention["end_ns"].to_numpy(np.float64)[ok],
                                         codes[ok].to_numpy(np.int64), len(out))
    else:
        out["attention_gpu_ns"] = 0.0 if attention_found else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        out["attention_share_pct"] = np.where(out["window_ns"] > 0, 100.0 * out["attention_gpu_ns"] / out["window_ns"], np.nan)
    out["provenance"] = "measured"
    out["note"] = ("CPU run: no GPU, so no busy or idle figures; attention_gpu_ns is the union of the step's attention ranges "
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
                     "communication_ns": d[g["name"].astype(str).str.contains(COMMUNICATION).to_numpy()].sum(),
                     "provenance": "measured",
                     "note": "ncu replays kernels one at a time: no timeline, so no window, busy or idle figures; kernel and "
                             "attention time are sums of the replayed durations"})
    out = pd.DataFrame(rows).reindex(columns=COLUMNS)
    out["step"] = pd.array(out["step"], dtype="Int64")
    return out
