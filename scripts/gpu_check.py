"""Physics checks on a report written by scripts/gpu_check.sh.

Prints each check and its figures; exits 1 if any fails. On a CPU dry run the
GPU-only checks are reported as skipped.
"""

from __future__ import annotations

import sys

import pandas as pd


def main(report: str) -> int:
    layers = pd.read_parquet(f"{report}/layers")
    heads = pd.read_parquet(f"{report}/heads")
    ranges = pd.read_parquet(f"{report}/ranges")
    runs = pd.read_parquet(f"{report}/runs")
    on_gpu = (runs["device_kind"] == "cuda").all()
    failures = []

    def check(name: str, ok: bool, detail: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            failures.append(name)

    print(f"device: {runs['device_name'].iloc[0]} ({runs['device_kind'].iloc[0]}); runs: {runs['run_id'].nunique()}")
    attention = ranges[ranges["level"].isin(["layer", "head"])]
    basis = set(attention["duration_basis"])
    if on_gpu:
        check("durations are GPU-projected", basis == {"gpu_projected"}, str(basis))
        empty = attention[attention["gpu_op_count"].fillna(0) == 0]
        check("every layer/head range launched kernels", empty.empty, f"{len(empty)} of {len(attention)} ranges without kernels")
        # analytic minimum bytes over measured time can never exceed the device's peak (~3.35 TB/s H100, 4.8 TB/s H200)
        peak = layers["bandwidth_gbps"].max()
        check("analytic bandwidth below 5,000 GB/s", peak < 5000, f"max {peak:,.0f} GB/s")
    else:
        print(f"skip GPU-only checks (device_kind={runs['device_kind'].iloc[0]})")
    measured = heads[heads["provenance"] == "measured"]
    if len(measured):
        merged = layers.dropna(subset=["heads_duration_ns"])
        ratio = (merged["heads_duration_ns"] / merged["duration_ns"]).describe()
        check("heads fit inside their layer", (merged["heads_duration_ns"] <= merged["duration_ns"] * 1.0001).all(),
              f"sum(heads)/layer: min {ratio['min']:.3f}, mean {ratio['mean']:.3f}, max {ratio['max']:.3f}")
    for (impl, phase), g in layers.groupby(["implementation", "phase"]):
        print(f"     {impl:18s} {phase:4s} {g['duration_per_call_ns'].mean() / 1e3:10.1f} µs/call  "
              f"{g['bandwidth_gbps'].mean():8.1f} GB/s (analytic bytes)  {g['intensity_flop_per_byte'].mean():7.1f} FLOP/B")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
