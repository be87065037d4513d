"""``headcount query OUT "SQL"``: DuckDB over a report's tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.table import Table

from headcount.common.tables import TABLES
from headcount.reports import terminal
from headcount.store.query import run_query

EXAMPLES = f"""\
views: {", ".join(TABLES)} (all runs; run_id is a column; a view is there when a run of the report has that table)

examples:
  headcount query out/ "SELECT implementation, layer, head, excess_traffic FROM heads ORDER BY excess_traffic DESC LIMIT 10"
  headcount query out/ "SELECT run_id, layer, avg(bandwidth_gbps) AS gbps FROM layers GROUP BY ALL ORDER BY ALL"
  headcount query out/ "SELECT name, sum(duration_ns)/1e6 AS ms FROM kernels WHERE runs_on = 'gpu' GROUP BY name ORDER BY ms DESC LIMIT 5" --csv top.csv
"""


def add_parser(subparsers):
    import argparse

    p = subparsers.add_parser("query", help="SQL (DuckDB) over a report's tables", epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Run a SQL query with DuckDB over every table of a report; print it, or write CSV or Parquet.")
    p.add_argument("report", help="report directory")
    p.add_argument("sql", help="the query")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--csv", default=None, help="write the result as CSV to this file ('-': stdout)")
    g.add_argument("--parquet", default=None, help="write the result as Parquet to this file")
    g.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON records to this file ('-': stdout)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="rows printed (default 50 in a table, 10 in the vertical layout)")
    p.add_argument("--layout", choices=["auto", "table", "vertical"], default="auto",
                   help=f"how a result is printed: a table, or one block of 'column  value' lines per row; auto "
                        f"(default): vertical for a result of more than {WIDE_COLUMNS} columns (SELECT * of kernels: 73), "
                        "which wraps unreadably as a table")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    table = run_query(args.report, args.sql)
    if args.csv:
        if args.csv == "-":  # standard output, as --json - does
            pacsv.write_csv(table, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return 0
        pacsv.write_csv(table, args.csv)
        terminal.console(stderr=True).print(f"{_rows(table.num_rows)} → {Path(args.csv)}")
        return 0
    if args.parquet:
        pq.write_table(table, args.parquet)
        terminal.console(stderr=True).print(f"{_rows(table.num_rows)} → {Path(args.parquet)}")
        return 0
    if args.json:
        import json

        text = json.dumps(table.to_pylist(), default=_plain, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
            terminal.console(stderr=True).print(f"{_rows(table.num_rows)} → {Path(args.json)}")
        return 0
    vertical = args.layout == "vertical" or (args.layout == "auto" and table.num_columns > WIDE_COLUMNS)
    rows = args.max_rows if args.max_rows is not None else 10 if vertical else 50
    caption = _rows(table.num_rows) + (f", first {rows} shown" if table.num_rows > rows else "")
    console = terminal.console()
    if vertical:
        _print_vertical(console, table, rows, caption)
        return 0
    shown = Table(show_header=True, header_style="bold", caption=caption)
    for name in table.column_names:
        shown.add_column(name, overflow="fold")
    for row in table.slice(0, rows).to_pylist():
        shown.add_row(*(_cell(v) for v in row.values()))
    console.print(shown)
    return 0


WIDE_COLUMNS = 12  # more columns than this print one block per row (--layout auto)


def _cell(value) -> str:
    return "" if value is None else f"{value:,.4g}" if isinstance(value, float) else str(value)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _print_vertical(console, table, rows: int, caption: str) -> None:
    """One block per row: a ``── row N ──`` rule, then ``column  value`` lines (nulls left out and counted), as
    psql's expanded display; for results too wide to read as a table."""
    width = max(map(len, table.column_names), default=0)
    for n, row in enumerate(table.slice(0, rows).to_pylist(), 1):
        console.print(f"── row {n} " + "─" * max(0, min(console.width, 80) - len(f"── row {n} ")), style="dim", highlight=False)
        nulls = [name for name, value in row.items() if value is None]
        for name, value in row.items():
            if value is not None:
                console.print(f"{name:<{width}}  {_cell(value)}", highlight=False, markup=False, soft_wrap=True)
        if nulls:
            console.print(f"{'(null)':<{width}}  {len(nulls)} columns: {', '.join(nulls)}", style="dim", highlight=False,
                          markup=False)
    console.print(caption + f"; {table.num_columns} columns, one block per row (--layout table: a table)", style="dim",
                  highlight=False)


def _plain(value):
    """A JSON value for what json cannot write: DuckDB's HUGEINT sums come as Decimal, times as datetime."""
    from decimal import Decimal

    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
