"""The cupti source's Python-side cost per range (issue 49): open and close one of headcount's ranges
(``headcount.collector.cupti_logs.RangeLog``: two timestamps, the external correlation id pushed and
popped — for a phase range opened with its layer range, only the layer's —, the range kept), without a GPU
(the copy of each CUPTI record: ``benchmarks/cupti_records.py``).

What stands in for CUPTI: its three calls are C builtins of the same arity (``time.perf_counter_ns`` for
``get_timestamp``, ``max`` for ``activity_push_external_correlation_id``, ``abs`` for the pop), so the figure
is headcount's own Python work around them; CUPTI's work inside those calls comes on top and is measured
by the GPU check (scripts/gpu_check.py). A regression in RangeLog shows here without a GPU.

Run: python benchmarks/range_cost.py [--ranges N] [--repeat R]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from types import SimpleNamespace

from headcount.collector.cupti_logs import RangeLog


def _stand_in() -> SimpleNamespace:
    return SimpleNamespace(ExternalCorrelationKind=SimpleNamespace(CUSTOM0=0), get_timestamp=time.perf_counter_ns,
                           activity_push_external_correlation_id=max, activity_pop_external_correlation_id=abs)


def per_range_ns(ranges: int, nested: bool) -> float:
    """Mean ns of one open + close, ``ranges`` of them on this thread (``nested``: a phase range around a
    layer range, as layer mode tags each call)."""
    log = RangeLog(_stand_in())
    start = time.perf_counter_ns()
    if nested:
        for _ in range(ranges // 2):
            outer = log.open("headcount", "fwd", correlate=False)  # as CorrelatedEmitter.push2: one id for the pair
            inner = log.open("headcount", "layer.0")
            log.close(inner)
            log.close(outer)
    else:
        for _ in range(ranges):
            log.close(log.open("headcount", "layer.0"))
    return (time.perf_counter_ns() - start) / ranges


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranges", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    for nested in (False, True):
        runs = [per_range_ns(args.ranges, nested) for _ in range(args.repeat)]
        what = "phase around layer (nested)" if nested else "one range at a time"
        print(f"RangeLog open + close, {what}: {statistics.median(runs):,.0f} ns per range (median of {args.repeat} runs of "
              f"{args.ranges:,}; min {min(runs):,.0f}, max {max(runs):,.0f}); Python side only, CUPTI's calls stood in by C builtins; "
              f"{threading.active_count()} thread(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
