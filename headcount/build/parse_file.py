"""One file of ``headcount parse``: read, built (:mod:`headcount.build`), and said.

The functions :data:`headcount.build.sources.FILE_SOURCES` names, one per kind of
file: each reads the file with its parser, builds its tables with the one
composition of the stages, and returns a :class:`Parsed` with the device and
tool version the file names, its notices, and the progress lines the user
sees (``headcount parse`` prints them; a large nsys export's lines are known
once its pieces are consumed).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd

from headcount.build.ncu import tables_from_ncu
from headcount.build.nsys import nsys_pieces, nsys_processes
from headcount.build.shared import collected
from headcount.common import signals
from headcount.common.arrays import equals
from headcount.common.device import Device
from headcount.common.errors import NothingRecorded
from headcount.parsers import ncu_metrics, nsys_sqlite
from headcount.parsers.files import readable
from headcount.parsers.options import ReadOptions


def tally(counts: dict, name: str, frame: pd.DataFrame) -> None:
    """Add a piece's rows to ``counts``: ``kernels``, ``ranges`` and ``attributed`` (ranges with GPU work)."""
    if name in ("kernels", "ranges"):
        counts[name] = counts.get(name, 0) + len(frame)
    if name == "ranges":
        counts["attributed"] = counts.get("attributed", 0) + int((frame["gpu_op_count"] > 0).sum())


def nsys_lines(path, counts: dict, extra: str = "") -> list[str]:
    """The progress lines of a parsed nsys export from its :func:`tally`."""
    lines = [] if counts.get("attributed") else [f"{path}: no GPU operation was launched inside an NVTX range"]
    return [*lines, f"{path}: {counts.get('kernels', 0)} GPU operations, {counts.get('ranges', 0)} NVTX ranges{extra}"]


