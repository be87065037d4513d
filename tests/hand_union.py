"""The length of a union of intervals, counted by hand in the tests (a plain sweep, never headcount's code): the
independent side of every busy-time check."""

from __future__ import annotations


def union_length(intervals) -> float:
    """The summed length of the union of ``(start, end)`` pairs, in their own unit."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total
