"""Read an nsys SQLite or ``parquetdir`` export into events tables (ranges,
runtime calls, GPU ops).

Either format is read through one interface
(:class:`~headcount.parsers.nsys_export.ExportSource`); this module holds
the plan of a read (:func:`plan_export`) and the readers of each table.

Columns and tables differ between nsys versions, so every query names only
the columns the file has (``PRAGMA table_info``) and optional tables may be
absent. Facts used (checked on the fixtures and nsys 2023.4.4's own
``nvtx_gpu_proj_trace`` report):

- NVTX ranges are ``NVTX_EVENTS`` rows of ``eventType`` 59 (push/pop), 60
  (start/end), 70/71 (NVTX-T variants); 75 creates a domain (name in
  ``text``), per process. A range's name is ``text`` or, when registered,
  ``StringIds.value`` via ``textId``. Start/end ranges that end on another
  thread (``endGlobalTid`` set) are left out, as nsys does; a range with no
  end extends to the last NVTX timestamp.
- ``globalTid`` holds the process id in bits 24–47 and the thread id in
  bits 0–23; GPU activity carries ``globalPid`` (the same with tid 0).
- GPU work (``CUPTI_ACTIVITY_KIND_KERNEL``, ``…_MEMCPY``, ``…_MEMSET``) joins
  its launch in ``CUPTI_ACTIVITY_KIND_RUNTIME`` (and ``…_DRIVER`` where
  present) on ``correlationId`` within one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from headcount.common.arrays import unique_inverse
from headcount.common.device import Device
from headcount.common.errors import HeadcountError, NothingRecorded
from headcount.common.tables import Timeline
from headcount.parsers.nsys_export import GPU_TABLES, NULL_INT, ExportSource, open_export, query_columns, query_frame
from headcount.parsers.nsys_gpu_query import SHARED_BITS, STREAM_BITS, gpu_columns
from headcount.parsers.options import ReadOptions
from headcount.parsers.plausible import drop_implausible

RANGE_EVENT_TYPES = {59: "PushPop", 60: "StartEnd", 70: "PushPop", 71: "StartEnd"}
DOMAIN_CREATE = 75
API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")

SPLIT_ROWS = 100_000  # tables larger than this are read in parts, one per thread (ReadOptions.threads)
STREAM_ROWS = 8_000_000  # NVTX rows above which an export is read one process at a time (~0.4 GB read at once below)


def _is_int(value) -> bool:
    """A value an integer column may hold (SQLite lets any column hold text or blobs)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Row-wise concatenation that keeps categorical columns categorical (their categories united)."""
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    columns = {}
    for col in frames[0].columns:
        parts = [f[col] for f in frames]
        if all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
            # categories as objects: an inferred 'str' index and an object one cannot be united
            columns[col] = union_categoricals([pd.Categorical.from_codes(p.cat.codes, categories=pd.Index(
                p.cat.categories.astype(object), dtype=object)) for p in parts])
        else:
            columns[col] = pd.concat(parts, ignore_index=True)
    return pd.DataFrame(columns)


def nsys_name(ranges: pd.DataFrame) -> pd.Series:
    """Range names as nsys's reports print them: ``domain:name``, or the name alone."""
    has_domain = ranges["domain"].notna()
    return ranges["name"].where(~has_domain, ranges["domain"].astype(object) + ":" + ranges["name"].astype(object))


