"""The nsys side of :mod:`headcount.attribute.untagged`: one process of an nsys export
(:class:`~headcount.common.tables.Timeline`'s ``ranges``, ``runtime``, ``gpu``) as the events table
:func:`~headcount.attribute.untagged.find_calls` reads (:func:`nvtx_events`: PyTorch's ``emit_nvtx``
ranges read as operators with their sequence numbers and input sizes, module ranges as modules), and
the export's NVTX ranges with the found calls' ranges added (:func:`with_nvtx_ranges`).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from headcount.attribute.untagged import CALL_KEY
from headcount.common import signals
from headcount.common.arrays import distinct_text, equals
from headcount.common.naming import DOMAIN

_NVTX_SEQ = re.compile(r", (?:stashed seq = (\d+)|seq = (\d+))")
_NVTX_SIZES = re.compile(r", sizes = (\[.*?\]\])")
_ANNOTATIONS = ("FSDP::",)


def _nvtx_name(name: str) -> tuple[str | None, int | None, dict | None]:
    """An NVTX range name's kind (``op``, ``module`` or ``None``: an annotation), the
    autograd sequence number and the input sizes ``emit_nvtx`` wrote into it."""
    base = signals.operator_name(name)
    if base.startswith(_ANNOTATIONS):  # record_function labels with "::", not operators: FSDP's hooks name module paths
        return None, None, None
    if "::" in base:
        m = _NVTX_SEQ.search(name)
        seq = int(m.group(1) or m.group(2)) if m else None
        args = None
        if base in signals.SOFTMAX_OPS or base in signals.MATMUL_OPS or signals.match("operator", base):
            sizes = _NVTX_SIZES.search(name)
            if sizes:
                try:
                    args = {"Input Dims": json.loads(sizes.group(1))}
                except ValueError:
                    args = None
        return "op", seq, args
    if base.startswith("nn.Module: ") or (signals.MODULE_INSTANCE.match(base)
                                         and (signals.LAYER_MODULE.search(base) or signals.match("module", base))):
        return "module", None, None
    if signals.BACKWARD.search(base) and (", seq = " in name or ", stashed seq = " in name):
        m = _NVTX_SEQ.search(name)  # an autograd node's range (``SoftmaxBackward0, seq = 12, …``)
        return "op", int(m.group(1) or m.group(2)) if m else None, None
    return None, None, None


def nvtx_events(ranges: pd.DataFrame, runtime: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame | None:
    """One process of an nsys export (:class:`~headcount.common.tables.Timeline`'s
    ``ranges``, ``runtime``, ``gpu``) as the events table :func:`~headcount.attribute.untagged.find_calls` reads:
    NVTX ranges named after operators (PyTorch's ``emit_nvtx``: ``aten::x, seq = N,
    op_id = M, sizes = […]``) are operators with their sequence number and input
    sizes (no dtypes: analytic bytes stay null), ranges named like module classes
    (``nn.Module: X_3``, ``CoreAttention``, ``…DecoderLayer_5``) are modules, other
    ranges annotations; runtime calls and kernels as they are.

    Returns:
        The events, or ``None`` when no range or kernel name can be a signal (nothing to find).
    """
    names = ranges["name"] if isinstance(ranges["name"].dtype, pd.CategoricalDtype) else ranges["name"].astype("category")
    distinct = [str(c) for c in names.cat.categories]
    parsed = [_nvtx_name(n) for n in distinct]  # once per distinct name
    kernel_names = distinct_text(gpu.loc[equals(gpu["kind"], "kernel"), "name"]) if len(gpu) else []
    named = any(p[0] == "module" or (p[0] == "op" and signals.match("operator", signals.operator_name(n)))
                for n, p in zip(distinct, parsed))
    if not named and not any(signals.match("kernel", k) for k in kernel_names):
        return None
    codes = names.cat.codes.to_numpy()
    text = np.array(distinct + [""], dtype=object)[codes]  # code -1 (no name): ""
    kinds = np.array([p[0] or "range" for p in parsed] + ["range"], dtype=object)[codes]
    args = np.array([p[2] for p in parsed] + [None], dtype=object)[codes]
    sequence = pd.array([p[1] for p in parsed] + [None], dtype="Int64")[codes]
    out = pd.DataFrame({
        "kind": kinds, "name": text,
        "pid": ranges["pid"].astype(object).to_numpy(), "tid": ranges["tid"].astype(object).to_numpy(),
        "start_ns": ranges["start_ns"].to_numpy(np.int64), "end_ns": ranges["end_ns"].to_numpy(np.int64),
        "correlation_id": pd.array([pd.NA] * len(ranges), dtype="Int64"),
        "args": args, "sequence": sequence,
        "graph_node_id": pd.array([pd.NA] * len(ranges), dtype="Int64"),
    })
    calls = pd.DataFrame({"kind": "runtime", "name": runtime["name"].astype(object).to_numpy(),
                          "pid": runtime["pid"].astype(object).to_numpy(), "tid": runtime["tid"].astype(object).to_numpy(),
                          "start_ns": runtime["start_ns"].to_numpy(np.int64), "end_ns": runtime["end_ns"].to_numpy(np.int64),
                          "correlation_id": pd.array(runtime["correlation_id"], dtype="Int64")})
    kernels = gpu[equals(gpu["kind"], "kernel")]
    work = pd.DataFrame({"kind": "kernel", "name": kernels["name"].astype(object).to_numpy(),
                         GPU_ROW: np.flatnonzero(equals(gpu["kind"], "kernel")),
                         "pid": kernels["pid"].astype(object).to_numpy(), "tid": None,
                         "start_ns": kernels["start_ns"].to_numpy(np.int64), "end_ns": kernels["end_ns"].to_numpy(np.int64),
                         "correlation_id": pd.array(kernels["correlation_id"], dtype="Int64"),
                         "graph_node_id": pd.array(kernels["graph_node_id"], dtype="Int64") if "graph_node_id" in kernels
                         else pd.array([pd.NA] * len(kernels), dtype="Int64")})
    return pd.concat([f for f in (out, calls, work) if len(f)] or [out], ignore_index=True)


GPU_ROW = "gpu_row"
"""Column of :func:`nvtx_events`' kernel rows: the row's position in the export's ``gpu`` table."""


