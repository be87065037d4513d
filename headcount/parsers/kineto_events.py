"""The fields of a torch.profiler trace event that headcount decodes (msgspec structs: the rest is skipped unread).

:mod:`headcount.parsers.kineto_json` decodes a trace's events with these; :mod:`headcount.parsers.kineto_counters`
reads its counter events from them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec


class Args(msgspec.Struct, gc=False):
    """The ``args`` of an event that the events table keeps (others are skipped unread)."""

    correlation: Any = None
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    # an op's inputs, kept as their JSON text (decoded only for the few ops whose shapes are read: decoding
    # every op's nested lists took two thirds of the decode)
    input_dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=None, name="Concrete Inputs")
    graph_node: Any = msgspec.field(default=None, name="graph node id")
    sequence: Any = msgspec.field(default=None, name="Sequence number")
    # a collective's message, on its kernel (and its record_param_comms operator)
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    counter: Any = msgspec.field(default=None, name="")  # a counter event's value (kineto_counters)
    # Inductor's estimates on the operator around a Triton launch (its profiler kwargs), or on the kernel (a trace
    # augmented by torch._inductor.analysis.profile_analysis)
    kernel_flop: Any = None
    kernel_num_gb: Any = None
    external: Any = msgspec.field(default=None, name="External id")  # joins a kernel to the operator that launched it
    # a CUDA-graph kernel annotation baked into a replayed kernel's args (torch 2.15's mark_kernels, exported with
    # export_chrome_trace(cuda_graph_annotations=…)): its region name and, for backward work, its autograd phase
    annotation: Any = msgspec.field(default=None, name="name")
    autograd_phase: Any = None


class Event(msgspec.Struct, gc=False):
    """One trace event; ``ts``/``dur`` as float64 (exact nanoseconds are recovered by :func:`~headcount.parsers.kineto_times.exact_nanoseconds`)."""

    ph: Any = None
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


class ExactEvent(Event, gc=False):
    """An event whose ``ts``/``dur`` are decoded from the JSON number's own digits
    (the fallback where float64 cannot pin a nanosecond)."""

    ts: Decimal | None = None
    dur: Decimal | None = None
