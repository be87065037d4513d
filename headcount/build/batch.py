"""Many recordings into one report: one run per file, each read, built and
staged on its own (:class:`headcount.store.dataset.StagedRun`), here, in
parallel processes (``--jobs``) or as Ray tasks (``--executor ray``); the
staged runs are committed together through the store's one write (:func:`parse_into` → :func:`headcount.store.dataset.write_runs`).

A large export of a source that can be split by process (nsys SQLite and
parquetdir) is split into shards across the worker processes
(:func:`stage_shard`); the parent then adds the run's ``layers``, ``heads``
and ``runs`` from what the shards return (:func:`_finish`).

A file's failure comes back as a value (:class:`FileResult` with ``error``),
not an exception, so a pool or a cluster reports every file, and the caller
decides: write nothing, or (``--keep-going``) commit the others.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from headcount.build import process_notices
from headcount.common import progress
from headcount.common.device import Device
from headcount.common.errors import HeadcountError
from headcount.common.tables import WRITTEN
from headcount.parsers.options import ReadOptions

PER_JOB_BYTES = 2 * 2**30  # what one parse may hold at its peak (the benchmark's ceiling)


@dataclass
class FileResult:
    """What became of one file.

    Attributes:
        path: the input file; run_id: its run (staged under ``OUT/.staging-<run_id>`` when ``error`` is None);
            runs: the runs staged there when the file held several (one per process; see :attr:`run_ids`).
        lines: one-line facts for the progress output; notices: what the reader should know.
        error, hint, exit_code: the :class:`~headcount.common.errors.HeadcountError` that stopped it, if any.
    """

    path: str
    run_id: str
    lines: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    runs: list[str] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        """The runs staged under ``.staging-<run_id>``: ``run_id`` itself, or one per process of a
        recording of several (``<run_id>-pid<pid>``)."""
        return self.runs or [self.run_id]


def stage_file(path: str, out: str, run_id: str, options: ReadOptions) -> FileResult:
    """Read ``path``, build its tables and stage them as run ``run_id`` under ``out`` (an export of several
    processes that ran GPU work: a run ``<run_id>-pid<pid>`` of each, staged side by side under ``run_id``).

    Runs in this process, a worker process or a Ray task alike (arguments and
    result are plain values). Errors a user can cause come back in the result;
    anything else (a bug) raises.
    """
    from headcount.build import parse_file, sources
    from headcount.common import env

    env.release_freed_memory()
    runs, lines, notices = [], [], []
    try:
        source = sources.for_path(Path(path))
        result = source.parse(Path(path), run_id, options)
        if result.runs is None:
            _stage(out, run_id, run_id, _metadata(path, run_id, source.name, result.version, result.device, result.notices,
                                                  result.run), result)
            return FileResult(str(path), run_id, result.lines, result.notices)
        for suffix, each in result.runs:  # one run per process, staged side by side
            runs.append(f"{run_id}-{suffix}")
            _stage(out, runs[-1], run_id, _metadata(path, runs[-1], source.name, each.version, each.device, each.notices, each.run),
                   each)
            lines += each.lines
            notices += [(each.run["pid"], n) for n in each.notices]
    except HeadcountError as exc:
        return FileResult(str(path), run_id, **_failure(path, exc))
    lines.append(parse_file.processes_line(path, runs))
    return FileResult(str(path), run_id, lines, process_notices.merged(notices), runs=runs)


def _stage(out: str, run_id: str, staging: str, meta: dict, parsed) -> None:
    """Stage ``parsed``'s tables and runs row as run ``run_id`` under ``.staging-<staging>``."""
    from headcount.store import dataset
    from headcount.store.metadata import runs_row

    with dataset.StagedRun(out, run_id, meta, staging=staging) as staged:
        for name, frame in parsed.pieces():
            if name in WRITTEN:
                staged.write(name, frame)
            del frame  # not held while the next piece is built
        meta.update(parsed.run)  # what the build learnt of the run while streaming (a trace's calls: dtype, batch, seq)
        staged.write("runs", runs_row(meta))