def _parts_by_rowid(src: ExportSource, table: str, id_col: str) -> list[str]:
    """WHERE conditions on ``id_col`` (the table's rowid) that split a large table
    into ``src.threads`` parts of equal rowid ranges, read on as many threads; none for a small table."""
    # two queries: SQLite answers a lone min() or max() of the rowid from the b-tree, both together by a scan
    lo, hi = src.rows(f"SELECT min(rowid) FROM {table}")[0][0], src.rows(f"SELECT max(rowid) FROM {table}")[0][0]
    if lo is None or hi - lo < SPLIT_ROWS or src.threads < 2:
        return []
    edges = [lo - 1 + (hi - lo + 1) * k // src.threads for k in range(src.threads + 1)]
    return [f"{id_col} > {a} AND {id_col} <= {b}" for a, b in zip(edges, edges[1:])]


def _ids_as_text(ids: np.ndarray) -> pd.Categorical:
    """Process/thread ids as text (the tables' type for them), built once per
    distinct id: a handful of threads carry millions of rows."""
    codes, unique = pd.factorize(ids, sort=True)
    return pd.Categorical.from_codes(codes, categories=pd.Index(unique.astype(str).tolist(), dtype=object))


def _split_tid(global_tid) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(global_tid, dtype=np.int64)
    return (g >> 24) & 0xFFFFFF, g & 0xFFFFFF


def _pid_of(col: str) -> str:
    return f"(({col} >> 24) & 16777215)"


@dataclass
class ExportPlan:
    """What :func:`plan_export` learns from an export before reading it in bulk.

    Attributes:
        processes: the process ids holding NVTX ranges, launch calls or GPU work, ascending,
            each to be read on its own; ``None``: read the export in one pass.
        empty: the export holds no NVTX range, launch call or GPU work at all.
        nvtx_rows: NVTX range rows per process (listed processes only).
        last_nvtx_ns: the export's last NVTX timestamp (where ranges left open end, as nsys has it).
        meta, devices, gpu_metrics: as in :class:`~headcount.common.tables.Timeline` (whole export).
        gpu_devices: the device ids that ran GPU work.
        gpu_processes: the process ids that launched GPU work (two or more: ``parse`` makes one run of each process).
    """

    processes: list[int] | None
    empty: bool
    nvtx_rows: dict[int, int]
    last_nvtx_ns: int | None
    meta: dict
    devices: pd.DataFrame
    gpu_metrics: pd.DataFrame
    gpu_devices: list[int]
    gpu_processes: list[int] = field(default_factory=list)


def plan_export(path: str | Path) -> ExportPlan:
    """Read an export's small tables and, when it is large (more than
    :data:`STREAM_ROWS` NVTX rows), list its processes (one pass over each
    bulk table) so that it is read one process at a time; a smaller export
    is read in one pass (``processes`` empty when it holds nothing at all).

    Raises:
        HeadcountError: as :func:`read_export`.
    """
    path = Path(path)
    src = open_export(path)
    try:
        tables = src.tables()
        meta = _read_meta(src, tables)
        if _size(src, tables) <= STREAM_ROWS:
            metrics, devices = _read_gpu_metrics(src, tables), _read_devices(src, tables)
            used, gpu_pids = _gpu_users(src, tables)
            bulk = ("NVTX_EVENTS", *API_TABLES, *GPU_TABLES)
            anything = any(src.rows(f"SELECT 1 FROM {t} LIMIT 1") for t in bulk if t in tables)
            return ExportPlan(None, not anything, {}, None, meta, devices, metrics, sorted(used), sorted(gpu_pids))
        nvtx_rows, last, pids = {}, None, set()
        if "NVTX_EVENTS" in tables:
            types = ",".join(str(t) for t in RANGE_EVENT_TYPES)
            rows = src.rows(f"SELECT {_pid_of('globalTid')} AS pid, count(*), max(start), max(\"end\") FROM NVTX_EVENTS "
                              f"WHERE eventType IN ({types}) GROUP BY 1")
            nvtx_rows = {int(p): int(n) for p, n, _, _ in rows if p is not None}
            stamps = [int(v) for _, _, a, b in rows for v in (a, b) if v is not None]
            last = max(stamps) if stamps else None
            pids.update(nvtx_rows)
        for table in API_TABLES:
            if table in tables:
                pids.update(int(p) for (p,) in src.rows(f"SELECT DISTINCT {_pid_of('globalTid')} FROM {table}") if p is not None)
        used, gpu_pids = _gpu_users(src, tables)
        pids.update(gpu_pids)
        metrics = _read_gpu_metrics(src, tables)
        devices = _read_devices(src, tables)
    finally:
        src.close()
    return ExportPlan(sorted(pids), not pids, nvtx_rows, last, meta, devices, metrics, sorted(used), sorted(gpu_pids))


def _gpu_users(src, tables) -> tuple[set, set]:
    """The device ids that ran GPU work, and the process ids that launched it."""
    used, pids = set(), set()
    for table in GPU_TABLES:
        if table in tables:
            columns = src.columns(table)
            device = "deviceId" if "deviceId" in columns else "NULL"
            pid = _pid_of("globalPid") if "globalPid" in columns else "NULL"
            for p, d in src.rows(f"SELECT DISTINCT {pid}, {device} FROM {table}"):
                pids.update([int(p)] if _is_int(p) else [])
                used.update([d] if _is_int(d) else [])
    return used, pids


def by_process(export: Timeline):
    """The export's processes one at a time (NVTX ranges, launches and GPU work
    never cross processes), each a :class:`~headcount.common.tables.Timeline` of its rows."""
    names = ("ranges", "runtime", "gpu", "graph_nodes")
    pids = [pd.Categorical(getattr(export, name)["pid"]) for name in names]
    every = sorted({str(c) for p in pids for c in p.categories})
    if len(every) <= 1:
        yield export
        return
    for pid in every:
        parts = {}
        for name, p in zip(names, pids):
            frame = getattr(export, name)
            code = [str(c) for c in p.categories].index(pid) if pid in {str(c) for c in p.categories} else -2
            parts[name] = frame.iloc[np.flatnonzero(p.codes == code)].reset_index(drop=True)
        yield Timeline(**parts, gpu_metrics=export.gpu_metrics, meta=export.meta, devices=export.devices,
                       notices=export.notices if pid == every[0] else [])
        del parts  # this process is done with: not held while the next one is cut out


def devices_of(part: Timeline) -> list[int]:
    """The device ids a timeline's GPU work ran on, ascending."""
    return sorted(int(d) for d in part.gpu["device"].dropna().unique()) if len(part.gpu) else []


def process_of(part: Timeline) -> str | None:
    """The process id (as text) of one process's timeline (:func:`by_process`), ``None`` when it holds no row."""
    for frame in (part.ranges, part.runtime, part.gpu):
        if len(frame):
            return str(frame["pid"].iloc[0])
    return None


def size_of(path: str | Path) -> int:
    """NVTX rows of an export (its largest rowid: no scan)."""
    src = open_export(Path(path))
    try:
        return _size(src, src.tables())
    finally:
        src.close()


def _size(src, tables) -> int:
    """NVTX rows of the export, from the largest rowid (no scan)."""
    if "NVTX_EVENTS" not in tables:
        return 0
    return int(src.rows("SELECT max(rowid) FROM NVTX_EVENTS")[0][0] or 0)


def _read_meta(src, tables) -> dict:
    meta = {}
    for meta_table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta_table in tables:
            meta.update(dict(src.rows(f"SELECT name, value FROM {meta_table}")))
    if "META_DATA_CAPTURE" in tables:  # the command nsys launched (not its environment: it may hold secrets)
        meta.update(dict(src.rows("SELECT name, value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:COMMAND' "
                                  "OR name LIKE 'PROCESS_0:ARGUMENT%'")))
    return meta


def capture_command(meta: dict) -> str | None:
    """The command line nsys launched and recorded (``PROCESS_0`` of ``META_DATA_CAPTURE``), shell-quoted; ``None``
    where the export does not say (an attached process, an older export)."""
    import shlex

    command = meta.get("PROCESS_0:COMMAND")
    if not command:
        return None
    numbered = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in meta.items()
                      if k.startswith("PROCESS_0:ARGUMENT_") and k.rsplit("_", 1)[1].isdigit())
    return shlex.join([str(command), *(str(v) for _, v in numbered)])


