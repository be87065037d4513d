"""Read one attention call's metadata from its tensors (:class:`~headcount.common.call_log.CallMeta`).

Read from the tensors' metadata only (``.shape``, ``.dtype``): never from
their values, so recording a call launches no GPU work inside the measured
range. The sizes the analytic model needs are worked out later, once per
distinct call (:func:`headcount.common.call_log.shape_of`).
"""

from __future__ import annotations

import torch

from headcount.common.call_log import CallMeta, CallShape, shape_of


def metadata(implementation, query, key, value, mask, causal, sliding_window=None, layout="bhsd") -> CallMeta:
    """The call's :class:`CallMeta`, read cheaply on the hot path (no sizes worked out, no hashing).

    Args:
        mask: the attention mask passed to the call (a tensor, or anything else for none).
        layout: ``bhsd`` (transformers, ``F.scaled_dot_product_attention``) or
            ``bshd`` (flash-attn's own functions).
    """
    mask_meta = (mask.shape, mask.dtype) if isinstance(mask, torch.Tensor) else None
    # tuple.__new__: the NamedTuple without its Python-level __new__ (hot path)
    return tuple.__new__(CallMeta, (implementation, query.shape, key.shape, value.shape, query.dtype, mask_meta, causal,
                                    sliding_window, layout))


def from_call(implementation, query, key, value, mask, causal, sliding_window=None, layout="bhsd") -> CallShape:
    """The call's sizes (:class:`~headcount.common.call_log.CallShape`) from its arguments (the arguments of :func:`metadata`)."""
    return shape_of(metadata(implementation, query, key, value, mask, causal, sliding_window, layout))
