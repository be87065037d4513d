"""Read ``.ncu-rep`` reports through NVIDIA's ``ncu_report`` module (the
``ncu-report`` wheel, or the one shipped in Nsight Compute's ``extras/python``).
It reads reports without a GPU.

``ncu_report`` exposes no process id, so ``pid`` stays null on this path (the
CSV export carries it). Values are exact doubles here, where the CSV prints
them rounded.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from headcount.common.errors import DAMAGED, HeadcountError
from headcount.parsers.files import damaged, head_bytes
from headcount.parsers.ncu_metrics import DEVICE_NAME, METRICS, kernels_frame, to_float


def nsight_python_dirs() -> list[Path]:
    """Folders holding Nsight Compute's own ``ncu_report.py`` (its ``extras/python``), newest first: beside the
    ``ncu`` that ``$HEADCOUNT_NCU`` or PATH names (an installer's ``ncu`` lies beside ``extras/``, the binary it
    runs two folders down), then the usual install roots (NVIDIA's installer, the CUDA toolkit)."""
    import glob
    import os
    import shutil

    found: list[Path] = []
    ncu = os.environ.get("HEADCOUNT_NCU") or shutil.which("ncu")
    if ncu:
        for folder in (Path(ncu).parent, Path(os.path.realpath(ncu)).parent):  # a link on PATH, or the file itself
            found += [folder / "extras" / "python", folder.parent.parent / "extras" / "python"]
    roots = sorted(glob.glob("/opt/nvidia/nsight-compute/*") + glob.glob("/usr/local/cuda*/nsight-compute*")
                   + glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "nsight-compute*")), reverse=True)
    found += [Path(root) / "extras" / "python" for root in roots]
    seen: list[Path] = []
    for folder in found:
        if (folder / "ncu_report.py").is_file() and folder not in seen:
            seen.append(folder)
    return seen


def _module():
    """NVIDIA's ``ncu_report``: the installed wheel, else the one in Nsight Compute's ``extras/python``.

    Raises:
        HeadcountError: neither imports.
    """
    try:
        import ncu_report
    except ImportError as exc:
        for folder in nsight_python_dirs():
            sys.path.insert(0, str(folder))  # ahead of a broken install; its ncu_report.py loads the module beside it
            try:
                import ncu_report
            except ImportError:
                sys.path.remove(str(folder))
                continue
            return ncu_report
        raise HeadcountError(
            "reading .ncu-rep files needs NVIDIA's ncu_report module (neither installed nor found in an Nsight Compute's "
            "extras/python)",
            hint="pip install ncu-report, or set HEADCOUNT_NCU to your Nsight Compute's ncu, or export with "
                 "`ncu --import R --csv --page raw` and pass the CSV",
        ) from exc
    return ncu_report


def _metric(action, name: str):
    metric = action.metric_by_name(name)
    if metric is None:
        return None
    try:
        return metric.as_double()
    except Exception:  # noqa: BLE001 - string metrics have no double value
        return to_float(metric.value())


def _text(action, name: str) -> str | None:
    metric = action.metric_by_name(name)
    if metric is None:
        return None
    try:
        return str(metric.as_string()).strip() or None
    except Exception:  # noqa: BLE001 - a numeric metric has no string value
        return None


def _nvtx_path(action) -> str | None:
    """Push/pop ranges open at the launch, ``domain@a/b/c`` per domain, joined with ``;``."""
    state = action.nvtx_state()
    if state is None:
        return None
    parts = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        ranges = list(domain.push_pop_ranges())
        if ranges:
            parts.append(f"{domain.name()}@{'/'.join(ranges)}")
    return ";".join(parts) or None