def last_nvtx(path: str | Path) -> int | None:
    """The export's last NVTX timestamp (ns), where ranges left open end (one scan)."""
    src = open_export(Path(path))
    try:
        if "NVTX_EVENTS" not in src.tables():
            return None
        types = ",".join(str(t) for t in RANGE_EVENT_TYPES)
        a, b = src.rows(f"SELECT max(start), max(\"end\") FROM NVTX_EVENTS WHERE eventType IN ({types})")[0]
    finally:
        src.close()
    stamps = [int(v) for v in (a, b) if v is not None]
    return max(stamps) if stamps else None


def read_export(path: str | Path, process: int | None = None, plan: ExportPlan | None = None,
                shard: tuple[int, int] | None = None, options: ReadOptions = ReadOptions()) -> Timeline:
    """Read an nsys SQLite export (a file) or ``parquetdir`` export (a directory),
    or one process of it, or one shard of its processes.

    Args:
        process: read only this process's ranges, launch calls and GPU work.
        shard: ``(k, m)``: read only the processes whose id is k modulo m (each
            process whole, so shards are attributed independently). Ranges
            left open end where they would in a whole read: at the plan's
            ``last_nvtx_ns``, else at :func:`last_nvtx` (scanned only when a
            range of this part is open).
        plan: the export's :func:`plan_export` (its small tables are then not read again).
        options: how to read it (threads).

    Returns:
        A :class:`~headcount.common.tables.Timeline`: ``ranges`` (range_id = NVTX_EVENTS rowid, pid, tid, domain, name,
        style, start_ns,
        end_ns, end_missing), ``runtime`` (launch calls: pid, tid,
        correlation_id, start_ns, end_ns, name), ``gpu`` (kind, name, pid,
        device, stream, correlation_id, start_ns, end_ns, grid, block,
        registers_per_thread, shared_memory_bytes, graph_node_id), ``graph_nodes``
        (CUDA graph node events), ``gpu_metrics`` (device-wide
        samples: device, metric, timestamp_ns, value; empty without
        ``--gpu-metrics-devices``), ``meta`` (export metadata). Names and
        other text are pandas Categoricals.

    Raises:
        HeadcountError: not an SQLite file / not a parquetdir export, damaged,
            or (whole export) holding neither NVTX ranges nor GPU activity.
    """
    path = Path(path)
    src = open_export(path, options)
    try:
        tables = src.tables()
        strings = "StringIds" in tables
        if process is not None:
            only = lambda col: f"{_pid_of(col)} = {int(process)}"  # noqa: E731
        elif shard is not None:
            only = lambda col: f"{_pid_of(col)} % {int(shard[1])} = {int(shard[0])}"  # noqa: E731
        else:
            only = None
        last = plan.last_nvtx_ns if plan else None
        if last is None and only is not None:  # a part of the export: open ranges end at the whole export's last timestamp
            last = lambda: last_nvtx(path)  # noqa: E731 - a scan of its own, only when a range of this part is open
        ranges = _read_ranges(src, tables, strings, only, last)
        runtime = _read_runtime(src, tables, strings, only)
        gpu = _read_gpu(src, tables, strings, only)
        graph_nodes = _read_graph_nodes(src, tables, only)
        notices = []
        ranges, runtime, gpu = (drop_implausible(frame, what, notices) for frame, what in (
            (ranges, "NVTX ranges"), (runtime, "CUDA API calls"), (gpu, "GPU operations")))
        if len(ranges) and "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            notices.append("no kernel table: recorded without CUDA tracing (`nsys profile --trace=cuda,nvtx`)?")
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables and not strings:
            notices.append("no StringIds table: kernel and API call names are missing")
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables and not src.rows("SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1"):
            notices.append("the kernel table (CUPTI_ACTIVITY_KIND_KERNEL) holds no row: no kernel was read, so there is no "
                           "kernel time and no attention kernel in this report (a recording stopped before the GPU work, or "
                           "the table emptied)")
        absent = [t for t in API_TABLES if t not in tables]
        if len(gpu) and not len(runtime):
            notices.append(f"no CUDA runtime or driver call was read ({', '.join(absent) or 'their tables'} "
                           f"{'missing' if absent else 'empty'}): GPU work belongs to no NVTX range and idle time cannot "
                           "be split by cause (record with `nsys profile --trace=cuda,nvtx`)")
        elif len(gpu) and API_TABLES[0] in absent:
            notices.append(f"no CUDA runtime table ({API_TABLES[0]}): launches read from the driver table alone; kernels "
                           "launched through the runtime belong to no NVTX range")
        notices += src.notices()
        if plan is None:
            meta, metrics, devices = _read_meta(src, tables), _read_gpu_metrics(src, tables), _read_devices(src, tables)
        else:
            meta, metrics, devices = plan.meta, plan.gpu_metrics, plan.devices
    finally:
        src.close()
    if ranges.empty and gpu.empty and process is None and shard is None:
        raise NothingRecorded(f"{path}: holds neither NVTX ranges nor GPU activity", hint="record with `nsys profile --trace=cuda,nvtx`")
    return Timeline(ranges=ranges, runtime=runtime, gpu=gpu, gpu_metrics=metrics, meta=meta, devices=devices,
                    graph_nodes=graph_nodes, notices=notices)