def _failure(path, exc: HeadcountError) -> dict:
    """A result's error fields from ``exc``, its message naming the file once."""
    message = exc.message if exc.message.startswith(str(path)) else f"{path}: {exc.message}"
    return {"error": message, "hint": exc.hint, "exit_code": exc.exit_code}


SHARD_ROWS = 1_000_000  # NVTX rows from which one nsys export is split across the worker processes


@dataclass
class ShardResult:
    """What a worker made of one shard of a large export: its attention ranges and row counts, or an error.
    An export whose processes are runs of their own (:attr:`processes`): each process's attention ranges,
    steps rows and GPUs by process id instead."""

    attention: object = None
    steps: object = None
    counts: dict = field(default_factory=dict)
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    processes: dict | None = None


def process_meta(meta: dict, run_id: str, pid: str, device, processes: int) -> dict:
    """The metadata of the run of process ``pid`` of a file whose processes are runs of their own
    (the sharded path's; :func:`headcount.build.parse_file.process_facts` as the one-worker path)."""
    from headcount.build.parse_file import process_facts

    return {**meta, "run_id": run_id, **process_facts(pid, processes), **({"device": device.as_dict()} if device is not None else {})}


def stage_shard(path: str, out: str, run_id: str, meta: dict, shard: int, shards: int, plan, options: ReadOptions) -> ShardResult:
    """Attribute and stage one shard of a large nsys export (:func:`headcount.build.nsys.nsys_shard`)
    as the pieces ``part-s<shard>`` of run ``run_id``; the parent finishes the run. Where the
    export's processes are runs of their own, each process is staged as its run's pieces."""
    from headcount.build import parse_file
    from headcount.build.nsys import nsys_shard
    from headcount.common import env
    from headcount.store import dataset

    env.release_freed_memory()
    counts: dict = {}
    attention, steps = None, []
    if len(plan.gpu_processes) > 1:
        return _stage_shard_processes(path, out, run_id, meta, shard, shards, plan, options)
    try:
        with dataset.StagedRun(out, run_id, meta, part=f"s{shard}", manifest=False) as staged:
            for name, frame in nsys_shard(Path(path), plan, shard, shards, options):
                parse_file.tally(counts, name, frame)
                if name == "attention":
                    attention = frame
                else:
                    staged.write(name, frame)
                if name == "steps":  # a few rows per process: the parent's findings need them
                    steps.append(frame)
                del frame
    except HeadcountError as exc:
        return ShardResult(**_failure(path, exc))
    return ShardResult(attention, steps, counts)


def _stage_shard_processes(path: str, out: str, run_id: str, meta: dict, shard: int, shards: int, plan,
                           options: ReadOptions) -> ShardResult:
    """:func:`stage_shard` of an export whose processes are runs of their own (``<run_id>-pid<pid>``)."""
    from headcount.build import parse_file
    from headcount.build.nsys import nsys_processes, process_pieces
    from headcount.parsers import nsys_sqlite
    from headcount.store import dataset

    counts: dict = {}
    processes: dict = {}
    try:
        for part in nsys_processes(Path(path), plan, (shard, shards), options):
            pid = nsys_sqlite.process_of(part)
            used = nsys_sqlite.devices_of(part)
            attention, steps = [], []
            sub = f"{run_id}-pid{pid}"
            each = process_meta(meta, sub, pid, nsys_sqlite.describe_device(plan.devices, used), len(plan.gpu_processes))
            with dataset.StagedRun(out, sub, each, part=f"s{shard}", manifest=False, staging=run_id) as staged:
                for name, frame in process_pieces([part], None, "unknown", plan.devices, plan.gpu_metrics, attention, set(),
                                                         release=True, steps=steps):
                    parse_file.tally(counts, name, frame)
                    staged.write(name, frame)
                    del frame
            processes[pid] = (attention, steps, used)
            del part
    except HeadcountError as exc:
        return ShardResult(**_failure(path, exc))
    return ShardResult(counts=counts, processes=processes)