def read_report(path: str | Path, salvage: bool = False) -> pd.DataFrame:
    """Read every profiled kernel of an ``.ncu-rep`` into headcount's kernels table.

    NVIDIA's reader is C++ and aborts the whole process on some damaged files,
    so it runs in a child process (:func:`read_here` through ``python -m
    headcount.parsers.ncu_rep``): an abort becomes one line. ``ncu_report``
    reads a cut file without a word (the kernels before the cut), so the file's
    own layout says first whether it is whole (:func:`layout`); a cut file, or
    records without a kernel name and without a metric (what damage leaves),
    is refused unless ``salvage``, where the kernels read are kept and
    ``frame.attrs["notices"]`` says how many records were lost.

    Raises:
        HeadcountError: no ncu_report module, the file is missing, not a report,
            empty, damaged or cut (without ``salvage``), or the reader aborted on it.
    """
    path = Path(path)
    if not path.is_file():
        raise HeadcountError(f"{path}: no such file", hint="check the path")
    if head_bytes(path, 4) != b"NVR\x00":  # the magic of every .ncu-rep seen so far
        raise HeadcountError(f"{path}: not a readable Nsight Compute report (no NVR header)", hint="pass a file written by `ncu -o`")
    shape = layout(path)
    try:
        frame, empty = _read_in_child(path)
    except HeadcountError as exc:
        if shape.problem:  # what the reader made of a cut file: the cut says more
            said = exc.message.removeprefix(f"{path}: ")
            raise damaged(path, f"damaged or truncated .ncu-rep ({shape.problem}); the reader: {said}") from exc
        raise
    read = 0 if frame is None else len(frame)
    if shape.problem or empty:
        total = max(shape.records, read + empty)
        lost = (f"{total - read} of {'at least ' if shape.problem else ''}{total} kernel records unreadable" if total
                else "no kernel record whole before the cut")
        why = shape.problem or f"{empty} records without a kernel name or any metric"
        if not salvage or frame is None:
            raise damaged(path, f"damaged or truncated .ncu-rep ({why}): {lost}",
                          kept=f"the {read} readable kernel{'s' if read != 1 else ''}" if read else None)
        frame.attrs["notices"] = [*frame.attrs.get("notices", []), f"{DAMAGED}{lost}, dropped ({why})"]
    if frame is None:
        raise HeadcountError(f"{path}: holds no profiled kernel", hint="check that ncu profiled something, or record it again")
    return frame


def _read_in_child(path: Path) -> tuple[pd.DataFrame | None, int]:
    """:func:`read_here` in a child process: ``(kernels or None, records dropped as damaged)``."""
    with tempfile.TemporaryDirectory(prefix="headcount-ncu-") as tmp:
        result = Path(tmp) / "kernels.pkl"
        try:
            done = subprocess.run([sys.executable, "-m", "headcount.parsers.ncu_rep", str(path), str(result)],
                                  capture_output=True, text=True, timeout=READ_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise HeadcountError(f"{path}: the .ncu-rep reader gave no answer in {READ_TIMEOUT_S} s",
                                 hint="export it with `ncu --import R --csv --page raw` and pass the CSV") from exc
        if done.returncode == 0:
            return pd.read_pickle(result)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith(_ERROR)]
        if said:
            _, message, hint = (said[-1].split("\t") + ["", ""])[:3]
            raise HeadcountError(message, hint=hint or None)
        why = (f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0 else f"exit status {done.returncode}")
        last = lines[-1].strip()[:200] if lines else "no message"
        raise HeadcountError(f"{path}: damaged .ncu-rep: the reader aborted ({why}: {last})",
                             hint="record it again, or export what ncu can read with `ncu --import R --csv --page raw`")


@dataclass(frozen=True)
class Layout:
    """What an ``.ncu-rep``'s own framing says of it (:func:`layout`).

    Attributes:
        records: the kernel (and range, command list, graph) results its block headers declare, the cut block's included.
        problem: ``None`` for a whole file; else where its framing breaks (a cut block, a header that does not parse).
    """

    records: int
    problem: str | None = None


