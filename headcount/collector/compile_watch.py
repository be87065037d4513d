"""When ``torch.compile`` compiled during a profiled block.

A step that compiled (Dynamo tracing, Inductor code generation, the lazy
compilation of the backward graph at the first backward) measures the
compiler, not the model: seconds where the compiled step takes milliseconds.
:class:`CompileWatch` times every compilation through Dynamo's compile
callbacks (``torch._dynamo.callback_handler``: forward compiles and lazy
backward compiles); the profiler compares those intervals with its steps.

Where the callbacks do not exist (older torch), Dynamo's counters tell
whether a compile happened at all, without telling when.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def _counter_total() -> int | None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - torch without Dynamo
        return None
    return int(sum(counters["stats"].values())) + int(sum(counters["aot_autograd"].values()))


@dataclass
class CompileWatch:
    """Records compile intervals (``time.perf_counter_ns``) between :meth:`start` and :meth:`stop`.

    Attributes:
        intervals: ``(start_ns, end_ns)`` of each compilation seen.
        timed: whether compilations were timed (callbacks available) or only counted.
    """

    intervals: list[tuple[int, int]] = field(default_factory=list)
    timed: bool = False
    _open: list[int] = field(default_factory=list)
    _handler: object = None
    _before: int | None = None
    _after: int | None = None

    def _started(self, *_args) -> None:
        self._open.append(time.perf_counter_ns())

    def _ended(self, *_args) -> None:
        if self._open:
            self.intervals.append((self._open.pop(), time.perf_counter_ns()))

    def start(self) -> "CompileWatch":
        self._before = _counter_total()
        try:
            import torch._dynamo

            handler = torch._dynamo.callback_handler
            handler.register_start_callback(self._started)
            handler.register_end_callback(self._ended)
        except (ImportError, AttributeError):
            return self
        self._handler, self.timed = handler, True
        return self

    def stop(self) -> None:
        self._after = _counter_total()
        if self._handler is not None:
            for remove, callback in ((self._handler.remove_start_callback, self._started),
                                     (self._handler.remove_end_callback, self._ended)):
                try:
                    remove(callback)
                except ValueError:
                    pass
            self._handler = None
        now = time.perf_counter_ns()
        while self._open:  # a compile still running at stop (an exception inside it)
            self.intervals.append((self._open.pop(), now))

    @property
    def compiled(self) -> bool:
        """Whether anything compiled while watching."""
        if self.intervals:
            return True
        return self._before is not None and self._after is not None and self._after > self._before

    @property
    def seconds(self) -> float:
        """Total compile time seen, in seconds (0 when only counted)."""
        return sum(end - start for start, end in self.intervals) / 1e9

    def overlaps(self, start_ns: int, end_ns: int) -> bool:
        """Whether a compilation ran between ``start_ns`` and ``end_ns`` (``perf_counter_ns``)."""
        return any(s < end_ns and e > start_ns for s, e in self.intervals)