def _shards(path: str, jobs: int):
    """``(shards, plan)``: the worker processes one file is split across and its plan: ``jobs``
    for a large nsys export (its processes never span two shards; the plan an
    :class:`~headcount.parsers.nsys_sqlite.ExportPlan`) or a large plain torch.profiler trace
    (read in spans; the plan a list of :class:`~headcount.parsers.kineto_json.Span`), else 1."""
    from headcount.build import sources  # noqa: F401
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers import nsys_sqlite

    if jobs <= 1:
        return 1, None
    try:
        source = sources.for_path(Path(path))
        if source.name == "torch" and Path(path).is_file():
            spans = kineto.spans(path, jobs)
            return (len(spans), spans) if spans else (1, None)
        if not source.splits or nsys_sqlite.size_of(path) < SHARD_ROWS:
            return 1, None
        plan = nsys_sqlite.plan_export(path)
        if plan.empty:
            return 1, None
    except HeadcountError:
        return 1, None  # the file's own task reports the error
    return jobs, plan


def read_span(path: str, span, directory: str):
    """Read one span of a large torch.profiler trace (:class:`~headcount.parsers.kineto_json.Span`), every
    piece written to ``directory``, for the parent to gather (:meth:`~headcount.parsers.kineto_steps.Pieces.add`).
    ``None`` where the span cannot be read (misaligned bounds, a damaged file): the parent then reads the
    file whole, which names the problem."""
    from headcount.common import env
    from headcount.parsers.kineto_steps import Pieces

    env.release_freed_memory()
    try:
        return Pieces(path, held_bytes=0, directory=directory).read(span)
    except HeadcountError:
        return None


@dataclass
class GroupsResult:
    """What a worker made of some groups of a trace's steps: what the whole trace's tables need of each, or an error."""

    parts: list = field(default_factory=list)
    kernels: int = 0
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0


def stage_groups(path: str, out: str, run_id: str, meta: dict, pieces, which: list[int], worker: int) -> GroupsResult:
    """Build and stage the groups ``which`` of a trace read in spans (:func:`headcount.build.kineto.kineto_group_pieces`)
    as the pieces ``part-g<worker>`` of run ``run_id``; the parent finishes the run."""
    from headcount.build.kineto import kineto_group_pieces
    from headcount.common import env
    from headcount.common.arrays import equals
    from headcount.parsers import kineto_json as kineto
    from headcount.store import dataset

    env.release_freed_memory()
    result = GroupsResult()
    device = kineto.run_device(pieces.described["devices"])
    try:
        with dataset.StagedRun(out, run_id, meta, part=f"g{worker}", manifest=False) as staged:
            for group, events in pieces.groups(which):
                for name, frame in kineto_group_pieces(events, group, device, pieces.launched, result.parts, pieces.pm):
                    if name == "kernels":
                        result.kernels += int(equals(frame["kind"], "kernel").sum())
                    staged.write(name, frame)
                    del frame
                del events
    except HeadcountError as exc:
        return GroupsResult(**_failure(path, exc))
    return result