# TARGET_INFO_GPU column → our name (units: bytes, Hz, counts; memoryBandwidth is bytes/s)
_DEVICE_COLUMNS = {
    "id": "device", "name": "name", "chipName": "chip", "computeMajor": "cc_major", "computeMinor": "cc_minor",
    "smCount": "sm_count", "totalMemory": "memory_bytes", "memoryBandwidth": "memory_bandwidth_bytes_per_s",
    "clockRate": "clock_hz", "l2CacheSize": "l2_bytes", "maxWarpsPerSm": "max_warps_per_sm",
    "maxBlocksPerSm": "max_blocks_per_sm", "maxRegistersPerSm": "registers_per_sm",
    "maxRegistersPerBlock": "max_registers_per_block", "maxShmemPerSm": "shared_memory_per_sm",
}


def _read_devices(src, tables) -> pd.DataFrame:
    """The GPUs of the recording (``TARGET_INFO_GPU``; absent in some exports):
    one row per device id, with what the occupancy calculator and the
    roofline need. Empty when the export has no such table."""
    columns = ["device", *[v for k, v in _DEVICE_COLUMNS.items() if k != "id"]]
    if "TARGET_INFO_GPU" not in tables:
        return pd.DataFrame(columns=columns)
    have = src.columns("TARGET_INFO_GPU")
    select = ", ".join(f"{k if k in have else 'NULL'} AS {v}" for k, v in _DEVICE_COLUMNS.items())
    try:
        rows = src.rows(f"SELECT DISTINCT {select} FROM TARGET_INFO_GPU")
    except Exception as exc:  # noqa: BLE001 - sqlite3 and DuckDB raise their own types
        raise HeadcountError(f"{src.path}: TARGET_INFO_GPU cannot be read ({str(exc).splitlines()[0]})",
                             hint="export the report again") from exc
    frame = pd.DataFrame(rows, columns=list(_DEVICE_COLUMNS.values()))
    return frame.drop_duplicates("device").reset_index(drop=True)[columns]


