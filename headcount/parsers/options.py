"""How ``headcount parse`` reads a recording: one declared set of options, checked up front and passed down."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadOptions:
    """What a reader may be told.

    Attributes:
        locale: the locale of the machine that exported an ncu CSV (``C``, ``en_US``,
            ``de_DE`` …); ``None``: inferred from the numbers.
        threads: threads an nsys export's large tables are read with (each table in
            that many parts); 1 where worker processes already share the cores.
        salvage: a recording that is cut or partly unreadable is read for what it holds,
            with a notice (``damaged: …``) of what was lost; ``False``: refused (exit 2,
            nothing written). See :func:`headcount.parsers.files.damaged`.
    """

    locale: str | None = None
    threads: int = 2
    salvage: bool = False
