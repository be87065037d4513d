"""Kernels replayed from CUDA graphs: attributed to the range that captured them.

A graph replay is one launch call (``cudaGraphLaunch``) for every kernel of
the graph, often made outside every attention range, so the plain rule
(:mod:`headcount.attribute.attribution`: the range around the launch call)
sees none of them. Each replayed kernel carries the id of the graph node it
ran from, and a node is made on the capturing thread, inside the capture's
launch call, while the ranges of the layer being captured are open: the
range open at that moment is where the kernel belongs (the rule nsys's own
``nvtx_gpu_proj_trace`` applies to graph nodes). An executable graph's nodes
are clones of the captured ones and name their original.

One captured range stands for every replay of it, so each replay gets its
own *replay instance* of the captured range and of its ancestors: the same
name and path (so the same phase, layer and head), on the thread and at the
CPU time of the replay's launch call (so the replay's step), with
``replay_of`` naming the captured range. The replay's kernels belong to the
instance, and counts, first and last kernel and per-call figures follow as
for any range. A captured range that launched no kernel of its own (a
capture runs nothing) is *capture only*: it stays in ``ranges`` but is not a
call of the figures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.attribute.nesting import ancestor_rows, innermost_range
from headcount.common.arrays import positions

NO_RANGE = -1  # a node made outside every range


def follow_clones(made: dict[int, int | None], origin: dict[int, int]) -> dict[int, int]:
    """Node id → ``range_id`` of the range that made it (:data:`NO_RANGE`: made
    outside every range), for made nodes and, through their originals, for
    clones (a clone of a clone is followed back). Nodes whose making was not
    recorded are absent.

    Args:
        made: node id → the range open when it was made (``None``: none).
        origin: clone node id → the node it was cloned from.
    """
    out = {node: NO_RANGE if rid is None else int(rid) for node, rid in made.items()}
    for node in origin:
        seen, current = set(), node
        while current in origin and current not in made and current not in seen:
            seen.add(current)
            current = origin[current]
        if current in made:
            out[node] = out[current]
    return out


def captured_by_external_id(graph_nodes: dict[int, int], ranges: pd.DataFrame) -> dict[int, int]:
    """Node id → the range that captured it, from the external correlation id each
    node's making carried (the cupti source's records); :data:`NO_RANGE` where it
    carried none of ``ranges``' ids."""
    by_external = dict(zip(ranges["external_id"].astype("int64"), ranges["range_id"].astype("int64")))
    return {node: by_external.get(ext, NO_RANGE) for node, ext in graph_nodes.items()}


def capture_ranges(nodes: pd.DataFrame, ranges: pd.DataFrame) -> dict[int, int]:
    """Node id → the range that captured it, from node-making events with times
    (an nsys export's graph node events).

    Args:
        nodes: ``node_id``, ``original_node_id`` (null for a made node), and for
            made nodes ``pid``, ``tid``, ``start_ns``, ``end_ns`` of the call
            that made the node.
        ranges: nested ranges (:func:`~headcount.attribute.nesting.nest_ranges`)
            of the domain to attribute to.
    """
    if not len(nodes):
        return {}
    original = pd.to_numeric(nodes["original_node_id"], errors="coerce")
    made = nodes[original.isna().to_numpy()].reset_index(drop=True)
    inner = innermost_range(made.astype({"start_ns": "int64", "end_ns": "int64"}), ranges) if len(made) else []
    made_map = {int(n): (int(r) if r >= 0 else None) for n, r in zip(made["node_id"], inner)}
    clones = nodes[original.notna().to_numpy()]
    origin = dict(zip(clones["node_id"].astype("int64").tolist(), original[original.notna()].astype("int64").tolist()))
    return follow_clones(made_map, origin)


