"""Tags that survive ``torch.compile``: range begin/end as custom operators.

Under Dynamo the eager tagging path cannot run: NVTX and record_function
calls, thread ids and the tagger's Python state are graph breaks (11 on a
2-layer Llama), and Dynamo drops ``torch.profiler.record_function`` from the
graph unless ``torch._dynamo.config.capture_profiler_record_function`` is set
(torch ≥ 2.10, profiler ranges only, no NVTX, no backward ranges).

What this module does instead (chosen for torch ≥ 2.4):

* Two operators, ``headcount::open_range`` and ``headcount::close_range``
  (``torch.library.custom_op``), registered as *ordered effects*: AOTAutograd
  threads an effect token through them, so they are never dead-code
  eliminated and keep their program order in the FX graph; Inductor calls
  them as extern kernels. Inductor's scheduler does not hold other kernels to
  that order (fusion pulls inputs forward: SDPA's backward ran before its
  range opened, head ranges interleaved), so :func:`order_ranges`, a
  post-grad pass, adds explicit ``control_deps``: each marker after the
  previous one and after the work before it, each range's first kernels
  after its opening (checked by ``tests/test_compiled.py`` on the profiler
  trace of a compiled forward+backward).
* Everything the range needs is an argument fixed at trace time: the *site*
  string (layer name, layer index, model class, implementation, dtype, mask
  rank/dtype, causal, sliding window, layout) and the shapes (``SymInt``s,
  so dynamic shapes need no recompile). The operator's body runs at every
  call, outside the graph: it finds the active tagger, decides ``fwd`` or
  ``recompute`` (activation checkpointing), logs the call and pushes the
  NVTX / record_function ranges. Nothing in the traced region reads a thread
  id, a global that changes per call, or the tagger.
* Backward ranges: the same autograd functions as the eager path
  (:mod:`headcount.tagging.grad_marks`: an identity on the output whose
  backward opens ``bwd/<layer>``, one on q/k/v whose backward closes it),
  given functions that call the operators; AOTAutograd puts those calls in
  the compiled backward graph.

Tracing reads only :data:`headcount.tagging.state.MODE` (the innermost
active tagger's mode, or ``None``) and :data:`headcount.tagging.state.LAYERS`
(module id → layer name), so a new profiler of the same mode reuses the
compiled graph: no recompile in a profiled step. The operators reach the
tagger through :func:`headcount.tagging.state.current` (its ``open_site`` /
``close_site``): this module imports nothing of the tagger.
"""

from __future__ import annotations

import threading

import torch

from headcount.common.call_log import CallMeta
from headcount.common.errors import HeadcountError
from headcount.tagging import state
from headcount.tagging.grad_marks import OpenOnGrad, close_on_grad, output, with_output

_SEP = "\x1f"
_NO_LAYER = -1
_stacks = threading.local()


@torch.library.custom_op("headcount::open_range", mutates_args=())
def open_range(after: list[torch.Tensor], site: str, phase: str, head: int, kv_head: int, dims: list[int]) -> torch.Tensor:
    """Open ``<phase>/<layer>`` (``head < 0``) or ``head.<head>`` on this thread
    (runs at every call of the compiled graph; see the module docstring).

    Returns an empty tensor: what :func:`order_ranges` makes the range's first
    kernels wait for."""
    tagger = state.current()
    stack = getattr(_stacks, "open", None)
    if stack is None:
        stack = _stacks.open = []
    stack.append(tagger.open_site(site, phase, head, kv_head, dims) if tagger is not None else None)
    return after[0].new_empty(0)


@open_range.register_fake
def _(after, site, phase, head, kv_head, dims):
    return after[0].new_empty(0)


@torch.library.custom_op("headcount::close_range", mutates_args=())
def close_range(after: list[torch.Tensor]) -> torch.Tensor:
    """Close the range the matching :func:`open_range` opened on this thread;
    returns an empty tensor (the next range's opening waits for it)."""
    stack = getattr(_stacks, "open", None)
    if stack:
        opened = stack.pop()
        tagger = state.current()
        if opened is not None and tagger is not None:
            tagger.close_site(opened)
    return after[0].new_empty(0)


@close_range.register_fake
def _(after):
    return after[0].new_empty(0)


def _register_effects() -> None:
    """Mark both operators as ordered side effects (API moved across torch versions)."""
    ops = (torch.ops.headcount.open_range.default, torch.ops.headcount.close_range.default)
    try:
        from torch._library.effects import EffectType

        for op in ops:
            torch.library._register_effectful_op(op, EffectType.ORDERED)
        return
    except (ImportError, AttributeError):
        pass
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op  # torch 2.4 – 2.9

    for op in ops:
        _register_effectful_op(op, _EffectType.ORDERED)


