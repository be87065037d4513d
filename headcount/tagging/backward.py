"""Backward ranges: ``bwd/<layer>`` (or a head's) opened when an attention
call's output gradient arrives and closed once its inputs' gradients exist,
on the thread that runs the backward.

:class:`BackwardRange` opens and closes the ranges; :func:`hook_backward`
drives it from gradient hooks, which leave the backward graph (and so every
gradient's bits) as it is, closing on the call's own backward nodes
(:func:`_core_frontier`). Where hooks cannot serve (head mode, a key/value
another call already waits on: :func:`awaited`) the tagger drives it from
the identity autograd functions of :mod:`headcount.tagging.grad_marks`
instead.
"""

from __future__ import annotations

import threading

import torch

from headcount.common.call_log import CallLog

# the autograd graph task running on this thread: -1 outside a backward pass (a forward inside one is
# activation checkpointing's recompute)
graph_task_id = torch._C._current_graph_task_id


class BackwardRange:
    """Opens ranges when the output's gradient arrives and closes them after
    the inputs' gradients are computed, through ``tagger`` (the
    :class:`~headcount.tagging.tagger.AttentionTagger` whose emitter pushes
    them and whose log records ``log``)."""

    __slots__ = ("tagger", "names", "log", "opened")

    def __init__(self, tagger, names: tuple[str, ...], log: CallLog):
        self.tagger = tagger
        self.names = names
        self.log = log
        self.opened: list[list] = []  # tokens of each open (retain_graph may run backward twice)

    def open(self, *_grad) -> None:
        """Open the ranges (from the output's gradient hook or :class:`~headcount.tagging.grad_marks.OpenOnGrad`)."""
        tagger = self.tagger
        tagger._record(self.log, threading.get_ident())
        if len(self.names) == 2:  # phase and layer, opened together as the forward's are (one correlation id)
            self.opened.append(tagger.emitter.push2(*self.names))
        else:
            self.opened.append([tagger.emitter.push(name) for name in self.names])

    def close(self, *_grads) -> None:
        """Close them once the inputs' gradients exist."""
        if self.opened:  # the output may have received no gradient
            tokens = self.opened.pop()
            if len(self.names) == 2:
                self.tagger.emitter.pop2(tokens)
                return
            for token in reversed(tokens):
                self.tagger.emitter.pop(token)


_AWAITED = "_headcount_awaited"  # set on a tensor whose gradient hook closes a backward range


def awaited(*tensors) -> bool:
    return any(getattr(t, _AWAITED, False) for t in tensors)


def hook_backward(bwd: BackwardRange, result, inputs: tuple, core: bool = True) -> None:
    """Open ``bwd`` when the output's gradient arrives and close it once the
    call's own backward has computed every input's gradient, from hooks: unlike
    identity functions they leave the backward graph as it is, so the order in
    which PyTorch runs its nodes and sums shared gradients is unchanged (an
    identity on q, k and v changed Inkling2's gradients in the last bits: its
    attention also reads the hidden states for position bias, sinks and an
    output gate, and the sum of their gradients was taken in another order).

    With ``core`` (an attention call: ``inputs`` are q, k, v) the range closes
    from post-hooks on the call's own backward nodes that hand q, k and v their
    gradients (:func:`_core_frontier`): a hook on q/k/v themselves runs only
    when autograd reaches their node, and autograd, which runs the ready node
    created last first, runs v's and k's projection backward before it reaches
    q (on an H100, 8 of the 11 kernels of each bwd range of bert-base). Without
    ``core`` (a module-hooked call: the range is the whole module, ``inputs``
    its hidden states) the hooks are on the inputs.
    """
    out = result if isinstance(result, torch.Tensor) else (result[0] if isinstance(result, tuple) and result else None)
    needing = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not isinstance(out, torch.Tensor) or not out.requires_grad or not needing:
        return
    for tensor in needing:
        setattr(tensor, _AWAITED, True)
    frontier = _core_frontier(out, needing) if core else None
    waits = len(frontier) if frontier else len(needing)
    remaining = [waits]

    def done(*_):
        remaining[0] -= 1
        if remaining[0] == 0:
            remaining[0] = waits  # retain_graph: a second backward closes it again
            bwd.close()

    out.register_hook(lambda grad: bwd.open())
    if frontier:
        for node in frontier:
            node.register_hook(done)
    else:
        for tensor in needing:
            tensor.register_hook(done)


_FRONTIER_WALK_LIMIT = 10_000  # backward nodes: past that, the inputs' own hooks close the range


def _core_frontier(out: torch.Tensor, inputs: list) -> list | None:
    """The backward nodes of one attention call that hand its inputs (q, k, v)
    their gradients: the nodes reached from the output's node, without passing
    through an input, that have an edge into an input's gradient edge.

    The walk stays within the nodes made since the latest input was made
    (autograd numbers the nodes of a thread in the order it makes them), so
    it never leaves the call through a mask or a position bias into the rest
    of the model. ``None`` where no such node is found (then the caller hooks
    the inputs themselves)."""
    get_edge = torch.autograd.graph.get_gradient_edge
    edges = set()
    floor = -1
    for tensor in inputs:
        edge = get_edge(tensor)
        edges.add((edge.node, edge.output_nr))
        if tensor.grad_fn is not None:
            floor = max(floor, edge.node._sequence_nr())
    start = out.grad_fn
    if start is None:
        return None
    frontier, seen, stack = [], {start}, [start]
    while stack:
        node = stack.pop()
        feeds = False
        for nxt, nr in node.next_functions:
            if nxt is None:
                continue
            if (nxt, nr) in edges:
                feeds = True
            elif nxt not in seen and nxt.next_functions and nxt._sequence_nr() > floor:
                seen.add(nxt)
                stack.append(nxt)
        if feeds:
            frontier.append(node)
        if len(seen) > _FRONTIER_WALK_LIMIT:
            return None
    return frontier or None
