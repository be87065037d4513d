"""Shapes of an attention call found in an untagged recording, from the input dims the
recording gives its operators (``record_shapes=True``): :func:`operator_shape` from an attention
operator's q/k/v by the layout of its signal row, :func:`eager_shape` from the softmax and the
q·kᵀ / ·v matmuls inside an eager attention module. Each gives a
:class:`~headcount.common.call_log.CallShape`, or ``None`` where the dims were not recorded or do
not fit; nothing is guessed. Used by :mod:`headcount.attribute.untagged`.
"""

from __future__ import annotations

import math

import pandas as pd

from headcount.common import signals
from headcount.common.call_log import CallShape

_DTYPES = {"c10::BFloat16": ("bfloat16", 2), "c10::Half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8),
           "c10::Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e5m2": ("float8_e5m2", 1)}


def _dtype(types, i: int) -> tuple[str | None, int | None]:
    name = types[i] if types and len(types) > i else None
    if not name:
        return None, None
    known = _DTYPES.get(str(name))
    return known if known else (str(name), None)


def _is_dims(d, rank: int | None = None) -> bool:
    return isinstance(d, list) and len(d) > 0 and all(isinstance(v, int) for v in d) and (rank is None or len(d) == rank)


def operator_shape(args: dict | None, row: signals.Signal) -> CallShape | None:
    """Shapes of a forward attention operator from its recorded inputs, by the
    row's ``layout``; ``None`` where the inputs were not recorded or do not fit."""
    dims = (args or {}).get("Input Dims") or []
    if len(dims) < 3 or not all(_is_dims(d) for d in dims[:3]):
        return None
    q, k, v = dims[:3]
    types = (args or {}).get("Input type") or []
    concrete = (args or {}).get("Concrete Inputs") or []
    dtype, size = _dtype(types, 0)
    impl = row.implementation or "unknown"
    if len(q) == 3 and len(k) == 3 and len(v) == 3:  # packed tokens: (tokens, heads, head dim)
        return CallShape(impl, None, q[1], k[1], None, None, q[2], v[2], dtype, size, None)
    if not (len(q) == len(k) == len(v) == 4):
        return None
    if row.layout == "bhsd":
        (b, hq, sq, d), (_, hkv, sk, _), dv = q, k, v[3]
    else:  # bshd
        (b, sq, hq, d), (_, sk, hkv, _), dv = q, k, v[3]
    causal = None
    if row.causal_arg is not None and len(concrete) > row.causal_arg:
        flag = str(concrete[row.causal_arg]).strip()
        causal = True if flag == "True" else False if flag == "False" else None
    mask = dims[3] if row.layout == "bhsd" and len(dims) > 3 and _is_dims(dims[3]) else []
    return CallShape(impl, b, hq, hkv, sq, sk, d, dv, dtype, size, bool(causal and sq > 1) if causal is not None else None,
                     mask_elements=math.prod(mask) if mask else 0, mask_dtype_bytes=1 if mask else 0)


def eager_shape(ops: pd.DataFrame) -> CallShape | None:
    """Shapes of eager attention from the operators inside one module call (in
    time order): the first 4-D softmax input ``(b, h, q_len, kv_len)``, the
    matmul ``(…, q_len, d) × (…, d, kv_len)`` before it and ``(…, q_len, kv_len)
    × (…, kv_len, dv)`` after it; ``None`` unless all three are recorded and agree."""
    names = [signals.operator_name(str(n)) for n in ops["name"]]
    args = ops["args"].to_numpy(object)
    soft = next((i for i, n in enumerate(names) if n in signals.SOFTMAX_OPS and args[i]
                 and _is_dims((args[i].get("Input Dims") or [None])[0], 4)), None)
    if soft is None:
        return None
    b, h, sq, sk = args[soft]["Input Dims"][0]

    def matmul(rng, want):
        for i in rng:
            if names[i] in signals.MATMUL_OPS and args[i]:
                dims = args[i].get("Input Dims") or []
                if len(dims) >= 2 and _is_dims(dims[0]) and _is_dims(dims[1]) and len(dims[0]) >= 3 and len(dims[1]) >= 3:
                    got = want(dims[0], dims[1])
                    if got is not None and math.prod(dims[0][:-2]) == b * h:
                        return got, i
        return None, None

    d, at = matmul(range(soft - 1, -1, -1), lambda a, c: a[-1] if a[-2] == sq and c[-1] == sk and c[-2] == a[-1] else None)
    dv, _ = matmul(range(soft + 1, len(names)), lambda a, c: c[-1] if a[-2:] == [sq, sk] and c[-2] == sk else None)
    if d is None or dv is None:
        return None
    dtype, size = _dtype(args[at].get("Input type") or [], 0)
    # eager attention computes every (query, key) score whatever the mask: not causal for the work done
    return CallShape("eager", b, h, h, sq, sk, d, dv, dtype, size, False)
