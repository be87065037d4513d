"""The implementation comparison (``headcount compare``): per run and
attention implementation, what attention costs — from any mix of sources.

Tables in, a table and notes out. Times are per step where steps are known
(``steps``), else per profile. ``speedup_vs_uncompiled`` (a run under
``torch.compile``): the same implementation's attention time in a comparable
uncompiled run over the row's. ``speedup`` is the baseline implementation's
attention time over the row's:

- within the row's own run when that run profiled the baseline;
- else against the baseline of another run only when the two are
  comparable — the same model config, batch, sequence length, dtype and
  mode, all known (``baseline_run`` names that run, and a note says so;
  devices may differ, which is the point of comparing two GPUs);
- else empty, with a note. Never against a run of another model or mode, and within a run only
  between implementations that ran the same layers with the same shapes (a pipeline's text encoder
  and transformer are different work). ``unknown`` is never the baseline; a baseline row that no
  other row was compared with has no speed-up (not 1.00× against itself).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.derive.aggregate import attention_per_step, work_signature

COLUMNS = [
    "run_id", "implementation", "compile_mode", "source", "device", "dtype", "batch", "seq", "duration_basis",
    "attention_ms_per_step", "calls_per_step", "kernels_per_call", "cpu_launch_cost_us_per_call", "launch_latency_p50_us",
    "dram_mb_per_step", "dram_bytes_provenance", "bandwidth_gbps", "flop_per_byte", "bound", "speedup", "baseline_run",
    "speedup_vs_uncompiled", "model",
]
# what two runs must share (all known) before a speed-up may compare them
COMPARABLE = ("model_config", "batch", "seq", "dtype", "mode")
_SHAPE_KEYS = {"device": "device", "dtype": "dtype", "batch": "batch size", "seq": "sequence length", "model": "model"}


def _sum(g: pd.DataFrame, col: str) -> float:
    return float(g[col].sum(min_count=1)) if col in g else np.nan


def comparable(a: dict, b: dict) -> bool:
    """Two runs may be compared: model config, batch, sequence length, dtype and mode known and equal."""
    for key in COMPARABLE:
        x, y = a.get(key), b.get(key)
        if x is None or y is None or pd.isna(x) or pd.isna(y) or str(x) != str(y):
            return False
    return True


def _vs_uncompiled(row: dict, table: pd.DataFrame) -> float:
    """A compiled row's speed-up over the same implementation uncompiled, in a
    comparable run (attention time per step, theirs over its); NaN otherwise."""
    if row.get("compile_mode") is None or pd.isna(row.get("compile_mode")):
        return np.nan
    plain = table[(table["implementation"] == row["implementation"]) & table["compile_mode"].isna()]
    plain = plain[[comparable(row, other) for other in plain.to_dict("records")]]
    if not len(plain) or not row["attention_ms_per_step"]:
        return np.nan
    return float(plain["attention_ms_per_step"].iloc[0] / row["attention_ms_per_step"])


def _speedups(table: pd.DataFrame, base_impl: str | None, said: list[tuple[str, str | None, str]]) -> tuple[list, list]:
    """Each row's speed-up over the baseline implementation and the run it was taken from (module docstring);
    what is not compared goes to ``said`` as ``(run id, implementation, note)`` (:func:`grouped`)."""
    speedups, against = [], []
    for row in table.to_dict("records"):
        base_rows = table[table["implementation"] == base_impl]
        same = base_rows[base_rows["run_id"] == row["run_id"]]
        different = bool(len(same)) and row["implementation"] != base_impl and same["_work"].iloc[0] != row["_work"]
        if different:
            said.append((row["run_id"], row["implementation"], f"it and {base_impl} ran different work (other layers "
                                                                        "or shapes: e.g. two models of one pipeline): no speed-up between them"))
            same = same.iloc[:0]
        elif not len(same):
            same = base_rows[[comparable(row, other) for other in base_rows.to_dict("records")]]
            if len(same) and row["implementation"] != base_impl:
                said.append((row["run_id"], None, f"no {base_impl} in the run: its {row['implementation']} speed-up is against run "
                                            f"{same['run_id'].iloc[0]} (same model config, batch, sequence length, dtype and mode)"))
            elif len(base_rows) and row["implementation"] != base_impl:
                said.append((row["run_id"], row["implementation"], f"no speed-up to compute — the run has no {base_impl} "
                                                                            f"and no run with {base_impl} matches its model config, "
                                                                            "batch, sequence length, dtype and mode"))
        base = same["attention_ms_per_step"].iloc[0] if len(same) else np.nan
        speedups.append(base / row["attention_ms_per_step"] if row["attention_ms_per_step"] else np.nan)
        against.append(same["run_id"].iloc[0] if len(same) else None)
    return speedups, against


def grouped(said: list[tuple[object, str | None, str]], shown: int = 4) -> list[str]:
    """One line per note said of runs (``(run id, implementation or None, note)``), in the order first said:
    ``run <id> (<impl>): <note>`` for one run, ``7 runs: <note> (runs <id> (vllm), <id> (sdpa, eager), … 3 more)``
    for a note several runs share word for word, not one paragraph per run."""
    notes: dict[str, dict] = {}
    for run_id, implementation, text in said:
        impls = notes.setdefault(text, {}).setdefault(run_id, [])
        if implementation is not None and implementation not in impls:
            impls.append(implementation)
    lines = []
    for text, runs in notes.items():
        named = [f"{run_id} ({', '.join(map(str, impls))})" if impls else str(run_id) for run_id, impls in runs.items()]
        if len(named) == 1:
            lines.append(f"run {named[0]}: {text}")
        else:
            listed = ", ".join(named[:shown]) + (f", … {len(named) - shown} more" if len(named) > shown else "")
            lines.append(f"{len(named)} runs: {text} (runs {listed})")
    return lines


def comparison(layers: pd.DataFrame, runs: pd.DataFrame, baseline: str | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per run × implementation, and notes on what is not comparable.

    Args:
        layers: the ``layers`` table of one or more reports.
        runs: their ``runs`` table.
        baseline: implementation the speed-up is measured against (default:
            eager when present, else the first).
    """
    rows = []
    info = runs.drop_duplicates(["run_id", "implementation"]).set_index(["run_id", "implementation"]) if len(runs) else None
    per_step = attention_per_step(layers).set_index(["run_id", "implementation"])
    for (run_id, impl), g in layers.groupby(["run_id", "implementation"], sort=True):
        steps = per_step.loc[(run_id, impl), "steps"]
        calls = _sum(g, "calls")
        duration = _sum(g, "duration_ns")
        dram = _sum(g, "dram_bytes")
        meta = {}
        if info is not None:
            key = (run_id, impl) if (run_id, impl) in info.index else next((k for k in info.index if k[0] == run_id), None)
            if key is not None:
                r = info.loc[key]
                meta = {"source": r.get("source"), "device": r.get("device_name"), "dtype": r.get("dtype"), "batch": r.get("batch"),
                        "seq": r.get("seq"), "model": r.get("model"), "model_config": r.get("model_config"), "mode": r.get("mode"),
                        "compile_mode": r.get("compile_mode")}
        bound = g["roofline_class"].dropna().mode() if "roofline_class" in g else pd.Series(dtype=object)
        rows.append({
            "run_id": run_id, "implementation": impl, **meta, "duration_basis": g["duration_basis"].iloc[0], "_work": work_signature(g),
            "attention_ms_per_step": per_step.loc[(run_id, impl), "attention_ns_per_step"] / 1e6,
            "calls_per_step": per_step.loc[(run_id, impl), "calls_per_step"],
            "kernels_per_call": _sum(g, "kernel_count") / calls if calls else np.nan,
            "cpu_launch_cost_us_per_call": _sum(g, "cpu_launch_cost_ns") / calls / 1e3 if calls else np.nan,
            "launch_latency_p50_us": float(pd.to_numeric(g["launch_latency_p50_ns"], errors="coerce").astype("float64").median()) / 1e3
            if "launch_latency_p50_ns" in g else np.nan,
            "dram_mb_per_step": dram / steps / 1e6, "dram_bytes_provenance": "/".join(sorted(set(g["dram_bytes_provenance"].dropna()))) or None,
            "bandwidth_gbps": dram / duration if duration else np.nan,
            "flop_per_byte": _sum(g, "flop") / dram if dram else np.nan,
            "bound": bound.iloc[0] if len(bound) else None,
        })
    table = pd.DataFrame(rows).reindex(columns=[*COLUMNS, *(c for c in COMPARABLE if c not in COLUMNS), "_work"])
    if not len(table):
        return table[COLUMNS], ["no layer rows to compare"]
    known = table[table["implementation"].astype(str) != "unknown"]
    base_impl = baseline or ("eager" if (table["implementation"] == "eager").any()
                             else known["implementation"].iloc[0] if len(known) else None)
    notes = []
    if base_impl is None:
        notes.append("no implementation is known (attention found by names only: implementation unknown): no baseline, no speed-up")
    elif not (table["implementation"] == base_impl).any():
        notes.append(f"baseline {base_impl} is in no run: no speed-up")
    said: list[tuple[str, str | None, str]] = []
    speedups, against = _speedups(table, base_impl, said)
    notes += grouped(said)
    table["speedup"] = speedups
    table["baseline_run"] = against
    # a baseline row that no other row was compared with is a run against itself: no figure
    used = {(r, base_impl) for r, impl, s in zip(against, table["implementation"], speedups)
            if r is not None and impl != base_impl and pd.notna(s)}
    alone = (table["implementation"] == base_impl) & ~pd.Series([(r, base_impl) in used for r in table["run_id"]], index=table.index)
    table.loc[alone, "speedup"] = np.nan
    table.loc[alone, "baseline_run"] = None
    table = table.drop(columns=["_work"])
    for key, label in _SHAPE_KEYS.items():
        values = sorted({str(v) for v in table[key] if not pd.isna(v)})
        if len(values) > 1:
            notes.append(f"not comparable as they stand: the runs differ in {label} ({', '.join(values)})")
    table["speedup_vs_uncompiled"] = [_vs_uncompiled(row, table) for row in table.to_dict("records")]
    if table["compile_mode"].notna().any() and table["speedup_vs_uncompiled"].isna().all():
        notes.append("compiled runs have no comparable uncompiled run (same implementation, model config, batch, sequence "
                     "length, dtype and mode): profile both, e.g. headcount profile --compile none,default")
    if table["mode"].nunique() > 1:
        notes.append("runs differ in mode (layer, head): head mode measures a different workload (one head at a time)")
    if table["duration_basis"].nunique() > 1:
        notes.append("times differ in basis (" + ", ".join(sorted(table["duration_basis"].dropna().unique())) +
                      "): ncu's kernel sums leave out launch gaps, CPU ranges include the CPU's work")
    return table[COLUMNS], list(dict.fromkeys(notes))
