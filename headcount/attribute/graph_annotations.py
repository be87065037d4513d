"""CUDA-graph kernel annotations as ranges: what torch 2.15's ``torch.cuda.graph_annotations.mark_kernels`` labels
at capture and ``prof.export_chrome_trace(path, cuda_graph_annotations=get_kernel_annotations())`` bakes into the
``args`` of each replayed kernel (its annotation's keys, values as text; backward work also
``"autograd_phase": "backward"``).

A replay's kernels carry no range of the thread that launched the graph (the capture's ranges ran once, at
capture), so without these labels they count for the range around the graph launch. Here each graph launch's
kernels with one annotation become one range instance, on the launching thread's replay lane
(:data:`headcount.common.process_ids.REPLAY_LANE`), spanning its kernels' GPU times, its kernels assigned to it by
key (:data:`headcount.attribute.untagged.CALL_KEY`), whatever else the launch holds:

- ``"name": "headcount@fwd/layer.3"`` (``…/head.2``), what headcount's tagger marks inside a capture: headcount's
  phase and layer (and head) ranges, the phase ``bwd`` for backward work — the replay's calls land in their layers;
- any other ``name`` (the user's own ``mark_kernels`` labels): a range of the recording's own annotations
  (domain :data:`~headcount.common.naming.USER_DOMAIN`), `` (backward)`` appended for backward work.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.attribute.untagged import CALL_KEY
from headcount.common.naming import DOMAIN
from headcount.common.process_ids import REPLAY_LANE

KEY_BASE = 1 << 40  # annotation keys, apart from the untagged finder's (0, 1, …)
_GPU = ("kernel", "memcpy", "memset")


def with_annotated_ranges(events: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``events`` (:func:`headcount.parsers.kineto_json.events_frame`) with a range per graph launch and annotation
    (module docstring) appended, and :data:`CALL_KEY` on the annotated GPU rows; the notices. Unchanged where
    no GPU row carries an annotation."""
    if "graph_annotation" not in events:
        return events, []
    kind = events["kind"].to_numpy(object)
    labelled = np.isin(kind, _GPU) & events["graph_annotation"].notna().to_numpy(dtype=bool)
    if not labelled.any():
        return events, []
    rows = np.flatnonzero(labelled)
    work = events.iloc[rows]
    correlation = pd.array(work["correlation_id"], dtype="Int64")
    runtime = events[(kind == "runtime") & events["correlation_id"].notna().to_numpy(dtype=bool)]
    runtime = runtime.drop_duplicates("correlation_id")
    launch = runtime.set_index(pd.Index(pd.array(runtime["correlation_id"], dtype="Int64")))
    backward = work["autograd_phase"].astype(object).fillna("").astype(str).str.lower().eq("backward").to_numpy(dtype=bool)
    groups = pd.DataFrame({"row": rows, "correlation": correlation, "name": work["graph_annotation"].astype(str).to_numpy(),
                           "backward": backward, "start": work["start_ns"].to_numpy(np.int64), "end": work["end_ns"].to_numpy(np.int64)})
    unlaunched = groups["correlation"].isna() | ~groups["correlation"].isin(launch.index)
    notices = []
    if unlaunched.any():
        notices.append(f"{int(unlaunched.sum())} GPU operations carry a CUDA-graph annotation but no graph launch of theirs is in "
                       "the trace (replayed before it began): counted, in no annotated range")
    groups = groups[~unlaunched.to_numpy(dtype=bool)]
    keys = np.full(len(events), -1, dtype=np.int64)
    new, ours, theirs = [], 0, 0
    for n, ((corr, name, back), g) in enumerate(groups.groupby(["correlation", "name", "backward"], sort=False)):
        key = KEY_BASE + n
        keys[g["row"].to_numpy(np.int64)] = key
        call = launch.loc[corr]
        pid, tid = call["pid"], f"{call['tid']}{REPLAY_LANE}"
        start, end = int(g["start"].min()), int(g["end"].max())
        if name.startswith(DOMAIN + "@"):
            ours += 1
            path = name.split("@", 1)[1].split("/")
            if back and path and path[0] == "fwd":
                path[0] = "bwd"
            # as the tagger nests them: phase around layer around head, each 1 ns wider than the next
            for depth, part in enumerate(path):
                pad = len(path) - 1 - depth
                new.append(_range(events, f"{DOMAIN}@{part}", pid, tid, start - pad, end + pad, key if depth == len(path) - 1 else -1))
        else:
            theirs += 1
            new.append(_range(events, name + (" (backward)" if back else ""), pid, tid, start, end, key))
    if not new:
        return events, notices
    out = events.assign(**{CALL_KEY: np.where(keys >= 0, keys, call_keys(events))})
    ranges = pd.DataFrame(new, columns=[*out.columns])
    for column in ("start_ns", "end_ns", CALL_KEY):
        ranges[column] = ranges[column].astype("int64")
    launches = groups["correlation"].nunique()
    said = []
    if ours:
        said.append(f"{ours} headcount calls")
    if theirs:
        said.append(f"{theirs} annotated regions of your own")
    notices.append(f"CUDA-graph kernel annotations: {' and '.join(said)} in {launches} graph replays, from "
                   f"{len(groups)} annotated GPU operations (torch.cuda.graph_annotations, baked by export_chrome_trace)")
    return pd.concat([out, ranges], ignore_index=True), notices


def call_keys(events: pd.DataFrame) -> np.ndarray:
    """Each row's :data:`CALL_KEY` (-1: none, or no such column)."""
    if CALL_KEY not in events:
        return np.full(len(events), -1, dtype=np.int64)
    return pd.array(events[CALL_KEY], dtype="Int64").to_numpy(np.int64, na_value=-1)


def _range(events: pd.DataFrame, name: str, pid, tid, start: int, end: int, key: int) -> dict:
    return {**{c: None for c in events.columns}, "kind": "range", "name": name, "pid": pid, "tid": tid,
            "start_ns": start, "end_ns": end, CALL_KEY: key}
