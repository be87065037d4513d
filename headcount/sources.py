"""The registry of sources: which recorders run in-process, which tools
``headcount run`` wraps, and which files ``headcount parse`` reads.

The CLI's ``--backend`` choices, the API's backend names and the parse
dispatch all read this module; adding a file format is one parser module,
one build function in :mod:`headcount.pipeline` and one :class:`FileSource`
entry here (see ``docs/adding-a-source.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from headcount.errors import HeadcountError

# in-process recorders (AttentionProfiler, headcount profile): name → what it gives
RECORDERS = {
    "torch": "torch.profiler: operator and kernel times, any machine",
    "cupti": "in-process CUPTI: kernels, launch latency, occupancy, PM-sampled DRAM traffic (NVIDIA GPU)",
}
# headcount run's recorders (a tool around the program, or the in-process collector in it)
WRAPPERS = {
    "nsys": "Nsight Systems: timeline, kernels, NVTX, GPU metrics",
    "ncu": "Nsight Compute: exact per-kernel counters",
    "cupti": "the in-process collector in each process",
}


@dataclass
class Parsed:
    """One file read and built: the tables of one run and what the run metadata needs.

    Attributes:
        tables: ``kernels``, ``ranges``, ``layers``, ``heads`` (and whatever else the build gives).
        device: the recording's device (``None``: the file does not say).
        version: the recording tool's version, where the file says.
        lines: one-line facts for the progress output.
        notices: what the reader should know (printed as notices, kept in the metadata).
    """

    tables: dict[str, pd.DataFrame]
    device: dict | None = None
    version: str | None = None
    lines: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FileSource:
    """A file format ``headcount parse`` reads.

    Attributes:
        name: the ``runs.source`` value (``nsys``, ``ncu``, ``torch``).
        label: what the file is, for messages.
        suffixes: lower-case name endings it is chosen by (a directory: ``directory``).
        parse: ``(path, run_id, options) → Parsed``; raises HeadcountError on bad input.
    """

    name: str
    label: str
    suffixes: tuple[str, ...]
    parse: Callable[[Path, str, dict], Parsed]
    directory: bool = False


def _nsys(path: Path, run_id: str, options: dict, read) -> Parsed:
    from headcount.parsers.nsys_sqlite import run_device
    from headcount.pipeline import add_roofline, tables_from_nsys

    export = read(path)
    tables = tables_from_nsys(export, run_id)
    device = run_device(export)
    add_roofline(tables, device)
    lines = [f"{path}: {len(tables['kernels'])} GPU operations, {len(tables['ranges'])} NVTX ranges"]
    if not (tables["ranges"]["gpu_op_count"] > 0).any():
        lines.insert(0, f"{path}: no GPU operation was launched inside an NVTX range")
    return Parsed(tables, device, export["meta"].get("EXPORT_PRODUCT_VERSION"), lines)


def _nsys_export(path: Path, run_id: str, options: dict) -> Parsed:
    from headcount.parsers.nsys_sqlite import read_export

    return _nsys(path, run_id, options, read_export)


def _nsys_rep(path: Path, run_id: str, options: dict) -> Parsed:
    from headcount.parsers.nsys_rep import read_report

    return _nsys(path, run_id, options, read_report)


def _ncu(path: Path, run_id: str, options: dict, read) -> Parsed:
    from headcount.parsers import ncu_metrics
    from headcount.pipeline import add_roofline, tables_from_ncu

    kernels = read(path)
    tables = tables_from_ncu(kernels, run_id)
    device = ncu_metrics.run_device(kernels)
    add_roofline(tables, device)
    k = tables["kernels"]
    return Parsed(tables, device, None, [f"{path}: {len(k)} kernels, {int(k['incomplete'].sum())} incomplete, "
                                         f"{int(k['layer_name'].notna().sum())} in headcount's attention ranges"])


def _ncu_csv(path: Path, run_id: str, options: dict) -> Parsed:
    from headcount.parsers import ncu_csv

    return _ncu(path, run_id, options, lambda p: ncu_csv.read_csv(p, locale=options.get("locale")))


def _ncu_rep(path: Path, run_id: str, options: dict) -> Parsed:
    from headcount.parsers import ncu_rep

    return _ncu(path, run_id, options, ncu_rep.read_report)


def _torch_trace(path: Path, run_id: str, options: dict) -> Parsed:
    from headcount.parsers import kineto
    from headcount.pipeline import tables_from_kineto

    trace = kineto.read_trace(path)
    tables, notices = tables_from_kineto(trace, run_id)
    device = kineto.run_device(trace["devices"]) or {"kind": "cpu", "name": None}
    layers = tables["layers"]
    how = "from nn.Module ranges" if len(layers) and (layers["provenance"] == "module ranges").any() else "from headcount's ranges"
    return Parsed(tables, device, None, [f"{path}: {int((tables['kernels']['kind'] == 'kernel').sum())} kernels, "
                                         f"{len(layers)} layer rows {how}"], notices)


FILE_SOURCES: list[FileSource] = [
    FileSource("nsys", "nsys SQLite export", (".sqlite", ".sqlite3", ".db"), _nsys_export),
    FileSource("nsys", "nsys parquetdir export", (), _nsys_export, directory=True),
    FileSource("nsys", ".nsys-rep report (exported by the nsys on PATH)", (".nsys-rep",), _nsys_rep),
    FileSource("ncu", "ncu CSV export (raw or details page)", (".csv",), _ncu_csv),
    FileSource("ncu", ".ncu-rep report (read with ncu_report)", (".ncu-rep",), _ncu_rep),
    FileSource("torch", "torch.profiler trace (Chrome JSON, plain or gzip)", (".json", ".json.gz"), _torch_trace),
]


def supported() -> str:
    """The formats ``headcount parse`` reads, for help texts and errors."""
    return ", ".join(f"{s.label} ({'a directory' if s.directory else ', '.join(s.suffixes)})" for s in FILE_SOURCES)


def for_path(path: Path) -> FileSource:
    """The file source that reads ``path`` (by its name's ending, or a directory).

    Raises:
        HeadcountError: no source reads it.
    """
    if path.is_dir():
        return next(s for s in FILE_SOURCES if s.directory)
    name = path.name.lower()
    matches = [s for s in FILE_SOURCES if any(name.endswith(suffix) for suffix in s.suffixes)]
    if not matches:
        suffix = path.suffix.lower() or "this"
        raise HeadcountError(f"{path}: {suffix} input is not supported yet", hint=f"supported: {supported()}")
    return max(matches, key=lambda s: max(len(x) for x in s.suffixes if name.endswith(x)))
