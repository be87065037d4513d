"""headcount's calls marked inside a CUDA-graph capture (torch 2.15's ``torch.cuda.graph_annotations``), so that a
replay's kernels carry their layer into the trace (:mod:`headcount.attribute.graph_annotations` reads it back).

A capture's ranges run once, at capture; its replays launch the captured kernels with no range around them. Where
torch can label captured work (``torch.cuda.graph_annotations.is_available()``: torch 2.15+, ``cuda-bindings`` and a
CUDA ≥ 13.1 driver), each phase-and-layer range the tagger opens while the current stream captures is also a
``mark_kernels({"name": "headcount@<phase>/<layer>"}, backward=False)`` scope (headcount marks its backward ranges
itself). The user's capture must pass ``enable_annotations=True`` and export with
``cuda_graph_annotations=get_kernel_annotations()``; otherwise the marks are torch's no-op. Elsewhere nothing is
wrapped and the hot path is unchanged. Head ranges (head mode) are not marked.
"""

from __future__ import annotations

from headcount.common.naming import DOMAIN


def marking(emitter) -> bool:
    """Wrap ``emitter``'s ``push2``/``pop2`` (:class:`~headcount.tagging.ranges.RangeEmitter`) with graph marks where
    torch can annotate captured kernels; ``True`` when it did."""
    try:
        import torch
        from torch.cuda import graph_annotations
    except ImportError:
        return False
    try:
        if not graph_annotations.is_available():
            return False
    except Exception:  # noqa: BLE001 - a prototype API: any failure to probe is "not available"
        return False
    wrap(emitter, graph_annotations.mark_kernels, torch.cuda.is_current_stream_capturing)
    return True


def wrap(emitter, mark_kernels, capturing) -> None:
    """Replace ``emitter.push2``/``pop2`` by versions that also enter ``mark_kernels`` while ``capturing()``."""
    push2, pop2 = emitter.push2, emitter.pop2

    def marked_push2(outer: str, inner: str):
        tokens = push2(outer, inner)
        if not capturing():
            return tokens, None
        scope = mark_kernels({"name": f"{DOMAIN}@{outer}/{inner}"}, backward=False)
        scope.__enter__()
        return tokens, scope

    def marked_pop2(tokens=None) -> None:
        inner, scope = tokens if tokens is not None else (None, None)
        if scope is not None:
            scope.__exit__(None, None, None)
        pop2(inner)

    emitter.push2, emitter.pop2 = marked_push2, marked_pop2
