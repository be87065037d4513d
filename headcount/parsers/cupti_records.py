"""Read the cupti source's records file into the events table.

The file (``cupti-records.jsonl.gz``, written by
:class:`headcount.collector.cupti_source.CuptiRecorder`) holds a header line,
headcount's ranges (with their external correlation ids), then CUPTI's
records as plain dicts: kernels, runtime and driver API calls, external
correlations, NVTX markers and PM samples. Timestamps are CUPTI's
nanoseconds.

:func:`events_frame` gives the same columns as the Kineto events table
(:mod:`headcount.parsers.kineto`) plus what CUPTI adds, so the shared
attribution runs on it unchanged:

=================================  ============================================
``external_id``                    ranges: their id; kernels and API calls: the
                                   innermost headcount range open on the
                                   launching thread (CUPTI external correlation)
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

import numpy as np
import pandas as pd

from headcount.errors import HeadcountError
from headcount.parsers.kineto import COLUMNS

FORMAT = "headcount-cupti-records"
EXTRA = [
    "external_id", "queued_ns", "submitted_ns", "block_threads", "shared_memory_static_bytes",
    "shared_memory_dynamic_bytes", "shared_memory_config_bytes", "local_memory_per_thread_bytes", "graph_id", "launch_type",
]


def read_records(path: str | Path) -> tuple[dict, list[dict]]:
    """The header and the records of a records file.

    Raises:
        HeadcountError: missing, truncated, not gzip/JSON, or not a headcount
            records file.
    """
    path = Path(path)
    hint = "pass the cupti-records.jsonl.gz that `headcount profile --backend cupti --trace-dir DIR` wrote"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            first = fh.readline()
            try:
                header = json.loads(first) if first else None
            except json.JSONDecodeError:
                header = None
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise HeadcountError(f"{path}: not a headcount CUPTI records file", hint=hint)
            records = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError as exc:
        raise HeadcountError(f"{path}: no such file", hint="check the path") from exc
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeadcountError(f"{path}: unreadable or truncated CUPTI records file ({type(exc).__name__}: {exc})",
                             hint="record it again; a run that was killed leaves no complete file") from exc
    return header, records


def _dims(x, y, z) -> str | None:
    if x is None:
        return None
    return f"({int(x)}, {int(y)}, {int(z)})"


def _nonzero(value):
    """CUPTI leaves timestamps it could not take at 0."""
    return value if value else None


def events_frame(header: dict, records: list[dict]) -> pd.DataFrame:
    """The events table of a records file (columns: Kineto's plus :data:`EXTRA`).

    Raises:
        HeadcountError: a headcount range was never closed (the run stopped mid-range).
    """
    pid = str(header.get("pid"))
    external = {}
    for r in records:
        if r["kind"] == "external_correlation":
            external[r["correlation_id"]] = r["external_id"]
    rows = []
    open_ranges = 0
    for r in records:
        kind = r["kind"]
        if kind == "range":
            if r.get("end") is None:
                open_ranges += 1
                continue
            rows.append({"kind": "range", "name": f"{r['domain']}@{r['name']}", "pid": str(r["process_id"]),
                         "tid": str(r["thread_id"]), "start_ns": r["start"], "end_ns": r["end"], "external_id": r["id"]})
        elif kind == "kernel":
            smem_static = r.get("static_shared_memory") or 0
            smem_dynamic = r.get("dynamic_shared_memory") or 0
            block = (r.get("block_x") or 0) * (r.get("block_y") or 0) * (r.get("block_z") or 0)
            rows.append({
                "kind": "kernel", "name": r["name"], "pid": pid, "tid": None, "start_ns": r["start"], "end_ns": r["end"],
                "correlation_id": r["correlation_id"], "device": r.get("device_id"), "stream": r.get("stream_id"),
                "grid": _dims(r.get("grid_x"), r.get("grid_y"), r.get("grid_z")),
                "block": _dims(r.get("block_x"), r.get("block_y"), r.get("block_z")),
                "registers_per_thread": r.get("registers_per_thread"),
                "shared_memory_bytes": smem_static + smem_dynamic,
                "external_id": external.get(r["correlation_id"]),
                "queued_ns": _nonzero(r.get("queued")), "submitted_ns": _nonzero(r.get("submitted")),
                "block_threads": block or None, "shared_memory_static_bytes": smem_static,
                "shared_memory_dynamic_bytes": smem_dynamic,
                "shared_memory_config_bytes": _nonzero(r.get("shared_memory_executed")),
                "local_memory_per_thread_bytes": r.get("local_memory_per_thread"),
                "graph_id": _nonzero(r.get("graph_id")), "launch_type": r.get("launch_type"),
            })
        elif kind in ("runtime", "driver"):
            rows.append({"kind": "runtime", "name": r["name"], "pid": str(r["process_id"]), "tid": str(r["thread_id"]),
                         "start_ns": r["start"], "end_ns": r["end"], "correlation_id": r["correlation_id"],
                         "external_id": external.get(r["correlation_id"])})
    if open_ranges:
        raise HeadcountError(f"{open_ranges} headcount range(s) in the CUPTI records were never closed",
                             hint="the profiled block was interrupted; record it again")
    frame = pd.DataFrame.from_records(rows, columns=[*COLUMNS, *EXTRA])
    for col in ("start_ns", "end_ns"):
        frame[col] = frame[col].astype(np.int64)
    for col in ("correlation_id", "device", "stream", "registers_per_thread", "shared_memory_bytes", *EXTRA):
        if col != "launch_type":
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    frame["est_achieved_occupancy_pct"] = pd.array([pd.NA] * len(frame), dtype="Float64")
    frame["pid"] = frame["pid"].astype(str)
    frame["tid"] = frame["tid"].astype(object).where(frame["tid"].notna(), None)
    return frame


def pm_samples_frame(records: list[dict]) -> pd.DataFrame:
    """PM samples: ``start_ns``, ``end_ns`` and one column per metric (the
    metric's own unit: ``.sum`` counters are totals over the sample window)."""
    rows = [{"start_ns": r["start"], "end_ns": r["end"], **r["values"]} for r in records if r["kind"] == "pm_sample"]
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return frame


def marker_count(records: list[dict]) -> int:
    """NVTX marker records seen (0 when NVTX injection was off)."""
    return sum(1 for r in records if r["kind"] == "marker")
