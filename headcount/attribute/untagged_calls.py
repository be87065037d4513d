"""What the finder of :mod:`headcount.attribute.untagged` keeps of a call while it finds calls
(:class:`_Call`: its extent, phase, signal, shapes, layer and how that was numbered: :data:`MODULE_RANGES`
or :data:`CALL_ORDER`) and the disjoint spans per thread that keep calls apart (:class:`_Spans`).
Shared by :mod:`headcount.attribute.untagged` and :mod:`headcount.attribute.untagged_kernels`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from headcount.common import signals
from headcount.common.call_log import CallShape

MODULE_RANGES, CALL_ORDER = "module ranges", "call order"


@dataclass
class _Call:
    pid: object
    tid: object
    start: int
    end: int
    phase: str
    signal: str
    row: signals.Signal | None
    found_as: str
    shape: CallShape | None = None
    layer: int | None = None
    layer_name: str | None = None
    numbered_by: str = CALL_ORDER
    sequences: frozenset = frozenset()
    forward: "_Call | None" = None   # a backward call: the forward call it belongs to
    module: tuple[int, int] | None = None  # the attention module around a forward core call: its start and end
    replayed: list[int] | None = None  # a call inside a graph replay: its kernels (events positions), theirs by name
    model: str | None = None  # the model (outermost module instance, or compiled graph) that made the call
    model_at: int | None = None  # the position of that model's module range on the call's thread (None: not a module)


class _Spans:
    """Disjoint intervals per thread, for "is this inside one of them / does it overlap one" queries."""

    def __init__(self):
        self._by_thread: dict = {}

    def add(self, key, start: int, end: int) -> None:
        bisect.insort(self._by_thread.setdefault(key, []), (start, end))

    def _near(self, key, start: int) -> list:
        spans = self._by_thread.get(key, [])
        at = bisect.bisect_right(spans, (start, float("inf")))
        return spans[max(at - 1, 0):at + 1]

    def holds(self, key, start: int, end: int) -> bool:
        return any(s <= start and end <= e for s, e in self._near(key, start))

    def overlaps(self, key, start: int, end: int) -> bool:
        return any(start <= e and s <= end for s, e in self._near(key, start))
