"""The file each tagged process of ``headcount run`` leaves in the raw folder
(``child-<pid>.json``): its fields, and how it is read back.

Written by :meth:`headcount.wrap.child.ChildSession.finish` inside the
profiled program; read by the build (:mod:`headcount.build.run_folder`) when
the run's report is assembled, or when ``headcount parse`` is given an nsys
report that sits in such a folder. A stage-crossing format, so it lives with
the readers: the writer imports it, the readers never import the writer
(which imports torch).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from headcount.common.call_log import CallLog, CallShape

CHILD_FILE = "child-{pid}.json"
"""Each tagged process's report: JSON, plain values only (the keys written in
:meth:`ChildSession.finish`; ``calls`` as :func:`calls_to_rows` rows), read
back by :func:`read_report`."""


@dataclass
class ChildReport:
    """What each tagged process of ``headcount run`` leaves in the raw folder
    (``child-<pid>.json``): plain values only.

    Attributes:
        calls: the call log as :func:`calls_to_rows` rows.
        records: the in-process recorder's file: the cupti source's records, the torch backend's Chrome
            trace (``None`` for nsys and ncu, and where the recorder did not start).
        complete: the program ended normally; ``ended_by`` says how it ended otherwise.
        device: where the process's work ran (:meth:`headcount.common.device.Device.from_torch`, as a dict).
        program: its torch and transformers versions.
        nvtx_tagged: headcount's ranges were also emitted as NVTX.
    """

    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    backend: str
    mode: str
    steps_seen: int
    steps_selected: object
    calls: list
    records: str | None
    complete: bool
    ended_by: str
    notices: list
    started: float | None
    argv: list
    device: dict | None
    program: dict
    nvtx_tagged: bool


def calls_to_rows(calls) -> list[dict]:
    """The call log as plain rows (the CallLog fields, the shape's fields under ``shape``)."""
    return [{**c._asdict(), "shape": asdict(c.shape) if c.shape is not None else None} for c in calls]


def calls_from_rows(rows: list[dict]) -> list:
    """:func:`calls_to_rows`'s rows back as CallLog objects."""
    return [CallLog(**{**r, "shape": CallShape(**r["shape"]) if r.get("shape") else None}) for r in rows]


def read_report(path) -> dict:
    """One process's report as written by :meth:`headcount.wrap.child.ChildSession.finish` (the
    fields of :class:`ChildReport`), with its call log as CallLog objects.

    Raises:
        OSError, ValueError (json.JSONDecodeError), TypeError, KeyError: unreadable or not such a report.
    """
    with open(path, encoding="utf-8") as fh:
        doc = asdict(ChildReport(**json.load(fh)))  # a missing or unknown field is a TypeError, not a silent default
    doc["calls"] = calls_from_rows(doc["calls"] or [])
    return doc
