"""The ncu route: a kernels frame read from an ncu CSV export or an ``.ncu-rep`` report
(:mod:`headcount.parsers.ncu_metrics`) → tables, each kernel's layer and head from the NVTX stack ncu
recorded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.attribute.calls import calls_frame
from headcount.build.shared import NO_ATTENTION, Built, finished, implementation_of, runs_on
from headcount.common.device import Device
from headcount.common.naming import DOMAIN, parse_path
from headcount.derive import aggregate, bound
from headcount.derive import steps as step_view
from headcount.parsers import ncu_metrics


def tables_from_ncu(kernels: pd.DataFrame, run_id: str, calls=None, device: Device | None = None) -> Built:
    """Build headcount's tables from ncu kernels (:mod:`headcount.parsers.ncu_csv`,
    :mod:`headcount.parsers.ncu_rep`).

    Kernels whose NVTX stack follows headcount's naming (domain ``headcount``)
    are aggregated into ``layers`` (and ``heads`` in head mode) with measured
    DRAM bytes; ncu has no range instances, so ``ranges`` is empty. With the
    tagger's call log (``headcount run --backend ncu``) the calls, analytic
    FLOPs and minimum bytes are filled in. ``roofline_class`` uses the GPU the
    report's device attributes name, else ``device``. The readers' notices
    (``kernels.attrs["notices"]``) become the build's.
    """
    k = kernels.copy()
    k["implementation"] = "unknown"
    k["bound"] = bound.kernel_bound(k)  # ncu's Speed of Light rule on its own counters
    k["runs_on"] = runs_on(np.ones(len(k), dtype=bool))
    paths = [_headcount_stack(p) for p in k["nvtx_path"]]
    parsed = [parse_path(p) if p else None for p in paths]
    k["phase"] = [p.phase if p else None for p in parsed]
    k["layer_name"] = [p.layer_name if p else None for p in parsed]
    k["layer"] = pd.array([p.layer if p else None for p in parsed], dtype="Int64")
    k["head"] = pd.array([p.head if p else None for p in parsed], dtype="Int64")
    k["kv_head"] = pd.array([pd.NA] * len(k), dtype="Int64")
    with_head = k[k["head"].notna()]
    layers = aggregate.from_kernels(k, aggregate.GROUP_LAYER)
    heads = aggregate.from_kernels(with_head, aggregate.GROUP_HEAD)
    if calls:
        impl = implementation_of(calls)
        layers = aggregate.with_call_totals(layers, calls_frame(calls), impl, heads=False)
        heads = aggregate.with_call_totals(heads, calls_frame(calls), impl, heads=True)
    tables = {"kernels": k, "ranges": pd.DataFrame(), "layers": layers, "heads": heads,
              "steps": step_view.kernel_sum_steps(k, implementation_of(calls) if calls else "unknown")}
    notices = list(kernels.attrs.get("notices", []))
    if len(k) and ("dram_bytes" not in k or not pd.to_numeric(k["dram_bytes"], errors="coerce").notna().any()):
        notices.append("the report has no DRAM byte counters (dram__bytes_read.sum, dram__bytes_write.sum): DRAM bytes and "
                       "bandwidth are null; record them with ncu --section MemoryWorkloadAnalysis (or --set full, or "
                       "--metrics dram__bytes_read.sum,dram__bytes_write.sum)")
    if not len(layers):
        notices.append(f"{NO_ATTENTION} (no kernel in headcount's ranges)")
    return finished(tables, run_id, ncu_metrics.run_device(kernels) or device, calls, notices)


def _headcount_stack(nvtx: str | None) -> str | None:
    """``headcount@fwd/layer.3;other@x`` → ``fwd/layer.3`` (headcount's domain only)."""
    if not isinstance(nvtx, str):
        return None
    for part in nvtx.split(";"):
        domain, _, stack = part.partition("@")
        if domain == DOMAIN:
            return stack
    return None