def layout(path: Path) -> Layout:
    """The framing of an ``.ncu-rep`` (``extras/FileFormat/ProfilerReport.proto`` of Nsight Compute): after ``NVR\\0``,
    a length-prefixed ``FileHeader``, then blocks, each a length-prefixed ``BlockHeader`` whose ``PayloadSize``
    bytes (sources and results) follow it; ``NumResults``, ``NumRangeResults``, ``NumCmdlistResults`` and
    ``NumGraphResults`` count its records. A whole file ends where its last block does. Only the headers are
    read (a seek past each payload)."""
    size = path.stat().st_size
    records, block = 0, 0
    with path.open("rb") as fh:
        fh.seek(4)
        at = 8 + int.from_bytes(fh.read(4).ljust(4, b"\xff"), "little")
        while at < size:
            fh.seek(at)
            length = int.from_bytes(fh.read(4).ljust(4, b"\xff"), "little")
            header = _fields(fh.read(length)) if at + 4 + length <= size else None
            if header is None:
                return Layout(records, f"block {block + 1}'s header at byte {at:,} is cut or unreadable (the file ends at {size:,})")
            records += sum(header.get(k, 0) for k in (2, 7, 8, 9))
            at, block = at + 4 + length + header.get(5, 0), block + 1
            if at > size:
                return Layout(records, f"the file ends at byte {size:,}, inside block {block}, which runs to byte {at:,}")
    if at > size:
        return Layout(records, f"the file ends at byte {size:,}, inside its file header")
    return Layout(records)


def _fields(raw: bytes) -> dict[int, int] | None:
    """The varint fields of a protobuf message (the first of each number); ``None``: not a message."""
    fields: dict[int, int] = {}
    at = 0
    try:
        while at < len(raw):
            key, at = _varint(raw, at)
            wire = key & 7
            if wire == 0:
                value, at = _varint(raw, at)
                fields.setdefault(key >> 3, value)
            elif wire == 2:
                length, at = _varint(raw, at)
                at += length
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            else:
                return None
    except IndexError:
        return None
    return fields if at == len(raw) else None


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80 or shift > 63:
            return value, at


READ_TIMEOUT_S = 600
_ERROR = "HEADCOUNT-ERROR\t"


def read_here(path: Path) -> tuple[pd.DataFrame | None, int]:
    """:func:`read_report`'s work, in this process: ``(kernels, records without a kernel name or any metric)``
    (``None``: no kernel)."""
    ncu_report = _module()
    try:
        context = ncu_report.load_report(str(path))
    except Exception as exc:  # noqa: BLE001 - the module raises its own exception types
        raise HeadcountError(f"{path}: not a readable Nsight Compute report ({str(exc).strip()[:200]})",
                             hint="a report from a newer ncu needs a newer ncu-report package") from exc
    wanted = {n for names in METRICS.values() for n in names}
    kernels, empty = [], 0
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            names = set(action.metric_names())
            metrics = {}
            for name in wanted & names:
                metrics[name] = (_metric(action, name), action.metric_by_name(name).unit())
            kernel_name = action.name(ncu_report.IAction.NameBase_DEMANGLED)
            if not kernel_name and not any(v is not None for v, _ in metrics.values()):
                empty += 1  # no name, no value: what a damaged record reads as
                continue
            dims = [_metric(action, f"launch__{k}_dim_{ax}") for k in ("grid", "block") for ax in "xyz"]
            grid = f"({int(dims[0])}, {int(dims[1])}, {int(dims[2])})" if None not in dims[:3] else None
            block = f"({int(dims[3])}, {int(dims[4])}, {int(dims[5])})" if None not in dims[3:] else None
            kernels.append({
                "ncu_id": len(kernels),
                "name": kernel_name,
                "pid": None,
                "device": _metric(action, "launch__device_id"),
                "stream": _metric(action, "launch__stream_id"),
                "grid": grid,
                "block": block,
                "nvtx_path": _nvtx_path(action),
                "device_name": _text(action, DEVICE_NAME),
                "metrics": metrics,
            })
    return (kernels_frame(kernels, "ncu") if kernels else None), empty


def _main(argv: list[str]) -> int:
    """``python -m headcount.parsers.ncu_rep REPORT RESULT``: :func:`read_here`, pickled to RESULT."""
    path, result = Path(argv[0]), Path(argv[1])
    try:
        pd.to_pickle(read_here(path), result)
    except HeadcountError as exc:
        print(f"{_ERROR}{exc.message}\t{exc.hint or ''}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
