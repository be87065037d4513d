"""Which CUDA runtime and driver calls the cupti source records: the ones a table reads.

Activity kinds ``RUNTIME`` and ``DRIVER`` record every API call; a PyTorch training step makes about 13,000
of them, 8,000 ``cudaGetDevice`` among them (tests/fixtures/gpu/h100-2026-12-05), and no table reads
those. The tables read an API call only where it

- launched GPU work (its correlation id is a kernel's, copy's or memset's): kernel launches, graph
  launches, copies and memsets, synchronous or not (attribution, launch cost and latency, the steps'
  launch-bound split);
- made the CPU wait for the GPU (:data:`headcount.derive.steps.SYNC_CALL`: synchronizes, blocking
  copies, frees), the steps' ``sync`` idle;
- began or ended a graph capture (a capture's calls ran nothing).

CUPTI records a chosen set when the calls are enabled one by one (``cuptiActivityEnableRuntimeApi``,
``…DriverApi``) **without** enabling the whole kind, which would override them (cupti_activity.h). The
names are matched on the call-id enums of the installed cupti-python (``runtime_api_trace_cbid``, ``driver_api_trace_cbid``), so a new CUDA's variants
(``_ptsz``, ``_v2``, ``Ex``) come along.
"""

from __future__ import annotations

import re

RUNTIME_CALLS = re.compile(
    r"^cuda(Launch(?!HostFunc)\w*|GraphLaunch\w*|Memcpy\w*|Memset\w*"
    r"|(Device|Stream|Event|Thread|Ctx)Synchronize\w*|Free\w*|Stream(Begin|End)Capture\w*)$")
"""Runtime call names (members of cupti-python's ``runtime_api_trace_cbid``, version suffix included) recorded."""

DRIVER_CALLS = re.compile(
    r"^cu(Launch(?!HostFunc)\w*|GraphLaunch\w*|Memcpy\w*|Memset\w*|MemFree\w*"
    r"|(Ctx|Stream|Event)Synchronize\w*|Stream(Begin|End)Capture\w*)$")
"""Driver call names (members of ``driver_api_trace_cbid``) recorded."""


def chosen(enum, pattern: re.Pattern) -> list[int]:
    """The call ids of ``enum`` (a cupti-python call-id enum) whose names ``pattern`` matches."""
    return sorted({int(member) for member in enum if pattern.match(member.name)})


def switch(cupti, on: bool) -> dict[str, int] | None:
    """Enable (``on``) or disable the runtime and driver calls the tables read, one call id at a time.

    Returns:
        How many call ids of each were switched (``{"runtime": n, "driver": m}``), or ``None`` where this
        cupti-python cannot choose (no ``activity_enable_runtime_api``): the caller enables the whole kinds.

    Raises:
        Whatever cupti-python raises (the caller classifies it).
    """
    if not (hasattr(cupti, "activity_enable_runtime_api") and hasattr(cupti, "activity_enable_driver_api")):
        return None
    counts = {}
    for what, enum, pattern, call in (("runtime", cupti.runtime_api_trace_cbid, RUNTIME_CALLS, cupti.activity_enable_runtime_api),
                                      ("driver", cupti.driver_api_trace_cbid, DRIVER_CALLS, cupti.activity_enable_driver_api)):
        ids = chosen(enum, pattern)
        for cbid in ids:
            call(cbid, int(on))
        counts[what] = len(ids)
    return counts