# NVTX_EVENTS' small columns travel packed in one integer (each column costs the
# driver ~0.4 s per 5 M rows): eventType (7 bits) | domainId + 1 (20 bits) |
# textId + 1 (31 bits) | ends on another thread (1 bit). Domain and string ids
# are small sequential numbers; larger ones are clamped and named in a notice-free way
_DOMAIN_BITS, _TEXT_BITS = 20, 31


def _read_ranges(src, tables, strings, only=None, last_ns: int | Callable[[], int] | None = None) -> pd.DataFrame:
    """NVTX ranges; a range left open ends at ``last_ns`` (a callable: asked only
    when a range is open), by default the last timestamp of the ranges read."""
    cols = ["range_id", "pid", "tid", "domain", "name", "style", "start_ns", "end_ns", "end_missing"]
    if "NVTX_EVENTS" not in tables:
        return pd.DataFrame(columns=cols)
    have = src.columns("NVTX_EVENTS")
    # ids + 1 (0: none) in fields of their own: a negative id is none, a too large one the field's last value
    def id_plus_one(col, bits):
        value = src.strict_int(col)
        return src.least(f"IFNULL(CASE WHEN {value} >= 0 THEN {value} + 1 END, 0)", (1 << bits) - 1)

    domain_id = id_plus_one("e.domainId", _DOMAIN_BITS) if "domainId" in have else "0"
    text_id = id_plus_one("e.textId", _TEXT_BITS) if "textId" in have else "0"
    crossed = "CAST(e.endGlobalTid IS NOT NULL AS INTEGER)" if "endGlobalTid" in have else "0"
    types = ",".join(str(t) for t in (*RANGE_EVENT_TYPES, DOMAIN_CREATE))
    # registered names (textId) are looked up in numpy: a join per row costs more than the read
    sql = f"""
        SELECT e.rowid AS range_id, e.start AS start_ns, e.end AS end_ns, e.globalTid AS global_tid,
               (({src.strict_int("e.eventType")} * {1 << _DOMAIN_BITS} + {domain_id}) * {1 << _TEXT_BITS} + {text_id}) * 2 + {crossed} AS packed,
               e.text AS text
        FROM NVTX_EVENTS e
        WHERE e.eventType IN ({types}){f" AND (e.eventType = {DOMAIN_CREATE} OR {only('e.globalTid')})" if only else ""}"""
    frame = query_columns(src, [f"{sql} AND {half}" for half in _parts_by_rowid(src, "NVTX_EVENTS", "e.rowid")] or sql, {
        "range_id": "int!", "start_ns": "int!", "end_ns": "int?", "global_tid": "int?", "packed": "int!", "text": "text"})
    packed = frame.pop("packed")
    event_type = packed >> (1 + _TEXT_BITS + _DOMAIN_BITS)
    domain_id = ((packed >> (1 + _TEXT_BITS)) & ((1 << _DOMAIN_BITS) - 1)) - 1
    text_id = ((packed >> 1) & ((1 << _TEXT_BITS) - 1)) - 1
    names = _names(frame.pop("text"), text_id, _string_ids(src, tables) if "textId" in have else (np.zeros(0, np.int64), []))
    is_domain = event_type == DOMAIN_CREATE
    keep = np.flatnonzero(~is_domain & ((packed & 1) == 0))
    if not len(keep):
        return pd.DataFrame(columns=cols)
    global_tid = frame.pop("global_tid")
    pid, tid = _split_tid(global_tid[keep])
    domain_pid, _ = _split_tid(global_tid[is_domain])
    out = pd.DataFrame({"range_id": frame.pop("range_id")[keep], "pid": _ids_as_text(pid), "tid": _ids_as_text(tid)})
    out["domain"] = _domains(domain_id[keep], pid, domain_id[is_domain], domain_pid, names[is_domain])
    out["name"] = names[keep]
    styles = sorted(set(RANGE_EVENT_TYPES.values()))
    style_code = np.full(max(RANGE_EVENT_TYPES) + 1, -1, dtype=np.int8)
    for event_type_id, style in RANGE_EVENT_TYPES.items():
        style_code[event_type_id] = styles.index(style)
    out["style"] = pd.Categorical.from_codes(style_code[event_type[keep]], categories=styles)
    starts = frame.pop("start_ns")[keep]
    ends = frame.pop("end_ns")[keep]
    missing = ends == NULL_INT
    if last_ns is None:  # nsys: the last NVTX timestamp
        last_ns = int(max(starts.max(), ends.max()))
    elif callable(last_ns):
        last_ns = last_ns() if missing.any() else 0
    out["start_ns"] = starts
    out["end_missing"] = missing
    out["end_ns"] = np.where(missing, last_ns, ends)
    return out


