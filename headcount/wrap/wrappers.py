"""What ``headcount run`` does differently per recorder: one class each.

A wrapper finds and checks its tool (:meth:`version`), builds the command
line around the program (:meth:`argv`), reads the tool's verdict on the run
(:meth:`check`) and turns the raw folder into one set of tables per rank
(:meth:`assemble`, through :mod:`headcount.build.run_folder` and
:mod:`headcount.build`). ``headcount run`` itself holds no per-tool branch;
:data:`WRAPPERS` is keyed like :data:`headcount.build.sources.WRAPPERS`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from headcount.build import run_folder
from headcount.collector import cupti_load
from headcount.common import env, nsight
from headcount.common.errors import HeadcountError, NothingRecorded
from headcount.wrap import nvidia_tools


class Wrapper:
    """The cupti wrapper, and the base of the others: the program runs as it is,
    each of its processes records with the in-process collector."""

    name = "cupti"

    def version(self) -> str | None:
        """The recording tool's version, checked before the program starts;
        raises HeadcountError (exit 3) where the tool is missing, too old, or
        cannot record on this machine."""
        try:
            if not os.environ.get("HEADCOUNT_CUPTI_FACTORY"):  # the tests' stand-in for the GPU (wrap/child.py) needs none
                cupti_load.require()  # no driver, no GPU, no cupti-python: said before the program runs, not after
        except HeadcountError as exc:
            hint = exc.hint
            if hint and "--backend torch" in hint:  # the API's wording names `auto`, which headcount run does not take
                hint = "use --backend torch here (torch.profiler, any machine), or --backend nsys for NVTX ranges"
            raise HeadcountError(f"--backend cupti cannot run here: {exc.message}", hint=hint, exit_code=3) from exc
        return cupti_load.cupti_version()

    def stdout_route(self):
        """How the program's stdout is passed on (:func:`headcount.wrap.launcher.run`'s ``route``): as it is."""
        return None

    def argv(self, args, raw: Path, command: list[str], console: Console) -> tuple[list[str], dict]:
        """The command line to run, and what to record of it in the run metadata."""
        return command, {"pm_sampling": not args.no_pm_sampling, "pm_interval_ns": args.pm_interval_ns}

    def check(self, raw: Path, tool_lines: list[str], info: dict) -> None:
        """Read the tool's verdict once the program ended; raises HeadcountError where the tool failed."""

    def raw_report(self, raw: Path) -> Path | None:
        """The tool's own report in the raw folder, which ``headcount parse`` reads (None: the records are headcount's own)."""
        return None

    def assemble(self, raw: Path, run_id: str, console: Console) -> list[run_folder.RankRun]:
        """The raw folder → one :class:`~headcount.build.run_folder.RankRun` per rank."""
        return run_folder.from_in_process(run_folder.read_children(raw), run_id)


class Torch(Wrapper):
    """The program runs as it is; each tagged process records with torch.profiler (any machine; on a GPU, PM
    samples where its torch has a route, :mod:`headcount.collector.torch_pm`)."""

    name = "torch"

    def version(self) -> str | None:
        """torch's version where headcount runs (the program's own is in each run's ``torch`` column): torch is
        imported by the program, not checked here."""
        from importlib import metadata

        try:
            return f"torch.profiler (torch {metadata.version('torch')})"
        except metadata.PackageNotFoundError:
            return "torch.profiler"


