"""How attention modules get their layer names (docs/architecture.md §2).

The names themselves (phases, ``layer.N``, ``head.N``, what may not appear in
them) are :mod:`headcount.common.naming`; this module picks a model's layer names from
its modules' qualified names.
"""

from __future__ import annotations

import re

from headcount.common.naming import sanitize

_INT = re.compile(r"^\d+$")
_CROSS_HINTS = ("cross", "encdec", "enc_dec")


def _role(qualname: str, module) -> str:
    if getattr(module, "is_cross_attention", False):
        return "cross"
    last = qualname.rsplit(".", 1)[-1].lower()
    if any(h in last for h in _CROSS_HINTS):
        return "cross"
    if "self" in last:
        return "self"
    return sanitize(qualname.rsplit(".", 1)[-1])


def layer_names(attention_modules: dict[str, object]) -> dict[str, tuple[str, int]]:
    """Give every attention module of one model a unique, stable layer name.

    The block index is ``module.layer_idx`` where the module has one, else the
    first integer in its qualified name (the index in the model's layer list).
    Models with several stacks (T5's encoder and decoder) prefix the part of
    the path that tells the stacks apart (``encoder.layer.0``); blocks that hold
    more than one attention module (T5's decoder: self and cross) suffix the
    role (``decoder.layer.0.self``, ``decoder.layer.0.cross``).

    Args:
        attention_modules: qualified name (as in ``model.named_modules()``) → module.

    Returns:
        qualified name → (layer name, layer index).
    """
    parts: dict[str, tuple[tuple[str, ...], int]] = {}
    for qualname, module in attention_modules.items():
        comps = qualname.split(".") if qualname else []
        pos = next((i for i, c in enumerate(comps) if _INT.match(c)), None)
        idx = getattr(module, "layer_idx", None)
        if not isinstance(idx, int):
            idx = int(comps[pos]) if pos is not None else 0
        prefix = tuple(comps[:pos]) if pos is not None else tuple(comps[:-1])
        parts[qualname] = (prefix, idx)

    prefixes = sorted({p for p, _ in parts.values()})
    stack_of: dict[tuple[str, ...], str] = {}
    if len(prefixes) > 1:
        for p in prefixes:
            # keep the components that differ from some other stack's path
            distinct = [c for i, c in enumerate(p) if any(len(o) <= i or o[i] != c for o in prefixes if o != p)]
            stack_of[p] = sanitize(".".join(distinct) or ".".join(p) or "stack")
    for p in prefixes:
        stack_of.setdefault(p, "")

    by_block: dict[tuple[str, int], list[str]] = {}
    for qualname, (prefix, idx) in parts.items():
        by_block.setdefault((stack_of[prefix], idx), []).append(qualname)

    names: dict[str, tuple[str, int]] = {}
    for (stack, idx), members in by_block.items():
        base = f"{stack}.layer.{idx}" if stack else f"layer.{idx}"
        if len(members) == 1:
            names[members[0]] = (base, idx)
            continue
        roles = {q: _role(q, attention_modules[q]) for q in members}
        if len(set(roles.values())) < len(members):
            roles = {q: sanitize(q.rsplit(".", 1)[-1]) for q in members}
        for q in members:
            names[q] = (f"{base}.{roles[q]}", idx)
    return names