def _stage_trace_in_spans(pool, slot: int, path: str, out: str, run_id: str, spans: list, options: ReadOptions) -> FileResult:
    """A large torch.profiler trace (input ``slot`` of the progress count) across the pool's workers: its spans read in parallel into one
    temporary directory, cut into groups of steps here, the groups built and staged in parallel,
    then the whole trace's layers, heads, findings and runs rows here. A span that cannot be read
    (bounds inside a string, a damaged file): the file is read whole by one worker instead."""
    import shutil
    import tempfile

    from headcount.build import parse_file
    from headcount.build.in_process import trace_samples
    from headcount.build.kineto import kineto_aggregates
    from headcount.build.shared import run_facts
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers.kineto_steps import Pieces
    from headcount.store import dataset, input_digest
    from headcount.store.metadata import runs_row

    directory = tempfile.mkdtemp(prefix="headcount-trace-")
    try:
        reads = [pool.submit(progress.task, slot, read_span, path, span, directory) for span in spans]
        input_digest.hash_ahead([path])  # the runs row's hash, beside the reads rather than after them (the pool has forked)
        parts = [f.result() for f in reads]
        if any(part is None for part in parts):
            return pool.submit(progress.task, slot, stage_file, path, out, run_id, options).result()
        pieces = Pieces(path, directory=directory)
        for part in parts:
            pieces.add(part)
        del parts
        try:
            pieces.cut()
        except HeadcountError as exc:
            return FileResult(path, run_id, **_failure(path, exc))
        device = kineto.run_device(pieces.described["devices"])
        pieces.pm, said = trace_samples(pieces.counters, device)
        pieces.counters = []  # the workers get the samples, not the events they were made of
        notices = list(pieces.notices) + said
        meta = _metadata(path, run_id, "torch", None, device or Device("cpu"), notices, pieces.described["distributed"])
        which = [list(range(k, pieces.count, len(spans))) for k in range(min(len(spans), pieces.count))]  # round robin
        results = [f.result() for f in [pool.submit(stage_groups, path, out, run_id, meta, pieces, mine, k) for k, mine in enumerate(which)]]
        failed = next((r for r in results if r.error), None)
        if failed:
            return FileResult(path, run_id, error=failed.error, hint=failed.hint, exit_code=failed.exit_code)
        groups = sorted((part for r in results for part in r.parts), key=lambda part: part.group)
        whole = kineto_aggregates(groups, device, notices, pieces.pm)  # its notices go to the list the metadata holds
        meta.update(run_facts(whole["calls"]))
        with dataset.StagedRun(out, run_id, meta) as staged:
            for name in ("steps", "layers", "heads", "findings"):  # steps: the work outside every step
                staged.write(name, whole[name])
            staged.write("runs", runs_row(meta))
    except HeadcountError as exc:
        return FileResult(path, run_id, **_failure(path, exc))
    except BaseException:
        end_workers(pool)  # before the directory goes: no worker writes into it afterwards
        raise
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    line = parse_file.trace_line(path, sum(r.kernels for r in results), whole["layers"], pieces, len(spans))
    return FileResult(path, run_id, [line], notices)


def _metadata(path: str, run_id: str, source: str, version, device, notices: list[str], run: dict | None = None) -> dict:
    """The run metadata of a parsed file: the device and versions the recording names, never this machine's
    (``run``: what else the file says of its run, e.g. its rank, its program); the file itself by its path as
    given, its size and its SHA-256 (:func:`headcount.store.metadata.input_facts`: hashed once per file and
    process, 1 MiB at a time)."""
    from headcount.store.metadata import input_facts, run_metadata

    return run_metadata(run_id, source, version, "parse",
                        {"input": str(path), **input_facts(path), "implementation": "unknown", "notices": notices, **(run or {})},
                        device=device or Device("cuda"), program={})


def _finish(path: str, run_id: str, out: str, meta: dict, parts: list[ShardResult], plan=None) -> FileResult:
    """The shards of one file are staged: add its layers, heads, findings and runs rows (or report the first error)."""
    from headcount.build import parse_file
    from headcount.build.nsys import nsys_aggregates
    from headcount.build.shared import run_findings
    from headcount.store import dataset
    from headcount.store.metadata import runs_row

    failed = next((r for r in parts if r.error), None)
    if failed:
        return FileResult(path, run_id, error=failed.error, hint=failed.hint, exit_code=failed.exit_code)
    counts = {k: sum(r.counts.get(k, 0) for r in parts) for k in ("kernels", "ranges", "attributed")}
    if any(r.processes is not None for r in parts):
        return _finish_processes(path, run_id, out, meta, parts, counts, plan)
    try:
        layers, heads = nsys_aggregates([r.attention for r in parts], None, Device.from_dict(meta.get("device")))
        findings = run_findings([f for r in parts for f in (r.steps or [])], layers, heads)
        with dataset.StagedRun(out, run_id, meta) as staged:
            staged.write("layers", layers)
            staged.write("heads", heads)
            staged.write("findings", findings)
            staged.write("runs", runs_row(meta))
    except HeadcountError as exc:
        return FileResult(path, run_id, **_failure(path, exc))
    return FileResult(path, run_id, parse_file.nsys_lines(path, counts, f" ({len(parts)} shards in parallel)"))


