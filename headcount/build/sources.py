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
from headcount.common.errors import HeadcountError, notice
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
    "torch": "torch.profiler in each process: operator and kernel times, any machine",
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
    FileSource("torch", "torch.profiler trace (Chrome JSON, plain or gzip)", (".json", ".json.gz"), parse_file.from_torch_trace),
    FileSource("cupti", "headcount's CUPTI collector records (cupti-records.jsonl.gz)", (".jsonl.gz",),
               parse_file.from_cupti_records),
]


def supported() -> str:
    """The formats ``headcount parse`` reads, for help texts and errors."""
    return ", ".join(f"{s.label} ({'a directory' if s.directory else ', '.join(s.suffixes)})" for s in FILE_SOURCES)


def _natural(path: Path) -> list:
    """Sort key: digits as numbers (rank2 before rank10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _parquetdir(path: Path) -> bool:
    """``path`` is an nsys parquetdir export: a directory with ``*.parquet`` files directly in it."""
    return any(f.name.lower().endswith(".parquet") and f.is_file() for f in path.iterdir())


def _subdirectory(entry: Path) -> Path | str:
    """What a directory's subdirectory holds: itself (a parquetdir export), its CUPTI collector records
    (a ``headcount run`` raw folder's ``cupti-<pid>/``), its torch.profiler trace (``torch-<pid>/``), or why it
    is skipped."""
    try:
        if _parquetdir(entry):
            return entry
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    for recording in (entry / "cupti-records.jsonl.gz", entry / "trace.json"):
        if recording.is_file():
            return recording
    return "holding no nsys parquetdir export, cupti records or torch trace (not descended into)"


def _suffix_source(name: str) -> FileSource | None:
    name = name.lower()
    matches = [s for s in FILE_SOURCES if any(name.endswith(suffix) for suffix in s.suffixes)]
    return max(matches, key=lambda s: max(len(x) for x in s.suffixes if name.endswith(x))) if matches else None


_CALL_LOG = re.compile(r"child-\d+\.json")  # a `headcount run` raw folder's call log (parsers/child_report.CHILD_FILE)
_NOT_READ = "of a kind no source reads"


def _ncu_csv(entry: Path) -> bool | None:
    """A CSV's header names ncu's ``ID`` column (after the ``==PROF==`` lines ncu mixes in); ``None``: unreadable."""
    import csv

    from headcount.parsers.files import head_bytes

    try:
        head = head_bytes(entry, 1 << 16).decode("utf-8", errors="replace").removeprefix("\ufeff")
    except HeadcountError:
        return None
    first = next((line for line in head.splitlines() if line.strip() and not line.startswith("==")), "")
    return "ID" in [cell.strip() for cell in next(csv.reader([first]), [])]


def _why_skipped(entry: Path, names: set[str]) -> str | None:
    """Why a directory's file is no recording headcount reads (``None``: it is one; ``names``: the directory's
    entries). A file a source reads by its name is a recording, and its parse the error where it is none
    (a ``.sqlite`` that is no nsys export); only what no parse should see is skipped."""
    if not entry.is_file():
        return "not regular files (a FIFO, socket or device)"
    name = entry.name
    if _CALL_LOG.fullmatch(name):
        return "call logs of a headcount run (read with the recording beside them)"
    source = _suffix_source(name)
    if source is None:
        return _NOT_READ
    lower = name.lower()
    if lower.endswith(".nsys-rep"):
        export = next((name[: -len(".nsys-rep")] + x for x in (".sqlite", ".sqlite3") if name[: -len(".nsys-rep")] + x in names), None)
        if export:
            return f"nsys reports whose SQLite export beside them is read instead ({export})"
    if lower.endswith(".csv") and _ncu_csv(entry) is False:
        return "CSV that is no ncu export (no ID column: an nsys stats report?)"
    return None


def scan(path: Path) -> tuple[list[Path], dict[str, list[str]]]:
    """The recordings in directory ``path``, and what was skipped there.

    A directory with ``*.parquet`` files in it is an nsys parquetdir export: itself. Otherwise every file
    directly in it that a source reads (:data:`FILE_SOURCES`, by its name's ending) is one input, and so is
    every subdirectory that is a parquetdir export, or that holds the CUPTI collector's records
    (``cupti-<pid>/cupti-records.jsonl.gz`` of a ``headcount run`` raw folder) or a torch trace
    (``torch-<pid>/trace.json``); all in natural order
    (rank2 before rank10). Not read: call logs (``child-<pid>.json``, read with the recording beside them),
    an ``.nsys-rep`` beside its own SQLite export, CSV files whose header has no ncu ``ID`` column, files
    no source reads, other subdirectories (not descended into).

    Returns:
        ``(inputs, skipped)``: ``skipped`` maps a reason to the names it applies to (a directory's with ``/``).
    """
    if _parquetdir(path):
        return [path], {}
    entries = sorted(path.iterdir(), key=_natural)
    names = {e.name for e in entries}
    found, skipped = [], {}
    for entry in entries:
        if entry.is_dir():
            inside = _subdirectory(entry)
            if isinstance(inside, Path):
                found.append(inside)
            else:
                skipped.setdefault(inside, []).append(entry.name + "/")
            continue
        why = _why_skipped(entry, names)
        if why is None:
            found.append(entry)
        else:
            skipped.setdefault(why, []).append(entry.name)
    return found, skipped


def skipped_lines(path: Path, skipped: dict[str, list[str]], shown: int = 10) -> list[str]:
    """One line per reason: ``DIR: skipped 3 files, of a kind no source reads: a.txt, b.png, c.log``."""
    lines = []
    for why, names in skipped.items():
        listed = ", ".join(names[:shown]) + (f", … {len(names) - shown} more" if len(names) > shown else "")
        folders = all(n.endswith("/") for n in names)
        noun = ("directory" if folders else "file") if len(names) == 1 else ("directories" if folders else "files")
        lines.append(f"{path}: skipped {len(names)} {noun}, {why}: {listed}")
    return lines


def expand(path: Path, said: list[str] | None = None) -> list[Path]:
    """The inputs that ``path`` names: a directory is the recordings in it (:func:`scan`), in natural order;
    anything else is itself. ``said``: gets the lines naming what a directory held that was skipped
    (:func:`skipped_lines`).

    Raises:
        HeadcountError: a directory that cannot be read, or holds no recording headcount reads.
    """
    if not path.is_dir():
        return [path]
    try:
        found, skipped = scan(path)
    except OSError as exc:
        from headcount.parsers.files import unreadable

        raise unreadable(path, exc) from exc
    if not found:
        listed = "; ".join(f"{why}: {', '.join(names[:5])}" for why, names in skipped.items()) or "it is empty"
        raise HeadcountError(f"{path}: a directory with no recording headcount reads in it ({listed})",
                             hint=f"headcount reads: {supported()}")
    if said is not None:
        said += skipped_lines(path, skipped)
    return found


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
    each checked before any work starts: a directory is the recordings in it (:func:`expand`), and a notice
    names what it held that is not read, and why.

    Raises:
        HeadcountError: no such path; not a regular file or directory (a FIFO would block); no source reads it.
    """
    names, said = [], []
    for name in paths:
        path = Path(name)
        if not path.exists():
            raise HeadcountError(f"{path}: no such file", hint="check the path")
        if not (path.is_file() or path.is_dir()):  # a FIFO or a device would block or never end
            raise HeadcountError(f"{path}: not a regular file (a FIFO, socket or device)", hint="pass the exported file itself")
        for each in expand(path, said):
            for_path(each)
            names.append(str(each))
    for line in said:  # once every input is known good: what a directory held that is not read
        notice(line)
    return names