def _domains(domain_id: np.ndarray, pid: np.ndarray, created_id: np.ndarray, created_pid: np.ndarray,
             created_name: pd.Categorical) -> pd.Categorical:
    """Each range's domain name: domains are created per process, so (domainId, pid) → name."""
    if not len(created_id):
        return pd.Categorical.from_codes(np.full(len(domain_id), -1), categories=pd.Index([], dtype=object))
    created_key = created_id * (1 << 24) + created_pid  # (domain id, process): a domain is created per process
    created_key, first = np.unique(created_key, return_index=True)
    created_names = np.asarray(created_name, dtype=object)[first]
    categories, name_code = np.unique(np.array([str(n) if isinstance(n, str) else "" for n in created_names], dtype=object),
                                      return_inverse=True)
    name_code = np.where([isinstance(n, str) for n in created_names], name_code, -1)
    key = domain_id * (1 << 24) + pid
    pos = np.minimum(np.searchsorted(created_key, key), len(created_key) - 1)
    codes = np.where((created_key[pos] == key) & (domain_id >= 0), name_code[pos], -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))


def _names(text: pd.Categorical, text_id: np.ndarray, strings: tuple[np.ndarray, list[str]]) -> pd.Categorical:
    """Range names: the registered string of ``text_id`` (``StringIds``, :func:`_string_ids`), else ``text``."""
    ids, values = strings
    if not len(ids) or not len(text):
        return text
    pos = np.minimum(np.searchsorted(ids, text_id), len(ids) - 1)
    hit = (ids[pos] == text_id) & (text_id >= 0)
    if not hit.any():
        return text
    # registered strings become extra categories: codes past the text's own
    known = set(text.categories)
    united = text.add_categories(list(dict.fromkeys(v for v in values if v not in known)))
    code_of = united.categories.get_indexer(values)
    codes = np.where(hit, code_of[pos], united.codes)
    return pd.Categorical.from_codes(codes, categories=united.categories)


