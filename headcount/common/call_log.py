"""What one attention call was: the declared shapes of the call log (docs/architecture.md §5).

Three types, built by the tagger on the hot path, by the untagged-recording
finder (:mod:`headcount.attribute.untagged`) and by ``headcount run``'s child
process, and read by attribution and the analytic model:

- :class:`CallMeta`: what the tagger reads from the call's tensors, cheaply
  (shapes and dtypes as torch hands them over, no arithmetic);
- :class:`CallShape`: the sizes the analytic model needs, worked out once per
  distinct :class:`CallMeta` (:func:`shape_of`);
- :class:`CallLog`: one range the tagger opened (or one call found in a
  recording), in the order it opened.

Torch-free on purpose: parsers and attribution read these types on machines
without torch (a dtype is read by duck typing: ``itemsize`` and its name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple


class CallMeta(NamedTuple):
    """One attention call's metadata as the tagger reads it (no sizes worked out yet).

    Shapes are in the call's own layout (``layout``): ``bhsd`` is (batch, heads,
    sequence, head dim), as transformers and ``F.scaled_dot_product_attention``
    take them; ``bshd`` puts heads third, as flash-attn's own functions do.

    Attributes:
        implementation: ``eager``, ``sdpa``, ``flash_attention_2``, ``flex_attention``, ``manual`` …
        q_shape, k_shape, v_shape: the tensors' shapes (``torch.Size`` or tuples of ints).
        dtype: q's dtype (a ``torch.dtype``: anything with ``itemsize`` whose ``str`` names it).
        mask: ``(shape, dtype)`` of a materialized mask tensor, else ``None``.
        causal: the call applies a causal mask.
        sliding_window: window length in tokens, else ``None``.
        layout: ``bhsd`` or ``bshd``.
    """

    implementation: str
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    dtype: Any
    mask: tuple | None
    causal: bool
    sliding_window: int | None
    layout: str


class OneHead(NamedTuple):
    """The metadata of one query head's share of a call (head mode)."""

    meta: CallMeta


@dataclass(frozen=True)
class CallShape:
    """Sizes of one attention call, as the analytic model reads them.

    Attributes:
        implementation: ``eager``, ``sdpa``, ``flash_attention_2``, ``flex_attention``, or ``manual``.
        batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_head_dim: sizes (elements);
            ``None`` where a recording does not tell (packed token layouts carry no batch).
        dtype: dtype name of q; dtype_bytes its element size (bytes).
        causal: the call applies a causal mask (and has more than one query); ``None``: not recorded.
        mask_elements: elements of a materialized mask tensor read by the call (0 if none).
        mask_dtype_bytes: element size of that mask (bytes).
        sliding_window: window length (tokens) where the call uses one.
        mask_per_head: the mask has a head dimension of size ``q_heads`` (else it is shared by all heads).
    """

    implementation: str
    batch: int | None
    q_heads: int
    kv_heads: int
    q_len: int | None
    kv_len: int | None
    head_dim: int
    v_head_dim: int
    dtype: str
    dtype_bytes: int
    causal: bool | None
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