_register_effects()


# --------------------------------------------------------------------------- keeping the attention inside


def _effect_target(node):
    """The operator a ``with_effects`` node calls (``None`` for other nodes)."""
    if node.op == "call_function" and node.target is getattr(torch.ops.higher_order, "with_effects", None):
        return node.args[1]
    return None


def _is_view(node) -> bool:
    import operator

    return node.target is operator.getitem or bool(getattr(node.target, "is_view", False))


def _source(node):
    """The node a chain of views starts from (``node`` itself when it is no view)."""
    while node.op == "call_function" and _is_view(node) and node.args and isinstance(node.args[0], type(node)):
        node = node.args[0]
    return node


def _marker_result(graph, node):
    """The marker's returned (empty) tensor: what later nodes are made to wait for."""
    import operator

    found = next((u for u in node.users if u.target is operator.getitem and u.args[1] == 1), None)
    if found is None:  # unused, so the graph dropped its getitem
        with graph.inserting_after(node):
            found = graph.call_function(operator.getitem, (node, 1))
        found.meta["val"] = node.meta["val"][1]
    return found


def _computes(node) -> bool:
    """A node that computes: a call that is neither a view nor an effect (a range marker)."""
    return node.op == "call_function" and not _is_view(node) and _effect_target(node) is None


def _sinks(segment: list) -> list:
    """The segment's computing nodes that nothing else in the segment reads (through views)."""
    inside = set(segment)
    out = []
    for node in segment:
        if not _computes(node):
            continue
        frontier, read = list(node.users), False
        while frontier and not read:
            user = frontier.pop()
            if user in inside and _computes(user):
                read = True
            elif user in inside and _is_view(user):
                frontier.extend(user.users)
        if not read:
            out.append(node)
    return out


def order_ranges(graph) -> int:
    """Hold Inductor to the program order of headcount's ranges (a post-grad pass).

    The effect token keeps the markers in program order in the FX graph, but
    Inductor's scheduler orders by data only: fusion pulls a kernel's inputs
    forward (SDPA's backward ran before its range opened) and markers without
    data between them interleave (a layer's head ranges did). So, as
    ``control_deps``: each marker waits for the previous marker and for the
    work since it (the segment's sinks: nothing drifts into the next range),
    and each range's roots — computing nodes whose inputs (through views) all
    exist before the range opens — wait for its opening (everything else in
    the range depends on a root through data). Returns the number of nodes
    given dependencies.
    """
    try:
        from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
        from torch.utils._ordered_set import OrderedSet
    except ImportError:  # torch without control_deps: ranges are ordered among themselves only
        return 0

    opening, closing = torch.ops.headcount.open_range.default, torch.ops.headcount.close_range.default
    position = {node: i for i, node in enumerate(graph.nodes)}
    stack: list[tuple[int, object]] = []  # (position of the opening, its token node)
    deps = {}

    previous = None  # the last marker's result: markers run in program order (the effect token alone does not hold in Inductor's scheduler)
    segment: list = []  # nodes since the last marker: they finish before the next one (nothing drifts into a range)
    for node in list(graph.nodes):
        target = _effect_target(node)
        if target is opening or target is closing:
            wait = deps.setdefault(node, OrderedSet())
            if previous is not None:
                wait.add(previous)
            wait.update(_sinks(segment))
            segment = []
            previous = _marker_result(graph, node)
            if target is opening:
                stack.append((position[node], previous))
            elif stack:
                stack.pop()
            continue
        segment.append(node)
        if not stack or node.op != "call_function" or _is_view(node) or target is not None:
            continue
        start, token = stack[-1]
        inputs = [_source(a) for a in node.all_input_nodes]
        if all(position.get(a, -1) < start for a in inputs):
            deps[node] = OrderedSet([token])
    deps = {node: wait for node, wait in deps.items() if wait}
    preserve_node_ordering(graph, deps)
    return len(deps)


_pass_installed = False


def install_ordering_pass() -> None:
    """Add :func:`order_ranges` to Inductor's post-grad passes (once per process,
    after any pass the user set; a no-op on graphs without headcount's ranges)."""
    global _pass_installed
    if _pass_installed:
        return
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:  # pragma: no cover - torch without Inductor
        return
    previous = inductor_config.post_grad_custom_post_pass

    class _OrderRanges(CustomGraphPass):
        def __call__(self, graph) -> None:
            if previous is not None:
                previous(graph)
            order_ranges(graph)

        def uuid(self):
            return ("headcount.order_ranges", 1, previous.uuid() if hasattr(previous, "uuid") else repr(previous))

    inductor_config.post_grad_custom_post_pass = _OrderRanges()
    _pass_installed = True


