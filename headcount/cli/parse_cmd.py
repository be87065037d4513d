"""``headcount parse``: turn existing profiles into headcount's Parquet report.

The formats are those of :data:`headcount.build.sources.FILE_SOURCES` (nsys SQLite
and parquetdir exports, ``.nsys-rep``, ncu CSV and ``.ncu-rep``, torch.profiler
traces). Each file becomes one run of the report, staged on its own (in parallel
with ``--jobs``, or on Ray) and committed together with the others: a
failure writes nothing, unless ``--keep-going``.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

from headcount.build import batch, sources
from headcount.common.errors import HeadcountError, notice
from headcount.parsers.files import stored_bytes
from headcount.parsers.options import ReadOptions
from headcount.reports import terminal
from headcount.reports.progress_view import Meter
from headcount.store import dataset, input_digest
from headcount.store.metadata import new_run_id

EXAMPLES = """\
examples:
  nsys export --type sqlite -o run.sqlite run.nsys-rep
  headcount parse run.sqlite -o report/
  headcount parse run-parquet/ -o report/         nsys export --type parquetdir
  headcount parse run.nsys-rep -o report/        exported with the nsys on PATH ($HEADCOUNT_NSYS to choose one)
  headcount parse kernels.ncu-rep -o report/      per-kernel counters, read with ncu_report
  ncu --import kernels.ncu-rep --csv --page raw --print-units base > raw.csv && headcount parse raw.csv -o report/
  headcount parse rank*.sqlite -o report/ --jobs 4        one run per rank, four files at a time
  headcount parse /shared/rank*.sqlite -o /shared/report --executor ray   one Ray task per file ($RAY_ADDRESS)
  headcount parse trace.json.gz -o report/       a torch.profiler trace (headcount's ranges, or nn.Module ranges + SDPA shapes)
  headcount parse traces/ -o report/ --jobs 4     a directory of torch.profiler traces, one per rank: a run each
  headcount parse cut.json.gz -o report/ --salvage   a cut trace: the events before the cut, with a notice of what was lost
"""



def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "parse", help="turn existing profiles (nsys, ncu, torch.profiler) into the Parquet report",
        description=f"Read existing profiles into headcount's tables, attributing each GPU operation to the NVTX ranges "
        f"that launched it (the rule of nsys's nvtx_gpu_proj_trace). Each file becomes one run; all are written "
        f"together, or none. Supported: {sources.supported()}.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", help="profile files")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--locale", default=None, help="locale of the machine that exported an ncu CSV (C, en_US, de_DE, …); inferred when omitted")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="files parsed at once, in separate processes (default: one per core, as many as memory holds at 2 GiB each)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="ray: one task per file on the Ray cluster at $RAY_ADDRESS (else a local Ray); -o must be shared storage")
    p.add_argument("--keep-going", action="store_true", help="write the files that parsed even if others failed (exit status still 1)")
    p.add_argument("--salvage", action="store_true",
                   help="read a cut or partly unreadable recording for what it holds, with a notice (damaged: …) of what "
                        "was lost; without it such a file is refused (exit 2, nothing written)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add to an existing report")
    group.add_argument("--force", action="store_true", help="replace an existing report")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    console = terminal.console(stderr=True)
    if args.jobs is not None and args.jobs < 1:
        raise HeadcountError(f"--jobs {args.jobs}: must be 1 or more", hint="e.g. --jobs 4")
    out = dataset.check_output(args.out, append=args.append, force=args.force)
    names = sources.inputs(args.files)  # every input is checked before any work starts
    input_digest.hash_ahead(names)  # the runs rows' hashes, beside the export's plan and the imports (parse_into goes on with it)
    files = [(name, new_run_id()) for name in names]
    jobs = args.jobs or batch.default_jobs()
    plan = batch.split(files, jobs) if args.executor == "local" else None
    what = files[0][0] if len(files) == 1 else f"{len(files)} files"
    how = f"{what} on Ray" if plan is None else f"{what}, {plan.workers} worker processes" if plan.workers > 1 else what
    meter = Meter(console, [stored_bytes(Path(name)) for name, _ in files], how)
    parallel = plan is None or plan.workers > 1
    if not meter.shown and parallel:  # small inputs: one line, no bar (a spinner is a thread: none where workers fork)
        console.print(f"reading {how}…", highlight=False)
    with meter, console.status(f"reading {how}…") if not meter.shown and not parallel else nullcontext():
        options = ReadOptions(locale=args.locale, salvage=args.salvage)
        results = batch.parse_into(out, files, options, jobs=jobs, executor=args.executor, done=progress(console, files, meter),
                                   plan=plan, keep_going=args.keep_going, append=args.append, force=args.force)
    failed = [r for r in results if r.error]
    runs = [run for r in results if not r.error for run in r.run_ids]  # one per file, or per process of a file
    if runs:
        terminal.console().print(f"Report: {args.out}/ ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    for r in failed:
        terminal.console(stderr=True).print(f"headcount: error: {r.error}" + (f" ({r.hint})" if r.hint else ""), soft_wrap=True, highlight=False)
    if failed:
        terminal.console(stderr=True).print(f"headcount: {len(failed)} of {len(files)} files failed; "
                                   f"{'the others were written' if runs else 'nothing was written'}", highlight=False)
        return 1
    return 0


def progress(console, files: list[tuple[str, str]], meter: Meter) -> Callable[[batch.FileResult], None]:
    """What the user sees as each of ``files`` (``(path, run id)``) is staged: its notices, its lines, (of several
    files) a count, and the ``meter`` moved on. ``headcount parse`` and the recordings ``headcount diff`` parses say the same."""
    finished = []
    index = {run_id: i for i, (_, run_id) in enumerate(files)}
    total = len(files)

    def done(result: batch.FileResult) -> None:
        finished.append(result)
        for line in result.notices:
            notice(f"{result.path}: {line}")
        for line in result.lines:
            console.print(line, soft_wrap=True)
        if total > 1:
            state = "failed" if result.error else "staged"
            console.print(f"[{len(finished)}/{total}] {result.path}: {state}", soft_wrap=True, highlight=False)
        meter.file_done(index[result.run_id])

    return done
