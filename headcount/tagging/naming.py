"""NVTX range names (docs/architecture.md §2) and how attention modules get their layer names.

Ranges live in one NVTX domain, :data:`DOMAIN`, and nest outermost first:
phase (``fwd``, ``bwd``, ``recompute``) → layer (``layer.3``, or
``decoder.layer.3.cross`` in models with several stacks) → head (``head.7``,
head mode only). Names never contain ``/`` or ``:`` because ncu uses ``/`` to
separate nesting levels in ``--nvtx-include`` and ``:`` inside its CSV cells.

The ``torch.profiler`` path cannot use domains, so the same names are emitted
as ``record_function`` ranges prefixed with the domain and ``@`` (for example
``headcount@layer.3``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOMAIN = "headcount"
"""The NVTX domain of every range headcount emits."""

STEP_DOMAIN = "headcount.step"
"""Domain of the ``step.N`` ranges the profile command puts around each step."""

PHASES = ("fwd", "bwd", "recompute")

_FORBIDDEN = re.compile(r"[/:\s]+")


def sanitize(name: str) -> str:
    """Make ``name`` safe as one NVTX nesting level (no ``/``, ``:`` or blanks)."""
    cleaned = _FORBIDDEN.sub("_", name.strip())
    if not cleaned:
        raise ValueError("an NVTX range name cannot be empty")
    return cleaned


def head_name(head: int) -> str:
    """Range name of query head ``head`` (``head.7``)."""
    return f"head.{head}"


_LAYER_RE = re.compile(r"^(?:(?P<stack>.+)\.)?layer\.(?P<idx>\d+)(?:\.(?P<role>[A-Za-z_]\w*))?$")
_HEAD_RE = re.compile(r"^head\.(?P<idx>\d+)$")


@dataclass(frozen=True)
class ParsedPath:
    """Phase, layer and head read back from a range path such as ``fwd/layer.3/head.7``."""

    phase: str | None
    layer_name: str | None
    layer: int | None
    head: int | None


def parse_path(path: str) -> ParsedPath:
    """Read phase, layer and head from a headcount range path.

    Args:
        path: levels joined with ``/``, outermost first, e.g. ``bwd/decoder.layer.0.cross/head.2``.

    Returns:
        The parsed fields; a field the path does not contain is ``None``.
    """
    phase = layer_name = None
    layer = head = None
    for level in path.split("/"):
        if level in PHASES and phase is None:
            phase = level
            continue
        m = _HEAD_RE.match(level)
        if m:
            head = int(m.group("idx"))
            continue
        m = _LAYER_RE.match(level)
        if m and layer_name is None:
            layer_name = level
            layer = int(m.group("idx"))
    return ParsedPath(phase, layer_name, layer, head)




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
