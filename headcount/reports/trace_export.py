"""A report's runs as Chrome trace-event JSON (Perfetto UI, ``chrome://tracing``,
Holistic Trace Analysis).

One file per run, in the layout torch.profiler (Kineto) writes, so that the
tools made for its traces read it: headcount's ranges and the program's other
NVTX ranges as ``user_annotation`` spans on the thread that opened them,
CPU operators as ``cpu_op`` on theirs, kernels and copies on one track per
GPU stream (``pid`` = device index, ``tid`` = stream; ``args``: stream,
device, correlation, grid, block, registers, occupancy), each launch call as
a ``cuda_runtime`` span on its thread with a flow arrow to its kernel
(``ac2g``, as Kineto links them), and ``distributedInfo.rank`` from the run.
Each step is a ``ProfilerStep#N`` span (what torch.profiler writes and
Holistic Trace Analysis counts iterations by) on the thread that opened most
ranges, from the first to the last CPU-side time of the step's rows (the
report keeps steps as a column, not as ranges).

Times are the report's, in µs with ns decimals (trace-event time unit). A
run without a timeline (ncu measures kernels one at a time, with no start
times) has nothing to draw and is skipped with a reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pandas as pd

from headcount.common.errors import HeadcountError
from headcount.common.numbers import missing
from headcount.reports import terminal
from headcount.reports.progress_view import Steps

_RANGE_COLUMNS = ("range_id", "name", "path", "level", "domain", "pid", "tid", "lane", "start_ns", "end_ns", "step", "phase",
                  "layer", "head", "implementation")
_KERNEL_COLUMNS = ("kind", "name", "pid", "tid", "device", "stream", "correlation_id", "start_ns", "end_ns",
                   "api_start_ns", "api_end_ns", "grid", "block", "registers_per_thread", "shared_memory_bytes",
                   "theoretical_occupancy_pct", "achieved_occupancy_pct", "external_id", "step", "layer", "head", "phase")
_GPU_KINDS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _us(ns) -> float:
    return round(int(ns) / 1000.0, 3)


def _int(value, default: int = -1) -> int:
    if missing(value):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _pid(value) -> int:
    """A trace ``pid`` (an integer): the process id, or a stable number for a name."""
    number = _int(value, None)
    if number is not None:
        return number
    return 1_000_000 + (sum(map(ord, str(value))) % 1_000_000)


def _device_index(value) -> int:
    text = str(value) if value is not None else ""
    return _int(text.rpartition(":")[2], 0) if text else 0


def _step_spans(ranges: pd.DataFrame, kernels: pd.DataFrame) -> Iterator[dict]:
    """``ProfilerStep#N`` spans: each step from its first to its last CPU-side time."""
    cpu = [ranges[["step", "start_ns", "end_ns"]]]
    ops = kernels[kernels["kind"] == "op"]
    cpu.append(ops[["step", "start_ns", "end_ns"]])
    launched = kernels[kernels["api_start_ns"].notna()]
    cpu.append(launched[["step", "api_start_ns", "api_end_ns"]].set_axis(["step", "start_ns", "end_ns"], axis=1))
    times = pd.concat([c for c in cpu if len(c)], ignore_index=True) if any(len(c) for c in cpu) else None
    if times is None or not len(ranges) or times["step"].isna().all():
        return
    owner = ranges.groupby(["pid", "tid"], dropna=False).size().idxmax()
    pid, tid = _pid(owner[0]), _int(owner[1], 0)
    times = times.dropna()
    for step, g in times.groupby("step"):
        start, end = int(g["start_ns"].min()), int(g["end_ns"].max())
        yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(step)}", "pid": pid, "tid": tid,
               "ts": _us(start), "dur": _us(end - start), "args": {"step": int(step), "span": "first to last CPU-side time of the step's rows"}}


