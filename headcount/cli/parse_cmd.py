"""``headcount parse``: turn existing profiles into headcount's Parquet report.

Supported: nsys SQLite exports, ``.nsys-rep`` reports (exported by the nsys
on PATH), nsys ``parquetdir`` exports (directories), ncu CSV exports (raw or
details page) and ``.ncu-rep`` reports (through ``ncu_report``). Every file is
read and attributed before anything is written; each file becomes one run of
the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from headcount.api import runs_row
from headcount.errors import HeadcountError
from headcount.parsers import ncu_csv, ncu_metrics, ncu_rep
from headcount.parsers.nsys_rep import read_report
from headcount.parsers.nsys_sqlite import read_export, run_device
from headcount.pipeline import add_roofline, tables_from_ncu, tables_from_nsys
from headcount.reports import dataset
from headcount.reports.metadata import new_run_id, run_metadata

EXAMPLES = """\
examples:
  nsys export --type sqlite -o run.sqlite run.nsys-rep
  headcount parse run.sqlite -o report/
  headcount parse run-parquet/ -o report/         nsys export --type parquetdir
  headcount parse run.nsys-rep -o report/        exported with the nsys on PATH ($HEADCOUNT_NSYS to choose one)
  headcount parse kernels.ncu-rep -o report/      per-kernel counters, read with ncu_report
  ncu --import kernels.ncu-rep --csv --page raw --print-units base > raw.csv && headcount parse raw.csv -o report/
  headcount parse rank0.sqlite rank1.sqlite -o report/ --append
"""

SUPPORTED = "nsys SQLite exports (.sqlite), nsys parquetdir exports (directories), .nsys-rep reports, ncu CSV exports (.csv), .ncu-rep reports"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "parse", help="turn existing profiles (nsys, ncu) into the Parquet report",
        description=f"Read existing profiles into headcount's tables, attributing each GPU operation to the NVTX ranges "
        f"that launched it (the rule of nsys's nvtx_gpu_proj_trace). Supported: {SUPPORTED}.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", help="profile files")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--locale", default=None, help="locale of the machine that exported an ncu CSV (C, en_US, de_DE, …); inferred when omitted")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add to an existing report")
    group.add_argument("--force", action="store_true", help="replace an existing report")
    p.set_defaults(func=run)
    return p


def _read(path: Path, locale: str | None):
    """``("nsys", export)`` or ``("ncu", kernels)``."""
    if path.is_dir():
        return "nsys", read_export(path)  # an nsys parquetdir export
    suffix = path.suffix.lower()
    if suffix in (".sqlite", ".db", ".sqlite3"):
        return "nsys", read_export(path)
    if suffix == ".nsys-rep":
        return "nsys", read_report(path)
    if suffix == ".csv":
        return "ncu", ncu_csv.read_csv(path, locale=locale)
    if suffix == ".ncu-rep":
        return "ncu", ncu_rep.read_report(path)
    raise HeadcountError(f"{path}: {suffix or 'this'} input is not supported yet", hint=f"supported: {SUPPORTED}")


def run(args) -> int:
    console = Console(stderr=True)
    dataset.check_output(args.out, append=args.append, force=args.force)
    parsed = []
    for name in args.files:
        path = Path(name)
        with console.status(f"reading {path}…"):
            kind, data = _read(path, args.locale)
            run_id = new_run_id()
            if kind == "nsys":
                tables = tables_from_nsys(data, run_id)
                version = data["meta"].get("EXPORT_PRODUCT_VERSION")
                device = run_device(data)
            else:
                tables = tables_from_ncu(data, run_id)
                version = None
                device = ncu_metrics.run_device(data)
        # the device and program versions the recording names (null where it does not), never this machine's
        device = device or {"kind": "cuda", "name": None}
        add_roofline(tables, device)
        meta = run_metadata(run_id, kind, version, "parse", {"input": str(path), "implementation": "unknown"},
                            device=device, program={})
        tables["runs"] = runs_row(meta)
        if kind == "nsys":
            if not (tables["ranges"]["gpu_op_count"] > 0).any():
                console.print(f"{path}: no GPU operation was launched inside an NVTX range", soft_wrap=True)
            console.print(f"{path}: {len(tables['kernels'])} GPU operations, {len(tables['ranges'])} NVTX ranges", soft_wrap=True)
        else:
            kernels = tables["kernels"]
            console.print(f"{path}: {len(kernels)} kernels, {int(kernels['incomplete'].sum())} incomplete, "
                          f"{int(kernels['layer_name'].notna().sum())} in headcount's attention ranges", soft_wrap=True)
        parsed.append((run_id, tables, meta))
    for i, (run_id, tables, meta) in enumerate(parsed):
        dataset.write_run(args.out, run_id, tables, meta, append=args.append or i > 0, force=args.force and i == 0)
    Console().print(f"Report: {args.out}/ ({len(parsed)} run{'s' if len(parsed) > 1 else ''})")
    return 0
