"""``headcount parse``: turn existing profiles into headcount's Parquet report.

The formats are those of :data:`headcount.sources.FILE_SOURCES` (nsys SQLite
and parquetdir exports, ``.nsys-rep``, ncu CSV and ``.ncu-rep``, torch.profiler
traces). Every file is read and attributed before anything is written; each
file becomes one run of the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from headcount import sources
from headcount.errors import notice
from headcount.reports import dataset
from headcount.reports.metadata import new_run_id, run_metadata, runs_row

EXAMPLES = """\
examples:
  nsys export --type sqlite -o run.sqlite run.nsys-rep
  headcount parse run.sqlite -o report/
  headcount parse run-parquet/ -o report/         nsys export --type parquetdir
  headcount parse run.nsys-rep -o report/        exported with the nsys on PATH ($HEADCOUNT_NSYS to choose one)
  headcount parse kernels.ncu-rep -o report/      per-kernel counters, read with ncu_report
  ncu --import kernels.ncu-rep --csv --page raw --print-units base > raw.csv && headcount parse raw.csv -o report/
  headcount parse rank0.sqlite rank1.sqlite -o report/ --append
  headcount parse trace.json.gz -o report/       a torch.profiler trace (headcount's ranges, or nn.Module ranges + SDPA shapes)
"""



def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "parse", help="turn existing profiles (nsys, ncu) into the Parquet report",
        description=f"Read existing profiles into headcount's tables, attributing each GPU operation to the NVTX ranges "
        f"that launched it (the rule of nsys's nvtx_gpu_proj_trace). Supported: {sources.supported()}.",
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


def run(args) -> int:
    console = Console(stderr=True)
    dataset.check_output(args.out, append=args.append, force=args.force)
    parsed = []
    for name in args.files:
        path = Path(name)
        source = sources.for_path(path)
        run_id = new_run_id()
        with console.status(f"reading {path}…"):
            result = source.parse(path, run_id, {"locale": args.locale})
        for line in result.notices:
            notice(f"{path}: {line}")
        # the device and program versions the recording names (null where it does not), never this machine's
        meta = run_metadata(run_id, source.name, result.version, "parse",
                            {"input": str(path), "implementation": "unknown", "notices": result.notices},
                            device=result.device or {"kind": "cuda", "name": None}, program={})
        tables = {k: v for k, v in result.tables.items() if k in ("kernels", "ranges", "layers", "heads")}
        tables["runs"] = runs_row(meta)
        for line in result.lines:
            console.print(line, soft_wrap=True)
        parsed.append((run_id, tables, meta))
    for i, (run_id, tables, meta) in enumerate(parsed):
        dataset.write_run(args.out, run_id, tables, meta, append=args.append or i > 0, force=args.force and i == 0)
    Console().print(f"Report: {args.out}/ ({len(parsed)} run{'s' if len(parsed) > 1 else ''})")
    return 0
