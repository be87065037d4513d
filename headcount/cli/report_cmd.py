"""``headcount report OUT``: the HTML page (and the console summary)."""

from __future__ import annotations

import os
from pathlib import Path

from headcount.common.errors import HeadcountError
from headcount.machine import calibrate
from headcount.parsers.files import stored_bytes
from headcount.reports import console as console_report
from headcount.reports import terminal
from headcount.reports.html import load_tables, render
from headcount.reports.progress_view import Steps

REPORT_SHOWN_FROM_BYTES = 64 << 20  # a report folder from this size shows the phases of its page being made


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="write a self-contained HTML page of a report (heatmaps, roofline, comparison)",
                              description="Write one self-contained HTML file (no script, no network) with the implementation "
                              "comparison, the bottlenecks in words, layer × head heatmaps and a roofline, and print the summary.")
    p.add_argument("report", help="report directory")
    p.add_argument("-o", "--output", default=None, help="HTML file to write (default REPORT/report.html)")
    p.add_argument("--ceiling-gbps", type=float, default=None, help="a measured DRAM bandwidth ceiling to draw instead of the datasheet's")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    ceiling, ceiling_device = args.ceiling_gbps, None
    if ceiling is None:  # a calibration stored with the report (headcount calibrate -o REPORT): for runs on that GPU only
        stored = calibrate.load(args.report)
        if stored and str(stored.get("device", "")).startswith("cuda"):
            ceiling, ceiling_device = stored["copy_ceiling_gbps"], stored.get("device_name")
    target = Path(args.output) if args.output else Path(args.report) / "report.html"
    # a big report shows its phases (no bytes to count: DuckDB reads); the three phases are the bar's steps
    big = stored_bytes(Path(args.report)) >= REPORT_SHOWN_FROM_BYTES
    with Steps(terminal.console(stderr=True), 3, "report", "phases", shown_from=0 if big else 4) as steps:
        steps.phase("reading the report's tables")
        tables = load_tables(args.report)
        steps.advance()
        steps.phase("drawing the page")
        page = render(args.report, ceiling, tables, measured_device=ceiling_device)
        steps.advance()
        steps.phase(f"writing {target}")
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(page, encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            raise HeadcountError(f"{target}: cannot write the page ({exc.strerror or exc})", hint="choose a writable path with -o") from exc
        steps.advance()
    console_report.print_summary(tables["layers"], tables["heads"], None, console=terminal.console(), runs=tables["runs"],
                                 ranges=tables["ranges_summary"], steps=tables["steps"], findings=tables["findings"],
                                 collectives=tables.get("collectives"))
    terminal.console().print(f"HTML: {target}")
    return 0
