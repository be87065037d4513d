"""Which ceiling a kernel is up against, from what the hardware measured: Nsight Compute's
own Speed of Light rule, applied to each kernel of a report.

The rule is the one ncu prints in its Speed of Light section (``sections/SpeedOfLight.py``
of Nsight Compute 2024.1, read there): from the SM throughput (``sm__throughput``) and the
memory throughput (``gpu__compute_memory_throughput``), each a percentage of its sustained
peak over the kernel's elapsed time, and the waves of CTAs per SM
(``launch__waves_per_multiprocessor``):

- either figure at :data:`HIGH_PCT` (80 %) or more: ``compute-bound`` or ``memory-bound``,
  whichever unit is the busier;
- both under :data:`LATENCY_PCT` (60 %): ``under-filled`` when the grid fills less than one
  wave (ncu's "Small Grid"), else ``latency-bound`` (ncu's "Latency Issue");
- in between: the busier unit's ``-bound`` where the two differ by :data:`BALANCED_PCT`
  (10 points) or more, else ``balanced``.

A kernel without both figures has no verdict (null), never a guess. The verdict's
provenance is ``measured``: it is read from counters, not from a model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

HIGH_PCT = 80.0
LATENCY_PCT = 60.0
BALANCED_PCT = 10.0
WAVES = 1.0

CLASSES = ("compute-bound", "memory-bound", "balanced", "latency-bound", "under-filled")


def kernel_bound(kernels: pd.DataFrame) -> pd.Series:
    """Each kernel row's verdict (:data:`CLASSES`, null where ``sm_throughput_pct`` or
    ``memory_throughput_pct`` is unknown): see the module docstring."""
    out = pd.Series([None] * len(kernels), index=kernels.index, dtype=object)
    if "sm_throughput_pct" not in kernels or "memory_throughput_pct" not in kernels:
        return out
    sm = pd.to_numeric(kernels["sm_throughput_pct"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    memory = pd.to_numeric(kernels["memory_throughput_pct"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    waves = (pd.to_numeric(kernels["waves_per_sm"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
             if "waves_per_sm" in kernels else np.full(len(kernels), np.nan))
    busier = np.where(sm >= memory, "compute-bound", "memory-bound")
    low = (sm < LATENCY_PCT) & (memory < LATENCY_PCT)
    verdict = np.where((sm >= HIGH_PCT) | (memory >= HIGH_PCT), busier,
                       np.where(low, np.where(waves < WAVES, "under-filled", "latency-bound"),
                                np.where(np.abs(sm - memory) >= BALANCED_PCT, busier, "balanced")))
    known = ~(np.isnan(sm) | np.isnan(memory))
    out[known] = verdict[known]
    return out


def evidence(sm_pct: float, memory_pct: float, dram_pct: float | None = None, waves: float | None = None) -> str:
    """The figures a verdict rests on, in words (percent of each unit's sustained peak, measured)."""
    parts = [f"SM {sm_pct:.3g} %", f"memory {memory_pct:.3g} %"]
    if dram_pct is not None and not np.isnan(dram_pct):
        parts.append(f"DRAM {dram_pct:.3g} %")
    said = ", ".join(parts) + " of peak (measured)"
    if waves is not None and not np.isnan(waves):
        said += f", {waves:.3g} waves per SM"
    return said