def dtype_name(dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16`` (and for the string ``"torch.bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def shape_of(meta: CallMeta | OneHead | tuple) -> CallShape:
    """The sizes of a call (or of one head's share of it) from its metadata
    (a :class:`CallMeta`, or its fields as the plain tuple the tagger's hot path logs)."""
    if isinstance(meta, OneHead):
        return shape_of(meta.meta).one_head()
    if type(meta) is tuple:
        meta = CallMeta._make(meta)
    h_dim, s_dim = (1, 2) if meta.layout == "bhsd" else (2, 1)
    q_shape, k_shape = meta.q_shape, meta.k_shape
    mask_elements = mask_bytes = 0
    per_head = False
    if meta.mask is not None:
        m_shape, m_dtype = meta.mask
        mask_elements = math.prod(int(n) for n in m_shape)
        mask_bytes = m_dtype.itemsize
        per_head = len(m_shape) == 4 and m_shape[1] == q_shape[h_dim] > 1
    q_len = int(q_shape[s_dim])
    return CallShape(
        implementation=meta.implementation,
        batch=int(q_shape[0]),
        q_heads=int(q_shape[h_dim]),
        kv_heads=int(k_shape[h_dim]),
        q_len=q_len,
        kv_len=int(k_shape[s_dim]),
        head_dim=int(q_shape[-1]),
        v_head_dim=int(meta.v_shape[-1]),
        dtype=dtype_name(meta.dtype),
        dtype_bytes=int(meta.dtype.itemsize),
        causal=bool(meta.causal and q_len > 1),
        mask_elements=mask_elements,
        mask_dtype_bytes=int(mask_bytes),
        sliding_window=int(meta.sliding_window) if meta.sliding_window else None,
        mask_per_head=per_head,
    )


class CallLog(NamedTuple):
    """One range the tagger opened, in the order it opened it (or one call found in an untagged recording).

    While the tagger records, ``shape`` holds the call's :class:`CallMeta` (or
    :class:`OneHead`): sizes are worked out once per distinct call when the log
    is read (``AttentionTagger.calls``), not on the hot path.

    Attributes:
        thread_id: ``threading.get_ident()`` of the thread that opened it.
        phase: ``fwd``, ``bwd`` or ``recompute``.
        layer_name: e.g. ``layer.3`` or ``decoder.layer.0.cross``.
        layer: block index.
        head: query head (head-mode ranges) or ``None`` (layer ranges).
        kv_head: the key/value head that query head reads (GQA), or ``None``.
        shape: the attention call's :class:`CallShape` (``None`` for ranges without tensors).
        model: name of the model class the layer belongs to.
        signal: for a call found in an untagged recording (:mod:`headcount.attribute.untagged`),
            what found it: ``operator``, ``module`` or ``kernel``; ``None`` for the tagger's own calls.
        found_as: the names the recording gives the call (enclosing layer module, attention
            module, operator or kernel, joined by ``/``); ``None`` for the tagger's own calls.
        numbered_by: for such a call, how its layer index was found: ``module ranges`` or ``call order``.
        implementation: for a call without a shape, the implementation its signal names (a kernel's name:
            ``flash_attention_2``, ``flashinfer`` …); a shape's own ``implementation`` comes first.
    """

    thread_id: int
    phase: str
    layer_name: str
    layer: int | None
    head: int | None
    kv_head: int | None
    shape: Any
    model: str | None
    signal: str | None = None
    found_as: str | None = None
    numbered_by: str | None = None
    implementation: str | None = None

    # the tagger derives entries on its hot path: these build them without
    # ``_replace`` (1 µs) or the class's Python-level ``__new__`` (0.25 µs)
    def in_phase(self, phase: str) -> "CallLog":
        """The same call logged for ``phase`` (a forward's backward)."""
        return _new(CallLog, (self.thread_id, phase, *self[2:]))

    def on_thread(self, thread_id: int) -> "CallLog":
        """The same call logged as opened on ``thread_id``."""
        return _new(CallLog, (thread_id, *self[1:]))

    def for_head(self, head: int, kv_head: int, meta: OneHead | None) -> "CallLog":
        """Query head ``head`` (reading key/value head ``kv_head``) of this call; ``meta``: ``OneHead(self.shape)``, made once per call."""
        return _new(CallLog, (*self[:4], head, kv_head, meta, *self[7:]))


def logged(thread_id: int, phase: str, layer_name: str, layer: int | None, meta: CallMeta | None, model: str | None) -> CallLog:
    """A tagger's log entry for a layer range (the hot path's builder: no defaults to fill in)."""
    return _new(CallLog, (thread_id, phase, layer_name, layer, None, None, meta, model, None, None, None, None))


_new = tuple.__new__