class Nsys(Wrapper):
    name = "nsys"

    def version(self) -> str | None:
        self.tool = nsight.find(self.name)
        text, numbers = nsight.version(self.tool)
        nsight.check_version(self.name, numbers, text)
        self.text = text
        return text

    def argv(self, args, raw: Path, command: list[str], console: Console) -> tuple[list[str], dict]:
        gpu_flag = None
        if args.gpu_metrics == "on" or (args.gpu_metrics == "auto" and env.driver_present()):
            help_text = subprocess.run([self.tool, "profile", "--help"], capture_output=True, text=True).stdout
            gpu_flag = nvidia_tools.nsys_gpu_metrics_flag(help_text)
            if gpu_flag is None:
                console.print(f"this nsys ({self.text}) has no GPU metrics option: sampling off")
        argv = nvidia_tools.nsys_argv(self.tool, str(raw / "run"), command, trace=args.trace, gpu_metrics_flag=gpu_flag,
                                      capture=args.capture_range)
        return argv, {"gpu_metrics": gpu_flag is not None, "trace": args.trace}

    def stdout_route(self):
        """nsys writes its own lines to the program's stdout: a progress bar per
        step of writing the report (dropped) and what it does (to stderr).
        Once it says ``Generating '….qdstrm'`` the program has exited, so every
        later line is nsys's (and ``route.program_ended()`` says so to the launcher)."""
        done = []

        def route(line: str, sink):
            if done:
                return None if _NSYS_PROGRESS.match(line) else sys.stderr
            if _NSYS_GENERATING.match(line):
                done.append(True)
                return sys.stderr
            if line.startswith("Collecting data..."):
                return sys.stderr
            return sink

        route.program_ended = lambda: bool(done)  # nsys is writing its report: an interrupt now would lose it
        return route

    def raw_report(self, raw: Path) -> Path | None:
        return raw / "run.nsys-rep"

    def assemble(self, raw: Path, run_id: str, console: Console) -> list[run_folder.RankRun]:
        rep = raw / "run.nsys-rep"
        if not rep.exists():
            raise HeadcountError(f"nsys wrote no report ({rep} missing)", hint="see nsys's messages above", exit_code=3)
        from headcount.parsers.nsys_rep import exported

        children = run_folder.read_children(raw)
        console.print(f"reading {rep} (exported to SQLite by nsys)…", soft_wrap=True, highlight=False)
        with console.status("exporting and reading the nsys report…"), exported(rep) as sqlite:
            return run_folder.from_nsys(sqlite, children, run_id)


class Ncu(Nsys):
    name = "ncu"

    def version(self) -> str | None:
        text = super().version()
        if not env.driver_present():  # ncu would start the program only to fail at its first kernel
            raise HeadcountError("--backend ncu cannot run here: no NVIDIA driver on this machine (ncu profiles GPU kernels)",
                                 hint="run it on a machine with an NVIDIA GPU; --backend nsys records NVTX ranges anywhere",
                                 exit_code=3)
        return text

    def stdout_route(self):
        return None

    def argv(self, args, raw: Path, command: list[str], console: Console) -> tuple[list[str], dict]:
        opt = nvidia_tools.NcuOptions(
            nvtx_includes=tuple(args.nvtx_include or nvidia_tools.NCU_DEFAULT_INCLUDES),
            metrics=tuple(m.strip() for m in args.metrics.split(",") if m.strip()) if args.metrics else
            (() if args.section_set else nvidia_tools.NCU_METRICS),
            section_set=args.section_set, clock_control=args.clock_control, cache_control=args.cache_control,
            launch_count=args.launch_count or None, capture=args.capture_range)
        argv = nvidia_tools.ncu_argv(self.tool, str(raw / "run"), command, opt, log_file=str(raw / "ncu.log"))
        return argv, {"nvtx_includes": list(opt.nvtx_includes), "metrics": list(opt.metrics), "set": opt.section_set,
                      "clock_control": opt.clock_control, "cache_control": opt.cache_control, "launch_count": opt.launch_count}

    def check(self, raw: Path, tool_lines: list[str], info: dict) -> None:
        lines = tool_lines + _lines(raw / "ncu.log")
        error, warnings = nvidia_tools.read_ncu_log(lines)
        info["tool_notices"] = warnings
        info["ncu_cost"] = {**nvidia_tools.ncu_passes(lines), "program_wall_s": info.get("program_wall_s")}
        said = nvidia_tools.ncu_cost_notice(info["ncu_cost"], info.get("program_wall_s"))
        if said:
            info.setdefault("cost_notices", []).append(said)
        if error is not None and not (raw / "run.ncu-rep").exists():
            raise error

    def raw_report(self, raw: Path) -> Path | None:
        return raw / "run.ncu-rep"

    def assemble(self, raw: Path, run_id: str, console: Console) -> list[run_folder.RankRun]:
        from headcount.parsers import ncu_rep

        if not (raw / "run.ncu-rep").exists():  # ncu writes no report when no kernel matched its filters
            raise NothingRecorded(f"ncu profiled no kernel ({raw / 'run.ncu-rep'} not written)",
                                  hint="check --nvtx-include, and that the program ran its model on the GPU")
        children = run_folder.read_children(raw)
        with console.status("reading the ncu report…"):
            kernels = ncu_rep.read_report(raw / "run.ncu-rep")
        return run_folder.from_ncu(kernels, children, run_id)


_NSYS_PROGRESS = re.compile(r"^\[\d+/\d+\] \[[=\s]*\d+%[=\s]*\] ")
_NSYS_GENERATING = re.compile(r"^Generating '.*\.qdstrm'$")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


WRAPPERS: dict[str, type[Wrapper]] = {"nsys": Nsys, "ncu": Ncu, "cupti": Wrapper, "torch": Torch}
