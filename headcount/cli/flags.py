"""Options that several commands take, defined once."""

from __future__ import annotations

import argparse

PM_INTERVAL_HELP = ("PM sampling interval in microseconds of GPU time, or auto (default): cupti, the finest CUPTI "
                    "accepts of 5, 10, 20, 50 µs; torch, 20 µs. A layer, head or kernel gets sampled DRAM bytes only where at least 4 "
                    "whole samples lie inside it, else null with a notice (--backend ncu measures them exactly)")


def pm_interval_ns(text: str) -> int:
    """``--pm-interval-us``: ``auto`` → 0 (the collector's choice), else microseconds → GPU nanoseconds.

    Raises:
        argparse.ArgumentTypeError: neither ``auto`` nor a positive number.
    """
    if text.strip().lower() == "auto":
        return 0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give microseconds (e.g. 10) or auto") from None
    if not value > 0 or value * 1000 < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive (e.g. 10), or auto")
    return int(round(value * 1000))


def add_pm_interval(parser) -> None:
    """``--pm-interval-us`` (dest ``pm_interval_ns``, GPU ns; 0: auto)."""
    parser.add_argument("--pm-interval-us", dest="pm_interval_ns", type=pm_interval_ns, default=0, metavar="US|auto",
                        help=PM_INTERVAL_HELP)
