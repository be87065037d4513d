"""Read a torch.profiler (Kineto) Chrome trace into one events table.

The trace is the file ``torch.profiler.profile.export_chrome_trace`` writes,
the same one Holistic Trace Analysis reads. Timestamps are microseconds with
three decimals relative to ``baseTimeNanoseconds``; they are parsed as text
and converted to integer nanoseconds exactly (a float64 of ~5e12 µs with three
decimals is already at the edge of its precision).

Output columns (one row per complete ``"ph": "X"`` event):

====================  =========================================================
``kind``              ``op`` (CPU operator), ``range`` (record_function /
                      user annotation), ``kernel``, ``memcpy``, ``memset``
                      (GPU activity), ``runtime`` (CUDA runtime/driver call)
``name``              event name
``pid``, ``tid``      process and thread as the trace gives them
``start_ns``          start, ns since the trace's base time
``end_ns``            end, ns
``correlation_id``    launch correlation (GPU activity and runtime calls)
``device``, ``stream``  GPU activity only
``grid``, ``block``   launch configuration, e.g. ``"(256, 1, 1)"``
``registers_per_thread``, ``shared_memory_bytes``, ``est_achieved_occupancy_pct``
====================  =========================================================
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.errors import HeadcountError

_KIND_BY_CAT = {
    "cpu_op": "op",
    "user_annotation": "range",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
}

COLUMNS = [
    "kind", "name", "pid", "tid", "start_ns", "end_ns", "correlation_id", "device", "stream",
    "grid", "block", "registers_per_thread", "shared_memory_bytes", "est_achieved_occupancy_pct",
]


def _ns(value) -> int:
    """Microseconds (as parsed text or number) → integer nanoseconds, exactly."""
    return int(Decimal(str(value)) * 1000)


def _launch_dims(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(int(v)) for v in value) + ")"
    return str(value)


def load_trace(path: str | Path) -> pd.DataFrame:
    """Parse a Kineto Chrome trace file into the events table described above.

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            doc = json.load(fh, parse_float=Decimal)
    except FileNotFoundError as exc:
        raise HeadcountError(f"{path}: no such file", hint="check the path") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeadcountError(
            f"{path}: not a torch.profiler trace (invalid JSON: {exc.msg if hasattr(exc, 'msg') else exc})",
            hint="pass the file written by torch.profiler's export_chrome_trace",
        ) from exc
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise HeadcountError(
            f"{path}: not a torch.profiler trace (no traceEvents list)",
            hint="pass the file written by torch.profiler's export_chrome_trace",
        )
    return events_frame(events, source=str(path))


def events_frame(events: list[dict], source: str = "trace") -> pd.DataFrame:
    """Turn a list of Chrome-trace event dicts into the events table."""
    rows = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        kind = _KIND_BY_CAT.get(str(ev.get("cat", "")).lower())
        if kind is None:
            continue
        try:
            start = _ns(ev["ts"])
            end = start + _ns(ev.get("dur", 0))
        except (KeyError, InvalidOperation, ValueError) as exc:
            raise HeadcountError(
                f"{source}: event {ev.get('name')!r} has no valid ts/dur",
                hint="the trace is damaged; record it again",
            ) from exc
        args = ev.get("args") or {}
        rows.append(
            (
                kind,
                str(ev.get("name", "")),
                ev.get("pid"),
                ev.get("tid"),
                start,
                end,
                args.get("correlation"),
                args.get("device"),
                args.get("stream"),
                _launch_dims(args.get("grid")),
                _launch_dims(args.get("block")),
                args.get("registers per thread"),
                args.get("shared memory"),
                args.get("est. achieved occupancy %"),
            )
        )
    frame = pd.DataFrame.from_records(rows, columns=COLUMNS)
    for col in ("start_ns", "end_ns"):
        frame[col] = frame[col].astype(np.int64)
    for col in ("correlation_id", "device", "stream", "registers_per_thread", "shared_memory_bytes"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    frame["est_achieved_occupancy_pct"] = pd.to_numeric(frame["est_achieved_occupancy_pct"], errors="coerce").astype("Float64")
    # pid/tid can be strings in GPU lanes ("stream 7"); keep them as text uniformly
    frame["pid"] = frame["pid"].astype(str)
    frame["tid"] = frame["tid"].astype(str)
    return frame
