"""The ``headcount`` command line.

Errors a user can cause are printed as one line (``headcount: error: …``)
with a non-zero exit status; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from importlib import import_module

from headcount._version import __version__
from headcount.common import stopping
from headcount.common.errors import HeadcountError

# subcommand → its module under headcount.cli; only the one that runs is imported (pandas, pyarrow, torch are
# imported by the commands that need them, so `--version` and `query` do not wait for torch)
COMMANDS = {"profile": "profile_cmd", "run": "run_cmd", "parse": "parse_cmd", "report": "report_cmd",
            "compare": "compare_cmd", "diff": "diff_cmd", "query": "query_cmd", "export": "export_cmd", "calibrate": "calibrate_cmd",
            "doctor": "doctor_cmd", "cupti": "cupti_cmd"}

EXAMPLES = """\
examples:
  headcount profile                      profile the embedded default model (eager vs sdpa)
  headcount profile --mode head          measure every attention head on its own
  headcount profile --help               all options of the profile command
  headcount parse run.sqlite -o report/  an existing nsys SQLite export into the same tables
  headcount run --backend nsys -o out/ -- python train.py   any script, tagged without code changes
  headcount report headcount-report             an HTML page: heatmaps, roofline, comparison, bottlenecks
  headcount compare headcount-report            eager vs sdpa (vs flash…): time, kernels, launch cost, bytes
  headcount diff before/ after/ --fail-on-regression 5   per call, against the noise: a CI gate
  headcount query headcount-report "SELECT * FROM layers ORDER BY duration_ns DESC LIMIT 5"
  headcount doctor                       what works here: GPU, driver, CUPTI, counters, nsys/ncu
  headcount profile --backend cupti      in-process CUPTI on an NVIDIA GPU (launch latency, occupancy, DRAM samples)
  headcount cupti install                the CUPTI that samples DRAM, beside your torch (never replacing it)

Read the report:
  headcount query headcount-report "SELECT layer_name, head, duration_ns FROM heads ORDER BY duration_ns DESC LIMIT 5"
  python -c "import pandas as pd; print(pd.read_parquet('headcount-report/layers'))"
  python -c "import duckdb; duckdb.sql(\\"SELECT * FROM read_parquet('headcount-report/heads/**/*.parquet', hive_partitioning=true)\\").show()"
  (the DuckDB CLI, `curl https://install.duckdb.org | sh`, reads the same paths: read only what headcount.json lists while a writer runs)
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``only``: register just that subcommand (its module alone is imported)."""
    parser = argparse.ArgumentParser(
        prog="headcount",
        description="Measure what attention costs, per transformer layer and per head, and write it as Parquet.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"headcount {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only in (None, name):
            command = import_module(f"headcount.cli.{module}").add_parser(sub)
            # --debug after the subcommand too (SUPPRESS: absent there, the top-level value stands)
            command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None and "--version" in argv:
        print(f"headcount {__version__}")
        return 0
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from headcount.common.env import release_freed_memory

    release_freed_memory()  # large tables are built and freed in turn: give freed memory back at once
    getattr(sys.modules.get("headcount.store.dataset"), "COMMITTED", []).clear()  # main() called again (tests)
    try:
        with stopping.handled():  # SIGTERM and SIGHUP clean up as Ctrl-C does: workers ended, staging removed
            return args.func(args)
    except HeadcountError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"headcount: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or stopping.Stopped (SIGTERM, SIGHUP)
        print(f"headcount: {_stopped_by(exc)}; {_written()}", file=sys.stderr)
        return stopping.exit_status(exc)
    except BrokenPipeError:
        return _reader_left()


def _stopped_by(exc: BaseException) -> str:
    signame = stopping.name(exc)
    return "interrupted" if signame == "SIGINT" else f"stopped by {signame}"


def _written() -> str:
    """What a stopped command leaves: nothing, or the report it had committed when the signal came."""
    committed = sys.modules.get("headcount.store.dataset")
    done = sorted({str(p) for p in getattr(committed, "COMMITTED", [])})
    return f"the report was written first ({', '.join(done)})" if done else "no report was written"


def _reader_left() -> int:
    """stdout's reader has gone (``headcount … | head``): stop quietly with
    status 1, as rich's console does (and Python's documentation advises),
    with nothing left to flush into the closed pipe at exit."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout replaced by something without a descriptor (tests)
        pass
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
