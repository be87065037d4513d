"""What an attention module launched on the GPU: whether its attention is there (untagged recordings).

An attention module found by its class name (``nano-vllm``'s ``Attention``, which stores the KV cache,
gathers and copies, then calls ``flash_fwd_splitkv_kernel`` through a pybind extension that records no
operator) is not all attention. Its launches decide (:func:`module_verdicts`):

- it launched an attention kernel (a ``kernel`` row of :data:`headcount.common.signals.SIGNALS`): the
  kernels are the attention, found by the kernel signal (time: their union), and the module stays the
  module around them (its other work stated apart, ``module_kernel_busy_ns``);
- it launched GPU work but no attention kernel and ran no softmax operator (eager attention's mark): its
  attention ran elsewhere (the CPU, a library the trace does not see): not GPU attention;
- it launched nothing in a recording with GPU work: no call;
- otherwise (eager attention, a CPU recording): the module is the call, as before.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from headcount.common import signals
from headcount.common.arrays import equals, per_text

KERNEL_INSIDE = "kernel inside"
ELSEWHERE = "no GPU attention"
NO_WORK = "no GPU work"
SOFTMAX = re.compile(r"softmax", re.IGNORECASE)


class ModuleLaunches:
    """Per launching thread, the start times of its launch calls (sorted), and which launched an attention kernel."""

    def __init__(self, events: pd.DataFrame):
        gpu = events[events["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy(dtype=bool)]
        self.any_gpu = bool(len(gpu))
        runtime = events[equals(events["kind"], "runtime") & events["correlation_id"].notna().to_numpy()]
        attention = per_text(gpu["name"], lambda n: signals.match("kernel", n) is not None).astype(bool) & equals(gpu["kind"], "kernel")
        work = pd.DataFrame({"correlation_id": pd.array(gpu["correlation_id"], dtype="Int64"), "attention": attention})
        work = work.groupby("correlation_id")["attention"].any().reset_index()
        calls = pd.DataFrame({"correlation_id": pd.array(runtime["correlation_id"], dtype="Int64"), "pid": runtime["pid"].to_numpy(object),
                              "tid": runtime["tid"].to_numpy(object), "start": runtime["start_ns"].to_numpy(np.int64)})
        launched = calls.merge(work, on="correlation_id", how="inner")
        self._by_thread = {}
        for (pid, tid), g in launched.groupby(["pid", "tid"], sort=False):
            order = np.argsort(g["start"].to_numpy(np.int64), kind="stable")
            self._by_thread[(pid, tid)] = (g["start"].to_numpy(np.int64)[order], g["attention"].to_numpy(dtype=bool)[order])

    def inside(self, pid, tid, start: int, end: int) -> tuple[int, int]:
        """(GPU launches, attention-kernel launches) of the thread whose call started in ``[start, end]``."""
        found = self._by_thread.get((pid, tid))
        if found is None:
            return 0, 0
        starts, attention = found
        lo, hi = np.searchsorted(starts, start, side="left"), np.searchsorted(starts, end, side="right")
        return int(hi - lo), int(attention[lo:hi].sum())


def verdict(launches: ModuleLaunches, pid, tid, start: int, end: int, ops_inside: pd.DataFrame | None) -> str | None:
    """What one attention module is (module docstring): :data:`KERNEL_INSIDE`, :data:`ELSEWHERE`, :data:`NO_WORK`,
    or ``None`` (the module is the call)."""
    if not launches.any_gpu:
        return None
    gpu, attention = launches.inside(pid, tid, start, end)
    if attention:
        return KERNEL_INSIDE
    if not gpu:
        return NO_WORK
    softmax = ops_inside is not None and len(ops_inside) and ops_inside["name"].astype(str).str.contains(SOFTMAX).any()
    return None if softmax else ELSEWHERE


def notices(counts: dict[str, int]) -> list[str]:
    """The notices of the modules left out (:func:`verdict`'s counts)."""
    out = []
    if counts.get(ELSEWHERE):
        out.append(f"{counts[ELSEWHERE]} attention modules launched GPU work but no attention kernel and no softmax: their "
                   "attention ran elsewhere (on the CPU, or in a library the trace does not see), so they are not GPU attention "
                   "calls (their GPU work stays in kernels and steps)")
    if counts.get(NO_WORK):
        out.append(f"{counts[NO_WORK]} attention modules launched no GPU work in a recording that has GPU work: not calls")
    return out
