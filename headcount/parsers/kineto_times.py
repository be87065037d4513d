"""Exact nanoseconds from a torch.profiler trace's microsecond floats (:func:`exact_nanoseconds`)."""

from __future__ import annotations

import numpy as np

EXACT_BELOW_US = 2.0**43
"""Below this many microseconds (~100 days of a trace's clock) float64's spacing is under 1 ns."""


def exact_nanoseconds(us: np.ndarray) -> np.ndarray | None:
    """Exact integer nanoseconds of microsecond values that the trace wrote with
    at most three decimals, from their float64 parse; ``None`` where that
    cannot be proven (the caller then decodes the digits as ``Decimal``).

    Below 2**43 µs (~100 days of the trace's clock) float64's spacing is under
    1 ns, so the nanosecond count ``n`` whose ``n / 1000`` parses to the same
    float is unique; it lies within 2 of ``rint(us * 1000)``, and ``n / 1000``
    in float64 is the correctly rounded quotient, as the JSON parse was.
    """
    if not len(us):
        return us.astype(np.int64)
    if not np.isfinite(us).all() or np.abs(us).max() >= EXACT_BELOW_US:
        return None
    guess = np.rint(us * 1000).astype(np.int64)
    out = guess.copy()
    found = np.zeros(len(us), dtype=bool)
    for delta in (0, -1, 1, -2, 2):
        candidate = guess + delta
        hit = ~found & (candidate.astype(np.float64) / 1000.0 == us)
        out[hit] = candidate[hit]
        found |= hit
    return out if found.all() else None
