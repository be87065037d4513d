"""Inductor's own estimates of the Triton kernels it generates: ``kernel_flop`` and ``kernel_num_gb``
(``torch/_inductor/runtime/triton_heuristics.py``: written into the profiler's operator around each
launch when Inductor computes them — ``config.benchmark_kernel`` or ``config.profile_bandwidth`` — or
onto the kernel by ``python -m torch._inductor.analysis.profile_analysis --augment_trace``).

They are estimates, not measurements: Inductor's count of the FLOPs of the kernel's code and of the
bytes its loads and stores touch once (a minimum, like headcount's analytic bytes for attention), with
provenance :data:`PROVENANCE`. headcount's analytic figures for attention stay as they are; these fill
the kernels table's ``estimated_flop`` and ``estimated_min_bytes`` where Inductor gave them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PROVENANCE = "inductor estimate"


def with_kernel_estimates(events: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """``events`` (:func:`headcount.parsers.kineto_json.events_frame`) with ``estimated_flop``,
    ``estimated_min_bytes`` (bytes) and ``estimate_provenance`` on each kernel that carries Inductor's
    estimates or whose launching operator does (by Kineto's ``External id``), and the notice for the
    estimates left out; null elsewhere, and the events unchanged where the trace has no estimate.

    An estimate is the whole operator's: a kernel gets it only as its operator's one kernel (a Triton
    launch is one). The kernels of an operator that launched several (an augmented trace gives each of
    them the operator's whole figure) get null, counted in the notice. Inductor's 0 means "not
    estimated": null, not a zero.
    """
    if "estimated_flop" not in events or not (events["estimated_flop"].notna().any() or events["estimated_num_gb"].notna().any()):
        return events, None
    kind = events["kind"].to_numpy(object)
    flop = pd.to_numeric(events["estimated_flop"]).astype("Float64")
    num_gb = pd.to_numeric(events["estimated_num_gb"]).astype("Float64")
    ref = pd.array(events["external_ref"], dtype="Int64")
    ops = (kind == "op") & (flop.notna() | num_gb.notna()).to_numpy(dtype=bool) & ~pd.isna(ref)
    kernels = kind == "kernel"
    # an operator's estimates by its External id; an id two operators share (not expected) names neither
    by_ref = pd.DataFrame({"ref": ref[ops], "flop": flop[ops].to_numpy(), "num_gb": num_gb[ops].to_numpy()})
    by_ref = by_ref.drop_duplicates("ref", keep=False).set_index("ref")
    mine = pd.Series(ref[kernels])
    own_flop, own_gb = flop[kernels].reset_index(drop=True), num_gb[kernels].reset_index(drop=True)
    kernel_flop = own_flop.fillna(pd.Series(mine.map(by_ref["flop"]).to_numpy(), dtype="Float64"))
    kernel_gb = own_gb.fillna(pd.Series(mine.map(by_ref["num_gb"]).to_numpy(), dtype="Float64"))
    given = (kernel_flop.notna() | kernel_gb.notna()).to_numpy(dtype=bool)
    siblings = mine.map(mine.value_counts()).to_numpy(np.float64, na_value=1.0)  # kernels launched under the same operator
    shared = given & (siblings > 1)
    estimated_flop = np.full(len(events), np.nan)
    estimated_bytes = np.full(len(events), np.nan)
    rows = np.flatnonzero(kernels)
    sole = ~shared
    estimated_flop[rows[sole]] = kernel_flop.where(kernel_flop > 0).to_numpy(np.float64, na_value=np.nan)[sole]
    estimated_bytes[rows[sole]] = (kernel_gb.where(kernel_gb > 0) * 1e9).to_numpy(np.float64, na_value=np.nan)[sole]
    out = events.copy(deep=False)
    out["estimated_flop"] = estimated_flop
    out["estimated_min_bytes"] = estimated_bytes
    has = ~(np.isnan(estimated_flop) & np.isnan(estimated_bytes))
    out["estimate_provenance"] = np.where(has, PROVENANCE, None)
    notice = None
    if shared.any():
        operators = int(pd.Series(mine[shared]).nunique())
        notice = (f"{int(shared.sum())} kernels of {operators} operator{'s' if operators != 1 else ''} that launched several kernels "
                  "each carry their operator's "
                  "whole FLOP/byte estimate (Inductor's or an augmented trace's): not given to any one of them (null)")
    return out, notice