def replay_instances(ranges: pd.DataFrame, work: pd.DataFrame, inner: np.ndarray,
                     captured: dict[int, int], replayable: np.ndarray | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Give replayed kernels their replay instances (see the module docstring).

    Args:
        ranges: nested ranges (``range_id``, ``parent_range_id`` and the rest
            of :func:`~headcount.attribute.nesting.nest_ranges`' columns).
        work: GPU work with ``graph_node_id``, ``correlation_id`` and its launch
            call (``launch_pid``, ``launch_tid``, ``api_start_ns``, ``api_end_ns``:
            :func:`~headcount.attribute.attribution.launches`).
        inner: each work row's innermost range by the plain rule (-1: none).
        captured: node id → capturing range (:func:`follow_clones`, :func:`capture_ranges`).
        replayable: rows of ``ranges`` that get replay instances (default: all).
            The others (step ranges, which enclose a whole step and are matched
            by time) are skipped: a kernel captured in one belongs to its
            nearest replayable ancestor, or to none.

    Returns:
        ``(ranges, inner)``: ``ranges`` with the replay instances appended, a
        ``replay_of`` column (null for recorded ranges) and ``graph_capture``
        (a recorded range in which nodes of replayed kernels were made); ``inner`` with replayed
        kernels moved to their instances (-1 for nodes made outside every range;
        kernels of nodes whose making was not recorded, and kernels replayed
        inside a range of their capturing range's path, keep the plain rule).
    """
    ranges = ranges.assign(replay_of=pd.array([pd.NA] * len(ranges), dtype="Int64"), graph_capture=False)
    inner = np.asarray(inner, dtype=np.int64).copy()
    if "graph_node_id" not in work.columns or not captured or not len(ranges):
        return ranges, inner
    node = pd.to_numeric(work["graph_node_id"], errors="coerce")
    known = node.notna().to_numpy() & node.isin(list(captured)).to_numpy()
    known &= work["api_start_ns"].notna().to_numpy()  # an instance needs its replay's launch call
    if not known.any():
        return ranges, inner
    rows = np.flatnonzero(known)
    capturing = np.array([captured[int(n)] for n in node.to_numpy()[rows]], dtype=np.int64)
    inner[rows[capturing == NO_RANGE]] = -1
    rows, capturing = rows[capturing != NO_RANGE], capturing[capturing != NO_RANGE]
    ids = ranges["range_id"].to_numpy(np.int64)
    present = positions(ids, capturing) >= 0
    rows, capturing = rows[present], capturing[present]
    levels = ancestor_rows(ranges, capturing)  # levels[0]: the capturing range's row, then its parent's, …
    made = np.zeros(len(ranges), dtype=bool)  # ranges in which nodes of the replayed kernels were made
    for level in levels:
        made[level[level >= 0]] = True
    ranges["graph_capture"] = made
    # a replay launched inside a range of the capturing range's own path has that range for
    # its instance already (a graph split at every range edge, as Inductor does around
    # headcount's markers, replays each piece inside the live ranges): the plain rule holds
    label = "path" if "path" in ranges.columns else "name"
    text = ranges[label].astype(object).to_numpy()
    live = positions(ids, inner[rows])
    same = (live >= 0) & (text[np.maximum(live, 0)] == text[positions(ids, capturing)])
    rows, capturing, levels = rows[~same], capturing[~same], [level[~same] for level in levels]
    if not len(rows):
        return ranges, inner
    return _with_instances(ranges, work, inner, rows, levels, replayable)


def _with_instances(ranges: pd.DataFrame, work: pd.DataFrame, inner: np.ndarray, rows: np.ndarray, levels: list,
                    replayable: np.ndarray | None) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`replay_instances` once the replayed kernels are known: ``rows`` of ``work``, ``levels`` their
    capturing ranges' rows and those of their ancestors (:func:`~headcount.attribute.nesting.ancestor_rows`).
    Returns ``ranges`` with the instances appended and ``inner`` with those kernels moved to them."""
    ids = ranges["range_id"].to_numpy(np.int64)
    # one replay = one launch call: (launching process, correlation id)
    pid_code, _ = pd.factorize(work["launch_pid"].to_numpy()[rows])
    correlation = pd.to_numeric(work["correlation_id"]).to_numpy(np.int64)[rows]
    replay, _ = pd.factorize(pid_code.astype(np.int64) * (int(correlation.max()) + 1) + correlation)
    if replayable is not None:
        levels = [np.where((level >= 0) & replayable[np.maximum(level, 0)], level, -1) for level in levels]
    own_row = np.full(len(rows), -1, dtype=np.int64)  # the innermost replayable range of each kernel
    for level in reversed(levels):
        own_row = np.where(level >= 0, level, own_row)
    n_ranges = len(ranges)
    pair_replay = np.concatenate([replay[level >= 0] for level in levels])
    pair_row = np.concatenate([level[level >= 0] for level in levels])
    pair_keys = np.unique(pair_replay.astype(np.int64) * n_ranges + pair_row)
    if not len(pair_keys):  # every node was captured outside the replayable ranges
        inner[rows] = -1
        return ranges, inner
    inst_replay, inst_row = pair_keys // n_ranges, pair_keys % n_ranges
    new_ids = int(ids.max()) + 1 + np.arange(len(pair_keys), dtype=np.int64)

    parent_at, has_parent = _instance_parents(ranges, ids, inst_replay, inst_row, pair_keys, levels, replayable)

    first_row = pd.Series(rows).groupby(replay).first().to_numpy()  # one work row per replay: its launch call
    launch = work.iloc[first_row[inst_replay]]
    instances = ranges.iloc[inst_row].copy()
    instances["range_id"] = new_ids
    instances["parent_range_id"] = np.where(has_parent, new_ids[parent_at], -1)
    instances["replay_of"] = pd.array(ids[inst_row], dtype="Int64")
    instances["graph_capture"] = False
    instances["pid"] = _like(ranges["pid"], launch["launch_pid"])
    instances["tid"] = _like(ranges["tid"], launch["launch_tid"])
    instances["start_ns"] = launch["api_start_ns"].to_numpy(np.int64)
    instances["end_ns"] = launch["api_end_ns"].to_numpy(np.int64)
    if "external_id" in instances.columns:
        instances["external_id"] = pd.NA
    if "nested" in instances.columns:
        instances["nested"] = True  # an instance's kernels are assigned by id, never by time

    own_key = replay * n_ranges + np.maximum(own_row, 0)
    inner[rows] = np.where(own_row >= 0, new_ids[np.minimum(np.searchsorted(pair_keys, own_key), len(pair_keys) - 1)], -1)
    out = pd.concat([ranges, instances], ignore_index=True)
    for col in ranges.columns[[isinstance(t, pd.CategoricalDtype) for t in ranges.dtypes]]:
        out[col] = pd.Categorical(out[col].astype(object))  # the instances' pids and tids may be new categories
    return out, inner


def _instance_parents(ranges: pd.DataFrame, ids: np.ndarray, inst_replay: np.ndarray, inst_row: np.ndarray,
                     pair_keys: np.ndarray, levels: list, replayable: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per replay instance (``pair_keys``: replay × ``len(ranges)`` + row, sorted), where its parent instance is
    in ``pair_keys`` and whether it has one."""
    n_ranges = len(ranges)
    # an instance's parent: the instance, in the same replay, of its range's nearest replayable ancestor
    parent_of = positions(ids, ranges["parent_range_id"].to_numpy(np.int64))
    parent_row = parent_of[inst_row]
    if replayable is not None:
        for _ in range(len(levels)):
            skip = (parent_row >= 0) & ~replayable[np.maximum(parent_row, 0)]
            if not skip.any():
                break
            parent_row = np.where(skip, parent_of[np.maximum(parent_row, 0)], parent_row)
    parent_key = inst_replay * n_ranges + np.maximum(parent_row, 0)
    parent_at = np.minimum(np.searchsorted(pair_keys, parent_key), len(pair_keys) - 1)
    has_parent = (parent_row >= 0) & (pair_keys[parent_at] == parent_key)
    return parent_at, has_parent


def _like(template: pd.Series, values: pd.Series) -> np.ndarray:
    """``values`` as plain strings when ``template`` holds strings (pids and tids are text in every table)."""
    return values.astype(str).to_numpy(dtype=object) if template.dtype == object or isinstance(template.dtype, pd.CategoricalDtype) \
        else values.to_numpy()


def capture_only(ranges: pd.DataFrame) -> np.ndarray:
    """Rows of recorded ranges in which graph nodes that were later replayed
    were made (``graph_capture``, :func:`replay_instances`) and that launched
    no GPU work of their own (a capture runs nothing): not calls."""
    if "graph_capture" not in ranges.columns:
        return np.zeros(len(ranges), dtype=bool)
    ops = pd.to_numeric(ranges["gpu_op_count"], errors="coerce").fillna(0).to_numpy() if "gpu_op_count" in ranges else 0
    return ranges["graph_capture"].fillna(False).to_numpy(dtype=bool) & (ops == 0)
