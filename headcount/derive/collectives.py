"""Communication by collective kind: the ``collectives`` table (docs/report-format.md § collectives).

Tables in (a kernels table), a table out; no I/O. One row per implementation × process × device × step ×
collective kind (:data:`headcount.common.communication.KINDS`), over the communication kernels named in
:data:`headcount.common.communication.SIGNALS`:

- ``kind``: what torch.distributed called the collective (the kernel's ``Collective name``, or its ``nccl:all_to_all``
  annotation), else what the kernel's name says (NCCL runs all-to-all and pipelined all-gathers as ``SendRecv``);
- ``calls``: the kernels (one per collective launch; NCCL runs one kernel per collective);
- ``time_ns``: their durations summed; ``busy_ns``: their union (kernels of one kind on several streams
  count once);
- where the recording carries each call's message (torch.profiler's ``In msg nelems`` / ``Out msg nelems``,
  ``dtype``, ``Group size`` on the kernel): ``bytes`` = the larger of the two messages × the element size
  (nccl-tests' *size*: the all-gather's output, the reduce-scatter's input), ``algbw_gbps`` = bytes ÷ the
  sized calls' time and ``busbw_gbps`` = algbw × the kind's factor for ``group_size`` ranks, both as
  nccl-tests defines them (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``: all-reduce 2(n−1)/n; all-gather,
  reduce-scatter and all-to-all (n−1)/n; broadcast, reduce and send/recv 1). Null where no call of the row
  carries a size (an nsys export: NCCL's NVTX payloads are not read), never 0.

Rows add up: a reader grouping them sums ``calls``, ``time_ns``, ``bytes`` and ``sized_time_ns`` and divides
again (``busy_ns`` of different rows may overlap).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common import communication
from headcount.common.arrays import equals, per_text
from headcount.derive.launch import union_length

DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2, "int": 4,
               "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "byte": 1, "uint8": 1, "char": 1, "int8": 1,
               "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}
"""Element sizes of the ``dtype`` torch.profiler writes on a collective (bytes)."""

def bus_factor(kind: str, ranks) -> float:
    """nccl-tests' bus-bandwidth factor of a collective kind over ``ranks`` ranks (NaN: ranks unknown)."""
    if kind in ("broadcast", "reduce", "send_recv"):
        return 1.0
    if ranks is None or pd.isna(ranks) or int(ranks) < 1:
        return float("nan")
    n = float(ranks)
    if kind == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    return float("nan")


KEYS = ["implementation", "pid", "device", "step", "kind"]
COLUMNS = [*KEYS, "library", "calls", "time_ns", "busy_ns", "sized_calls", "sized_time_ns", "bytes", "group_size", "dtype",
           "algbw_gbps", "busbw_gbps", "provenance"]


