"""``headcount parse``: turn existing profiles into headcount's Parquet report.

Supported so far: nsys SQLite exports and ``.nsys-rep`` reports (exported by
the nsys on PATH). Every
file is read and attributed before anything is written; each file becomes one
run of the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from headcount.api import runs_row
from headcount.errors import HeadcountError
from headcount.parsers.nsys_rep import read_report
from headcount.parsers.nsys_sqlite import read_export
from headcount.pipeline import tables_from_nsys
from headcount.reports import dataset
from headcount.reports.metadata import new_run_id, run_metadata

EXAMPLES = """\
examples:
  nsys export --type sqlite -o run.sqlite run.nsys-rep
  headcount parse run.sqlite -o report/
  headcount parse run.nsys-rep -o report/        exported with the nsys on PATH ($HEADCOUNT_NSYS to choose one)
  headcount parse rank0.sqlite rank1.sqlite -o report/ --append
"""

SUPPORTED = "nsys SQLite exports (.sqlite) and .nsys-rep reports"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "parse", help="turn existing profiles (nsys SQLite exports, .nsys-rep) into the Parquet report",
        description=f"Read existing profiles into headcount's tables, attributing each GPU operation to the NVTX ranges "
        f"that launched it (the rule of nsys's nvtx_gpu_proj_trace). Supported: {SUPPORTED}.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", help="profile files")
    p.add_argument("-o", "--out", required=True, help="output directory")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add to an existing report")
    group.add_argument("--force", action="store_true", help="replace an existing report")
    p.set_defaults(func=run)
    return p


def _read(path: Path) -> dict:
    if path.is_dir():
        raise HeadcountError(f"{path}: directories (nsys parquetdir exports) are not supported yet", hint=f"supported: {SUPPORTED}")
    suffix = path.suffix.lower()
    if suffix in (".sqlite", ".db", ".sqlite3"):
        return read_export(path)
    if suffix == ".nsys-rep":
        return read_report(path)
    raise HeadcountError(f"{path}: {suffix or 'this'} input is not supported yet", hint=f"supported: {SUPPORTED}")


def run(args) -> int:
    console = Console(stderr=True)
    dataset.check_output(args.out, append=args.append, force=args.force)
    parsed = []
    for name in args.files:
        path = Path(name)
        with console.status(f"reading {path}…"):
            export = _read(path)
            run_id = new_run_id()
            tables = tables_from_nsys(export, run_id)
        version = export["meta"].get("EXPORT_PRODUCT_VERSION")
        meta = run_metadata(run_id, "nsys", version, "parse", {"input": str(path), "implementation": "unknown"})
        meta["device"] = {"kind": "cuda", "name": None}
        tables["runs"] = runs_row(meta)
        if not (tables["ranges"]["gpu_op_count"] > 0).any():
            console.print(f"{path}: no GPU operation was launched inside an NVTX range", soft_wrap=True)
        parsed.append((run_id, tables, meta))
        console.print(f"{path}: {len(tables['kernels'])} GPU operations, {len(tables['ranges'])} NVTX ranges", soft_wrap=True)
    for i, (run_id, tables, meta) in enumerate(parsed):
        dataset.write_run(args.out, run_id, tables, meta, append=args.append or i > 0, force=args.force and i == 0)
    Console().print(f"Report: {args.out}/ ({len(parsed)} run{'s' if len(parsed) > 1 else ''})")
    return 0
