"""Head mode's split: one attention call computed one query head at a time,
with the same numbers as the fused call (docs/architecture.md §2).

Bit-identity is the point: a head-mode profile must measure the model the
user trains, so every output and every gradient must equal the fused call's
bit for bit. Three things make that hold beyond plain slicing:

- the stand-in module (:class:`OneHeadModule`) hands the attention function
  that head's slice of any per-head tensor it reads from the module
  (gpt-oss's attention-sink logits);
- query heads that share a key/value head get their key/value through
  :func:`grouped_heads`, whose backward sums a group's gradients in one
  reduction, as transformers' ``repeat_kv`` does in the fused call;
- a per-head module tensor that the function broadcasts (gpt-oss expands
  its sinks to ``(batch, heads, queries, 1)``) is broadcast whole and then
  sliced (:class:`PerHeadTensors`), so that its gradient is reduced over the
  same strides as in the fused call.
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from headcount.common.errors import HeadcountError


def head_slice(value, head: int, n_heads: int):
    """Slice per-head arguments (masks with a head dimension, T5's position
    bias, attention-sink logits); pass shared ones through unchanged.

    Raises:
        HeadcountError: a flex_attention ``BlockMask`` that differs per head.
    """
    if isinstance(value, torch.Tensor) and n_heads > 1:
        if value.dim() == 4 and value.shape[1] == n_heads:
            return value[:, head : head + 1]
        if value.dim() == 1 and value.shape[0] == n_heads:
            return value[head : head + 1]
    elif type(value).__name__ == "BlockMask" and getattr(value, "shape", (1, 1))[1] not in (1,):
        raise HeadcountError(
            "head mode cannot split a flex_attention BlockMask that differs per head",
            hint="profile this model in layer mode, or build the block mask with H=1",
        )
    return value


class OneHeadModule:
    """Stands in for the attention module when one head is computed alone:
    every attribute is the module's, except that no key/value repetition is
    needed (``num_key_value_groups == 1``: the caller already picked the
    key/value head of that query head), and that a per-head tensor the
    attention function reads from the module (gpt-oss's ``sinks``: one logit
    per head) is that head's slice. A plain attribute and ``__getattr__``:
    Dynamo traces that (not a ``__slots__`` proxy)."""

    num_key_value_groups = 1

    def __init__(self, module, head: int = 0, n_heads: int = 1):
        self._module = module
        self._head = head
        self._n_heads = n_heads
        self._sliced: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(slice) -> (slice, whole)

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not isinstance(value, torch.Tensor):
            return value
        part = head_slice(value, self._head, self._n_heads)
        if part is not value and not torch.compiler.is_compiling():  # followed in eager code only
            self._sliced[id(part)] = (part, value)
        return part


def _has_per_head_tensors(module, n_heads: int) -> bool:
    """Whether the module holds a tensor that :func:`head_slice` would slice
    (then one head's call runs under :class:`PerHeadTensors`)."""
    if n_heads <= 1:
        return False
    tensors = [*module._parameters.values(), *module._buffers.values(),
               *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]
    return any(isinstance(t, torch.Tensor) and head_slice(t, 0, n_heads) is not t for t in tensors)


class PerHeadTensors(TorchFunctionMode):
    """While one head's attention runs, follow the head's slice of each
    per-head module tensor (gpt-oss's and Granite-SWA's sinks) and give it to
    the function already broadcast, as a slice of the whole tensor broadcast
    once for all heads of the call (:class:`_BroadcastHeads`):

    - an operation on the slice alone (reshape, view, ``to``, unsqueeze…) is
      applied to the whole tensor alongside, so the whole stays in step;
    - an expand of the slice (gpt-oss: ``(1, 1, 1, 1)`` → ``(batch, 1,
      queries, 1)``) returns the head's slice of the whole tensor expanded;
    - an elementwise operation that broadcasts the slice against other
      tensors (Granite-SWA: ``lse - sinks.view(1, -1, 1)``; ``_BROADCASTING``)
      runs with the slice expanded that way first.

    The values are the function's own; what changes is the backward: the
    broadcast's gradient is reduced over ``(batch, heads, queries)`` with the
    fused call's strides, not over a ``(batch, 1, queries)`` slice whose
    dimensions PyTorch merges and sums in another order (the sinks'
    gradients differed in the last bits). Random operations are never
    applied to the whole tensor, in-place ones only to headcount's own copies
    (:meth:`_in_place`); anything not derived from those slices runs as the
    function wrote it. Not used while compiling (Dynamo traces the plain
    slice; the sinks' gradient may then differ in the last bits).

    Args:
        stand_in: the head's :class:`OneHeadModule` (its handed-out slices).
        shared: one dictionary per attention call, shared by its heads.
    """

    def __init__(self, stand_in: OneHeadModule, shared: dict):
        super().__init__()
        self._stand_in = stand_in
        self._shared = shared
        self._derived: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # id(part) -> (part, whole, root)

    def _whole_of(self, tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(whole, root)`` of a followed slice: the whole tensor it is the
        head's slice of, and the module tensor both come from."""
        if not isinstance(tensor, torch.Tensor):
            return None
        entry = self._stand_in._sliced.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1], entry[1]
        entry = self._derived.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1], entry[2]
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_DUNDERS:
            return self._in_place(func, name, args, kwargs)
        if func is torch.Tensor.expand and args and self._whole_of(args[0]) is not None:
            sizes = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
            return self._expanded(args[0], list(sizes), lambda: func(*args, **kwargs))
        followed = [i for i, a in enumerate(args) if self._whole_of(a) is not None]
        if not followed:
            return func(*args, **kwargs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in _BROADCASTING and len(tensors) > 1:
            try:
                shape = torch.broadcast_shapes(*(t.shape for t in tensors))
            except RuntimeError:
                return func(*args, **kwargs)
            new = list(args)
            for i in followed:
                if args[i].shape != shape:
                    new[i] = self._expanded(args[i], list(shape), lambda part=args[i]: part.expand(shape))
            return func(*new, **kwargs)
        out = func(*args, **kwargs)
        if len(tensors) == 1 and followed == [0] and isinstance(out, torch.Tensor) and not _RANDOM.search(name):
            self._follow(func, args, kwargs, out)
        return out

    def _in_place(self, func, name: str, args, kwargs):
        """An in-place operation. On a followed tensor: applied to its whole
        too when that whole is headcount's own copy (``bias = sinks.clone();
        bias.mul_(0.5)``) and the operation takes no other tensor and draws no
        random numbers; otherwise the tensor is followed no further (its whole
        would be stale), and the module's own tensor is never written. A
        followed tensor that it broadcasts into another (``scores += bias``)
        is expanded first, as for the out-of-place operation."""
        if args and self._whole_of(args[0]) is not None:
            whole, root = self._whole_of(args[0])
            out = func(*args, **kwargs)
            own_copy = id(args[0]) in self._derived and whole.untyped_storage().data_ptr() != root.untyped_storage().data_ptr()
            if own_copy and not _RANDOM.search(name) and not any(isinstance(a, torch.Tensor) for a in args[1:]):
                try:
                    func(whole, *args[1:], **kwargs)
                    return out
                except (RuntimeError, TypeError, ValueError):
                    pass
            self._derived.pop(id(args[0]), None)
            self._stand_in._sliced.pop(id(args[0]), None)
            return out
        base = name[3:-2] if name in _IN_PLACE_DUNDERS else name[:-1]
        followed = [i for i, a in enumerate(args) if i > 0 and self._whole_of(a) is not None]
        if not followed or base not in _BROADCASTING:
            return func(*args, **kwargs)
        shape = args[0].shape
        new = list(args)
        for i in followed:
            if args[i].shape != shape:
                new[i] = self._expanded(args[i], list(shape), lambda part=args[i]: part.expand(shape))
        return func(*new, **kwargs)

    def _follow(self, func, args, kwargs, out) -> None:
        """Apply ``func`` to the whole tensor too, when its result differs
        from ``out`` in the head dimension only."""
        whole, root = self._whole_of(args[0])
        try:
            whole_out = func(whole, *args[1:], **kwargs)
        except (RuntimeError, TypeError, ValueError):  # does not apply to the whole tensor: stop following
            return
        if isinstance(whole_out, torch.Tensor) and _head_axis(out, whole_out) is not None:
            self._derived[id(out)] = (out, whole_out, root)

    def _expanded(self, part, sizes: list, plain: Callable) -> torch.Tensor:
        """The head's slice of the whole tensor expanded to ``sizes`` (as in
        ``Tensor.expand``, the head dimension kept whole), or ``plain()`` when
        the whole tensor does not expand that way."""
        whole, root = self._whole_of(part)
        axis = _head_axis(part, whole)
        if axis is None or len(sizes) < part.dim():
            return plain()
        sizes[len(sizes) - part.dim() + axis] = -1  # the function sized it for one head
        try:
            whole_out = whole.expand(*sizes)
        except RuntimeError:
            return plain()
        out = plain()
        axis = _head_axis(out, whole_out)
        if axis is None:
            return out
        key = (id(root), tuple(whole_out.shape), tuple(whole.stride()), axis)
        if key not in self._shared:
            self._shared[key] = (root, _BroadcastHeads.apply(whole_out, axis))
        return self._shared[key][1][self._stand_in._head]


# elementwise operations that broadcast their tensors (the slice is expanded before them)
_BROADCASTING = frozenset({
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "maximum", "minimum", "where",
    "logaddexp", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
})
# in-place operators spelled as Python's augmented assignments (``add_`` and the like end in one "_")
_IN_PLACE_DUNDERS = frozenset(f"__i{op}__" for op in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift"))
# operations that draw random numbers: never run a second time on the whole tensor
_RANDOM = re.compile(r"^(.*dropout.*|rand.*|bernoulli_?|normal_?|multinomial|poisson|uniform_|exponential_|geometric_|cauchy_|log_normal_)$")


def _head_axis(part: torch.Tensor, whole: torch.Tensor) -> int | None:
    """The one dimension where ``part`` has size 1 and ``whole`` more, else ``None``."""
    if part.dim() != whole.dim():
        return None
    differing = [d for d in range(part.dim()) if part.shape[d] != whole.shape[d]]
    return differing[0] if len(differing) == 1 and part.shape[differing[0]] == 1 else None


_DENSE_ABOVE_BYTES = 1 << 30


class _BroadcastHeads(torch.autograd.Function):
    """Each head's slice of a broadcast per-head tensor (views, no copy). The
    backward gets every head's gradient at once and lays them out with the
    strides the fused call's gradient has: each head's gradient is a slice
    of that head's own larger gradient (gpt-oss: the sink column of the
    ``(batch, 1, queries, keys + 1)`` logits), so the fused one is the same
    with the outer dimensions' strides times the number of heads. The
    expand's backward then sums it exactly as in the fused call. That buffer
    is as large as the fused gradient it imitates (one attention matrix,
    left uninitialised but for the slices); above 1 GiB a dense buffer is
    used instead (the sum may then differ in the last bits)."""

    @staticmethod
    def forward(ctx, whole, axis: int):
        ctx.axis, ctx.shape = axis, whole.shape
        return tuple(whole.narrow(axis, h, 1) for h in range(whole.shape[axis]))

    @staticmethod
    def backward(ctx, *grads):
        axis, shape = ctx.axis, ctx.shape
        present = next((g for g in grads if g is not None), None)
        if present is None:
            return None, None
        n = shape[axis]
        strides = [s * n if d < axis else s for d, s in enumerate(present.stride())]
        inner = sum((present.shape[d] - 1) * present.stride(d) for d in range(axis + 1, present.dim()))
        offset = present.storage_offset() % max(present.stride(axis), 1)
        extent = offset + sum((shape[d] - 1) * strides[d] for d in range(len(shape))) + 1
        same = all(g is None or g.stride() == present.stride() for g in grads)
        if same and inner < present.stride(axis) and extent * present.element_size() <= _DENSE_ABOVE_BYTES:
            full = present.new_empty(extent).as_strided(shape, strides, offset)
        else:
            full = present.new_empty(shape)
        for h, g in enumerate(grads):
            part = full.narrow(axis, h, 1)
            part.copy_(g) if g is not None else part.zero_()
        return full, None


def interface_call(fn: Callable, module, attention_mask, args: tuple, kwargs: dict, n_heads: int):
    """``(fused, one_head)`` of one call through transformers' interface, for
    the tagger and its traced counterpart alike."""

    def fused(q, k, v):
        return fn(module, q, k, v, attention_mask, *args, **kwargs)

    # traced code keeps the plain slices (PerHeadTensors is a Python-level mode)
    follow = not torch.compiler.is_compiling() and _has_per_head_tensors(module, n_heads)
    shared: dict = {}  # what the heads of this call share (PerHeadTensors)

    def one_head(h, q, k, v):
        mask = head_slice(attention_mask, h, n_heads)
        kw = {n: head_slice(t, h, n_heads) for n, t in kwargs.items()}
        stand_in = OneHeadModule(module, h, n_heads)
        try:
            with PerHeadTensors(stand_in, shared) if follow else contextlib.nullcontext():
                return fn(stand_in, q, k, v, mask, *args, **kw)
        except HeadcountError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the function raised, said as the split's failure
            features = call_features(module, q, k, v, attention_mask, kwargs, n_heads)
            raise HeadcountError(
                f"{type(module).__name__}: head mode could not compute head {h} alone ({', '.join(features)}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                hint="profile this model in layer mode (mode='layer', --mode layer); the model itself is unchanged",
            ) from exc

    return fused, one_head


def call_features(module, query, key, value, mask, kwargs: dict, n_heads: int) -> list[str]:
    """What one attention call uses beyond plain attention, in words (for
    messages): sinks, soft-capping, sliding window, a per-head mask (ALiBi),
    relative position bias, grouped key/value heads, MLA's head dimensions,
    cross-attention; ``["plain attention"]`` when none.

    ``key``/``value`` are one head's here; the grouping is read from the module."""
    found = []
    if _has_per_head_tensors(module, n_heads) or any(kwargs.get(n) is not None for n in ("sinks", "s_aux")):
        found.append("attention sinks")
    if kwargs.get("softcap"):
        found.append("soft-capping")
    if kwargs.get("sliding_window"):
        found.append("sliding window")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] == n_heads > 1:
        found.append("a per-head mask (ALiBi)")
    if any(kwargs.get(n) is not None for n in ("position_bias", "relative_position_bias")):
        found.append("relative position bias")
    if getattr(module, "num_key_value_groups", 1) > 1:
        found.append("grouped key/value heads")
    if query.shape[-1] != value.shape[-1]:
        found.append("different query and value head dimensions (MLA)")
    if query.dim() == 4 and key.dim() == 4 and query.shape[-2] != key.shape[-2]:
        found.append("cross-attention or a cache")
    return found or ["plain attention"]


def join_transformers(results: list) -> tuple:
    """Per-head ``(out (B, Q, 1, D), weights (B, 1, Q, K) | None)`` → fused layout."""
    out = torch.cat([r[0] for r in results], dim=2)
    weights = [r[1] for r in results]
    joined = torch.cat(weights, dim=1) if all(isinstance(w, torch.Tensor) for w in weights) else None
    return out, joined


class _GroupedHeads(torch.autograd.Function):
    """Each query head's key (or value) head: views of the key/value heads,
    like transformers' ``repeat_kv`` without its copy. The backward gets
    every head's gradient at once and sums each group in one reduction over
    the group, as the expand inside ``repeat_kv`` does in the fused call;
    autograd's own accumulation of one shared slice would add them one at a
    time in backward order, which moves the last bits once a group holds
    three or more query heads (multi-query Falcon, GPT-BigCode)."""

    @staticmethod
    def forward(ctx, tensor, dim: int, groups: int):
        ctx.dim, ctx.groups, ctx.shape = dim, groups, tensor.shape
        return tuple(tensor.narrow(dim, h // groups, 1) for h in range(tensor.shape[dim] * groups))

    @staticmethod
    def backward(ctx, *grads):
        dim, groups = ctx.dim, ctx.groups
        present = next((g for g in grads if g is not None), None)
        if present is None:
            return None, None, None
        grads = [torch.zeros_like(present) if g is None else g for g in grads]
        shape = list(ctx.shape)
        shape[dim : dim + 1] = [ctx.shape[dim], groups]
        return torch.cat(grads, dim=dim).view(shape).sum(dim + 1), None, None


def grouped_heads(tensor: torch.Tensor, dim: int, groups: int) -> tuple[torch.Tensor, ...]:
    """The key (or value) head of each query head, ``groups`` query heads per
    key/value head: ``n_kv * groups`` tensors with one head each on ``dim``."""
    if groups > 1 and torch.is_grad_enabled() and tensor.requires_grad:
        return _GroupedHeads.apply(tensor, dim, groups)
    if groups == 1:
        return tensor.split(1, dim)  # one backward node, one concatenation (narrow: a zero-filled copy per head, then sums)
    return tuple(tensor.narrow(dim, h // groups, 1) for h in range(tensor.shape[dim] * groups))
