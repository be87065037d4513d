"""Tag every attention call of a model with headcount's ranges (docs/architecture.md §2, §5).

How it hooks in: transformers 5.x resolves the attention function on every
call through ``AttentionInterface.get_interface(config._attn_implementation,
eager_attention_forward)``. While a tagger is active that method is wrapped
(on the class, so model files that keep a local interface instance are covered
too) and returns the resolved function wrapped in a tagging closure. The model
itself is never modified: masks, the flash-kernel loader and the
implementation name stay what transformers chose, and deactivation restores
the original method.

Per call, the wrapper opens ``<phase>/<layer>`` (``fwd``, or ``recompute``
when the forward is re-run inside a backward pass by activation
checkpointing), computes the attention — fused (layer mode) or one query head
at a time inside ``head.N`` ranges (head mode, :mod:`headcount.tagging.head_split`)
— and tags its backward on the thread that runs it: ``bwd/<layer>`` opens when
the output's gradient arrives and closes once q/k/v's are done, from gradient
hooks in layer mode (they leave the backward graph, and so every gradient's
bits, as they are) and from two identity autograd functions in head mode and
where a key/value is shared with another call
(:func:`~headcount.tagging.backward.hook_backward`).

Each range opened is also logged with the call's metadata
(:class:`~headcount.common.call_log.CallLog`, :class:`~headcount.common.call_log.CallMeta`),
which is how the analytic model later knows what each range computed.
"""

from __future__ import annotations

import functools
import random
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from headcount.common.call_log import CallLog, CallMeta, CallShape, OneHead, logged, shape_of
from headcount.common.errors import HeadcountError
from headcount.common.naming import head_name, sanitize
from headcount.tagging import compiled as _compiled
from headcount.tagging import graph_marks, state
from headcount.tagging import shapes as _shapes
from headcount.tagging.backward import BackwardRange, awaited, graph_task_id, hook_backward
from headcount.tagging.grad_marks import CloseOnGrad, OpenOnGrad, with_output
from headcount.tagging.head_split import grouped_heads, head_slice, interface_call, join_transformers
from headcount.tagging.layer_names import layer_names
from headcount.tagging.module_hooks import bypassing_attention, calls_attention_interface, hook_module
from headcount.tagging.ranges import CorrelatedEmitter, RangeEmitter

MODES = ("layer", "head")


@dataclass(frozen=True)
class LayerInfo:
    name: str
    index: int | None
    qualname: str
    model: str


def _causal(module, kwargs: dict) -> bool:
    """Whether a call through transformers' interface is causal (its argument, else the module's flag)."""
    causal = kwargs.get("is_causal")
    return getattr(module, "is_causal", False) if causal is None else causal


# --------------------------------------------------------------------------- the tagger

_original_get_interface: Callable | None = None
_active = state.ACTIVE  # the same list: read on every call, without a function call
_new = tuple.__new__  # a NamedTuple without its Python-level __new__ (all fields given): 0.1 µs less per head


def _interface_class():
    from transformers.modeling_utils import AttentionInterface

    return AttentionInterface


def _patched_get_interface(self, attn_implementation, default):
    fn = _original_get_interface(self, attn_implementation, default)
    if torch.compiler.is_compiling():  # traced: only the mode and the layer names are read (state.py)
        mode = state.MODE
        return fn if mode is None else _traced_wrapper(fn, attn_implementation or "eager", mode)
    if _active:
        tagger = _active[-1]
        return tagger._wrappers.get((fn, attn_implementation)) or tagger._wrapped(fn, attn_implementation)
    return fn


def _traced_wrapper(fn: Callable, implementation: str, mode: str) -> Callable:
    """The tagging closure for a traced (``torch.compile``) model: ranges as
    operator calls (:mod:`headcount.tagging.compiled`)."""

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        info = state.LAYERS.get(id(module))
        if info is None:
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        layer_name, layer, model = info
        fused, one_head = interface_call(fn, module, attention_mask, args, kwargs, query.shape[1])
        site = _compiled.site(layer_name, layer, model, implementation, query, attention_mask, _causal(module, kwargs),
                              kwargs.get("sliding_window"), "bhsd")
        return _compiled.run(mode, site, _compiled.dims(query, key, value, attention_mask), query, key, value,
                             fused, one_head, join_transformers)

    return wrapper


