"""The console summary printed at the end of ``headcount profile``.

Reads the tables; prints with rich. Units are in the headers.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table


def _fmt(value, spec: str = ",.0f") -> str:
    if value is None or pd.isna(value):
        return "–"
    return format(value, spec)


def implementation_summary(layers: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and phase: attention time per step (ns), calls per step,
    analytic FLOPs and bytes per step, operators/kernels per call."""
    steps = layers["steps"].fillna(1).clip(lower=1)
    if _has_kernels(layers):  # GPU sources: kernels per call, not CPU operators
        layers = layers.assign(op_count=layers["kernel_count"])
    per_step = layers.assign(
        duration_step=layers["duration_ns"] / steps,
        calls_step=layers["calls"] / steps,
        flop_step=layers["flop"] / steps,
        bytes_step=layers["dram_bytes"] / steps,
    )
    out = per_step.groupby(["implementation", "phase"], sort=True).agg(
        attention_ns_per_step=("duration_step", "sum"),
        calls_per_step=("calls_step", "sum"),
        flop_per_step=("flop_step", "sum"),
        dram_bytes_per_step=("bytes_step", "sum"),
        ops=("op_count", "sum"),
        calls=("calls", "sum"),
        basis=("duration_basis", "first"),
        bytes_provenance=("dram_bytes_provenance", "first"),
    ).reset_index()
    out["ops_per_call"] = out["ops"] / out["calls"]
    return out.drop(columns=["ops", "calls"])


def _has_kernels(layers: pd.DataFrame) -> bool:
    return "kernel_count" in layers and layers["kernel_count"].notna().any()


def _launch_table(layers: pd.DataFrame, kernels: pd.DataFrame) -> Table:
    from headcount.derive.launch import summary

    t = Table(title="Launching attention (per layer call)",
              caption="latency: kernel start − launch call start; gaps: GPU idle between a call's kernels; occupancy: theoretical")
    for col in ("impl", "phase", "kernels", "launch cost µs", "gaps µs", "GPU µs", "latency p50 µs", "p99 µs", "occupancy %"):
        t.add_column(col, justify="left" if col in ("impl", "phase") else "right")
    occ = layers.groupby(["implementation", "phase"])["theoretical_occupancy_pct"].mean() if "theoretical_occupancy_pct" in layers else {}
    for r in summary(layers, kernels).itertuples(index=False):
        t.add_row(r.implementation, r.phase, _fmt(r.kernels_per_call, ",.1f"), _fmt(r.cpu_launch_cost_per_call_ns / 1e3, ",.1f"),
                  _fmt(r.kernel_gap_per_call_ns / 1e3, ",.1f"), _fmt(r.gpu_time_per_call_ns / 1e3, ",.1f"),
                  _fmt(r.launch_latency_p50_ns / 1e3, ",.1f"), _fmt(r.launch_latency_p99_ns / 1e3, ",.1f"),
                  _fmt(occ.get((r.implementation, r.phase)) if len(occ) else None, ",.1f"))
    return t


def _provenance_caption(frame: pd.DataFrame) -> str:
    basis = ", ".join(sorted(frame["duration_basis"].dropna().unique())) or "–"
    return (f"time: {basis} ({'/'.join(sorted(frame['duration_provenance'].dropna().unique())) or '–'}); "
            f"bytes: {'/'.join(sorted(frame['dram_bytes_provenance'].dropna().unique())) or '–'}; FLOP: analytic")


def print_summary(layers: pd.DataFrame, heads: pd.DataFrame, out_dir, console: Console | None = None, top: int = 5,
                  kernels: pd.DataFrame | None = None) -> None:
    """Print the per-implementation comparison, what launching costs (GPU
    sources, given ``kernels``), the costliest layers (or heads, when they
    were measured), and where the report is."""
    console = console or Console()
    summary = implementation_summary(layers)
    table = Table(title="Attention per step", caption=_provenance_caption(layers))
    for col in ("impl", "phase", "ms", "calls", "kernels/call" if _has_kernels(layers) else "ops/call", "GFLOP", "MB", "GB/s"):
        table.add_column(col, justify="left" if col in ("impl", "phase") else "right")
    for row in summary.itertuples(index=False):
        gbps = row.dram_bytes_per_step / row.attention_ns_per_step if row.attention_ns_per_step else None
        table.add_row(
            row.implementation, row.phase, _fmt(row.attention_ns_per_step / 1e6, ",.2f"), _fmt(row.calls_per_step, ",.0f"),
            _fmt(row.ops_per_call, ",.1f"), _fmt(row.flop_per_step / 1e9, ",.3f"), _fmt(row.dram_bytes_per_step / 1e6, ",.2f"),
            _fmt(gbps, ",.2f"),
        )
    console.print(table)
    if kernels is not None and _has_kernels(layers):
        console.print(_launch_table(layers, kernels))

    measured_heads = heads[heads["provenance"] == "measured"] if len(heads) else heads
    rows, what = (measured_heads, "heads") if len(measured_heads) else (layers, "layers")
    t = Table(title=f"Top {top} {what} by time per call", caption=_provenance_caption(rows))
    for col in ("impl", "phase", "layer", *(("head", "kv") if what == "heads" else ()), "µs/call", "GB/s", "FLOP/B"):
        t.add_column(col, justify="left" if col in ("impl", "phase", "layer") else "right")
    for r in rows.sort_values("duration_per_call_ns", ascending=False).head(top).itertuples(index=False):
        cells = [r.implementation, r.phase, str(r.layer_name)]
        if what == "heads":
            cells += [_fmt(r.head, "d"), _fmt(r.kv_head, "d")]
        cells += [_fmt(r.duration_per_call_ns / 1e3, ",.1f"), _fmt(r.bandwidth_gbps, ",.2f"), _fmt(r.intensity_flop_per_byte, ",.1f")]
        t.add_row(*cells)
    console.print(t)
    if out_dir is not None:
        console.print(f"Report: {out_dir}/ (Parquet datasets kernels, ranges, layers, heads, runs)")
