"""The query of one GPU activity table of an nsys export (kernels, memcpy, memset): its columns, the small ones
packed in pairs, each value + 1 (0: NULL) — device | stream (:data:`STREAM_BITS`); registers per thread |
shared memory bytes | shared memory configured (:data:`SHARED_BITS` each) — and launch dimensions packed
x | y | z, unpacked by :func:`headcount.parsers.nsys_sqlite.read_export`.

SQLite columns have no fixed type: a value that is not an integer (text, a real) in an integer column
is read as missing. The fast way reads the integer columns as they are and checks them in numpy
(:func:`_plain`, no SQL per row: a third of the kernel table's read); an export whose driver finds a
value that is not an integer there is read the strict way, the checks in SQL (:func:`_strict`). Both
give the same columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.parsers.nsys_export import ABSENT, NotPlain, query_columns, query_frame

STREAM_BITS, SHARED_BITS = 40, 24
_FIELDS = ("deviceId", "streamId", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
           "staticSharedMemory", "dynamicSharedMemory", "sharedMemoryExecuted")
_TYPES = {"name_id": "int?", "global_pid": "int?", "device_stream": "int!", "correlation_id": "int?",
          "start_ns": "int?", "end_ns": "int?", "grid": "int?", "block": "int?", "resources": "int!", "bytes": "int",
          "graph_node_id": "int?"}


def gpu_columns(src, table: str, have: set[str], name_col: str | None, only=None) -> pd.DataFrame:
    """The columns of :data:`_TYPES` of GPU activity ``table`` (whose columns are ``have``; ``name_col``: its
    name's string id, if any; ``only``: a condition on the process id column, as :func:`read_export`'s)."""
    where = f" WHERE {only('g.globalPid')}" if only else ""
    passed = [f"g.{name_col}" if name_col else "NULL", "g.globalPid", "g.correlationId", "g.start", "g.end",
              "g.bytes" if "bytes" in have else "NULL", "g.graphNodeId" if "graphNodeId" in have else "NULL"]
    names = ["name_id", "global_pid", "correlation_id", "start_ns", "end_ns", "bytes", "graph_node_id"]
    fields = [c for c in _FIELDS if c in have]
    sql = (f"SELECT {', '.join(f'{e} AS {n}' for e, n in zip(passed, names))}"
           f"{''.join(f', g.{c} AS {c}' for c in fields)} FROM {table} g{where}")
    try:
        raw = query_columns(src, sql, {**{n: _TYPES[n] for n in names}, **{c: "int~" for c in fields}}, plain=True)
    except NotPlain:
        return _strict(src, table, have, name_col, where)
    return pd.DataFrame(_plain(raw, {c: raw.pop(c) for c in fields}))


def _plain(raw: dict, fields: dict[str, np.ndarray]) -> dict:
    """The packed columns of :func:`_strict`'s SQL, computed in numpy from the raw ``fields`` (NULL: ABSENT)."""
    n = len(raw["start_ns"])
    zero = np.zeros(n, dtype=np.int64)

    def plus_one(v, bits=SHARED_BITS):  # a value + 1, 0 for NULL, absent, not an integer, negative or too wide
        return np.where((v >= 0) & (v <= (1 << bits) - 2), v + 1, 0)

    def field(name, bits=SHARED_BITS):
        return plus_one(fields[name], bits) if name in fields else zero

    def dims(prefix):  # y and z of a grid or block are at most 65535 (CUDA's limits); outside them: unknown (-1)
        if not {f"{prefix}{a}" for a in "XYZ"} <= fields.keys():
            return np.full(n, -1, dtype=np.int64)
        x, y, z = (fields[f"{prefix}{a}"] for a in "XYZ")
        ok = (x >= 0) & (x <= 2147483647) & (y >= 0) & (y <= 65535) & (z >= 0) & (z <= 65535)
        return np.where(ok, x * 4294967296 + y * 65536 + z, -1)

    if {"staticSharedMemory", "dynamicSharedMemory"} <= fields.keys():
        static, dynamic = fields["staticSharedMemory"], fields["dynamicSharedMemory"]
        summed = (static != ABSENT) & (dynamic != ABSENT) & (np.abs(static) < 1 << 62) & (np.abs(dynamic) < 1 << 62)
        shared = plus_one(np.where(summed, static + dynamic, -1))
    else:
        shared = zero
    return {"name_id": raw["name_id"], "global_pid": raw["global_pid"],
            "device_stream": field("deviceId", 20) * (1 << STREAM_BITS) + field("streamId", STREAM_BITS),
            "correlation_id": raw["correlation_id"], "start_ns": raw["start_ns"], "end_ns": raw["end_ns"],
            "grid": dims("grid"), "block": dims("block"),
            "resources": (field("registersPerThread", 14) * (1 << SHARED_BITS) + shared) * (1 << SHARED_BITS)
                         + field("sharedMemoryExecuted"),
            "bytes": raw["bytes"], "graph_node_id": raw["graph_node_id"]}


def _strict(src, table: str, have: set[str], name_col: str | None, where: str) -> pd.DataFrame:
    """:func:`gpu_columns` with every integer checked in SQL (an export with values that are not integers)."""

    def col(name, alias, default="NULL"):
        return f"g.{name} AS {alias}" if name in have else f"{default} AS {alias}"

    def dims(prefix):
        if {f"{prefix}X", f"{prefix}Y", f"{prefix}Z"} <= have:
            x, y, z = (src.strict_int(f"g.{prefix}{a}") for a in "XYZ")
            return (f"CASE WHEN {x} BETWEEN 0 AND 2147483647 AND {y} BETWEEN 0 AND 65535 AND {z} BETWEEN 0 AND 65535 "
                    f"THEN {x} * 4294967296 + {y} * 65536 + {z} END")
        return "NULL"

    def plus_one(value, bits=SHARED_BITS):
        return f"(CASE WHEN {value} BETWEEN 0 AND {(1 << bits) - 2} THEN {value} + 1 ELSE 0 END)"

    def field(name, bits=SHARED_BITS):
        return plus_one(src.strict_int(f"g.{name}"), bits) if name in have else "0"

    shared = (plus_one(f"{src.strict_int('g.staticSharedMemory')} + {src.strict_int('g.dynamicSharedMemory')}")
              if {"staticSharedMemory", "dynamicSharedMemory"} <= have else "0")
    return query_frame(src, f"""
        SELECT {f"g.{name_col}" if name_col else "NULL"} AS name_id, g.globalPid AS global_pid,
               {field('deviceId', 20)} * {1 << STREAM_BITS} + {field('streamId', STREAM_BITS)} AS device_stream,
               g.correlationId AS correlation_id, g.start AS start_ns, g.end AS end_ns,
               {dims('grid')} AS grid, {dims('block')} AS block,
               ({field('registersPerThread', 14)} * {1 << SHARED_BITS} + {shared}) * {1 << SHARED_BITS}
                   + {field('sharedMemoryExecuted')} AS resources,
               {col('bytes', 'bytes')}, {col('graphNodeId', 'graph_node_id')}
        FROM {table} g{where}""", _TYPES)
