"""The module-hook path: tagging the attention of models that bypass
transformers' attention interface (Bloom, MPT, DeBERTa…).

Such a model never calls the interface :mod:`headcount.tagging.tagger`
patches, so its attention modules (:func:`bypassing_attention`) are tagged
by wrapping each one's forward instead (:func:`hook_module`): the ranges
open around the whole module, the call's metadata comes from the module's
input and the model config (:func:`hooked_meta`: the attention function
itself is not visible), and the backward range from gradient hooks on the
module's output and input (:func:`headcount.tagging.backward.hook_backward`).
Layer mode only: the tagger refuses head mode for such a model.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Callable

import torch

from headcount.common.call_log import CallMeta, logged
from headcount.tagging.backward import BackwardRange, graph_task_id, hook_backward


def calls_attention_interface(module: torch.nn.Module) -> bool:
    """True when the module's forward resolves an attention function through
    transformers' interface (it names ``ALL_ATTENTION_FUNCTIONS``)."""
    forward = inspect.unwrap(type(module).forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def bypassing_attention(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The attention modules of a model none of whose modules goes through
    transformers' interface (Bloom, MPT, DeBERTa…): the innermost modules whose
    class is named ``…Attention…``. Empty when any module uses the interface
    (the interface then tags the model)."""
    modules = dict(model.named_modules())
    if any(calls_attention_interface(m) for m in modules.values()):
        return {}
    found = {}
    for qualname, module in modules.items():
        if "Attention" in type(module).__name__ and not any(
                "Attention" in type(child).__name__ for child in module.modules() if child is not module):
            found[qualname] = module
    return found


def hooked_meta(hidden: torch.Tensor, config, causal: bool) -> CallMeta:
    """Shape metadata of a module-hooked attention call, from its input
    (batch, sequence) and the model config (heads, key/value heads, head
    dimension): the attention function itself is not visible."""
    heads = next((getattr(config, n) for n in ("num_attention_heads", "n_head", "n_heads") if getattr(config, n, None)), 1)
    width = hidden.shape[-1]
    kv = getattr(config, "num_kv_heads", None) or getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        kv = 1
    batch, seq = (hidden.shape[0], hidden.shape[1]) if hidden.dim() == 3 else (1, hidden.shape[0])
    q = torch.Size((batch, heads, seq, width // heads))
    k = torch.Size((batch, kv, seq, width // heads))
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    return CallMeta(implementation, q, k, k, hidden.dtype, None, causal, None, "bhsd")


def hook_module(tagger, module: torch.nn.Module, config) -> None:
    """Tag an attention module that bypasses the interface by wrapping its
    forward (an instance attribute, removed at
    :meth:`~headcount.tagging.tagger.AttentionTagger.deactivate`): the ranges
    and backward tags of :meth:`~headcount.tagging.tagger.AttentionTagger.run`,
    around the whole module, for ``tagger`` (the
    :class:`~headcount.tagging.tagger.AttentionTagger` that registered it)."""
    if "forward" in vars(module):
        return
    original = module.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        info = tagger._layers.get(id(module))
        if info is None or not isinstance(hidden, torch.Tensor):
            return original(*args, **kwargs)
        causal = "CausalLM" in (info.model or "") or "LMHead" in (info.model or "")
        return _run_hooked(tagger, info, hooked_meta(hidden, config, causal), hidden,
                           lambda: original(*args, **kwargs))

    module.forward = forward


def _run_hooked(tagger, info, meta: CallMeta, hidden: torch.Tensor, call: Callable):
    """:meth:`~headcount.tagging.tagger.AttentionTagger.run` for a
    module-hooked attention call of layer ``info``
    (:class:`~headcount.tagging.tagger.LayerInfo`): the backward range
    opens and closes from gradient hooks on the module's output and input
    (:func:`~headcount.tagging.backward.hook_backward`; the module's input is usually also the
    residual, whose gradients an identity function would sum in another
    order)."""
    phase = "recompute" if graph_task_id() != -1 else "fwd"
    log = logged(threading.get_ident(), phase, info.name, info.index, meta, info.model)
    tagger._record(log, log.thread_id)
    tokens = tagger.emitter.push2(phase, info.name)
    try:
        result = call()
    finally:
        tagger.emitter.pop2(tokens)
    if torch.is_grad_enabled() and hidden.requires_grad:
        hook_backward(BackwardRange(tagger, ("bwd", info.name), log.in_phase("bwd")), result, (hidden,), core=False)
    return result
