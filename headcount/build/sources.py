"""The registry of sources: which recorders run in-process, which tools
``headcount run`` wraps, and which files ``headcount parse`` reads.

The CLI's ``--backend`` choices, the API's backend names and the parse
dispatch all read this module; adding a file format is one parser module,
one route module of :mod:`headcount.build` and one :class:`FileSource`
entry here (see ``docs/adding-a-source.md``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from headcount.build import parse_file
from headcount.common.errors import HeadcountError
from headcount.parsers.options import ReadOptions

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


@dataclass(frozen=True)
class FileSource:
    """A file format ``headcount parse`` reads.

    Attributes:
        name: the ``runs.source`` value (``nsys``, ``ncu``, ``torch``).
        label: what the file is, for messages.
        suffixes: lower-case name endings it is chosen by (a directory: ``directory``).
        parse: ``(path, run_id, options) →`` :class:`headcount.build.parse_file.Parsed` (``options``: a
            :class:`~headcount.parsers.options.ReadOptions`); raises HeadcountError on bad input.
        directory: the format is a directory.
        splits: a large file can be split by process across workers (:func:`headcount.build.nsys.nsys_shard`).
    """

    name: str
    label: str
    suffixes: tuple[str, ...]
    parse: Callable[[Path, str, ReadOptions], parse_file.Parsed]
    directory: bool = False
    splits: bool = False


FILE_SOURCES: list[FileSource] = [
    FileSource("nsys", "nsys SQLite export", (".sqlite", ".sqlite3", ".db"), parse_file.from_nsys_export, splits=True),
    FileSource("nsys", "nsys parquetdir export", (), parse_file.from_nsys_export, directory=True, splits=True),
    FileSource("nsys", ".nsys-rep report (exported by the nsys on PATH)", (".nsys-rep",), parse_file.from_nsys_rep),
    FileSource("ncu", "ncu CSV export (raw or details page)", (".csv",), parse_file.from_ncu_csv),
    FileSource("ncu", ".ncu-rep report (read with ncu_report)", (".ncu-rep",), parse_file.from_ncu_rep),
    FileSource("torch", "torch.profiler trace (Chrome JSON, plain or gzip; a directory of them: one run each)", (".json", ".json.gz"), parse_file.from_torch_trace),
]


def supported() -> str:
    """The formats ``headcount parse`` reads, for help texts and errors."""
    return ", ".join(f"{s.label} ({'a directory' if s.directory else ', '.join(s.suffixes)})" for s in FILE_SOURCES)


def _natural(path: Path) -> list:
    """Sort key: digits as numbers (rank2 before rank10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def expand(path: Path) -> list[Path]:
    """The inputs that ``path`` names: a directory of torch.profiler traces (one per rank, as Holistic
    Trace Analysis's ``trace_dir``; no ``.parquet`` file in it) is its trace files, in natural order;
    anything else is itself.

    Raises:
        HeadcountError: a directory that holds neither traces nor an nsys parquetdir export.
    """
    if not path.is_dir():
        return [path]
    files = [f for f in path.iterdir() if f.is_file()]
    if any(f.name.lower().endswith(".parquet") for f in files):
        return [path]  # an nsys parquetdir export
    torch = next(s for s in FILE_SOURCES if s.name == "torch")
    traces = sorted((f for f in files if f.name.lower().endswith(torch.suffixes)), key=_natural)
    if not traces:
        raise HeadcountError(f"{path}: a directory with no torch.profiler trace ({', '.join('*' + x for x in torch.suffixes)}) "
                             "and no nsys parquetdir export (*.parquet) in it",
                             hint="export nsys with `nsys export --type parquetdir`, or pass the files themselves")
    return traces


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


def inputs(paths: list[str]) -> list[str]:
    """The files that ``headcount parse`` (or a recording given to ``headcount diff``) reads for ``paths``,
    each checked before any work starts: a directory of rank traces is its files (:func:`expand`).

    Raises:
        HeadcountError: no such path; not a regular file or directory (a FIFO would block); no source reads it.
    """
    names = []
    for name in paths:
        path = Path(name)
        if not path.exists():
            raise HeadcountError(f"{path}: no such file", hint="check the path")
        if not (path.is_file() or path.is_dir()):  # a FIFO or a device would block or never end
            raise HeadcountError(f"{path}: not a regular file (a FIFO, socket or device)", hint="pass the exported file itself")
        for each in expand(path):
            for_path(each)
            names.append(str(each))
    return names
