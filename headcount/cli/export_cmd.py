"""``headcount export REPORT --format trace``: a report's runs as trace-event JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """\
examples:
  headcount export headcount-report --format trace                 REPORT/traces/<run id>/trace.json, every run
  headcount export out/ --format trace --run 20261203T101500Z-ab12cd -o traces/
then open a trace.json in https://ui.perfetto.dev or chrome://tracing, or in Holistic Trace Analysis:
  python -c "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir='traces/<run id>')"
"""


def add_parser(subparsers):
    p = subparsers.add_parser("export", help="write a report's runs as Chrome/Perfetto trace-event JSON (timeline)",
                              description="Write each run of a report as trace-event JSON in torch.profiler's layout: "
                              "NVTX layer/head ranges and CPU operators per thread, kernels per GPU stream, launch→kernel "
                              "arrows. Opens in Perfetto UI and chrome://tracing; loads in Holistic Trace Analysis.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="report directory")
    p.add_argument("--format", choices=("trace",), default="trace", help="trace: Chrome trace-event JSON (the only format so far)")
    p.add_argument("-o", "--output", default=None, help="directory for the traces (default REPORT/traces/); one folder per run")
    p.add_argument("--run", action="append", default=None, metavar="RUN_ID", help="only this run (repeatable; default every run)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from headcount.reports import terminal
    from headcount.reports.trace_export import export_traces

    out = Path(args.output) if args.output else Path(args.report) / "traces"
    err = terminal.console(stderr=True)
    written, skipped = export_traces(args.report, out, args.run, console=err)
    for line in skipped:
        err.print(f"headcount: skipped {line}")
    for path in written:
        terminal.console().print(str(path))
    return 0
