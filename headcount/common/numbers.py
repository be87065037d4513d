"""Numbers as a reader sees them: rounded to what their spread supports.

A median over calls printed to six digits claims a precision the calls do
not have. :func:`with_spread` prints the median and its p10–p90 interval,
all rounded at the decade of the interval's half-width (never to fewer than
two significant digits of the median); a figure without a spread (one call)
gets three significant digits.
"""

from __future__ import annotations

import math

import pandas as pd


def missing(value) -> bool:
    """None, NaN or pandas' NA."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value)


def decimals_for(value: float, p10: float | None = None, p90: float | None = None, digits: int = 3) -> int:
    """Decimal places (negative: tens, hundreds …) to print ``value`` with.

    With an interval: the decade of its half-width, but at least two
    significant digits of ``value``. Without one: ``digits`` significant digits.
    """
    if missing(value) or value == 0:
        return 0
    magnitude = math.floor(math.log10(abs(value)))
    if missing(p10) or missing(p90) or p90 <= p10:
        return digits - 1 - magnitude
    half = (p90 - p10) / 2.0
    return max(-math.floor(math.log10(half)), 1 - magnitude)


def fixed(value, decimals: int) -> str:
    """``value`` rounded to ``decimals`` places (negative: to tens, hundreds …), with thousands separators."""
    if missing(value):
        return "–"
    rounded = round(float(value), decimals)
    return format(rounded, f",.{max(decimals, 0)}f")


def number(value, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits ("–" when missing)."""
    if missing(value):
        return "–"
    return fixed(value, decimals_for(float(value), digits=digits))


def with_spread(p50, p10=None, p90=None, scale: float = 1.0) -> str:
    """``"2,300 (2,100–2,900)"``: the median and its p10–p90 interval, × ``scale``,
    rounded to the interval; just the median to three significant digits
    when the interval is unknown."""
    if missing(p50):
        return "–"
    mid = float(p50) * scale
    if missing(p10) or missing(p90):
        return number(mid)
    lo, hi = float(p10) * scale, float(p90) * scale
    places = decimals_for(mid, lo, hi)
    return f"{fixed(mid, places)} ({fixed(lo, places)}–{fixed(hi, places)})"
