"""``headcount run``: run any script under nsys, ncu, the CUPTI collector or torch.profiler,
tagged without code changes, and write the report.

The program's own output is passed through; its exit status is headcount's
(a failing program still gets the report of what was recorded, marked
incomplete). headcount's own failures have their own status: 2 (usage), 3
(tool or environment), 4 (nothing tagged was recorded).
"""

from __future__ import annotations

import argparse
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

from headcount.build import run_folder, sources
from headcount.cli.flags import add_pm_interval
from headcount.common import stopping
from headcount.common.device import Device
from headcount.common.errors import HeadcountError, NothingRecorded
from headcount.common.tables import WRITTEN
from headcount.parsers.files import stored_bytes
from headcount.reports import console as console_report
from headcount.reports import terminal
from headcount.reports.progress_view import size as _size
from headcount.store import dataset
from headcount.store.metadata import new_run_id, run_metadata, runs_row
from headcount.wrap import child as child_mod
from headcount.wrap import launcher, wrappers

EXAMPLES = """\
examples:
  headcount run --backend nsys -o out/ -- python train.py --epochs 1
  headcount run --backend ncu --steps 10-11 -o out/ -- python train.py            only steps 10 and 11 under ncu
  headcount run --backend ncu --nvtx-include "headcount@fwd/layer.3/" -o out/ -- python infer.py
  headcount run --backend cupti --mode head -o out/ -- python train.py
  headcount run --backend torch --steps 5-6 -o out/ -- python train.py           torch.profiler, any machine
  headcount run --backend nsys -o out/ -- torchrun --nproc-per-node 2 train.py    one run per rank
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "run", help="run a script under nsys, ncu, the CUPTI collector or torch.profiler, tagged, and write the report",
        usage="headcount run [options] -o OUT -- COMMAND [ARGS ...]",
        description="Run COMMAND with every Hugging Face model it builds tagged per layer (and head), under NVIDIA's "
        "nsys or ncu, headcount's in-process CUPTI collector or torch.profiler, then parse and attribute what was recorded into the "
        "Parquet report. The tools' own files stay in OUT/raw/<run id>/.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", choices=tuple(sources.WRAPPERS), default="nsys", help="the recorder (default nsys)")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--mode", choices=("layer", "head"), default="layer", help="layer (as in production) or head (one head at a time)")
    p.add_argument("--steps", default="", help="tag only these steps (torch: record only them too; a step starts at each outermost model forward): N or A-B")
    p.add_argument("--capture-range", action="store_true",
                   help="also limit the tool's capture to those steps (cudaProfilerStart/Stop; nsys and ncu, GPU only)")
    p.add_argument("--tag-sdpa", action="store_true", help="also tag F.scaled_dot_product_attention calls made outside transformers")
    g = p.add_argument_group("ncu")
    g.add_argument("--nvtx-include", action="append", default=None,
                   help="ncu NVTX filter, repeatable (default: headcount@fwd/, headcount@bwd/, headcount@recompute/); "
                   "e.g. 'headcount@fwd/layer.3/' or 'headcount@fwd/layer.3/head.7/'")
    g.add_argument("--metrics", default=None, help="comma-separated ncu metrics (default: a one-pass set: duration, DRAM bytes "
                   "read/written, DRAM throughput, achieved occupancy, L2 bytes)")
    g.add_argument("--set", dest="section_set", default=None, help="an ncu section set (e.g. full) instead of --metrics")
    g.add_argument("--clock-control", choices=("none", "base"), default="none", help="ncu clock control (default none: realistic clocks)")
    g.add_argument("--cache-control", choices=("all", "none"), default="all", help="ncu cache control (default all: flushed between passes)")
    g.add_argument("--launch-count", type=int, default=5000, help="stop ncu after this many kernels (default 5000; 0: no limit)")
    g = p.add_argument_group("nsys")
    g.add_argument("--trace", default="cuda,nvtx", help="nsys --trace (default cuda,nvtx; add osrt for OS runtime calls)")
    g.add_argument("--gpu-metrics", choices=("auto", "on", "off"), default="auto",
                   help="nsys GPU metrics sampling (auto: when a GPU is present and nsys supports it)")
    g = p.add_argument_group("cupti and torch")
    g.add_argument("--no-pm-sampling", action="store_true",
                   help="do not sample DRAM traffic and warps active (torch: where its torch.profiler can, see headcount doctor)")
    add_pm_interval(g)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add to an existing report")
    group.add_argument("--force", action="store_true", help="replace an existing report")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program to run, after --")
    p.set_defaults(func=run)
    return p


def _command(args) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise HeadcountError("no command to run", hint="put the program after --, e.g. headcount run -o out/ -- python train.py")
    return command


def _validate(args) -> list[str]:
    command = _command(args)
    try:
        child_mod.parse_steps(args.steps)
    except ValueError as exc:
        raise HeadcountError(f"--steps {args.steps}: not a step or a range of steps", hint="e.g. --steps 10 or --steps 10-12") from exc
    if args.launch_count < 0:
        raise HeadcountError(f"--launch-count {args.launch_count}: must be 0 or more", hint="0 means no limit")
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        raise HeadcountError(f"{command[0]}: command not found", hint="check the program after --")
    dataset.check_output(args.out, append=args.append, force=args.force)
    return command


def run(args) -> int:
    console = terminal.console(stderr=True)
    command = _validate(args)
    out = Path(args.out)
    run_id = new_run_id()
    raw = out / "raw" / run_id
    tool_info: dict = {"backend": args.backend, "command": command}

    wrapper = wrappers.WRAPPERS[args.backend]()
    tool_info["tool_version"] = wrapper.version()
    raw.mkdir(parents=True, exist_ok=True)
    env = launcher.child_env(raw, args.backend, args.mode, args.steps, args.tag_sdpa, args.capture_range,
                             not args.no_pm_sampling, args.pm_interval_ns)
    argv, details = wrapper.argv(args, raw, command, console)
    tool_info.update(details)
    tool_info["tool_command"] = argv
    _phase(console, f"recording the program under {args.backend}, {args.mode} mode{f', steps {args.steps}' if args.steps else ''}; "
                    f"raw files in {raw}/")

    started = time.monotonic()
    try:
        ran = launcher.run(argv, env, route=wrapper.stdout_route())
    except FileNotFoundError as exc:
        raise HeadcountError(f"{argv[0]}: cannot be started ({exc.strerror})", hint="check the command", exit_code=3) from exc
    tool_info["program_wall_s"] = round(time.monotonic() - started, 3)  # under the recorder: what recording cost
    try:
        if ran.killed or ran.held:  # killed: what the tool had not written is lost; held: the user stopped headcount there
            console.print(f"headcount: {'killed' if ran.killed else 'interrupted'}; no report was written; "
                          f"{_kept(wrapper, raw, out)}", soft_wrap=True, highlight=False)
            return ran.stopped_status
        return _report(args, console, wrapper, ran, raw, out, run_id, tool_info)
    except KeyboardInterrupt as exc:  # while the recording is exported, read or committed: nothing half-written, the raw files kept
        console.print(f"headcount: interrupted; no report was written; {_kept(wrapper, raw, out)}", soft_wrap=True, highlight=False)
        return stopping.exit_status(exc)
    finally:
        follow_umask(raw)  # what the recorder, the program and the exports wrote


def _phase(console, text: str) -> None:
    """Say which phase ``run`` is in (recording, reading, writing): one line, on a terminal or in a log alike."""
    console.print(f"headcount run: {text}", soft_wrap=True, highlight=False)


def follow_umask(raw: Path) -> None:
    """Give the raw files the recorder and the program wrote the mode this user's files get (0666 less
    headcount's umask), as the report's files have: nsys starts the program with a umask of its own
    (its ``child-<pid>.json`` came out 0666, ``run.nsys-rep`` 0664 under umask 027). A file that
    cannot be changed (another owner) keeps its mode."""
    mode = 0o666 & ~dataset.umask()
    for path in raw.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                path.chmod(mode)
        except OSError:
            pass


def recorded_steps(tables: dict) -> int | None:
    """The steps a rank's recording holds (its ``steps`` rows within a step); None where it has no steps table."""
    steps = tables.get("steps")
    if steps is None or "step" not in steps:
        return None
    return int(steps["step"].dropna().nunique())