def run_events(ranges: pd.DataFrame, kernels: pd.DataFrame, tick: Callable[[], None] = lambda: None) -> Iterator[dict]:
    """The trace events of one run (see the module docstring); ``tick`` is called once per row of ``ranges`` and ``kernels`` (progress)."""
    threads: dict[tuple[int, int], str] = {}  # (pid, tid) → the thread's name
    yield from _step_spans(ranges, kernels)
    for r in ranges.itertuples(index=False):
        tick()
        if missing(r.start_ns) or missing(r.end_ns):
            continue
        pid, tid = _pid(r.pid), _int(r.tid, 0)
        name = f"thread {tid}"
        if not missing(r.lane):  # a graph replay's calls: a lane of their own beside the thread, as in the tables
            name = f"thread {tid} ({r.lane})"
            tid = _pid(name)
        threads[(pid, tid)] = name
        args = {"level": r.level, "domain": r.domain}
        for key in ("step", "phase", "layer", "head"):
            value = getattr(r, key)
            if not missing(value):
                args[key] = value if isinstance(value, str) else _int(value)
        yield {"ph": "X", "cat": "user_annotation", "name": str(r.path if not missing(r.path) else r.name), "pid": pid, "tid": tid,
               "ts": _us(r.start_ns), "dur": _us(r.end_ns - r.start_ns), "args": args}
    gpus: dict[int, set[int]] = {}
    for k in kernels.itertuples(index=False):
        tick()
        if missing(k.start_ns) or missing(k.end_ns):
            continue
        where = {key: getattr(k, key) for key in ("step", "phase", "layer", "head") if not missing(getattr(k, key))}
        where = {key: value if isinstance(value, str) else _int(value) for key, value in where.items()}
        if k.kind == "op":
            pid, tid = _pid(k.pid), _int(k.tid, 0)
            threads.setdefault((pid, tid), f"thread {tid}")
            yield {"ph": "X", "cat": "cpu_op", "name": str(k.name), "pid": pid, "tid": tid, "ts": _us(k.start_ns),
                   "dur": _us(k.end_ns - k.start_ns), "args": {"External id": _int(k.external_id), **where}}
            continue
        device, stream = _device_index(k.device), _int(k.stream, 0)
        gpus.setdefault(device, set()).add(stream)
        correlation = _int(k.correlation_id)
        args = {"device": device, "stream": stream, "correlation": correlation, "External id": _int(k.external_id), **where}
        for key, label in (("grid", "grid"), ("block", "block")):
            if not missing(getattr(k, key)):
                args[label] = str(getattr(k, key))
        for key, label in (("registers_per_thread", "registers per thread"), ("shared_memory_bytes", "shared memory"),
                           ("theoretical_occupancy_pct", "theoretical occupancy %"),
                           ("achieved_occupancy_pct", "achieved occupancy %")):
            if not missing(getattr(k, key)):
                args[label] = float(getattr(k, key))
        ts = _us(k.start_ns)
        yield {"ph": "X", "cat": _GPU_KINDS.get(k.kind, "kernel"), "name": str(k.name), "pid": device, "tid": stream,
               "ts": ts, "dur": _us(k.end_ns - k.start_ns), "args": args}
        if correlation >= 0 and not missing(k.api_start_ns) and not missing(k.api_end_ns) and not missing(k.pid):
            pid, tid = _pid(k.pid), _int(k.tid, 0)
            threads.setdefault((pid, tid), f"thread {tid}")
            launch = _us(k.api_start_ns)
            yield {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": pid, "tid": tid, "ts": launch,
                   "dur": _us(k.api_end_ns - k.api_start_ns), "args": {"correlation": correlation}}
            yield {"ph": "s", "id": correlation, "pid": pid, "tid": tid, "ts": launch, "cat": "ac2g", "name": "ac2g"}
            yield {"ph": "f", "id": correlation, "pid": device, "tid": stream, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}
    for pid in sorted({pid for pid, _ in threads}):
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"process {pid}"}}
    for (pid, tid), name in sorted(threads.items()):
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
    for device, streams in sorted(gpus.items()):
        yield {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"GPU {device}"}}
        for stream in sorted(streams):
            yield {"ph": "M", "name": "thread_name", "pid": device, "tid": stream, "args": {"name": f"stream {stream}"}}


