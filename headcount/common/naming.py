"""NVTX range names (docs/architecture.md §2): what headcount emits and how a path reads back.

Ranges live in one NVTX domain, :data:`DOMAIN`, and nest outermost first:
phase (``fwd``, ``bwd``, ``recompute``) → layer (``layer.3``, or
``decoder.layer.3.cross`` in models with several stacks) → head (``head.7``,
head mode only). Names never contain ``/`` or ``:`` because ncu uses ``/`` to
separate nesting levels in ``--nvtx-include`` and ``:`` inside its CSV cells.

The ``torch.profiler`` path cannot use domains, so the same names are emitted
as ``record_function`` ranges prefixed with the domain and ``@`` (for example
``headcount@layer.3``).
This module imports nothing of headcount and nothing heavy: the tagger that
writes these names, and the parsers and attribution that read them back, all
import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOMAIN = "headcount"
"""The NVTX domain of every range headcount emits."""

STEP_DOMAIN = "headcount.step"
USER_DOMAIN = "torch.profiler"
"""The domain given to a torch.profiler trace's own annotations (``record_function`` / ``user_annotation``:
``## forward ##``, ``nccl:all_reduce``, ``DistributedDataParallel.forward``): ranges like foreign NVTX ranges."""
"""Domain of the ``step.N`` ranges the profile command puts around each step."""

PHASES = ("fwd", "bwd", "recompute")

MODULE = "module"
"""Name of a range around a phase range that spans the whole attention module of that call
(projections, rotary embedding, copies) where the phase range holds only its core (untagged recordings)."""

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