def _finish_processes(path: str, run_id: str, out: str, meta: dict, parts: list[ShardResult], counts: dict, plan) -> FileResult:
    """:func:`_finish` of an export whose processes are runs of their own: each run's layers, heads, findings and runs rows."""
    from headcount.build import parse_file
    from headcount.build.nsys import nsys_aggregates
    from headcount.build.shared import note_no_attention, run_findings
    from headcount.parsers import nsys_sqlite
    from headcount.store import dataset
    from headcount.store.metadata import runs_row

    processes = {pid: got for r in parts for pid, got in (r.processes or {}).items()}
    runs, notices = [], []
    try:
        for pid in sorted(processes, key=lambda p: int(p) if str(p).isdigit() else str(p)):
            attention, steps, used = processes[pid]
            sub = f"{run_id}-pid{pid}"
            device = nsys_sqlite.describe_device(plan.devices, used)
            each = process_meta(meta, sub, pid, device, len(processes))
            found: list[str] = []
            layers, heads = nsys_aggregates(attention, None, Device.from_dict(each.get("device")))
            note_no_attention(layers, found)
            each["notices"] = [*each.get("notices", []), *found]
            findings = run_findings(steps, layers, heads)
            with dataset.StagedRun(out, sub, each, staging=run_id) as staged:
                staged.write("layers", layers)
                staged.write("heads", heads)
                staged.write("findings", findings)
                staged.write("runs", runs_row(each))
            runs.append(sub)
            notices += [(pid, n) for n in found]
    except HeadcountError as exc:
        return FileResult(path, run_id, **_failure(path, exc))
    lines = parse_file.nsys_lines(path, counts, f" ({len(parts)} shards in parallel)")
    lines.append(parse_file.processes_line(path, runs))
    return FileResult(path, run_id, lines, process_notices.merged(notices), runs=runs)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_jobs() -> int:
    """Parallel parses by default: one per core, as many as memory holds
    (:data:`PER_JOB_BYTES` each, from ``MemAvailable``)."""
    cores = _cores()
    by_memory = cores
    try:
        with open("/proc/meminfo") as fh:
            available = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
        by_memory = max(1, available // PER_JOB_BYTES)
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, min(cores, by_memory))  # not capped by the files: a large export is split across workers


@dataclass
class Split:
    """How :func:`run_files` spreads its files: ``shards`` per file (``(m, plan)``
    of :func:`_shards`) and the worker processes started (1: none, parsed here)."""

    shards: list
    workers: int


def split(files: list[tuple[str, str]], jobs: int) -> Split:
    """The worker processes ``files`` take with at most ``jobs`` of them: one per
    file or per shard of a large nsys export, never more than there is work for."""
    shards = [_shards(path, jobs) for path, _ in files]
    workers = min(jobs, sum(m for m, _ in shards)) if jobs > 1 else 1
    return Split(shards, workers)


