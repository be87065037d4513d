"""Stage 2, record: one module per source, no tagging and no parsing.

Every in-process source is a :class:`Recorder`: :mod:`headcount.collector.torch_source`
(torch.profiler) and :mod:`headcount.collector.cupti_source` (CUPTI). The tools
``headcount run`` wraps (nsys, ncu) are found, versioned and given their
command lines by :mod:`headcount.wrap.nvidia_tools`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Recorder(Protocol):
    """What :class:`headcount.api.AttentionProfiler` needs of a source.

    Attributes:
        name: the source's name (``torch``, ``cupti``; :data:`headcount.build.sources.RECORDERS`).
        version: the recording library's version.
        notices: one-line facts the user should know, appended while recording.
        writes: what :meth:`stop` writes: ``kineto`` (a torch.profiler trace) or
            ``cupti-records`` (:mod:`headcount.parsers.cupti_records`); it chooses the build.
        correlates_ranges: the source records which range launched each kernel
            (CUPTI external correlation): it starts before the tagger, whose
            ranges then push their ids into :attr:`range_log`.
        range_log: where the ranges push their ids once started (``None`` without correlation).
        device_limits: the SM limits the source knows of its GPU (``None``: the model's device's).
    """

    name: str
    notices: list[str]
    writes: str
    correlates_ranges: bool
    range_log: object | None
    device_limits: object | None

    @property
    def version(self) -> str | None: ...

    def start(self) -> None:
        """Start recording. Raises HeadcountError when the source cannot (one line, with what to do)."""

    def stop(self) -> Path:
        """Stop and write the recording; returns its file (for :mod:`headcount.parsers`)."""

    def cleanup(self) -> None:
        """Remove temporary files the recording used."""
