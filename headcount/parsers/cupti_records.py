"""Read the cupti source's records file into the events table.

The file (``cupti-records.jsonl.gz``, written by
:class:`headcount.collector.cupti_source.CuptiRecorder`) holds a header line,
headcount's ranges (with their external correlation ids), then CUPTI's
records as plain dicts: kernels, memcpys and memsets, runtime and driver API calls, external
correlations, NVTX markers and PM samples. Timestamps are CUPTI's
nanoseconds.

:func:`events_frame` gives the same columns as the Kineto events table
(:mod:`headcount.parsers.kineto_json`) plus what CUPTI adds, so the shared
attribution runs on it unchanged:

=================================  ============================================
``external_id``                    ranges: their id; kernels and API calls: the
                                   innermost headcount range open on the
                                   launching thread (CUPTI external correlation;
                                   for a kernel replayed from a CUDA graph, the
                                   range around the graph launch: the range
                                   that captured its node comes from :func:`graph_nodes`,
                                   which attribution uses)
``queued_ns``, ``submitted_ns``    kernel queued to / submitted from the command
                                   buffer (null where CUPTI gives none)
``block_threads``                  threads per block
``shared_memory_static_bytes``,    per block
``shared_memory_dynamic_bytes``
``shared_memory_config_bytes``     shared memory per SM the driver configured
``local_memory_per_thread_bytes``
``graph_id``, ``launch_type``
=================================  ============================================
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from headcount.common.errors import HeadcountError
from headcount.parsers.files import unreadable
from headcount.parsers.kineto_json import COLUMNS

FORMAT = "headcount-cupti-records"
READ_CHUNK_BYTES = 64 << 20  # of decompressed JSON lines, decoded at once (msgspec: 3× faster than the json module)
_JSON = msgspec.json.Decoder()
EXTRA = [
    "external_id", "queued_ns", "submitted_ns", "block_threads", "shared_memory_static_bytes",
    "shared_memory_dynamic_bytes", "shared_memory_config_bytes", "local_memory_per_thread_bytes", "graph_id", "launch_type",
]


HINT = "pass the cupti-records.jsonl.gz that `headcount profile --backend cupti --trace-dir DIR` or `headcount run --backend cupti` wrote"


def read_header(path: str | Path) -> dict:
    """The header line of a records file alone (``pid``, ``stats``, ``notices``; one line decompressed).

    Raises:
        HeadcountError: missing, unreadable, not gzip, or not a headcount records file.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            first = fh.readline(1 << 20)
    except (FileNotFoundError, PermissionError) as exc:
        raise unreadable(path, exc) from exc
    except (OSError, EOFError, zlib.error) as exc:
        raise HeadcountError(f"{path}: unreadable or truncated CUPTI records file ({type(exc).__name__}: {exc})",
                             hint="record it again; a run that was killed leaves no complete file") from exc
    return _header(path, first)


def _header(path: Path, first: bytes) -> dict:
    try:
        header = _JSON.decode(first) if first.strip() else None
    except msgspec.DecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise HeadcountError(f"{path}: not a headcount CUPTI records file", hint=HINT)
    return header