def run_files(files: list[tuple[str, str]], out: str, options: ReadOptions, jobs: int = 1, executor: str = "local",
              done: Callable[[FileResult], None] | None = None, plan: Split | None = None) -> list[FileResult]:
    """Stage every ``(path, run_id)`` of ``files`` under ``out``.

    Args:
        jobs: parallel worker processes (``executor`` ``local``); 1 parses here, one file after another.
        plan: :func:`split` of ``files`` and ``jobs``, when the caller made it already.
        executor: ``local``, or ``ray``: one Ray task per file on the cluster at
            ``RAY_ADDRESS`` (else a local Ray started here); ``out`` must be a
            path every node sees (a shared file system).
        done: called with each result as it arrives (progress output).

    Returns:
        The results, in the order of ``files``.

    Raises:
        HeadcountError: ``ray`` is not installed or no cluster can be reached.
    """
    done = done or (lambda result: None)
    if executor == "ray":
        progress.workers_started()  # none here: the tasks run on the cluster
        return _on_ray(files, out, options, done)
    plan = plan or split(files, jobs)
    shards, workers = plan.shards, plan.workers
    if workers <= 1:
        progress.workers_started()
        results = []
        for i, (path, run_id) in enumerate(files):
            results.append(progress.task(i, stage_file, path, out, run_id, options))
            done(results[-1])
        return results
    from concurrent.futures import as_completed

    context = _pool_context(nsys=any(_may_be_nsys(path) for path, _ in files))
    from headcount.parsers import nsys_sqlite

    results: list[FileResult | None] = [None] * len(files)
    options = replace(options, threads=max(1, _cores() // workers))  # the workers share the cores
    with _pool(workers, context) as pool:
        futures, metas, parts, traces = {}, {}, {}, []
        for i, ((path, run_id), (m, export_plan)) in enumerate(zip(files, shards)):
            if m == 1:
                futures[pool.submit(progress.task, i, stage_file, path, out, run_id, options)] = (i, None)
                continue
            if isinstance(export_plan, list):  # a large torch.profiler trace: read in spans once the pool is fed
                traces.append((i, export_plan))
                continue
            device = nsys_sqlite.describe_device(export_plan.devices, export_plan.gpu_devices)
            metas[i] = _metadata(path, run_id, "nsys", export_plan.meta.get("EXPORT_PRODUCT_VERSION"), device, [])
            parts[i] = []
            for k in range(m):
                futures[pool.submit(progress.task, i, stage_shard, path, out, run_id, metas[i], k, m, export_plan, options)] = (i, k)
        for i, spans in traces:
            results[i] = _stage_trace_in_spans(pool, i, files[i][0], out, files[i][1], spans, options)
            done(results[i])
        for future in as_completed(futures):
            i, k = futures[future]
            if k is None:
                results[i] = future.result()
            else:
                parts[i].append(future.result())
                if len(parts[i]) < shards[i][0]:
                    continue
                results[i] = _finish(files[i][0], files[i][1], out, metas[i], parts[i], shards[i][1])
            done(results[i])
    return results


def _may_be_nsys(path: str) -> bool:
    """Whether ``path`` may be read by the nsys route (a name no source reads: its error comes later)."""
    from headcount.build import sources

    try:
        return sources.for_path(Path(path)).name == "nsys"
    except HeadcountError:
        return False


@contextmanager
def _pool(workers: int, context):
    """A pool of ``workers`` processes (:func:`headcount.common.stopping.worker_init`: they leave stopping to this
    process, and die with it). Leaving it by an exception (Ctrl-C, SIGTERM, SIGHUP, a bug) kills the workers and
    waits until they are gone, before anything staged is removed: no worker outlives the command, nor writes
    into a staging folder after it was discarded."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init, initargs=(progress.shared(context),))
    try:
        pool.submit(int)  # with fork, the first task starts every worker at once: none is forked after this
        progress.workers_started()
        yield pool
    except BaseException:
        end_workers(pool)
        raise
    pool.shutdown(wait=True)


def _worker_init(counts) -> None:
    """What a worker process does first: leave stopping to its parent, count what it reads into ``counts``."""
    from headcount.common import stopping

    stopping.worker_init()
    progress.attach(counts)


def end_workers(pool) -> None:
    """Kill the pool's worker processes, cancel what is queued, and wait until the workers are gone."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public way to end workers before 3.14
    for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=10)


def _pool_context(nsys: bool = True):
    """The multiprocessing context the workers start from: ``fork`` where no thread could hold a lock the
    fork would inherit, else a ``forkserver`` preloaded with the heavy imports (``nsys``: an input may be
    an nsys export: its SQLite driver too)."""
    import multiprocessing as mp
    import threading

    from headcount.store import input_digest

    input_digest.pause()  # no thread lives through the fork: the inputs' hashing ahead stops (and goes on later)
    # imported once here, inherited by forked workers (each would otherwise import them on its first file)
    if nsys:
        import adbc_driver_sqlite.dbapi  # noqa: F401 - the nsys reader's driver (0.15 s: it imports polars)

    import headcount.build.kineto  # noqa: F401
    import headcount.build.nsys  # noqa: F401
    from headcount.build import sources  # noqa: F401
    from headcount.parsers import kineto_steps  # noqa: F401
    from headcount.store import dataset, metadata  # noqa: F401

    if threading.active_count() == 1:  # no thread whose locks a fork could inherit held: fork (starts in ms)
        context = mp.get_context("fork")
    else:  # a fresh single-threaded server forks the workers, with the heavy imports done once
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["headcount.build.batch", "headcount.build.sources", "headcount.build.kineto",
                                        "headcount.build.nsys", "headcount.store.dataset",
                                        "adbc_driver_sqlite.dbapi"])
    return context