# --------------------------------------------------------------------------- sites


def site(layer_name: str, layer: int | None, model: str | None, implementation: str, query, mask, causal,
         sliding_window, layout: str) -> str:
    """The constant that names one attention call site (built while tracing)."""
    mask_rank = mask.dim() if isinstance(mask, torch.Tensor) else -1
    mask_dtype = str(mask.dtype) if isinstance(mask, torch.Tensor) else ""
    return _SEP.join((layer_name, str(_NO_LAYER if layer is None else layer), model or "", implementation,
                      str(query.dtype), str(mask_rank), mask_dtype, "1" if causal else "0",
                      str(sliding_window or 0), layout))


def dims(query, key, value, mask) -> list:
    """The shapes the site's metadata needs, as (symbolic) ints."""
    out = [*query.shape, *key.shape, *value.shape]
    if isinstance(mask, torch.Tensor):
        out.extend(mask.shape)
    return out


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def parse_site(text: str) -> tuple:
    """``(layer_name, layer, model, fixed)``; ``fixed`` builds the shape metadata
    (:class:`~headcount.common.call_log.CallMeta`) from :func:`dims` at run time."""
    layer_name, layer, model, implementation, dtype, mask_rank, mask_dtype, causal, window, layout = text.split(_SEP)
    fixed = (implementation, _dtype(dtype), int(mask_rank), _dtype(mask_dtype) if mask_dtype else None,
             causal == "1", int(window) or None, layout)
    return layer_name, None if int(layer) == _NO_LAYER else int(layer), model or None, fixed


def metadata(fixed: tuple, shape: list[int]) -> CallMeta:
    """The call's :class:`~headcount.common.call_log.CallMeta`, from a parsed site and its run-time dims."""
    implementation, dtype, mask_rank, mask_dtype, causal, window, layout = fixed
    q, k, v = tuple(shape[0:4]), tuple(shape[4:8]), tuple(shape[8:12])
    mask = (tuple(shape[12:12 + mask_rank]), mask_dtype) if mask_rank >= 0 else None
    return CallMeta(implementation, q, k, v, dtype, mask, causal, window, layout)


# --------------------------------------------------------------------------- the traced path


def _open_backward(grad, site_name: str, head: int, kv_head: int, shape) -> None:
    torch.ops.headcount.open_range([grad], site_name, "bwd", head, kv_head, shape)


def _close_backward(grads) -> None:
    torch.ops.headcount.close_range([g for g in grads if g is not None])


def _tracks(query, key, value) -> bool:
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def run(mode: str, site_name: str, shape: list, query, key, value, fused, one_head, join, head_dim: int = 1):
    """The compiled counterpart of :meth:`AttentionTagger.run`: the same ranges,
    as operator calls in the graph."""
    track = _tracks(query, key, value)
    if track:
        query, key, value = close_on_grad(_close_backward, query, key, value)
    torch.ops.headcount.open_range([query, key, value], site_name, "fwd", -1, -1, shape)
    if mode == "head":
        result = _per_head(site_name, shape, query, key, value, one_head, join, head_dim, track)
    else:
        result = fused(query, key, value)
    torch.ops.headcount.close_range([output(result)])
    if track:
        result = with_output(result, lambda out: OpenOnGrad.apply(out, _open_backward, site_name, -1, -1, shape))
    return result


def _per_head(site_name, shape, query, key, value, one_head, join, head_dim, track):
    n_q, n_kv = query.shape[head_dim], key.shape[head_dim]
    if n_kv == 0 or n_q % n_kv:
        raise HeadcountError(f"{site_name.split(_SEP)[0]}: {n_q} query heads cannot share {n_kv} key/value heads",
                             hint="profile this model in layer mode")
    groups = n_q // n_kv
    results = []
    for h in range(n_q):
        g = h // groups
        q_h, k_h, v_h = query.narrow(head_dim, h, 1), key.narrow(head_dim, g, 1), value.narrow(head_dim, g, 1)
        if track:
            q_h, k_h, v_h = close_on_grad(_close_backward, q_h, k_h, v_h)
        torch.ops.headcount.open_range([q_h, k_h, v_h], site_name, "fwd", h, g, shape)
        res = one_head(h, q_h, k_h, v_h)
        torch.ops.headcount.close_range([output(res)])
        if track:
            res = with_output(res, lambda out, h=h, g=g: OpenOnGrad.apply(out, _open_backward, site_name, h, g, shape))
        results.append(res)
    return join(results)