def write_trace(path: Path, run: dict, events: Iterator[dict]) -> int:
    """Write one trace file atomically; returns the number of events."""
    header = {"schemaVersion": 1, "displayTimeUnit": "ms", "traceName": f"headcount run {run['run_id']}",
              "distributedInfo": {"rank": run.get("rank") or 0, "world_size": run.get("world_size") or 1},
              "headcount": {key: value for key, value in run.items() if value is not None}}
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps(header, default=str)[:-1] + ', "traceEvents": [\n')
            for event in events:
                fh.write((",\n" if count else "") + json.dumps(event, default=str))
                count += 1
            fh.write("\n]}\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise HeadcountError(f"{path}: cannot write the trace ({exc.strerror or exc})", hint="choose a writable directory with -o") from exc
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP (headcount.common.stopping): no half-written trace stays
        tmp.unlink(missing_ok=True)
        raise
    return count


def export_traces(report: str | Path, out: str | Path, run_ids: list[str] | None = None,
                  console=None) -> tuple[list[Path], list[str]]:
    """Write ``OUT/<run id>/trace.json`` for each run of ``report`` (or of ``run_ids``), with progress on ``console``
    where given (rows of ranges and kernels done of all, :class:`headcount.reports.progress_view.Steps`).

    Returns:
        ``(files written, runs skipped with the reason)``.

    Raises:
        HeadcountError: ``report`` is not a report, a run id is not in it, nothing had a timeline, or ``out`` is not writable.
    """
    from headcount.store.query import connect

    con = connect(report)
    runs = con.sql("SELECT * FROM runs").df() if _has_view(con, "runs") else pd.DataFrame(columns=["run_id"])
    known = list(dict.fromkeys(runs["run_id"].astype(str)))
    wanted = run_ids or known
    unknown = [r for r in wanted if r not in known]
    if unknown:
        raise HeadcountError(f"{report}: no run {unknown[0]}", hint=f"choose from {', '.join(known)}" if known else "the report holds no run")
    out = Path(out)
    written, skipped = [], []
    rows = sum(_rows(con, name, wanted) for name in ("ranges", "kernels"))
    with Steps(console or terminal.console(stderr=True, quiet=True), rows, f"exporting {len(wanted)} run(s)", "rows",
               shown_from=EXPORT_SHOWN_FROM_ROWS) as steps:
        for k, run_id in enumerate(wanted):
            steps.phase(f"exporting run {k + 1} of {len(wanted)} ({run_id})")
            path, reason = _export_run(con, runs, run_id, out, steps.advance)
            if path:
                written.append(path)
            else:
                skipped.append(reason)
    if not written:
        raise HeadcountError(f"{report}: no run has a timeline to export ({'; '.join(skipped)})",
                             hint="export a run recorded by profile, run --backend nsys|cupti, or parse of an nsys or torch.profiler file")
    return written, skipped


EXPORT_SHOWN_FROM_ROWS = 50_000  # rows of ranges and kernels from which an export shows its progress (about a second of work)


def _rows(con, name: str, run_ids: list[str]) -> int:
    """Rows of table ``name`` in the runs ``run_ids`` (0 where the report has no such table)."""
    if not _has_view(con, name):
        return 0
    return int(con.execute(f"SELECT count(*) FROM {name} WHERE run_id IN (SELECT unnest(?))", [run_ids]).fetchall()[0][0])


def _export_run(con, runs: pd.DataFrame, run_id: str, out: Path, tick: Callable[[], None]) -> tuple[Path | None, str | None]:
    """Write ``out/<run id>/trace.json`` of one run: ``(its path, None)``, or ``(None, why it was skipped)``.

    Raises:
        HeadcountError: the folder or the file cannot be written.
    """
    ranges = _table(con, "ranges", _RANGE_COLUMNS, run_id)
    kernels = _table(con, "kernels", _KERNEL_COLUMNS, run_id)
    if not (ranges["start_ns"].notna().any() or kernels["start_ns"].notna().any()):
        return None, f"{run_id}: no timeline (no range or kernel has a start time; ncu measures kernels one at a time)"
    row = runs[runs["run_id"].astype(str) == run_id].iloc[0].to_dict()
    run = {"run_id": run_id, **{k: (None if missing(v) else v) for k, v in row.items()
                               if k in ("implementation", "source", "mode", "model", "device_name", "rank", "world_size")}}
    folder = out / run_id
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HeadcountError(f"{folder}: cannot be created ({exc.strerror or exc})", hint="choose a writable directory with -o") from exc
    path = folder / "trace.json"
    try:
        write_trace(path, run, run_events(ranges, kernels, tick))
    except BaseException:
        if made:  # nor does the folder of a trace never written
            with suppress(OSError):
                folder.rmdir()
        raise
    return path, None


def _has_view(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND NOT internal", [name]).fetchall()[0][0])


def _table(con, name: str, columns: tuple[str, ...], run_id: str) -> pd.DataFrame:
    if not _has_view(con, name):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    have = {r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE {name})").fetchall()}
    select = ", ".join(c if c in have else f"NULL AS {c}" for c in columns)
    order = "start_ns" if "start_ns" in have else "1"
    return con.execute(f"SELECT {select} FROM {name} WHERE run_id = ? ORDER BY {order}", [run_id]).df()