def _string_ids(src: ExportSource, tables) -> tuple[np.ndarray, list[str]]:
    """``StringIds`` (id → string), sorted by id, read once per export."""
    if src.strings is None:
        raw = src.rows("SELECT id, value FROM StringIds") if "StringIds" in tables else []
        # ids that are not integers cannot be referred to; a value that is not text is shown as text
        rows = sorted((int(i), v if isinstance(v, str) else "" if v is None else
                       v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
                      for i, v in raw if isinstance(i, int) and not isinstance(i, bool))
        src.odd_values += len(raw) - len(rows)
        src.strings = (np.array([i for i, _ in rows], dtype=np.int64), [v for _, v in rows])
    return src.strings


def _by_string_id(ids: np.ndarray, strings: tuple[np.ndarray, list[str]]) -> pd.Categorical:
    """String ids (-1: none) as a Categorical of their strings (only the strings used)."""
    known, values = strings
    if not len(known):
        return pd.Categorical.from_codes(np.full(len(ids), -1), categories=pd.Index([], dtype=object))
    pos = np.minimum(np.searchsorted(known, ids), len(known) - 1)
    codes = np.where((known[pos] == ids) & (ids >= 0), pos, -1)
    used, codes = unique_inverse(codes)
    # two ids may hold one string (a damaged or hand-made export): one category each string
    words, word_of = pd.factorize(np.array([values[u] for u in used if u >= 0], dtype=object))
    codes = codes.reshape(-1) - (1 if len(used) and used[0] < 0 else 0)
    codes = np.where(codes >= 0, words[np.maximum(codes, 0)] if len(words) else -1, -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index(np.asarray(word_of, dtype=object), dtype=object))


def _read_runtime(src, tables, strings, only=None) -> pd.DataFrame:
    frames = []
    for table in API_TABLES:
        if table not in tables:
            continue
        have = src.columns(table)
        name_id = "r.nameId" if strings and "nameId" in have else "NULL"
        frame = query_frame(src, f"""
            SELECT r.globalTid AS global_tid, r.correlationId AS correlation_id, r.start AS start_ns, r.end AS end_ns,
                   {name_id} AS name_id
            FROM {table} r{f" WHERE {only('r.globalTid')}" if only else ""}""",
                       {"global_tid": "int?", "correlation_id": "int?", "start_ns": "int?", "end_ns": "int?", "name_id": "int?"})
        frame["name"] = _by_string_id(frame.pop("name_id").to_numpy(np.int64), _string_ids(src, tables))
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["pid", "tid", "correlation_id", "start_ns", "end_ns", "name"])
    frame = _concat(frames)
    frame = frame[frame["correlation_id"].to_numpy(np.int64) != NULL_INT].reset_index(drop=True)  # no id: launches nothing we can see
    pid, tid = _split_tid(frame["global_tid"])
    return pd.DataFrame({
        "pid": _ids_as_text(pid), "tid": _ids_as_text(tid), "correlation_id": frame["correlation_id"].to_numpy(np.int64),
        "start_ns": frame["start_ns"].to_numpy(np.int64), "end_ns": frame["end_ns"].to_numpy(np.int64),
        "name": frame["name"].array,
    })


def _dims(packed: np.ndarray) -> pd.Categorical:
    """Grid or block sizes packed as x·2³² + y·2¹⁶ + z (-1: none) as ``(x, y, z)`` text, built once per distinct size."""
    used, codes = unique_inverse(packed)
    valid = used >= 0
    text = [f"({u >> 32}, {(u >> 16) & 0xFFFF}, {u & 0xFFFF})" for u in used[valid].tolist()]
    remap = np.full(len(used), -1, dtype=np.int64)
    remap[valid] = np.arange(int(valid.sum()))
    return pd.Categorical.from_codes(remap[codes.reshape(-1)], categories=pd.Index(text, dtype=object))


def _unpacked(plus_one: np.ndarray) -> pd.arrays.IntegerArray:
    """Values stored + 1 (0 for NULL) as a nullable integer array."""
    missing = plus_one == 0
    return pd.arrays.IntegerArray(np.where(missing, 0, plus_one - 1), missing)


def _read_gpu(src, tables, strings, only=None) -> pd.DataFrame:
    frames = []
    for table, kind in GPU_TABLES.items():
        if table not in tables:
            continue
        have = src.columns(table)
        name_col = next((c for c in ("shortName", "demangledName") if c in have), None) if kind == "kernel" and strings else None
        frame = gpu_columns(src, table, have, name_col, only)
        node = frame.pop("graph_node_id").to_numpy(np.int64)
        frame["graph_node_id"] = pd.arrays.IntegerArray(np.maximum(node, 0), node <= 0)  # 0 and NULL: not from a graph
        packed = frame.pop("device_stream").to_numpy(np.int64)
        resources = frame.pop("resources").to_numpy(np.int64)
        frame["device"] = _unpacked(packed >> STREAM_BITS)
        frame["stream"] = _unpacked(packed & ((1 << STREAM_BITS) - 1))
        frame["registers_per_thread"] = _unpacked(resources >> (2 * SHARED_BITS))
        frame["shared_memory_bytes"] = _unpacked((resources >> SHARED_BITS) & ((1 << SHARED_BITS) - 1))
        frame["shared_memory_config_bytes"] = _unpacked(resources & ((1 << SHARED_BITS) - 1))
        n = len(frame)
        if name_col:
            names = _by_string_id(frame.pop("name_id").to_numpy(np.int64), _string_ids(src, tables))
        else:  # memcpy, memset: named by their kind
            frame.pop("name_id")
            names = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[kind])
        frame.insert(0, "kind", pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[kind]))
        frame.insert(1, "name", names)
        frame["grid"] = _dims(frame["grid"].to_numpy(np.int64))
        frame["block"] = _dims(frame["block"].to_numpy(np.int64))
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["kind", "name", "pid", "device", "stream", "correlation_id", "start_ns", "end_ns"])
    frame = _concat(frames)
    pid, _ = _split_tid(frame["global_pid"])
    frame["pid"] = _ids_as_text(pid)
    return frame[["kind", "name", "pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "grid", "block",
                  "registers_per_thread", "shared_memory_bytes", "bytes", "shared_memory_config_bytes", "graph_node_id"]]


