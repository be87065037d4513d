"""What one attention call looked like: the shapes the analytic model needs.

Read from the tensors' metadata only (``.shape``, ``.dtype``): never from
their values, so recording a call launches no GPU work inside the measured
range.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class CallShape:
    """Shapes of one attention call (layouts as transformers passes them:
    q ``(B, H_q, Q, D)``, k/v ``(B, H_kv, K, D)``).

    Attributes:
        implementation: ``eager``, ``sdpa``, ``flash_attention_2``, ``flex_attention``, or ``manual``.
        batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_head_dim: sizes (elements).
        dtype: torch dtype name of q; dtype_bytes its element size (bytes).
        causal: the call applies a causal mask (and has more than one query).
        mask_elements: elements of a materialized mask tensor read by the call (0 if none).
        mask_dtype_bytes: element size of that mask (bytes).
        sliding_window: window length (tokens) where the call uses one.
        mask_per_head: the mask has a head dimension of size ``q_heads`` (else it is shared by all heads).
    """

    implementation: str
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_head_dim: int
    dtype: str
    dtype_bytes: int
    causal: bool
    mask_elements: int = 0
    mask_dtype_bytes: int = 0
    sliding_window: int | None = None

    mask_per_head: bool = False

    def one_head(self) -> "CallShape":
        """The same call restricted to one query head (and its key/value head)."""
        mask = self.mask_elements
        if self.mask_per_head:
            mask //= self.q_heads
        return replace(self, q_heads=1, kv_heads=1, mask_elements=mask, mask_per_head=False)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def from_call(
    implementation: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask,
    causal: bool,
    sliding_window: int | None = None,
    layout: str = "bhsd",
) -> CallShape:
    """Build a :class:`CallShape` from the call's arguments.

    Args:
        layout: ``bhsd`` (transformers, ``F.scaled_dot_product_attention``) or
            ``bshd`` (flash-attn's own functions).
    """
    return from_meta(metadata(implementation, query, key, value, mask, causal, sliding_window, layout))


def metadata(implementation, query, key, value, mask, causal, sliding_window=None, layout="bhsd") -> tuple:
    """What :func:`from_meta` needs, read cheaply on the hot path (no hashing,
    no object construction beyond a tuple)."""
    mask_meta = (mask.shape, mask.dtype) if isinstance(mask, torch.Tensor) else None
    return (implementation, query.shape, key.shape, value.shape, query.dtype, mask_meta, causal, sliding_window, layout)


def from_meta(meta: tuple) -> CallShape:
    """Build a :class:`CallShape` from :func:`metadata`'s tuple."""
    implementation, q_shape, k_shape, v_shape, dtype, mask_meta, causal, sliding_window, layout = meta
    h_dim, s_dim = (1, 2) if layout == "bhsd" else (2, 1)
    mask_elements = mask_bytes = 0
    per_head = False
    if mask_meta is not None:
        m_shape, m_dtype = mask_meta
        mask_elements = int(torch.Size(m_shape).numel())
        mask_bytes = m_dtype.itemsize
        per_head = len(m_shape) == 4 and m_shape[1] == q_shape[h_dim] > 1
    q_len = q_shape[s_dim]
    return CallShape(
        implementation=implementation,
        batch=int(q_shape[0]),
        q_heads=int(q_shape[h_dim]),
        kv_heads=int(k_shape[h_dim]),
        q_len=int(q_len),
        kv_len=int(k_shape[s_dim]),
        head_dim=int(q_shape[-1]),
        v_head_dim=int(v_shape[-1]),
        dtype=_dtype_name(dtype),
        dtype_bytes=int(dtype.itemsize),
        causal=bool(causal and q_len > 1),
        mask_elements=mask_elements,
        mask_dtype_bytes=int(mask_bytes),
        sliding_window=int(sliding_window) if sliding_window else None,
        mask_per_head=per_head,
    )