def with_nvtx_ranges(ranges: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """An nsys export's NVTX ranges (:class:`~headcount.common.tables.Timeline` ``ranges``) plus the
    ranges of the calls :func:`~headcount.attribute.untagged.find_calls` found there, as ranges of headcount's domain
    (new ``range_id`` s after the export's own), with their :data:`~headcount.attribute.untagged.CALL_KEY` where a graph replay's kernels
    are assigned by name (null for the export's own ranges)."""
    first = int(ranges["range_id"].max()) + 1 if len(ranges) else 1
    ours = pd.DataFrame({"range_id": np.arange(first, first + len(found), dtype=np.int64), "pid": found["pid"].to_numpy(object),
                         "tid": found["tid"].to_numpy(object), "domain": DOMAIN,
                         "name": [n.split("@", 1)[1] for n in found["name"]], "style": "PushPop",
                         "start_ns": found["start_ns"].to_numpy(np.int64), "end_missing": False,
                         "end_ns": found["end_ns"].to_numpy(np.int64)})
    if CALL_KEY in found and (found[CALL_KEY] >= 0).any():
        ours[CALL_KEY] = pd.array(found[CALL_KEY].to_numpy(np.int64), dtype="Int64")
    text = [c for c in ("pid", "tid", "domain", "name", "style") if c in ranges]
    both = pd.concat([ranges.astype({c: object for c in text}), ours], ignore_index=True)
    return both.astype({c: "category" for c in text})