def read_records(path: str | Path) -> tuple[dict, list[dict]]:
    """The header and the records of a records file.

    Raises:
        HeadcountError: missing, truncated, not gzip/JSON, or not a headcount
            records file.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            header = _header(path, fh.readline())
            records = []
            while chunk := fh.readlines(READ_CHUNK_BYTES):  # whole lines, a bounded piece at a time
                try:
                    records += _JSON.decode_lines(b"".join(chunk))
                except msgspec.DecodeError:  # NaN, as files the json module wrote (headcount before 2026-12-05) may hold
                    records += [json.loads(line) for line in chunk if line.strip()]
    except (FileNotFoundError, PermissionError) as exc:
        raise unreadable(path, exc) from exc
    except (OSError, EOFError, zlib.error, msgspec.DecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeadcountError(f"{path}: unreadable or truncated CUPTI records file ({type(exc).__name__}: {exc})",
                             hint="record it again; a run that was killed leaves no complete file") from exc
    return header, records


def graph_nodes(records: list[dict]) -> tuple[dict[int, int | None], dict[int, int]]:
    """What the records say of CUDA graph nodes: ``(made, origin)``, node id →
    ``id`` of the headcount range open when the node was made
    (:class:`~headcount.collector.cupti_logs.GraphNodeLog`; ``None``: made
    outside every range), and clone node id → the node it was cloned from.
    :func:`headcount.attribute.graphs.follow_clones` resolves clones to the
    range that made their original."""
    made = {r["node_id"]: r.get("range_id") for r in records if r["kind"] == "graph_node"}
    origin = {r["node_id"]: r["original_node_id"] for r in records if r["kind"] == "graph_node_clone"}
    return made, origin


def without_open_ranges(records: list[dict]) -> tuple[list[dict], int]:
    """``records`` less the range records never closed, and how many they were (a recording a signal stopped)."""
    kept = [r for r in records if not (r["kind"] == "range" and r.get("end") is None)]
    return kept, len(records) - len(kept)


def events_frame(header: dict, records: list[dict]) -> pd.DataFrame:
    """The events table of a records file (columns: Kineto's plus :data:`EXTRA`).

    Raises:
        HeadcountError: a headcount range was never closed (the run stopped mid-range).
    """
    by_kind: dict[str, list[dict]] = {}
    for r in records:
        by_kind.setdefault(r["kind"], []).append(r)
    external = {r["correlation_id"]: r["external_id"] for r in by_kind.get("external_correlation", [])}
    frames = []

    ranges = pd.DataFrame(by_kind.get("range", []), columns=["id", "domain", "name", "process_id", "thread_id", "start", "end"])
    if ranges["end"].isna().any():
        raise HeadcountError(f"{int(ranges['end'].isna().sum())} headcount range(s) in the CUPTI records were never closed",
                             hint="the profiled block was interrupted; record it again")
    if len(ranges):
        frames.append(pd.DataFrame({
            "kind": "range", "name": ranges["domain"] + "@" + ranges["name"], "pid": ranges["process_id"].astype(str),
            "tid": ranges["thread_id"].astype(str), "start_ns": ranges["start"], "end_ns": ranges["end"], "external_id": ranges["id"]}))

    k = pd.DataFrame(by_kind.get("kernel", []))
    if len(k):
        for col in ("block_x", "block_y", "block_z", "grid_x", "grid_y", "grid_z", "static_shared_memory", "dynamic_shared_memory",
                    "queued", "submitted", "shared_memory_executed", "graph_id", "graph_node_id", "local_memory_per_thread", "launch_type"):
            if col not in k:
                k[col] = None
        smem_static = pd.to_numeric(k["static_shared_memory"]).fillna(0)
        smem_dynamic = pd.to_numeric(k["dynamic_shared_memory"]).fillna(0)
        block = pd.to_numeric(k["block_x"]) * pd.to_numeric(k["block_y"]) * pd.to_numeric(k["block_z"])
        node = _nonzero_column(k["graph_node_id"])
        frames.append(pd.DataFrame({
            "kind": "kernel", "name": k["name"], "pid": str(header.get("pid")), "tid": None, "start_ns": k["start"], "end_ns": k["end"],
            "correlation_id": k["correlation_id"], "device": k.get("device_id"), "stream": k.get("stream_id"),
            "grid": _dims_column(k, "grid"), "block": _dims_column(k, "block"),
            "registers_per_thread": k.get("registers_per_thread"), "shared_memory_bytes": smem_static + smem_dynamic,
            "external_id": k["correlation_id"].map(external),
            "queued_ns": _nonzero_column(k["queued"]), "submitted_ns": _nonzero_column(k["submitted"]),
            "block_threads": block.where(block > 0), "shared_memory_static_bytes": smem_static,
            "shared_memory_dynamic_bytes": smem_dynamic, "shared_memory_config_bytes": _nonzero_column(k["shared_memory_executed"]),
            "local_memory_per_thread_bytes": k["local_memory_per_thread"], "graph_id": _nonzero_column(k["graph_id"]),
            "launch_type": k["launch_type"], "graph_node_id": node,
        }))

    copies = pd.DataFrame(by_kind.get("memcpy", []) + by_kind.get("memset", []),
                          columns=["kind", "name", "start", "end", "correlation_id", "device_id", "stream_id", "graph_id", "graph_node_id"])
    if len(copies):
        frames.append(pd.DataFrame({
            "kind": copies["kind"], "name": copies["name"], "pid": str(header.get("pid")), "tid": None, "start_ns": copies["start"],
            "end_ns": copies["end"], "correlation_id": copies["correlation_id"], "device": copies["device_id"],
            "stream": copies["stream_id"], "external_id": copies["correlation_id"].map(external),
            "graph_id": _nonzero_column(copies["graph_id"]), "graph_node_id": _nonzero_column(copies["graph_node_id"])}))

    api = pd.DataFrame(by_kind.get("runtime", []) + by_kind.get("driver", []),
                       columns=["name", "process_id", "thread_id", "start", "end", "correlation_id"])
    if len(api):
        frames.append(pd.DataFrame({
            "kind": "runtime", "name": api["name"], "pid": api["process_id"].astype(str), "tid": api["thread_id"].astype(str),
            "start_ns": api["start"], "end_ns": api["end"], "correlation_id": api["correlation_id"],
            "external_id": api["correlation_id"].map(external)}))

    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = frame.reindex(columns=[*COLUMNS, *EXTRA])
    for col in ("start_ns", "end_ns"):
        frame[col] = frame[col].astype(np.int64)
    for col in ("correlation_id", "device", "stream", "registers_per_thread", "shared_memory_bytes", "graph_node_id", *EXTRA):
        if col != "launch_type":
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    frame["est_achieved_occupancy_pct"] = pd.array([pd.NA] * len(frame), dtype="Float64")
    frame["pid"] = frame["pid"].astype(str)
    frame["tid"] = frame["tid"].astype(object).where(frame["tid"].notna(), None)
    if header.get("stats", {}).get("correlation") is False:
        # recorded without external correlation: work belongs to the ranges around its launch call on its thread
        frame = frame.drop(columns=["external_id"])
    return frame


def _dims_column(k: pd.DataFrame, prefix: str) -> pd.Series:
    """``"(x, y, z)"`` launch dimensions, null where CUPTI gave none."""
    x, y, z = (pd.to_numeric(k[f"{prefix}_{a}"]) for a in "xyz")
    text = "(" + x.astype("Int64").astype(str) + ", " + y.astype("Int64").astype(str) + ", " + z.astype("Int64").astype(str) + ")"
    return text.astype(object).where(x.notna(), None)


def _nonzero_column(values: pd.Series) -> pd.Series:
    """CUPTI leaves timestamps and ids it could not take at 0: those are unknown."""
    v = pd.to_numeric(values)
    return v.where(v != 0)


def pm_samples_frame(records: list[dict]) -> pd.DataFrame:
    """PM samples: ``start_ns``, ``end_ns`` and one column per metric (the
    metric's own unit: ``.sum`` counters are totals over the sample window);
    a sample without a window (start 0, or end not after start) is left out."""
    # CUPTI's first sample of a run starts at 0 (no window before it: on the H100 it spanned 1.8e18 ns): no window, left out
    rows = [{"start_ns": r["start"], "end_ns": r["end"], **r["values"]} for r in records
            if r["kind"] == "pm_sample" and 0 < r["start"] < r["end"]]
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return frame


def marker_count(records: list[dict]) -> int:
    """NVTX marker records seen (0 when NVTX injection was off)."""
    return sum(1 for r in records if r["kind"] == "marker")
