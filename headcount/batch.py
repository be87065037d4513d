"""Many recordings into one report: one run per file, each read, built and
staged on its own (:class:`headcount.reports.dataset.StagedRun`), here, in
parallel processes (``--jobs``) or as Ray tasks (``--executor ray``); the
caller commits the staged runs together (:func:`headcount.reports.dataset.commit`).

A file's failure comes back as a value (:class:`FileResult` with ``error``),
not an exception, so a pool or a cluster reports every file, and the caller
decides: write nothing, or (``--keep-going``) commit the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from headcount.errors import HeadcountError

PER_JOB_BYTES = 2 * 2**30  # what one parse may hold at its peak (the benchmark's ceiling)
WRITTEN = ("kernels", "ranges", "layers", "heads")


@dataclass
class FileResult:
    """What became of one file.

    Attributes:
        path: the input file; run_id: its run (staged under ``OUT/.staging-<run_id>`` when ``error`` is None).
        lines: one-line facts for the progress output; notices: what the reader should know.
        error, hint, exit_code: the :class:`~headcount.errors.HeadcountError` that stopped it, if any.
    """

    path: str
    run_id: str
    lines: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0


def stage_file(path: str, out: str, run_id: str, options: dict) -> FileResult:
    """Read ``path``, build its tables and stage them as run ``run_id`` under ``out``.

    Runs in this process, a worker process or a Ray task alike (arguments and
    result are plain values). Errors a user can cause come back in the result;
    anything else (a bug) raises.
    """
    from headcount import sources
    from headcount.reports import dataset
    from headcount.reports.metadata import run_metadata, runs_row

    try:
        source = sources.for_path(Path(path))
        result = source.parse(Path(path), run_id, options)
        # the device and program versions the recording names (null where it does not), never this machine's
        meta = run_metadata(run_id, source.name, result.version, "parse",
                            {"input": str(path), "implementation": "unknown", "notices": result.notices},
                            device=result.device or {"kind": "cuda", "name": None}, program={})
        with dataset.StagedRun(out, run_id, meta) as staged:
            for name, frame in result.pieces():
                if name in WRITTEN:
                    staged.write(name, frame)
                del frame  # not held while the next piece is built
            staged.write("runs", runs_row(meta))
    except HeadcountError as exc:
        message = exc.message if exc.message.startswith(str(path)) else f"{path}: {exc.message}"
        return FileResult(str(path), run_id, error=message, hint=exc.hint, exit_code=exc.exit_code)
    return FileResult(str(path), run_id, result.lines, result.notices)


def default_jobs(files: int) -> int:
    """Parallel parses by default: one per core, as many as memory holds
    (:data:`PER_JOB_BYTES` each, from ``MemAvailable``), at most one per file."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    by_memory = cores
    try:
        with open("/proc/meminfo") as fh:
            available = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
        by_memory = max(1, available // PER_JOB_BYTES)
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, min(files, cores, by_memory))


def run_files(files: list[tuple[str, str]], out: str, options: dict, jobs: int = 1, executor: str = "local",
              done: Callable[[FileResult], None] | None = None) -> list[FileResult]:
    """Stage every ``(path, run_id)`` of ``files`` under ``out``.

    Args:
        jobs: parallel worker processes (``executor`` ``local``); 1 parses here, one file after another.
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
        return _on_ray(files, out, options, done)
    if jobs <= 1 or len(files) == 1:
        results = []
        for path, run_id in files:
            results.append(stage_file(path, out, run_id, options))
            done(results[-1])
        return results
    import multiprocessing as mp
    import threading
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from headcount import sources  # noqa: F401 - imported once here, inherited by forked workers

    if threading.active_count() == 1:  # no thread whose locks a fork could inherit held: fork (starts in ms)
        context = mp.get_context("fork")
    else:  # a fresh single-threaded server forks the workers, with the heavy imports done once
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["headcount.batch", "headcount.sources", "headcount.build", "headcount.reports.dataset"])
    workers = min(jobs, len(files))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_share_cores,
                             initargs=(max(1, cores // workers),)) as pool:
        futures = {pool.submit(stage_file, path, out, run_id, options): i for i, (path, run_id) in enumerate(files)}
        results: list[FileResult | None] = [None] * len(files)
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done(results[futures[future]])
    return results


def _share_cores(threads: int) -> None:
    """In a worker process: read with ``threads`` threads (the workers share the cores)."""
    from headcount.parsers import nsys_sqlite

    nsys_sqlite.READ_THREADS = threads


def _on_ray(files, out, options, done) -> list[FileResult]:
    try:
        import ray
    except ImportError as exc:
        raise HeadcountError("--executor ray needs Ray", hint="pip install 'headcount[ray]'", exit_code=3) from exc
    started = False
    if not ray.is_initialized():
        try:  # RAY_ADDRESS names a cluster; without it Ray starts one on this machine
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HeadcountError(f"no Ray cluster at {os.environ.get('RAY_ADDRESS') or 'this machine'} ({exc})",
                                 hint="check RAY_ADDRESS, or unset it to start a local Ray", exit_code=3) from exc
        started = True
    try:
        task = ray.remote(stage_file)
        pending = {task.remote(path, str(Path(out).absolute()), run_id, options): i for i, (path, run_id) in
                   enumerate((str(Path(p).absolute()), r) for p, r in files)}
        results: list[FileResult | None] = [None] * len(files)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                results[i] = ray.get(ref)
                done(results[i])
        return results
    finally:
        if started:
            ray.shutdown()