GRAPH_NODE_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")  # newer exports, older exports


def _read_graph_nodes(src, tables, only=None) -> pd.DataFrame:
    """CUDA graph node events (``--cuda-graph-trace=node``): a node made by the
    call at ``start_ns``–``end_ns`` on thread (``pid``, ``tid``), or, with
    ``original_node_id``, a clone of that node in an executable graph.
    Newer exports hold them in ``CUDA_GRAPH_NODE_EVENTS``, older ones in
    ``CUDA_GRAPH_EVENTS`` rows that carry a ``graphNodeId``. Id 0 is no id."""
    for table in GRAPH_NODE_TABLES:
        have = src.columns(table) if table in tables else set()
        if not {"graphNodeId", "globalTid", "start", "end"} <= have:
            continue
        original = "e.originalGraphNodeId" if "originalGraphNodeId" in have else "NULL"
        where = " AND ".join(["e.graphNodeId IS NOT NULL", "e.graphNodeId <> 0", *([only("e.globalTid")] if only else [])])
        frame = query_frame(src, f"""
            SELECT e.graphNodeId AS node_id, {original} AS original_node_id, e.globalTid AS global_tid,
                   e.start AS start_ns, e."end" AS end_ns
            FROM {table} e WHERE {where}""", {
            "node_id": "int?", "original_node_id": "int?", "global_tid": "int?", "start_ns": "int?", "end_ns": "int?"})
        pid, tid = _split_tid(frame["global_tid"])
        original = frame["original_node_id"].to_numpy(np.int64)
        return pd.DataFrame({
            "node_id": frame["node_id"].to_numpy(np.int64),
            "original_node_id": pd.arrays.IntegerArray(np.maximum(original, 0), original <= 0),
            "pid": _ids_as_text(pid), "tid": _ids_as_text(tid),
            "start_ns": frame["start_ns"].to_numpy(np.int64), "end_ns": frame["end_ns"].to_numpy(np.int64)})
    return Timeline.empty_graph_nodes()


def _read_gpu_metrics(src, tables) -> pd.DataFrame:
    """nsys GPU-metrics samples: ``GPU_METRICS`` (typeId, metricId, timestamp,
    value) named through ``TARGET_INFO_GPU_METRICS`` (typeId, metricId,
    metricName). The GPU of a sample is ``typeId & 0xFF`` (nsys's encoding)."""
    cols = ["device", "metric", "timestamp_ns", "value"]
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables:
        return pd.DataFrame(columns=cols)
    frame = query_frame(src, """
        SELECT m.typeId AS type_id, m.metricId AS metric_id, m.timestamp AS timestamp_ns, m.value AS value
        FROM GPU_METRICS m""", {"type_id": "int!", "metric_id": "int!", "timestamp_ns": "int!", "value": "int"})
    names = pd.DataFrame(src.rows("SELECT DISTINCT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS"),
                         columns=["type_id", "metric_id", "metric"])
    frame = frame.merge(names, on=["type_id", "metric_id"], how="left")
    frame["device"] = (frame["type_id"] & 0xFF).astype(np.int64)
    frame["value"] = frame["value"].astype("float64")
    return frame[cols].sort_values(["device", "metric", "timestamp_ns"], kind="stable").reset_index(drop=True)


def describe_device(devices: pd.DataFrame | None, used: list[int]) -> Device | None:
    """The run's device: the GPU its work ran on (the first, when several; ``count`` says
    how many distinct devices ran work), as ``TARGET_INFO_GPU`` describes it (``devices``,
    one row per device id); ``None`` without that table."""
    if devices is None or not len(devices):
        return None
    rows = devices[devices["device"].isin(list(used))] if len(used) else devices
    rows = rows if len(rows) else devices
    names = sorted({str(n) for n in rows["name"].dropna()})
    return Device.from_target_info(rows.iloc[0], count=int(len(rows)), name=" + ".join(names) if names else None)