def collectives(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """The ``collectives`` rows of a kernels table (see the module docstring); no row without communication."""
    if kernels is None or not len(kernels) or "name" not in kernels or "kind" not in kernels:
        return pd.DataFrame(columns=COLUMNS)
    kind_by_name = per_text(kernels["name"], communication.kind_of)
    mine = equals(kernels["kind"], "kernel") & pd.notna(kind_by_name)
    comm = kernels[mine]
    if not len(comm):
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.DataFrame({
        "implementation": comm["implementation"].astype(object).to_numpy() if "implementation" in comm else "unknown",
        "pid": comm["pid"].astype(object).to_numpy() if "pid" in comm else None,
        "device": comm["device"].astype(object).to_numpy() if "device" in comm else None,
        "step": pd.array(comm["step"], dtype="Int64") if "step" in comm else pd.array([pd.NA] * len(comm), dtype="Int64"),
        "kind": _kinds(comm, kind_by_name[mine]),
        "library": comm["name"].astype(str).map(communication.library_of).to_numpy(),
        # relative to the first start in int64 first: absolute CUPTI times (~1.7e18 ns) are 256 ns apart in float64
        "start": _since(comm["start_ns"], comm["start_ns"]),
        "end": _since(comm["end_ns"], comm["start_ns"]),
    })
    frame["duration"] = frame["end"] - frame["start"]
    frame["bytes"] = _message_bytes(comm)
    frame["group_size"] = pd.array(comm["group_size"], dtype="Int64") if "group_size" in comm else pd.array([pd.NA] * len(comm), dtype="Int64")
    frame["dtype"] = comm["comm_dtype"].astype(object).to_numpy() if "comm_dtype" in comm else None
    rows = []
    for key, g in frame.groupby(KEYS, dropna=False, sort=True):
        sized = g[g["bytes"].notna()]
        total = float(sized["bytes"].sum()) if len(sized) else np.nan
        sized_time = float(sized["duration"].sum()) if len(sized) else np.nan
        ranks = g["group_size"].dropna()
        ranks = int(ranks.mode().iloc[0]) if len(ranks) else None
        algbw = total / sized_time if len(sized) and sized_time > 0 else np.nan
        dtypes = g["dtype"].dropna()
        rows.append({**dict(zip(KEYS, key)), "library": g["library"].mode().iloc[0], "calls": len(g),
                     "time_ns": float(g["duration"].sum()), "busy_ns": float(union_length(np.zeros(len(g), dtype=np.int64), g["start"].to_numpy(), g["end"].to_numpy(), 1)[0]),
                     "sized_calls": len(sized), "sized_time_ns": sized_time, "bytes": total, "group_size": ranks,
                     "dtype": dtypes.mode().iloc[0] if len(dtypes) else None, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * bus_factor(key[-1], ranks), "provenance": "measured"})
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["step"] = pd.array(out["step"], dtype="Int64")
    out["group_size"] = pd.array(out["group_size"], dtype="Int64")
    return out


_MESSAGE = (("collective", "Collective name", object), ("msg_in_nelems", "In msg nelems", "Int64"),
            ("msg_out_nelems", "Out msg nelems", "Int64"), ("group_size", "Group size", "Int64"), ("comm_dtype", "dtype", object))


def message_columns(kernels: pd.DataFrame) -> None:
    """Give a kernels table (in place) its collectives' messages as columns (``collective``, ``msg_in_nelems``,
    ``msg_out_nelems``, ``group_size``, ``comm_dtype``) from the ``args`` a torch.profiler trace keeps on those kernels;
    nothing where no row carries one."""
    if "args" not in kernels or not len(kernels):
        return
    args = kernels["args"].to_numpy(object)
    rows = [i for i, a in enumerate(args) if isinstance(a, dict) and "Collective name" in a]
    if not rows:
        return
    for column, key, dtype in _MESSAGE:
        values = kernels[column].astype(object).to_numpy(copy=True) if column in kernels else np.full(len(kernels), None, dtype=object)
        values[rows] = [args[i].get(key) for i in rows]  # the kernel's own message first (an annotation's name else)
        kernels[column] = pd.array(pd.to_numeric(pd.Series(values), errors="coerce"), dtype="Int64") if dtype == "Int64" \
            else pd.Series(values, index=kernels.index, dtype=object)


def _since(values: pd.Series, starts: pd.Series) -> np.ndarray:
    """``values`` less the earliest of ``starts``, exactly (int64), as float64 ns."""
    ints = pd.to_numeric(values).to_numpy(np.int64)
    return (ints - int(pd.to_numeric(starts).to_numpy(np.int64).min())).astype(np.float64)


def _kinds(comm: pd.DataFrame, by_name: np.ndarray) -> np.ndarray:
    """Each communication kernel's kind: the collective its message or its ``nccl:…`` annotation names
    (``collective``: torch.distributed's own word), else its kernel name's (``by_name``: NCCL runs an all-to-all as ``SendRecv``)."""
    if "collective" not in comm:
        return by_name
    named = comm["collective"].astype(object).map(lambda c: communication.kind_of_collective(c) if isinstance(c, str) else None)
    return np.where(named.notna().to_numpy(), named.to_numpy(object), by_name)


def _message_bytes(comm: pd.DataFrame) -> np.ndarray:
    """Each collective's size (bytes): the larger of its input and output messages × its element size; NaN unknown."""
    if "msg_in_nelems" not in comm and "msg_out_nelems" not in comm:
        return np.full(len(comm), np.nan)
    def nelems(col):
        return pd.to_numeric(comm[col], errors="coerce").to_numpy(np.float64, na_value=np.nan) if col in comm \
            else np.full(len(comm), np.nan)

    count = np.fmax(nelems("msg_in_nelems"), nelems("msg_out_nelems"))
    size = comm["comm_dtype"].astype(object).map(lambda d: DTYPE_BYTES.get(str(d).lower()) if d is not None and not pd.isna(d) else None) \
        if "comm_dtype" in comm else pd.Series([None] * len(comm))
    return count * pd.to_numeric(size, errors="coerce").to_numpy(np.float64, na_value=np.nan)