def first_recorded(runs: list) -> run_folder.RankRun:
    return next((r for r in runs if not run_folder.empty(r.tables)), runs[0])


def _interrupted_notice(run: run_folder.RankRun) -> str:
    """What an interrupted run's recording covers: the steps recorded before the recorder stopped (the program may
    run on a little longer while its recorder shuts down; those steps are not in it)."""
    held, seen = recorded_steps(run.tables), run.info.get("steps_seen")
    of = f" of the {seen} the program began" if seen and held is not None and seen != held else ""
    return f"interrupted: the recording covers {held} steps{of}, those before the interrupt" if held is not None \
        else "interrupted: the recording covers the steps before the interrupt"


def _kept(wrapper, raw: Path, out: Path) -> str:
    """What an interrupt leaves: the raw files, and the command that makes the report from them later."""
    report = wrapper.raw_report(raw)
    if report is None or not report.exists():
        return f"the raw files are kept in {raw}/"
    return f"the raw files are kept in {raw}/; make the report from them later with: headcount parse {report} -o {out} --append"


def _report(args, console, wrapper, ran, raw: Path, out: Path, run_id: str, tool_info: dict) -> int:
    """Read what the program's run recorded and commit it as the report (one run per rank)."""
    status = ran.status
    wrapper.check(raw, ran.tool_lines, tool_info)
    ended = "was stopped" if ran.interrupted else f"exited with status {status}"
    _phase(console, f"the program {ended} after {tool_info['program_wall_s']:.1f} s; reading what {args.backend} recorded "
                    f"({_size(stored_bytes(raw))})…")
    try:
        with console.status(f"reading what {args.backend} recorded…") if console.is_terminal else nullcontext():
            runs, notes = wrapper.assemble(raw, run_id, console), []
    except NothingRecorded as exc:  # e.g. an nsys report of a program that stopped before its first range
        runs, notes = [], [exc.message]
    for line in tool_info.get("cost_notices", []):
        console.print(line, soft_wrap=True, highlight=False)
        for r in runs:
            r.info["notices"] = [*r.info.get("notices", []), line]
    if ran.interrupted:
        for r in runs:
            r.info["notices"] = [*r.info.get("notices", []), _interrupted_notice(r)]
            r.info["complete"] = False
    if not runs or all(run_folder.empty(r.tables) for r in runs):
        notes += [n for r in runs for n in r.info.get("notices", [])]
        note = f" ({'; '.join(notes)})" if notes else ""
        if ran.interrupted:
            console.print(f"headcount: interrupted before anything tagged was recorded{note}")
            return ran.stopped_status
        if status:
            console.print(f"headcount: error: the program exited with status {status} and nothing tagged was recorded{note}")
            return status
        raise HeadcountError(f"nothing tagged was recorded{note}",
                             hint="does the program build a transformers model (or use --tag-sdpa)? raw files are kept in " + str(raw),
                             exit_code=4)
    if ran.interrupted:
        console.print(f"{_interrupted_notice(first_recorded(runs))}; the run is marked incomplete")
    elif status:
        console.print(f"the program exited with status {status}: the report holds what was recorded, marked incomplete")
    staged = []  # every rank's run staged, then all committed together: never a report with some ranks only

    def stage() -> dataset.Staged:
        for r in runs:
            if run_folder.empty(r.tables):
                console.print(f"{r.run_id}: nothing recorded ({'; '.join(r.info.get('notices', []))})")
                continue
            # the program's device and versions, as its own process saw them (never this launcher's)
            meta = run_metadata(r.run_id, args.backend, tool_info.get("tool_version"), args.mode,
                                {**r.info, **tool_info, "program_exit_status": status, "steps": r.info.get("steps_seen"),
                                 "complete": bool(r.info.get("complete", True)) and status == 0 and not ran.interrupted},
                                device=Device.from_dict(r.info.get("device")),
                                program=r.info.get("program") or {})
            with dataset.StagedRun(out, r.run_id, meta) as run:
                staged.append(r.run_id)
                for name in WRITTEN:
                    if name in r.tables:
                        run.write(name, r.tables[name])
                run.write("runs", runs_row(meta))
        return dataset.Staged(staged)

    _phase(console, "writing the report…")
    dataset.write_runs(out, [r.run_id for r in runs], stage, append=args.append, force=args.force)
    written = len(staged)
    first = next(r for r in runs if not run_folder.empty(r.tables))
    console_report.print_summary(first.tables["layers"], first.tables["heads"], None, console=terminal.console(),
                                 kernels=first.tables["kernels"], steps=first.tables.get("steps"), findings=first.tables.get("findings"),
                                 collectives=first.tables.get("collectives"))
    terminal.console().print(f"Report: {out}/ ({written} run{'s' if written > 1 else ''}: {', '.join(r.run_id for r in runs)}); raw files: {raw}/")
    return ran.stopped_status if ran.interrupted else status
