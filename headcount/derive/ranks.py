"""The ranks of one report side by side: each rank's step time, the skew between ranks and the straggler
(docs/reading-a-report.md § Ranks).

Tables in (``steps`` and ``runs`` of a report holding one run per rank: ``headcount parse`` of each rank's
trace, ``headcount run`` of a launcher), a table and a verdict out; no I/O. Steps are matched by their
number (torch.profiler's ``ProfilerStep#N`` counts the same on every rank).

- **step time** of a rank: its step's GPU window (the longest of its devices'), ns;
- **skew** of a step: the longest rank's step time less the shortest's;
- **straggler**: in a collective every rank waits for the last to arrive, so the rank that arrives last
  spends the least time inside its communication kernels. The rank whose communication time is the least
  in at least :data:`STRAGGLER_SHARE` of the steps seen on every rank (and at least :data:`MIN_STEPS` of
  them) is named, with its communication time against the other ranks' median; the rule of Holistic Trace
  Analysis' ``get_potential_stragglers``, on whole steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_STEPS = 2
STRAGGLER_SHARE = 0.75

COLUMNS = ["rank", "step", "run_id", "step_ns", "gpu_busy_ns", "communication_ns", "communication_exposed_ns"]


def rank_steps(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per rank × step (:data:`COLUMNS`); empty unless the report holds two ranks or more."""
    if steps is None or runs is None or not len(steps) or not len(runs) or "rank" not in runs:
        return pd.DataFrame(columns=COLUMNS)
    rank_of = runs.dropna(subset=["rank"]).drop_duplicates("run_id").set_index("run_id")["rank"]
    rows = steps[(steps["basis"] == "gpu_window").to_numpy() & steps["step"].notna().to_numpy()].copy()
    rows["rank"] = rows["run_id"].map(rank_of)
    rows = rows.dropna(subset=["rank"])
    if rows["rank"].nunique() < 2:
        return pd.DataFrame(columns=COLUMNS)
    has = {c: c in rows for c in ("communication_ns", "communication_exposed_ns")}
    out = rows.groupby(["rank", "step"], sort=True).agg(
        run_id=("run_id", "first"), step_ns=("window_ns", "max"), gpu_busy_ns=("gpu_busy_ns", "sum"),
        **({"communication_ns": ("communication_ns", "sum")} if has["communication_ns"] else {}),
        **({"communication_exposed_ns": ("communication_exposed_ns", "sum")} if has["communication_exposed_ns"] else {}),
    ).reset_index()
    out["rank"] = out["rank"].astype("int64")
    return out.reindex(columns=COLUMNS)


def skew_and_straggler(per_rank: pd.DataFrame) -> dict:
    """``steps`` (those every rank has), ``skew_p50_ns``/``skew_max_ns`` over them, per-rank median step time
    (``step_ns``, rank → ns), and ``straggler`` (a rank, or ``None``) with its ``evidence`` (module docstring)."""
    if not len(per_rank):
        return {"steps": 0, "straggler": None, "evidence": "fewer than two ranks in the report"}
    ranks = sorted(per_rank["rank"].unique())
    common = per_rank.groupby("step")["rank"].nunique()
    common = common[common == len(ranks)].index
    rows = per_rank[per_rank["step"].isin(common)]
    if not len(rows):
        return {"steps": 0, "straggler": None, "evidence": "no step number is on every rank"}
    times = rows.pivot(index="step", columns="rank", values="step_ns")
    skew = times.max(axis=1) - times.min(axis=1)
    out = {"steps": len(times), "ranks": ranks, "skew_p50_ns": float(skew.median()), "skew_max_ns": float(skew.max()),
           "step_ns": {int(r): float(times[r].median()) for r in times.columns}, "straggler": None}
    comm = rows.pivot(index="step", columns="rank", values="communication_ns")
    if comm.isna().all().all() or not (comm.fillna(0) > 0).any().any():
        out["evidence"] = "no communication kernel in the steps: no straggler rule (ranks that do not communicate do not wait)"
        return out
    least = comm.idxmin(axis=1)
    counts = least.value_counts()
    top, seen = int(counts.index[0]), int(counts.iloc[0])
    if len(times) < MIN_STEPS or seen < STRAGGLER_SHARE * len(times):
        tied = int((counts == seen).sum())
        most = (f"{tied} ranks tie at {seen} step{'s' if seen > 1 else ''} each" if tied > 1
                else f"rank {top} in {seen}")
        out["evidence"] = (f"no rank had the least communication time in at least {int(STRAGGLER_SHARE * 100)} % of the "
                           f"{len(times)} steps every rank has; {most}")
        return out
    mine = float(comm[top].median())
    others = float(np.nanmedian(comm.drop(columns=[top]).to_numpy()))
    out["straggler"] = top
    out["evidence"] = (f"rank {top} spends the least time in communication kernels in {seen} of {len(times)} steps "
                       f"(median {mine / 1e6:.3g} ms against {others / 1e6:.3g} ms on the other ranks): the others wait for "
                       f"it inside their collectives; step time {out['step_ns'][top] / 1e6:.3g} ms (median), skew between "
                       f"ranks {out['skew_p50_ns'] / 1e6:.3g} ms (median), {out['skew_max_ns'] / 1e6:.3g} ms (largest); measured")
    return out
