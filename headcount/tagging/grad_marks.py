"""The two identity functions that tag a backward pass, shared by the eager and the compiled path.

A backward range opens when the attention output's gradient arrives and
closes once q, k and v's gradients are computed: an identity on the output
whose backward runs ``on_grad`` first (:class:`OpenOnGrad`), and one on q, k,
v whose backward runs ``on_grads`` (:class:`CloseOnGrad`). What they call is
the caller's: the eager tagger pushes and pops NVTX ranges itself
(:mod:`headcount.tagging.tagger`), a compiled graph calls headcount's range
operators so that AOTAutograd keeps them in the compiled backward
(:mod:`headcount.tagging.compiled`).
"""

from __future__ import annotations

from typing import Callable

import torch


class OpenOnGrad(torch.autograd.Function):
    """Identity on the attention output; its backward calls ``on_grad(grad, *args)`` before passing the gradient on."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, on_grad: Callable, *args):
        ctx.on_grad, ctx.args = on_grad, args
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.on_grad(grad, *ctx.args)
        return (grad, None, *(None for _ in ctx.args))


class CloseOnGrad(torch.autograd.Function):
    """Identity on q, k, v (the distinct ones: :func:`close_on_grad`); its backward
    calls ``on_grads(grads)`` once their gradients exist (``None`` for one that got none)."""

    @staticmethod
    def forward(ctx, on_grads: Callable, *tensors: torch.Tensor):
        ctx.on_grads = on_grads
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.on_grads(grads)
        return (None, *grads)


def close_on_grad(on_grads: Callable, q, k, v):
    """:class:`CloseOnGrad` on the distinct tensors among q, k, v (Dynamo refuses
    the same tensor twice in one ``apply``: self-attention on one x)."""
    if q is k and k is v:
        (q,) = CloseOnGrad.apply(on_grads, q)
        return q, q, q
    if k is v:
        q, k = CloseOnGrad.apply(on_grads, q, k)
        return q, k, k
    if q is k or q is v:
        q, other = CloseOnGrad.apply(on_grads, q, v if q is k else k)
        return (q, q, other) if q is k else (q, other, q)
    return CloseOnGrad.apply(on_grads, q, k, v)


def output(result) -> torch.Tensor:
    """The attention output of a result: the result itself or its first item."""
    return result if isinstance(result, torch.Tensor) else result[0]


def with_output(result, fn: Callable):
    """``result`` with ``fn`` applied to its attention output (where that needs a gradient)."""
    if isinstance(result, torch.Tensor):
        return fn(result) if result.requires_grad else result
    if isinstance(result, tuple) and result and isinstance(result[0], torch.Tensor):
        out = result[0]
        return (fn(out) if out.requires_grad else out, *result[1:])
    return result
