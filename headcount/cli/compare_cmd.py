"""``headcount compare OUT [OUT2 …]``: attention implementations side by side."""

from __future__ import annotations

import argparse

import pandas as pd
from rich.table import Table

from headcount.reports import terminal
from headcount.reports.compare import comparison
from headcount.store.query import connect


def add_parser(subparsers):
    p = subparsers.add_parser(
        "compare", help="compare attention implementations across runs and reports",
        description="Per run and attention implementation: attention time per step, kernels per call, launch latency "
        "and CPU launch cost, DRAM bytes, bandwidth, FLOP/byte, memory- or compute-bound, speed-up vs a baseline.",
        epilog="example: headcount compare out-a100/ out-h100/ --baseline eager", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="report directories")
    p.add_argument("--baseline", default=None, help="implementation to compare against (default eager, else the first)")
    p.add_argument("--csv", default=None, help="also write the table as CSV")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON records ('-': to stdout, instead of the table)")
    p.set_defaults(func=run)
    return p


def _fmt(v, spec):
    return "–" if v is None or pd.isna(v) else format(v, spec)


def run(args) -> int:
    layers, runs = [], []
    for out in args.reports:
        con = connect(out)
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        if "layers" in views:
            layers.append(con.sql("SELECT * FROM layers").df())
        if "runs" in views:
            runs.append(con.sql("SELECT * FROM runs").df())
    table, notes = comparison(pd.concat(layers, ignore_index=True) if layers else pd.DataFrame(),
                              pd.concat(runs, ignore_index=True) if runs else pd.DataFrame(), args.baseline)
    shown = Table(title="Attention implementations",
                  caption="per step where steps are known; bytes provenance as given; speed-up within a run, or against a "
                          "comparable run (same model config, shapes, dtype, mode) named in 'against run'; vs uncompiled: a torch.compile run "
                          "against the same implementation uncompiled in a comparable run")
    cols = [("run", "run_id", "s"), ("impl", "implementation", "s"), ("compile", "compile_mode", "s"), ("source", "source", "s"), ("ms/step", "attention_ms_per_step", ",.3f"),
            ("calls", "calls_per_step", ",.0f"), ("kernels/call", "kernels_per_call", ",.1f"),
            ("launch µs/call", "cpu_launch_cost_us_per_call", ",.1f"), ("latency p50 µs", "launch_latency_p50_us", ",.1f"),
            ("MB/step", "dram_mb_per_step", ",.2f"), ("bytes", "dram_bytes_provenance", "s"), ("GB/s", "bandwidth_gbps", ",.1f"),
            ("FLOP/B", "flop_per_byte", ",.1f"), ("bound", "bound", "s"), ("speed-up", "speedup", ",.2f"),
            ("against run", "baseline_run", "s"), ("vs uncompiled", "speedup_vs_uncompiled", ",.2f")]
    for label, _, _ in cols:
        shown.add_column(label, justify="left" if label in ("run", "impl", "compile", "source", "bytes", "bound", "against run") else "right")
    for row in table.to_dict("records"):
        shown.add_row(*(_fmt(row[c], spec) if spec != "s" else ("–" if row[c] is None or pd.isna(row[c]) else str(row[c]))
                        for _, c, spec in cols))
    if args.json == "-":
        print(_json(table, notes))
        return 0
    console = terminal.console(width=max(terminal.console().width, 200))  # a wide table: do not squeeze it into 80 columns
    console.print(shown)
    for note in notes:
        console.print(f"note: {note}")
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(_json(table, notes) + "\n")
    return 0


def _json(table: pd.DataFrame, notes: list[str]) -> str:
    """The comparison as JSON: ``{"rows": [...], "notes": [...]}`` (missing values as null)."""
    import json

    rows = json.loads(table.to_json(orient="records", date_format="iso"))
    return json.dumps({"rows": rows, "notes": list(notes)}, indent=1)
