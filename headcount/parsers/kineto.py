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
``args``              the op's recorded inputs (``Input Dims``, ``Input type``,
                      ``Concrete Inputs``) for ``aten::scaled_dot_product_attention``
                      only (what :mod:`headcount.attribute.modules` needs), else null
====================  =========================================================

``kind`` ``module`` marks an ``nn.Module: <Class>_<k>`` range of a trace
recorded ``with_modules=True``. Files may be gzip-compressed (``.json.gz``).
:func:`read_trace` also returns the trace's ``deviceProperties``.
"""

from __future__ import annotations

import gzip
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
    "grid", "block", "registers_per_thread", "shared_memory_bytes", "est_achieved_occupancy_pct", "args",
]
MODULE_PREFIX = "nn.Module: "
SDPA_OP = "aten::scaled_dot_product_attention"
_KEPT_ARGS = ("Input Dims", "Input type", "Concrete Inputs")


def _ns(value) -> int:
    """Microseconds (as parsed text or number) → integer nanoseconds, exactly."""
    return int(Decimal(str(value)) * 1000)


def _ns_array(values: list) -> np.ndarray:
    """:func:`_ns` of many values: plain decimals (``"1733212345678901.123"``, the
    form Kineto writes) split on the point in bulk, anything else one by one.

    Raises:
        InvalidOperation: a value that is no number.
    """
    text = pd.Series(values, dtype=object).astype(str)
    parts = text.str.partition(".")
    whole, frac = parts[0], parts[2]
    plain = (whole.str.fullmatch(r"\d{1,16}") & frac.str.fullmatch(r"\d{0,3}")).to_numpy(dtype=bool).copy()
    out = np.zeros(len(text), dtype=np.int64)
    if plain.any():
        micro = whole[plain].astype(np.int64).to_numpy()
        fits = micro <= np.iinfo(np.int64).max // 1000 - 1
        plain[np.flatnonzero(plain)[~fits]] = False
        out[plain] = micro[fits] * 1000 + frac[plain].str.ljust(3, "0").astype(np.int64).to_numpy()
    for i in np.flatnonzero(~plain):  # exponents, more than 3 decimals, huge values: exactly, one by one
        out[i] = _ns(values[i])
    return out


def _launch_dims(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(int(v)) for v in value) + ")"
    return str(value)


def _document(path: Path) -> dict:
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            doc = json.load(fh, parse_float=str)  # exact: microsecond decimals are split, never rounded
    except FileNotFoundError as exc:
        raise HeadcountError(f"{path}: no such file", hint="check the path") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise HeadcountError(
            f"{path}: not a torch.profiler trace (invalid JSON: {exc.msg if hasattr(exc, 'msg') else exc})",
            hint="pass the file written by torch.profiler's export_chrome_trace",
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise HeadcountError(
            f"{path}: not a torch.profiler trace (no traceEvents list)",
            hint="pass the file written by torch.profiler's export_chrome_trace",
        )
    return doc


def load_trace(path: str | Path) -> pd.DataFrame:
    """Parse a Kineto Chrome trace file (plain or gzip) into the events table described above.

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace.
    """
    path = Path(path)
    return events_frame(_document(path)["traceEvents"], source=str(path))


def read_trace(path: str | Path) -> dict:
    """A trace file as ``{"events": events table, "devices": deviceProperties
    (list of dicts, empty for a CPU trace), "meta": the other top-level keys}``.

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace.
    """
    path = Path(path)
    doc = _document(path)
    devices = doc.get("deviceProperties") if isinstance(doc.get("deviceProperties"), list) else []
    meta = {k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties")}
    return {"events": events_frame(doc["traceEvents"], source=str(path)), "devices": devices, "meta": meta}


def run_device(devices: list[dict]) -> dict | None:
    """The run metadata's ``device`` from a trace's ``deviceProperties`` (the
    first GPU), with the per-SM limits the occupancy calculator reads; ``None`` for a CPU trace."""
    if not devices:
        return None
    d = devices[0]

    def num(key):
        v = d.get(key)
        if isinstance(v, str):  # floats are read as text (exact timestamps)
            try:
                return int(float(v))
            except ValueError:
                return None
        return int(v) if isinstance(v, (int, float, Decimal)) else None

    major, minor = num("computeMajor"), num("computeMinor")
    threads = num("maxThreadsPerMultiprocessor")
    return {"kind": "cuda", "name": d.get("name"), "index": num("id"), "count": len(devices),
            "compute_capability": f"{major}.{minor}" if major is not None and minor is not None else None,
            "sm_count": num("numSms"), "memory_bytes": num("totalGlobalMem"), "source": "trace deviceProperties",
            "limits": {"cc_major": major, "cc_minor": minor, "max_warps_per_sm": threads // 32 if threads else None,
                       "registers_per_sm": num("regsPerMultiprocessor"), "shared_memory_per_sm": num("sharedMemPerMultiprocessor")}}


def events_frame(events: list[dict], source: str = "trace") -> pd.DataFrame:
    """Turn a list of Chrome-trace event dicts into the events table.

    Raises:
        HeadcountError: an event without a valid ``ts``/``dur``.
    """
    rows, stamps = [], []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        kind = _KIND_BY_CAT.get(cat)
        if kind is None and cat == "python_function" and str(ev.get("name", "")).startswith(MODULE_PREFIX):
            kind = "module"
        if kind is None:
            continue
        if "ts" not in ev:
            raise HeadcountError(f"{source}: event {ev.get('name')!r} has no valid ts/dur", hint="the trace is damaged; record it again")
        stamps.append((ev["ts"], ev.get("dur", 0)))
        args = ev.get("args") or {}
        rows.append(
            (
                kind,
                str(ev.get("name", "")),
                ev.get("pid"),
                ev.get("tid"),
                0,
                0,
                args.get("correlation"),
                args.get("device"),
                args.get("stream"),
                _launch_dims(args.get("grid")),
                _launch_dims(args.get("block")),
                args.get("registers per thread"),
                args.get("shared memory"),
                args.get("est. achieved occupancy %"),
                {k: args.get(k) for k in _KEPT_ARGS} if ev.get("name") == SDPA_OP else None,
            )
        )
    frame = pd.DataFrame.from_records(rows, columns=COLUMNS)
    try:
        start = _ns_array([ts for ts, _ in stamps])
        frame["start_ns"] = start
        frame["end_ns"] = start + _ns_array([dur for _, dur in stamps])
    except (InvalidOperation, ValueError, TypeError) as exc:
        bad = next((rows[i][1] for i, (ts, dur) in enumerate(stamps) if not _valid(ts) or not _valid(dur)), None)
        raise HeadcountError(f"{source}: event {bad!r} has no valid ts/dur", hint="the trace is damaged; record it again") from exc
    for col in ("start_ns", "end_ns"):
        frame[col] = frame[col].astype(np.int64)
    for col in ("correlation_id", "device", "stream", "registers_per_thread", "shared_memory_bytes"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    frame["est_achieved_occupancy_pct"] = pd.to_numeric(frame["est_achieved_occupancy_pct"], errors="coerce").astype("Float64")
    # pid/tid can be strings in GPU lanes ("stream 7"); keep them as text uniformly
    frame["pid"] = frame["pid"].astype(str)
    frame["tid"] = frame["tid"].astype(str)
    return frame


def _valid(value) -> bool:
    try:
        _ns(value)
    except (InvalidOperation, ValueError, TypeError):
        return False
    return True
