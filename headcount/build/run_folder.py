"""From what a ``headcount run`` recorded to one set of tables per rank.

Inputs are the raw folder's files: the tool's report (``.nsys-rep`` →
SQLite, or ``.ncu-rep``), the CUPTI records of each process (cupti backend)
or its torch.profiler trace (torch backend),
and the ``child-<pid>.json`` every tagged process wrote (rank, call log,
status; see :mod:`headcount.parsers.child_report`). Each tagged process becomes
one run, ``<run id>-rank<r>`` when there are several, so ranks live in their
own partitions of one dataset and are never mixed up. Parse → attribute →
derive are the shared ones of :mod:`headcount.build`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headcount.build import process_notices
from headcount.build.in_process import tables_from_cupti, tables_from_torch
from headcount.build.ncu import tables_from_ncu
from headcount.build.nsys import gathered, nsys_processes
from headcount.build.shared import implementation_of
from headcount.common.device import Device
from headcount.common.errors import HeadcountError, NothingRecorded, notice
from headcount.parsers import child_report, ncu_metrics, nsys_sqlite


@dataclass
class RankRun:
    """One process's tables and what the run metadata says about it."""

    run_id: str
    rank: int
    tables: dict[str, pd.DataFrame]
    info: dict = field(default_factory=dict)


def read_children(raw: Path) -> list[dict]:
    """The ``child-<pid>.json`` reports of a raw folder, by rank then pid."""
    children = []
    for path in sorted(raw.glob("child-*.json")):
        try:
            children.append(child_report.read_report(path))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise HeadcountError(f"{path}: unreadable ({type(exc).__name__}: {exc})", hint="the process died while writing it; run again") from exc
    children = [c for c in children if c.get("steps_seen", 0) > 0 or c.get("calls")]
    children.sort(key=lambda c: (c["rank"] if c["rank"] is not None else 1 << 30, c["pid"]))
    for i, child in enumerate(children):
        if child["rank"] is None:
            child["rank"] = i
    return children


def _run_ids(run_id: str, children: list[dict]) -> list[str]:
    if len(children) == 1 and not (children[0].get("world_size") or 1) > 1:
        return [run_id]
    return [f"{run_id}-rank{c['rank']}" for c in children]


def _info(child: dict) -> dict:
    keys = ("pid", "rank", "local_rank", "world_size", "steps_seen", "steps_selected", "complete", "ended_by", "notices", "argv",
            "device", "program")
    return {k: child.get(k) for k in keys}


def from_nsys(sqlite: Path, children: list[dict], run_id: str) -> list[RankRun]:
    """An nsys export (SQLite), one process at a time as ``headcount parse`` reads it
    (:func:`headcount.build.nsys.nsys_processes`): one run per tagged process, with its call log.

    Raises:
        HeadcountError: the export is unreadable, or holds neither NVTX ranges nor GPU activity.
    """
    plan = nsys_sqlite.plan_export(sqlite)
    if plan.empty:
        raise NothingRecorded("nsys recorded neither NVTX ranges nor GPU activity", hint="record with `nsys profile --trace=cuda,nvtx`")
    if not children:
        built = gathered(nsys_processes(sqlite, plan), run_id, devices=plan.devices, gpu_metrics=plan.gpu_metrics, release=True)
        return [RankRun(run_id, 0, built.tables, {"notices": ["no tagged process reported back: NVTX ranges only, no layers"]})]
    wanted = {str(child["pid"]): (child, rid) for child, rid in zip(children, _run_ids(run_id, children))}
    runs: dict[str, RankRun] = {}
    for part in nsys_processes(sqlite, plan):
        pid = nsys_sqlite.process_of(part)
        if pid not in wanted or not len(part.ranges):  # a process the program did not tag (a tool, a data loader)
            continue
        child, rid = wanted[pid]
        impl = implementation_of(child["calls"])
        built = gathered([part], rid, child["calls"], impl, Device.from_dict(child.get("device")), plan.devices, plan.gpu_metrics,
                         release=True)
        runs[pid] = RankRun(rid, child["rank"], built.tables, {**_info(child), "implementation": impl,
                                                               "notices": [*child["notices"], *built.notices]})
    return [runs.get(pid) or RankRun(rid, child["rank"], {}, {**_info(child), "notices": [
        *child["notices"], f"nsys recorded no NVTX range of process {pid}"]}) for pid, (child, rid) in wanted.items()]


def from_ncu(kernels: pd.DataFrame, children: list[dict], run_id: str) -> list[RankRun]:
    """ncu kernels (one run: ``.ncu-rep`` files carry no process id), with the
    analytic FLOPs and bytes of every logged call of the profiled steps."""
    calls = [c for child in children for c in child["calls"]]
    impl = implementation_of(calls)
    # the report's own device attributes first (exact for the profiled GPU), else what the program saw
    device = ncu_metrics.run_device(kernels) or next((Device.from_dict(c["device"]) for c in children if c.get("device")), None)
    tables = tables_from_ncu(kernels, run_id, calls=calls, device=device).tables
    info = {"notices": [], "processes": [_info(c) for c in children], "implementation": impl,
            "complete": all(c.get("complete", True) for c in children), "device": device.as_dict() if device else None,
            "program": next((c.get("program") for c in children if c.get("program")), None)}
    if len(children) > 1:
        info["notices"].append("several processes under ncu: one run (ncu reports carry no process id), ranks not split")
    return [RankRun(run_id, 0, tables, info)]


def from_in_process(children: list[dict], run_id: str) -> list[RankRun]:
    """Each process's own recording with its call log: CUPTI records (the cupti backend) or a torch.profiler
    trace (the torch backend)."""
    runs, said = [], []
    try:
        for child, rid in zip(children, _run_ids(run_id, children)):
            runs.append(child_run(child, rid, said))
    finally:  # once for all the ranks each applies to, also where a later rank's records fail
        for line in process_notices.merged(said):
            notice(line)
    return runs


def child_run(child: dict, rid: str, said: list) -> RankRun:
    """One process's run of :func:`from_in_process` (and of ``headcount parse`` of a records file: the same
    build), by the backend that recorded it; its notices go to ``said`` as ``(pid, notice)``."""
    info = _info(child)
    on_torch = child.get("backend") == "torch"
    if not child.get("records"):
        what = "torch.profiler trace" if on_torch else "CUPTI records"
        return RankRun(rid, child["rank"], {}, {**info, "notices": [*child["notices"], f"no {what} from this process"]})
    impl = implementation_of(child["calls"])
    device = Device.from_dict(child.get("device"))
    limits = device.limits() if device is not None else None
    if on_torch:
        built = tables_from_torch(child["records"], child["calls"], rid, impl, limits, device=device)
    else:
        built = tables_from_cupti(child["records"], child["calls"], rid, impl, limits,
                                  nvtx_tagged=child.get("nvtx_tagged", True), device=device,
                                  interrupted=str(child.get("ended_by") or "").startswith("signal"))
    said += [(child.get("pid"), line) for line in built.notices]
    # in the run's metadata as `headcount parse` of the same file would put them, not only printed
    info.update(implementation=impl, collector=built.info, notices=[*child["notices"], *built.notices])
    return RankRun(rid, child["rank"], built.tables, info)


def empty(tables: dict) -> bool:
    return not tables or not len(tables.get("layers", [])) and not len(tables.get("kernels", []))