def _on_ray(files, out, options, done) -> list[FileResult]:
    try:
        import ray
    except ImportError as exc:
        raise HeadcountError("--executor ray needs Ray", hint="pip install 'headcount[ray]'", exit_code=3) from exc
    import signal
    import threading

    from headcount.common import stopping

    started = False
    if not ray.is_initialized():
        ours = {each: signal.getsignal(each) for each in (signal.SIGINT, *stopping.HANDLED)}
        try:  # RAY_ADDRESS names a cluster; without it Ray starts one on this machine
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HeadcountError(f"no Ray cluster at {os.environ.get('RAY_ADDRESS') or 'this machine'} ({exc})",
                                 hint="check RAY_ADDRESS, or unset it to start a local Ray", exit_code=3) from exc
        finally:  # Ray installs its own (a SIGTERM would end the command at once, tasks running, staging left)
            for each, handler in ours.items():
                if handler is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(each, handler)
        started = True
    try:
        task = ray.remote(stage_file)
        pending = {task.remote(path, str(Path(out).absolute()), run_id, options): i for i, (path, run_id) in
                   enumerate((str(Path(p).absolute()), r) for p, r in files)}
        results: list[FileResult | None] = [None] * len(files)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    i = pending.pop(ref)
                    results[i] = ray.get(ref)
                    done(results[i])
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: no task goes on writing into the report's staging
            # a Ray this command started is shut down below, its workers with it; a force-cancel of a task that was
            # just completing aborted the whole command inside Ray ("Check failed: … Tried to complete task that was
            # not pending", task_manager.cc, seen once in the suite): only a cluster's tasks are cancelled one by one
            if not started:
                for ref in pending:
                    ray.cancel(ref, force=True)
            raise
        return results
    finally:
        if started:
            ray.shutdown()


def parse_into(out: str | Path, files: list[tuple[str, str]], options: ReadOptions, jobs: int, executor: str = "local",
               done: Callable[[FileResult], None] = lambda result: None, plan: Split | None = None, keep_going: bool = False,
               append: bool = False, force: bool = False) -> list[FileResult]:
    """``headcount parse``'s work, for it and for ``headcount diff``'s recordings: every ``(path, run_id)``
    read and staged (:func:`run_files`), then all committed together through the store's one write
    (:func:`headcount.store.dataset.write_runs`); a failure writes nothing, unless ``keep_going``
    (then the files that parsed are committed and the failures come back in the results).

    Returns:
        Every file's :class:`FileResult`, in the order they finished.

    Raises:
        HeadcountError: a file failed and ``keep_going`` is false ("nothing was written", its hint and exit code);
            the report cannot be written.
    """
    from headcount.store import dataset, input_digest

    results: list[FileResult] = []
    input_digest.hash_ahead([path for path, _ in files])  # the runs rows' hashes, while the parse starts

    def stage() -> dataset.Staged | None:
        results.extend(run_files(files, str(out), options, jobs=jobs, executor=executor, done=done, plan=plan))
        failed = [r for r in results if r.error]
        if failed and not keep_going:
            first = failed[0]
            others = f"; {len(failed) - 1} more file(s) failed" if len(failed) > 1 else ""
            raise HeadcountError(f"{first.error}{others}; nothing was written", hint=first.hint, exit_code=first.exit_code or 2)
        good = [r for r in results if not r.error]
        # one run per file, or per process of a file, staged under the file's id
        return dataset.Staged([run for r in good for run in r.run_ids], [r.run_id for r in good]) if good else None

    try:
        dataset.write_runs(out, [run_id for _, run_id in files], stage, append=append, force=force)
    finally:
        input_digest.pause()
    return results
