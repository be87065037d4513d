"""The ``headcount`` command line.

Errors a user can cause are printed as one line (``headcount: error: …``)
with a non-zero exit status; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from headcount._version import __version__
from headcount.cli import calibrate_cmd, compare_cmd, doctor_cmd, parse_cmd, profile_cmd, query_cmd, report_cmd, run_cmd
from headcount.errors import HeadcountError

EXAMPLES = """\
examples:
  headcount profile                      profile the embedded default model (eager vs sdpa)
  headcount profile --mode head          measure every attention head on its own
  headcount profile --help               all options of the profile command
  headcount parse run.sqlite -o report/  an existing nsys SQLite export into the same tables
  headcount run --backend nsys -o out/ -- python train.py   any script, tagged without code changes
  headcount report headcount-report             an HTML page: heatmaps, roofline, comparison, bottlenecks
  headcount compare headcount-report            eager vs sdpa (vs flash…): time, kernels, launch cost, bytes
  headcount query headcount-report "SELECT * FROM layers ORDER BY duration_ns DESC LIMIT 5"
  headcount doctor                       what works here: GPU, driver, CUPTI, counters, nsys/ncu
  headcount profile --backend cupti      in-process CUPTI on an NVIDIA GPU (launch latency, occupancy, DRAM samples)

Read the report:
  python -c "import pandas as pd; print(pd.read_parquet('headcount-report/layers'))"
  duckdb -c "SELECT * FROM read_parquet('headcount-report/heads/**/*.parquet', hive_partitioning=true)"
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headcount",
        description="Measure what attention costs, per transformer layer and per head, and write it as Parquet.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"headcount {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    profile_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    parse_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    compare_cmd.add_parser(sub)
    query_cmd.add_parser(sub)
    calibrate_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from headcount.env import release_freed_memory

    release_freed_memory()  # large tables are built and freed in turn: give freed memory back at once
    try:
        return args.func(args)
    except HeadcountError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"headcount: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("headcount: interrupted; no report was written", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