@dataclass
class Parsed:
    """One file read and built: the tables of one run and what the run metadata needs.

    Attributes:
        tables: ``kernels``, ``ranges``, ``layers``, ``heads`` (and whatever else the build gives).
        device: the recording's device (``None``: the file does not say).
        version: the recording tool's version, where the file says.
        lines: one-line facts for the progress output (complete once :meth:`pieces` is consumed).
        notices: what the reader should know (printed as notices, kept in the metadata).
        run: run metadata the file states (``rank``, ``world_size`` of a distributed trace; a trace's found calls add
            ``implementation``, ``dtype``, ``batch``, ``seq`` once :meth:`pieces` is consumed).
        stream: instead of ``tables``, the tables in pieces (``(name, DataFrame)``),
            built while they are consumed (large recordings, one process at a time).
        runs: instead of either, a recording of several processes that each ran GPU work
            (the ranks of a distributed job): ``(suffix, Parsed)`` of each process, one run
            each (``<run id>-pid<pid>``), built while they are consumed.
    """

    tables: dict[str, pd.DataFrame]
    device: Device | None = None
    version: str | None = None
    lines: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    stream: Iterator[tuple[str, pd.DataFrame]] | None = None
    run: dict = field(default_factory=dict)
    runs: Iterator[tuple[str, "Parsed"]] | None = None

    def pieces(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """``(table name, rows)`` to write, in order; consumed once."""
        if self.stream is not None:
            yield from self.stream
        else:
            yield from self.tables.items()

    def gather(self) -> dict[str, pd.DataFrame]:
        """The tables whole (:meth:`pieces` consumed and concatenated): for a caller that holds them all."""
        if self.stream is not None:
            self.tables = collected(self.pieces())
            self.stream = None
        return self.tables


def _nsys_file(path: Path, export: AbstractContextManager, options: ReadOptions, run_id: str) -> Parsed:
    """An nsys export (``export`` yields its path, and cleans up when the pieces are consumed)."""
    stack = ExitStack()
    try:
        sqlite = stack.enter_context(export)
        plan = nsys_sqlite.plan_export(sqlite)
    except BaseException:
        stack.close()
        raise
    if plan.empty:
        stack.close()
        raise NothingRecorded(f"{path}: holds neither NVTX ranges nor GPU activity", hint="record with `nsys profile --trace=cuda,nvtx`")
    parsed = Parsed({}, nsys_sqlite.describe_device(plan.devices, plan.gpu_devices), plan.meta.get("EXPORT_PRODUCT_VERSION"),
                    run={"program_command": command} if (command := nsys_sqlite.capture_command(plan.meta)) else {})
    children = _call_logs(path)
    if children:  # a `headcount run` raw folder: its ranks' call logs as the run would have read them
        with stack:
            return _from_raw_folder(path, sqlite, children, run_id, parsed)
    if len(plan.gpu_processes) > 1:  # ranks: one run each, as `headcount run` makes them
        parsed.runs = _nsys_runs(path, sqlite, plan, parsed, stack, options)
    else:
        parsed.stream = _nsys_stream(path, nsys_processes(sqlite, plan, options=options), plan, parsed.lines, parsed.notices)
        parsed.stream = _closing(parsed.stream, stack)
    return parsed


def _closing(stream, stack: ExitStack):
    with stack:
        yield from stream


def _nsys_stream(path: Path, parts, plan, lines: list[str], notices: list[str], what: str = ""):
    counts: dict = {}
    for name, frame in nsys_pieces(parts, devices=plan.devices, gpu_metrics=plan.gpu_metrics, release=True, notices=notices):
        tally(counts, name, frame)
        yield name, frame
        del frame  # the consumer is done with it: not held while the next process is built
    lines.extend(nsys_lines(f"{path}{what}", counts))


def _nsys_runs(path: Path, sqlite: Path, plan, whole: Parsed, stack: ExitStack, options: ReadOptions):
    """``(pid<pid>, Parsed)`` of each process of an export whose processes ran GPU work on their own."""
    with stack:
        for part in nsys_processes(sqlite, plan, options=options):
            pid = nsys_sqlite.process_of(part)
            run = Parsed({}, nsys_sqlite.describe_device(plan.devices, nsys_sqlite.devices_of(part)) or whole.device, whole.version,
                         run={**whole.run, **process_facts(pid, len(plan.gpu_processes))})
            run.stream = _nsys_stream(path, [part], plan, run.lines, run.notices, f" (process {pid})")
            del part  # held by the stream only: released once it is built
            yield f"pid{pid}", run


def _call_logs(path: Path) -> list[dict] | None:
    """The call logs beside an nsys report in a ``headcount run`` raw folder (``child-<pid>.json``), or None."""
    folder = path.parent if path.is_file() else None
    if folder is None or not any(folder.glob("child-*.json")):
        return None
    from headcount.build import run_folder

    return run_folder.read_children(folder) or None


def _from_raw_folder(path: Path, sqlite: Path, children: list[dict], run_id: str, whole: Parsed) -> Parsed:
    """The runs ``headcount run`` would have written from this raw folder (one per tagged rank, with its call log):
    a report made later from the raw files an interrupt kept has the tables the run would have given."""
    from headcount.build import run_folder

    ranks = run_folder.from_nsys(sqlite, children, run_id)
    parsed = [_rank_parsed(path, r, whole) for r in ranks]
    if len(ranks) == 1 and ranks[0].run_id == run_id:
        return parsed[0]
    whole.runs = iter([(r.run_id.removeprefix(f"{run_id}-"), p) for r, p in zip(ranks, parsed)])
    return whole


def _rank_parsed(path: Path, rank, whole: Parsed) -> Parsed:
    info = rank.info
    device = Device.from_dict(info.get("device")) or whole.device
    program = info.get("program") or {}
    run = {k: info.get(k) for k in ("pid", "rank", "world_size", "implementation", "complete", "ended_by", "argv")
           if info.get(k) is not None}
    run.update(steps=info.get("steps_seen"), torch=program.get("torch"), transformers=program.get("transformers"))
    line = f"{path}: a headcount run's raw files, rank {rank.rank}: {len(rank.tables.get('layers', []))} layer rows, read with its call log"
    return Parsed(rank.tables, device, whole.version, lines=[line],
                  notices=list(info.get("notices", [])), run=run)


def process_facts(pid, processes: int) -> dict:
    """What the run of one process of a recording of several says of itself (its runs row's ``pid``)."""
    return {"pid": pid, "processes_in_recording": processes}


def processes_line(path, runs: list[str]) -> str:
    """The progress line of a file whose processes became runs of their own."""
    return f"{path}: {len(runs)} processes ran GPU work: one run each ({', '.join(r.rsplit('-', 1)[1] for r in runs)})"


# Each reader below checks first that its file can be read (files.readable: one line, exit 2, whatever the format).
# A cut or partly unreadable recording is refused unless options.salvage: SQLite and .nsys-rep cannot be salvaged
# (SQLite refuses a malformed file, nsys will not export a cut report); ncu CSV, .ncu-rep and torch.profiler traces can.
def from_nsys_export(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    readable(path)  # a parquetdir export: the directory listed, each file opened
    return _nsys_file(path, nullcontext(path), options, run_id)


def from_nsys_rep(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    from headcount.parsers.nsys_rep import exported

    return _nsys_file(path, exported(path), options, run_id)


def _ncu_file(path: Path, run_id: str, options: ReadOptions, read) -> Parsed:
    readable(path)
    kernels = read(path)
    built = tables_from_ncu(kernels, run_id)
    device = ncu_metrics.run_device(kernels)
    k = built.tables["kernels"]
    pids = set(kernels["pid"].dropna().astype(str)) if "pid" in kernels else set()
    return Parsed(built.tables, device, None, [f"{path}: {len(k)} kernels, {int(k['incomplete'].sum())} incomplete, "
                                               f"{int(k['layer_name'].notna().sum())} in headcount's attention ranges"], built.notices,
                  run={"pid": pids.pop()} if len(pids) == 1 else {})  # the profiled process, where it was one


def from_ncu_csv(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    from headcount.parsers import ncu_csv

    return _ncu_file(path, run_id, options, lambda p: ncu_csv.read_csv(p, locale=options.locale, salvage=options.salvage))


def from_ncu_rep(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    from headcount.parsers import ncu_rep

    return _ncu_file(path, run_id, options, lambda p: ncu_rep.read_report(p, salvage=options.salvage))


def from_cupti_records(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    """The CUPTI collector's raw records (``cupti-records.jsonl.gz``), built as ``headcount run --backend cupti``
    builds them (:func:`headcount.build.run_folder.child_run`): a GPU run re-analysed anywhere into the tables
    the run gave. In a ``headcount run`` raw folder (``child-<pid>.json`` of the records' process beside them,
    or one folder up, as ``raw/cupti-<pid>/``) with that process's call log, rank and device; alone, without
    (no shapes: no FLOPs, no analytic bytes; no device: no theoretical occupancy)."""
    from headcount.build import run_folder
    from headcount.parsers import cupti_records

    header = cupti_records.read_header(path)
    child = _records_child(path, header)
    said: list = []
    rank = run_folder.child_run(child, run_id, said)
    for_run = [line for _, line in said]
    if child.get("argv") is not None:  # the run's own process report: as the run made it
        parsed = _rank_parsed(path, rank, Parsed({}, None, header.get("cupti_python")))
        parsed.notices = [*child["notices"], *for_run]
    else:
        kinds = rank.tables.get("kernels", pd.DataFrame(columns=["kind"]))["kind"].astype(object)
        line = (f"{path}: {int((kinds == 'kernel').sum())} kernels, {len(rank.tables.get('layers', []))} layer rows, "
                "CUPTI records without a call log (no shapes: FLOPs and analytic bytes unknown)")
        parsed = Parsed(rank.tables, None, header.get("cupti_python"), lines=[line], notices=list(dict.fromkeys(for_run)),
                        run={"pid": header.get("pid"), "implementation": rank.info.get("implementation"),
                             "complete": header.get("stats", {}).get("complete", True)})
    return parsed


def _records_child(path: Path, header: dict) -> dict:
    """The ``child-<pid>.json`` of the process that wrote the records at ``path`` (its records: ``path``), or
    a report standing in for one: no call log, no rank, no device."""
    from headcount.build import run_folder

    pid = header.get("pid")
    for folder in (path.parent, path.parent.parent):
        if pid is not None and (folder / f"child-{pid}.json").is_file():
            child = next((c for c in run_folder.read_children(folder) if c["pid"] == pid), None)
            if child is not None:
                return {**child, "records": str(path)}  # the raw folder may have moved since
    stopped = header.get("stats", {}).get("complete") is False  # the process was stopped mid-recording
    return {"pid": pid, "rank": None, "world_size": None, "records": str(path), "calls": [], "notices": [], "device": None,
            "nvtx_tagged": True, "ended_by": "signal (the records say the recording did not complete)" if stopped else "exit"}


def from_torch_trace(path: Path, run_id: str, options: ReadOptions) -> Parsed:
    """A torch.profiler trace: read a piece at a time (:class:`~headcount.parsers.kineto_steps.Pieces`),
    then built a group of whole steps at a time (:func:`headcount.build.kineto.kineto_pieces`) as the pieces
    are consumed."""
    from headcount.build.in_process import trace_samples
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers.kineto_steps import Pieces

    pieces = Pieces(path, salvage=options.salvage)
    try:
        pieces.read()
    except BaseException:
        pieces.close()
        raise
    device = kineto.run_device(pieces.described["devices"]) or Device("cpu")
    pieces.pm, said = trace_samples(pieces.counters, device)
    parsed = Parsed({}, device, None, notices=list(pieces.notices) + said, run=pieces.described["distributed"])
    parsed.stream = _torch_stream(path, pieces, parsed.lines, parsed.notices, parsed.run)
    return parsed


def _torch_stream(path: Path, pieces, lines: list[str], notices: list[str], run: dict):
    from headcount.build.kineto import kineto_pieces
    from headcount.build.shared import run_facts

    kernels, layers, calls = 0, pd.DataFrame(), {}
    with pieces:
        for name, frame in kineto_pieces(pieces.groups(), pieces.described["devices"], notices, launched=pieces.launched,
                                         found=calls, pm=pieces.pm):
            if name == "kernels":
                kernels += int(equals(frame["kind"], "kernel").sum())
            elif name == "layers":
                layers = frame  # small: one row per layer and phase
            yield name, frame
            del frame
    run.update(run_facts(calls["calls"]))  # known once every group is built: the runs row is written after the pieces
    lines.append(trace_line(path, kernels, layers, pieces))


def trace_line(path, kernels: int, layers: pd.DataFrame, pieces, workers: int = 1) -> str:
    """The progress line of a parsed torch.profiler trace: its kernels, its ``layers`` rows and how their calls were found."""
    found = signals.kinds_in(layers["signal"]) if "signal" in layers else []
    layer_rows = len(layers)
    how = f"found by {'/'.join(found)} names" if found else "from headcount's ranges"
    groups = f", attributed in {pieces.count} groups of steps" if pieces.count > 1 else ""
    on = f" ({workers} workers)" if workers > 1 else ""
    rank = pieces.described["distributed"].get("rank")
    return f"{path}: {kernels} kernels, {layer_rows} layer rows {how}{groups}{on}" + (f" (rank {rank})" if rank is not None else "")
