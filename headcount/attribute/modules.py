"""Attention calls of a trace recorded without headcount's tags, from what
torch.profiler recorded anyway: ``nn.Module`` ranges (``with_modules=True``)
and the inputs of ``aten::scaled_dot_product_attention`` (``record_shapes=True``).

Each SDPA call becomes one attention call: ``fwd/layer.N`` ranges spanning
the call on its thread (so the kernels it launched are attributed by the same
launch rule as headcount's own ranges) and a call-log entry with its shapes.
``N`` is the index of the nearest enclosing module named like a layer
(``BertLayer_0``, ``Qwen2DecoderLayer_3``, ``GPT2Block_5``: ``…Layer_N`` or
``…Block_N``), else of the nearest enclosing attention module
(``…Attention_N``), else the call's order. Only SDPA calls are found this way:
eager attention (matmul + softmax) has no single operator to key on.
Backward calls are not recognised (the SDPA backward operators carry no
module); such traces give forward layers only.
"""

from __future__ import annotations

import re

import pandas as pd

from headcount.tagging.naming import DOMAIN
from headcount.tagging.shapes import CallShape
from headcount.tagging.tagger import CallLog

_LAYER = re.compile(r"(?:Layer|Block)_(\d+)$")
_ATTENTION = re.compile(r"Attention_(\d+)$")
_DTYPES = {"c10::BFloat16": ("bfloat16", 2), "c10::Half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8)}


def _index(modules: pd.DataFrame, pattern: re.Pattern) -> int | None:
    for name in modules.sort_values("start_ns", ascending=False)["name"]:  # innermost first
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return None


def _shape(args: dict) -> CallShape | None:
    dims = (args or {}).get("Input Dims") or []
    types = (args or {}).get("Input type") or []
    concrete = (args or {}).get("Concrete Inputs") or []
    if len(dims) < 3 or any(len(d) != 4 for d in dims[:3]):
        return None
    (b, hq, sq, d), (_, hkv, sk, _), (_, _, _, dv) = dims[:3]
    dtype, size = _DTYPES.get(types[0] if types else "", (str(types[0]) if types else "unknown", 0))
    mask = dims[3] if len(dims) > 3 else []
    causal = len(concrete) > 5 and str(concrete[5]).strip() == "True"
    mask_elements = 1
    for v in mask:
        mask_elements *= int(v)
    return CallShape(implementation="sdpa", batch=int(b), q_heads=int(hq), kv_heads=int(hkv), q_len=int(sq), kv_len=int(sk),
                     head_dim=int(d), v_head_dim=int(dv), dtype=dtype, dtype_bytes=size, causal=bool(causal and sq > 1),
                     mask_elements=mask_elements if mask else 0, mask_dtype_bytes=1 if mask else 0)


def _range(events: pd.DataFrame, name: str, pid, tid, start: int, end: int) -> dict:
    return {**{c: None for c in events.columns}, "kind": "range", "name": f"{DOMAIN}@{name}", "pid": pid, "tid": tid,
            "start_ns": start, "end_ns": end}


def attention_ranges(events: pd.DataFrame) -> tuple[pd.DataFrame, list[CallLog]]:
    """Ranges (rows of the events table, ``kind`` ``range``, named
    ``headcount@fwd`` and ``headcount@layer.N``) and call-log entries for
    every SDPA call inside an ``nn.Module`` range.

    Returns:
        ``(ranges, calls)``; both empty when the trace has no SDPA call or no module ranges.
    """
    sdpa = events[(events["kind"] == "op") & (events["name"] == "aten::scaled_dot_product_attention")]
    modules = events[events["kind"] == "module"]
    rows, calls = [], []
    if not len(sdpa) or not len(modules):
        return pd.DataFrame(columns=events.columns), calls
    # an SDPA call nested in another (a wrapper calling the operator again) counts once
    sdpa = sdpa.sort_values("start_ns")
    order = 0
    last_end = {}
    for op in sdpa.itertuples(index=False):
        key = (op.pid, op.tid)
        if last_end.get(key, -1) >= op.end_ns:
            continue
        last_end[key] = op.end_ns
        around = modules[(modules["pid"] == op.pid) & (modules["tid"] == op.tid)
                         & (modules["start_ns"] <= op.start_ns) & (modules["end_ns"] >= op.end_ns)]
        if not len(around):
            continue
        index = _index(around, _LAYER)
        if index is None:
            index = _index(around, _ATTENTION)
        if index is None:
            index = order
        order += 1
        layer_name = f"layer.{index}"
        # as headcount tags a call: fwd around layer.N (1 ns wider, so that the two nest unambiguously)
        rows.append(_range(events, "fwd", op.pid, op.tid, op.start_ns - 1, op.end_ns + 1))
        rows.append(_range(events, layer_name, op.pid, op.tid, op.start_ns, op.end_ns))
        calls.append(CallLog(thread_id=0, phase="fwd", layer_name=layer_name, layer=index, head=None, kv_head=None,
                             shape=_shape(op.args), model=None))
    ranges = pd.DataFrame(rows, columns=events.columns)
    if len(ranges):
        ranges["start_ns"] = ranges["start_ns"].astype("int64")
        ranges["end_ns"] = ranges["end_ns"].astype("int64")
    return ranges, calls