def current_tagger() -> "AttentionTagger | None":
    """The innermost active tagger, or ``None``."""
    return state.current()


class AttentionTagger:
    """Tags the attention of registered models (or, with ``auto=True``, of
    every transformers model that runs) while active.

    Args:
        models: models to register now (more with :meth:`add_model`).
        mode: ``layer`` (compute as the model does) or ``head`` (one head at a time).
        auto: register every ``PreTrainedModel`` whose forward runs while active.
        nvtx: emit NVTX ranges; torch_ranges: emit ``record_function`` ranges
            while torch.profiler records.
        log_calls: keep the per-call log (:attr:`calls`) that the analytic model
            needs. Without it, layer mode with no gradient tracking only opens
            and closes the ranges (the cheapest tags; backward tagging and head
            mode still run).
        range_log: the cupti source's range log: ranges then also push CUPTI
            external correlation ids (see :class:`~headcount.tagging.ranges.CorrelatedEmitter`).

    Raises:
        HeadcountError: unknown mode.
    """

    def __init__(self, models=(), mode: str = "layer", auto: bool = False, nvtx: bool = True, torch_ranges: bool = True,
                 log_calls: bool = True, range_log=None):
        if mode not in MODES:
            raise HeadcountError(f"unknown mode {mode!r}", hint="use mode='layer' or mode='head'")
        self.mode = mode
        self.auto = auto
        self.log_calls = log_calls
        if range_log is not None:
            self.emitter = CorrelatedEmitter(range_log, nvtx=nvtx, torch_ranges=torch_ranges)
        else:
            self.emitter = RangeEmitter(nvtx=nvtx, torch_ranges=torch_ranges)
        self.graph_marks = graph_marks.marking(self.emitter)  # a capture's calls labelled for its replays (torch 2.15+)
        self._log: list[CallLog | tuple] = []  # shape: the CallMeta (sizes are worked out when read)
        self._shapes: dict[CallMeta | OneHead, CallShape] = {}
        self._layers: dict[int, LayerInfo] = {}
        self._qualnames: dict[int, tuple[str, str]] = {}  # id(module) -> (qualname, model class)
        self._models: list[torch.nn.Module] = []
        self._sites: dict[str, tuple] = {}  # compiled call sites, parsed once (compiled.parse_site)
        self._wrappers: dict[tuple[Callable, str], Callable] = {}
        self._hooked: dict[int, tuple] = {}  # id → (attention module tagged by a forward wrapper, its model's config)
        self._turns: dict[tuple, int] = {}  # (layer, phase) → calls so far: head mode draws each call's head order (head_order)
        self.paths: dict[str, str] = {}  # model class → "attention interface" | "module hooks"
        self._hook = None
        self.active = False
        # called with (layer info, module, q, k, mask, kwargs) for each forward call (attention statistics)
        self.observer = None
        for model in models or ():
            self.add_model(model)

    # ---------------------------------------------------------------- registration
    def add_model(self, model: torch.nn.Module) -> None:
        """Register ``model``: name its attention modules (docs/architecture.md §2).

        Raises:
            HeadcountError: ``model`` is not a ``torch.nn.Module``.
        """
        if not isinstance(model, torch.nn.Module):
            raise HeadcountError(
                f"expected a torch.nn.Module, got {type(model).__name__}",
                hint="pass the model object, e.g. AttentionProfiler(model)",
            )
        if id(model) in self._qualnames:
            return
        self._models.append(model)
        model_name = type(model).__name__
        attention = {}
        for qualname, module in model.named_modules():
            self._qualnames.setdefault(id(module), (qualname, model_name))
            if calls_attention_interface(module):
                attention[qualname] = module
        hooked = bypassing_attention(model) if not attention else {}
        if hooked and self.mode == "head":
            raise HeadcountError(
                f"{model_name}: its attention does not go through transformers' attention interface, so head mode "
                "cannot compute its heads one at a time",
                hint="profile it in layer mode (mode='layer', --mode layer): its layers are tagged through module hooks")
        if attention or hooked:
            self.paths[model_name] = "module hooks" if hooked else "attention interface"
        attention.update(hooked)
        named = layer_names(attention)
        for qualname, module in attention.items():
            if id(module) not in self._layers:
                name, idx = named[qualname]
                self._layers[id(module)] = LayerInfo(name, idx, qualname, model_name)
            self._share(self._layers[id(module)], module)
        for module in hooked.values():
            self._hooked[id(module)] = (module, getattr(model, "config", None))
            if self.active:
                hook_module(self, module, getattr(model, "config", None))

    @staticmethod
    def _share(info: LayerInfo, module) -> None:
        """Publish a layer's name for traced code (state.LAYERS)."""
        state.share_layer(id(module), (info.name, info.index, info.model))

    @property
    def layers(self) -> list[LayerInfo]:
        """The attention layers known so far, in registration order."""
        return list(self._layers.values())

    def _layer_of(self, module) -> LayerInfo | None:
        info = self._layers.get(id(module))
        if info is None and id(module) in self._qualnames:
            # an attention module that the static scan missed: name it alone
            qualname, model_name = self._qualnames[id(module)]
            name, idx = layer_names({qualname: module})[qualname]
            info = self._layers[id(module)] = LayerInfo(name, idx, qualname, model_name)
            self._share(info, module)
        return info

    def _auto_register(self, module, args):
        if id(module) not in self._qualnames:
            from transformers import PreTrainedModel

            if isinstance(module, PreTrainedModel):
                try:
                    self.add_model(module)
                except HeadcountError as err:  # inside the user's forward: said, never raised
                    from headcount.common.errors import notice

                    self._qualnames.setdefault(id(module), ("", type(module).__name__))
                    notice(f"not tagged: {err.one_line()}")

    # ---------------------------------------------------------------- activation
    @property
    def models(self) -> list:
        """The models registered so far (given, or found running with ``auto``)."""
        return list(self._models)

    def activate(self) -> "AttentionTagger":
        """Start tagging (idempotent). Raises HeadcountError if transformers is missing."""
        global _original_get_interface
        if self.active:
            return self
        with state.LOCK:
            try:
                cls = _interface_class()
            except ImportError as exc:  # pragma: no cover - transformers is a dependency
                raise HeadcountError("transformers is not installed", hint="pip install transformers") from exc
            if state.push(self):
                _original_get_interface = cls.get_interface
                cls.get_interface = _patched_get_interface
        _compiled.install_ordering_pass()
        if self.auto:
            self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._auto_register)
        self.active = True
        for module, config in self._hooked.values():
            hook_module(self, module, config)
        return self

    def deactivate(self) -> None:
        """Stop tagging and restore transformers' attention dispatch exactly."""
        global _original_get_interface
        if not self.active:
            return
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        with state.LOCK:
            if state.pop(self) and _original_get_interface is not None:
                _interface_class().get_interface = _original_get_interface
                _original_get_interface = None
        self._wrappers.clear()
        for module, _ in self._hooked.values():
            vars(module).pop("forward", None)
        self.active = False

    def __enter__(self) -> "AttentionTagger":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # ---------------------------------------------------------------- the per-call path
    @property
    def calls(self) -> list[CallLog]:
        """Every range opened so far, in order (see :class:`CallLog`)."""
        calls = []
        for entry in self._log:
            log = entry if type(entry) is CallLog else CallLog(*entry)  # a plain tuple from the inference hot path
            calls.append(log._replace(shape=self._shape_of(log.shape)))
        return calls

    def _shape_of(self, meta: CallMeta | OneHead | None) -> CallShape | None:
        """Sizes from the metadata logged on the hot path (worked out once per distinct call)."""
        if meta is None:
            return None
        shape = self._shapes.get(meta)
        if shape is None:
            shape = self._shapes[meta] = shape_of(meta)
        return shape

    def open_site(self, site: str, phase: str, head: int, kv_head: int, dims) -> list:
        """A compiled call site's range opens (called by the ``headcount::open_range``
        operator at run time): log the call, push its ranges; returns their tokens."""
        parsed = self._sites.get(site)
        if parsed is None:
            parsed = self._sites[site] = _compiled.parse_site(site)
        layer_name, layer, model, fixed = parsed
        if phase == "fwd" and graph_task_id() != -1:
            phase = "recompute"
        meta = _compiled.metadata(fixed, dims)
        tid = threading.get_ident()
        if head < 0:
            self._record(logged(tid, phase, layer_name, layer, meta, model), tid)
            names = (phase, layer_name)
        else:
            self._record(logged(tid, phase, layer_name, layer, meta, model).for_head(head, kv_head, OneHead(meta)), tid)
            names = (head_name(head),)
        return [self.emitter.push(name) for name in names]

    def close_site(self, tokens: list) -> None:
        """Pop the ranges :meth:`open_site` pushed (the ``headcount::close_range`` operator)."""
        for token in reversed(tokens):
            self.emitter.pop(token)

    def _record(self, log: CallLog, thread_id: int) -> None:
        if self.log_calls:
            self._log.append(log if log.thread_id == thread_id else log.on_thread(thread_id))

    def _wrapped(self, fn: Callable, implementation: str) -> Callable:
        cache_key = (fn, implementation)
        implementation = implementation or "eager"
        wrapper = self._wrappers.get(cache_key)
        if wrapper is None:
            layers, log, emitter, grad_enabled = self._layers, self._log, self.emitter, torch.is_grad_enabled
            log_calls, layer_mode, get_ident, tensor = self.log_calls, self.mode == "layer", threading.get_ident, torch.Tensor

            @functools.wraps(fn)
            def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
                info = layers.get(id(module)) or self._layer_of(module)
                if info is None:
                    return fn(module, query, key, value, attention_mask, *args, **kwargs)
                if self.observer is not None and graph_task_id() == -1:
                    self.observer(info, module, query, key, attention_mask, kwargs)  # outside the ranges
                fused_only = layer_mode and not (grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
                if fused_only and not log_calls:
                    # tags only (no tool reads the log): two ranges and nothing else
                    tokens = emitter.push2("recompute" if graph_task_id() != -1 else "fwd", info.name)
                    try:
                        return fn(module, query, key, value, attention_mask, *args, **kwargs)
                    finally:
                        emitter.pop2(tokens)
                causal = kwargs.get("is_causal")
                if causal is None:
                    causal = getattr(module, "is_causal", False)
                # CallMeta's and CallLog's fields as plain tuples: building the NamedTuples here cost
                # 0.25 µs a call (10 % of the tagging); `calls` reads them back as the declared types
                meta = (implementation, query.shape, key.shape, value.shape, query.dtype,
                        (attention_mask.shape, attention_mask.dtype) if isinstance(attention_mask, tensor) else None,
                        causal, kwargs.get("sliding_window"), "bhsd")
                if fused_only:
                    # inference in layer mode: no closures, no autograd nodes
                    phase = "recompute" if graph_task_id() != -1 else "fwd"
                    log.append((get_ident(), phase, info.name, info.index, None, None, meta, info.model))
                    tokens = emitter.push2(phase, info.name)
                    try:
                        return fn(module, query, key, value, attention_mask, *args, **kwargs)
                    finally:
                        emitter.pop2(tokens)
                fused, one_head = interface_call(fn, module, attention_mask, args, kwargs, query.shape[1])
                return self.run(info.name, info.index, info.model, meta, query, key, value, fused, one_head, join_transformers)

            self._wrappers[cache_key] = wrapper
        return wrapper

    def run(
        self,
        layer_name: str,
        layer_index: int | None,
        model_name: str | None,
        meta: CallMeta | tuple | None,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        fused: Callable,
        one_head: Callable,
        join: Callable,
        head_dim: int = 1,
    ):
        """Run one attention call inside its ranges.

        Args:
            meta: the call's metadata (:func:`headcount.tagging.shapes.metadata`; or its fields as a plain tuple).
            fused: ``fused(q, k, v)`` computes the call as the model does.
            one_head: ``one_head(h, q_h, k_h, v_h)`` computes query head ``h`` alone.
            join: ``join(results)`` assembles the per-head results into the fused result.
            head_dim: the head dimension of q, k and v.
        """
        phase = "recompute" if graph_task_id() != -1 else "fwd"
        tid = threading.get_ident()
        log = _new(CallLog, (tid, phase, layer_name, layer_index, None, None, meta, model_name, None, None, None, None))
        track = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        emitter = self.emitter
        # the identity functions stay outside the forward range so that their
        # own (small) cost is not counted as attention;
        # gradient hooks keep the backward graph as it is (bit-identical gradients), but
        # a tensor another call already waits on (Gemma3n's shared key/value) completes
        # only after that call's backward: this call then closes from an identity function
        hooks = track and self.mode == "layer" and not awaited(query, key, value)
        if track:
            bwd = BackwardRange(self, ("bwd", layer_name),
                                _new(CallLog, (tid, "bwd", layer_name, layer_index, None, None, meta, model_name, None, None, None, None)))
            if not hooks:
                query, key, value = CloseOnGrad.apply(bwd.close, query, key, value)
        if self.log_calls:
            self._log.append(log)
        tokens = emitter.push2(phase, layer_name)
        try:
            if self.mode == "head":
                result = self._per_head(log, query, key, value, one_head, join, head_dim, track)
            else:
                result = fused(query, key, value)
        finally:
            emitter.pop2(tokens)
        if hooks:
            hook_backward(bwd, result, (query, key, value))
        elif track:
            result = with_output(result, lambda out: OpenOnGrad.apply(out, bwd.open))
        return result

    def _per_head(self, log: CallLog, query, key, value, one_head, join, head_dim, track):
        n_q = query.shape[head_dim]
        n_kv = key.shape[head_dim]
        if n_kv == 0 or n_q % n_kv:
            raise HeadcountError(
                f"{log.layer_name}: {n_q} query heads cannot share {n_kv} key/value heads",
                hint="profile this model in layer mode",
            )
        groups = n_q // n_kv
        head_meta = OneHead(log.shape) if log.shape is not None else None
        tid, phase, layer_name, layer, model = log.thread_id, log.phase, log.layer_name, log.layer, log.model
        record = self._log.append if self.log_calls else None
        # split, not narrow: its backward is one concatenation of the heads' gradients, where narrow's
        # is a zero-filled copy of the whole tensor per head, then a sum of them (glue that no head holds)
        queries = query.split(1, head_dim)
        keys, values = grouped_heads(key, head_dim, groups), grouped_heads(value, head_dim, groups)
        results: list = [None] * n_q
        emitter = self.emitter
        turn = self._turns.get((layer_name, phase), 0)
        self._turns[(layer_name, phase)] = turn + 1
        for h in head_order(layer_name, turn, n_q):
            g = h // groups
            q_h, k_h, v_h = queries[h], keys[h], values[h]
            name = head_name(h)
            head_log = _new(CallLog, (tid, phase, layer_name, layer, h, g, head_meta, model, None, None, None, None))
            if track:
                bwd = BackwardRange(self, (name,), _new(CallLog, (tid, "bwd", layer_name, layer, h, g, head_meta, model, None, None,
                                                                   None, None)))
                q_h, k_h, v_h = CloseOnGrad.apply(bwd.close, q_h, k_h, v_h)
            if record is not None:
                record(head_log)
            token = emitter.push(name)
            try:
                res = one_head(h, q_h, k_h, v_h)
            finally:
                emitter.pop(token)
            if track:
                res = with_output(res, lambda out: OpenOnGrad.apply(out, bwd.open))
            results[h] = res
        return join(results)


def head_order(layer_name: str, call: int, heads: int) -> list[int]:
    """The order in which head mode computes the ``heads`` heads of call ``call`` (0, 1, …) of a layer.

    The first head computed in a call (and the last, whose backward runs first)
    pays for warming caches and allocators, and later places for what builds
    up. So that no place is ever taken for a head, orders are drawn at random
    but reproducibly (seeded by the layer) and balanced: every ``heads``
    consecutive calls form a Latin square (each head once at each place),
    with its rows in random order and the heads relabelled at random. A
    head's place is then independent of the head, which is what lets
    :func:`headcount.derive.spread.rank_tests` test a head's rank among the
    heads of its calls against chance, and each head's median is taken over
    every place alike."""
    block, row = divmod(call, heads)
    draw = random.Random(f"{layer_name}/{block}")
    relabel, rows = draw.sample(range(heads), heads), draw.sample(range(heads), heads)
    return [relabel[(rows[row] + i) % heads] for i in range(heads)]


# --------------------------------------------------------------------------- public helpers


def tag(model: torch.nn.Module, mode: str = "layer", log_calls: bool = False) -> AttentionTagger:
    """Tag ``model``'s attention until :func:`untag` (or ``tagger.deactivate()``),
    for an external tool (nsys, ncu) to record.

    Args:
        log_calls: also keep the per-call log (``tagger.calls``); off by
            default, which makes inference tags the cheapest.

    Returns:
        The active tagger.
    """
    return AttentionTagger([model], mode=mode, log_calls=log_calls).activate()


def untag(tagger: AttentionTagger) -> None:
    """Stop tagging; the model and transformers are left exactly as before."""
    tagger.deactivate()


def tag_attention(fn: Callable | None = None, *, layer: str | int, layout: str = "bhsd", causal: bool = False):
    """Tag a hand-written attention callable as one layer (the manual API).

    For attention that does not go through transformers' interface (xFormers,
    a custom kernel, a plain ``F.scaled_dot_product_attention`` in a user
    model). The callable takes ``(q, k, v, *args, **kwargs)`` and returns the
    attention output (or a tuple whose first item is the output) in the same
    layout as q. While a tagger is active (inside ``AttentionProfiler``),
    calls run inside ``fwd/<layer>`` and ``bwd/<layer>`` ranges, and in head
    mode one query head at a time. Otherwise the callable runs untouched.

    Args:
        layer: layer name (``"layer.3"``) or index (``3``).
        layout: ``bhsd`` (heads on dim 1) or ``bshd`` (heads on dim 2).
        causal: whether the callable applies a causal mask (for the analytic model).

    Example::

        @tag_attention(layer=0)
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    if layout not in ("bhsd", "bshd"):
        raise HeadcountError(f"unknown layout {layout!r}", hint="use layout='bhsd' or layout='bshd'")
    name = sanitize(f"layer.{layer}" if isinstance(layer, int) else layer)
    index = layer if isinstance(layer, int) else None
    head_dim = 1 if layout == "bhsd" else 2

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def tagged(query, key, value, *args, **kwargs):
            compiling = torch.compiler.is_compiling()
            tagger = None if compiling else current_tagger()
            if (state.MODE if compiling else tagger) is None:
                return func(query, key, value, *args, **kwargs)
            mask, is_causal = kwargs.get("attn_mask"), causal or bool(kwargs.get("is_causal"))
            n_heads = query.shape[head_dim]

            def fused(q, k, v):
                return func(q, k, v, *args, **kwargs)

            def one_head(h, q, k, v):
                kw = {n: head_slice(t, h, n_heads) for n, t in kwargs.items()}
                return func(q, k, v, *args, **kw)

            def join(results):
                if isinstance(results[0], torch.Tensor):
                    return torch.cat(results, dim=head_dim)
                return (torch.cat([r[0] for r in results], dim=head_dim), *results[0][1:])

            if compiling:
                site = _compiled.site(name, index, None, "manual", query, mask, is_causal, None, layout)
                return _compiled.run(state.MODE, site, _compiled.dims(query, key, value, mask), query, key, value,
                                     fused, one_head, join, head_dim)
            meta = _shapes.metadata("manual", query, key, value, mask, is_causal, None, layout)
            return tagger.run(name, index, None, meta, query, key, value, fused, one_head, join, head_dim)

        return tagged

    return decorate(fn) if fn is not None else decorate


class attention_range:
    """Context manager that tags a block of code as ``fwd/<layer>`` (manual API).

    It has no tensors to hook, so it tags the forward only and cannot split
    heads; use :func:`tag_attention` on a callable for backward and head mode.
    Does nothing unless a tagger is active.
    """

    def __init__(self, layer: str | int):
        self.name = sanitize(f"layer.{layer}" if isinstance(layer, int) else layer)
        self.index = layer if isinstance(layer, int) else None
        self._tagger: AttentionTagger | None = None
        self._tokens = None

    def __enter__(self):
        self._tagger = current_tagger()
        if self._tagger is not None:
            phase = "recompute" if graph_task_id() != -1 else "fwd"
            tid = threading.get_ident()
            self._tagger._record(logged(tid, phase, self.name, self.index, None, None), tid)
            self._tokens = self._tagger.emitter.push2(phase, self.name)
        return self

    def __exit__(self, *exc) -> None:
        if self._tagger is not None:
            self._tagger.emitter.pop2(self._tokens)
            self._tagger = None
