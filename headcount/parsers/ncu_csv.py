"""Read Nsight Compute CSV exports (``ncu --import R --csv --page raw|details``).

- ``--page raw``: row 1 names the columns, row 2 gives units (empty for the
  identity columns), then one row per profiled kernel; columns are looked up
  by name (NVTX columns exist only for ``--nvtx`` recordings).
- ``--page details``: long format, one row per (kernel, section, metric),
  ragged (rule columns only on some rows); ncu 2021 writes ``Kernel Time``
  and no launch columns. Metrics are display names (``Duration``,
  ``Achieved Occupancy``) or, when requested with ``--metrics``, raw names.
- Numbers follow the locale of the machine that exported them: ``1,168,077,824``
  (en_US) or ``84.480`` (de_DE, 84480). The separators are inferred from the
  file (a decimal part that is not a group of three digits gives the decimal
  mark away) unless ``locale`` says ``C``/``en`` or ``de``.
- ``==PROF==`` / ``==WARNING==`` / ``==ERROR==`` lines that ncu mixes into its
  output are skipped.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from headcount.common.errors import DAMAGED, HeadcountError
from headcount.parsers.files import damaged, head_bytes
from headcount.parsers.ncu_metrics import DEVICE_NAME, DISPLAY_NAMES, METRICS, kernels_frame, to_float

# details-page display names -> raw metric names

_NUMERIC = re.compile(r"^-?[\d.,]+$")
_DECIMAL_DOT = re.compile(r"\.(\d{1,2}|\d{4,})$|\..*\.")   # "99.89", "0.0001", or two dots (de thousands)
_DECIMAL_COMMA = re.compile(r",(\d{1,2}|\d{4,})$|,.*,")


def _separators(cells, locale: str | None) -> tuple[str, str]:
    """(thousands, decimal) separators of the file."""
    if locale:
        lang = locale.split(".")[0].split("_")[0].lower()
        return (".", ",") if lang in ("de", "fr", "it", "es", "nl", "pt", "ru") else (",", ".")
    dot_decimal = comma_decimal = False
    for cell in cells:
        if not _NUMERIC.match(cell):
            continue
        if "." in cell and "," in cell:
            if cell.rfind(",") > cell.rfind("."):
                comma_decimal = True
            else:
                dot_decimal = True
        elif "." in cell:
            if cell.count(".") > 1:
                comma_decimal = True  # "1.168.077.824": dots group thousands
            elif _DECIMAL_DOT.search(cell):
                dot_decimal = True
        elif "," in cell:
            if cell.count(",") > 1:
                dot_decimal = True
            elif _DECIMAL_COMMA.search(cell):
                comma_decimal = True
    if comma_decimal and not dot_decimal:
        return ".", ","
    return ",", "."


def _number(cell: str, thousands: str, decimal: str) -> float | None:
    text = cell.strip()
    if _NUMERIC.match(text):
        text = text.replace(thousands, "").replace(decimal, ".")
    return to_float(text)


_CUT = "unexpected end of data"  # the csv module's words for a file that ends inside a quoted field


def _rows(path: Path, cut: dict | None = None):
    """The CSV's rows, read as a stream (never the whole file at once): a file
    that stops being CSV fails at that row, whatever its size. ncu's own
    ``==PROF==`` lines are skipped; a byte-order mark is dropped. A file that
    ends inside a quoted field is cut: refused, or (``cut`` given: ``--salvage``)
    read to the row before, ``cut["row"]`` set to the cut row's number.

    Raises:
        HeadcountError: missing, unreadable, binary, cut, or malformed at some row.
    """
    head = head_bytes(path, 4096)
    if b"\x00" in head:
        raise HeadcountError(f"{path}: not an ncu CSV (binary data)", hint="for a .ncu-rep report, pass the .ncu-rep file itself")
    with path.open("r", encoding="utf-8-sig", errors="replace", newline="") as fh:
        lines = (line for line in fh if not line.startswith("=="))
        n = 0
        try:
            for row in csv.reader(lines, strict=True):
                if row:
                    n += 1
                    yield row
        except csv.Error as exc:
            if _CUT not in str(exc):
                raise HeadcountError(f"{path}: malformed CSV ({exc})", hint="export it again with `ncu --import … --csv`") from exc
            if cut is None:
                raise damaged(path, f"truncated ncu CSV: it ends inside row {n + 1}, in a quoted field",
                              kept="the rows before it") from exc
            cut["row"] = n + 1


def read_csv(path: str | Path, locale: str | None = None, salvage: bool = False) -> pd.DataFrame:
    """Read an ncu CSV (raw or details page) into headcount's kernels table.

    Args:
        locale: the exporting machine's locale (``C``, ``en_US``, ``de_DE``, …);
            inferred from the numbers when omitted.
        salvage: a file cut inside its last row is read to the row before, with a
            notice in ``frame.attrs["notices"]``; without it, refused.

    Raises:
        HeadcountError: empty, not an ncu CSV, cut mid-row (without ``salvage``), or holding no kernel.
    """
    path = Path(path)
    cut = {} if salvage else None
    rows = _rows(path, cut)
    first = next(rows, None)
    if first is None:
        raise HeadcountError(f"{path}: empty file", hint="export the report with `ncu --import R --csv --page raw`")
    header = [h.strip() for h in first]
    if "ID" not in header:
        raise HeadcountError(f"{path}: not an ncu CSV (no ID column)", hint="export with `ncu --import R --csv --page raw`")
    if len(set(header)) != len(header):
        raise HeadcountError(f"{path}: not an ncu CSV (a column name repeats)", hint="export it again with `ncu --import … --csv`")
    details = "Metric Name" in header and "Metric Value" in header
    if details:
        kernels = _details(path, header, rows, locale, cut)
    elif "ID" in header and "Kernel Name" in header:
        kernels = _raw(path, header, rows, locale, cut)
    else:
        raise HeadcountError(f"{path}: not an ncu CSV (no ID / Kernel Name columns)", hint="export with `ncu --import R --csv --page raw`")
    frame = kernels_frame(kernels, "ncu")
    if frame.empty:
        if cut or not _ends_a_line(path):  # ncu ends every row with a newline: a file without one is cut
            raise damaged(path, "truncated ncu CSV: it ends before its first whole kernel row")
        raise HeadcountError(f"{path}: holds no profiled kernel", hint="check that ncu profiled something (see its ==PROF== output)")
    if cut:
        lost = (f"its last metric row (row {cut['row']}) unreadable, dropped: the last of its {len(frame)} kernels may lack "
                "metrics" if details else f"1 of {len(frame) + 1} kernel rows unreadable (row {cut['row']}), dropped")
        frame.attrs["notices"] = [*frame.attrs.get("notices", []), f"{DAMAGED}the file is cut: {lost}"]
    return frame


def _ends_a_line(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(0, 2)
        if fh.tell() == 0:
            return True
        fh.seek(-1, 2)
        return fh.read(1) in (b"\n", b"\r")


def _identity(record: dict) -> dict:
    return {
        "ncu_id": record.get("ID"),
        "name": record.get("Kernel Name"),
        "pid": record.get("Process ID") or None,
        "device": record.get("Device") or None,
        "stream": record.get("Stream") or None,
        "grid": record.get("Grid Size") or None,
        "block": record.get("Block Size") or None,
        "nvtx_path": None,
        "device_name": record.get(DEVICE_NAME) or None,  # raw page only
    }


def _checked(path: Path, rows, width: int, at_least: bool = False, cut: dict | None = None):
    """``rows``, each checked as it is read: ``width`` columns (or more than
    ``width`` with ``at_least``); the first row that is not is an error, except
    a short last row: the file is cut there (refused, or with ``cut``, dropped
    and ``cut["row"]`` set to its number)."""
    rows = iter(rows)
    row, n = next(rows, None), 1
    while row is not None:
        n += 1
        following = next(rows, None)
        if (len(row) <= width) if at_least else (len(row) != width):
            if following is None and (len(row) <= width if at_least else len(row) < width):
                if cut is not None:
                    cut["row"] = n
                    return
                raise damaged(path, f"truncated ncu CSV: its last row (row {n}) has {len(row)} of the "
                              f"{'more than ' if at_least else ''}{width} columns its rows have", kept="the rows before it")
            raise HeadcountError(f"{path}: row {n} has {len(row)} columns where {'more than ' if at_least else ''}{width} "
                                 "belong (not ncu's CSV past that point)", hint="export it again")
        yield row
        row = following


# the metrics the kernels table is built from: only these are kept per kernel (a raw page may hold ~1,000 columns)
_READ = {name for names in METRICS.values() for name in names}


def _body(path: Path, cut: dict | None = None):
    """The rows after the header, read again from the file (the second pass), up to the cut row the first found."""
    rows = _rows(path, {} if cut is not None else None)
    next(rows, None)
    stop = (cut or {}).get("row")
    for n, row in enumerate(rows, start=2):
        if n == stop:
            return
        yield row


def _raw(path: Path, header: list[str], rows, locale, cut: dict | None = None) -> Iterator[dict]:
    """Two passes over the file, neither keeping its rows: the first checks every
    row's width, finds the units row and infers the number format; the second
    yields, per kernel, its identity and the metrics headcount reads."""
    evidence = [i for i, name in enumerate(header) if "__" in name]
    wanted = [i for i, name in enumerate(header) if name in _READ]
    found: dict = {}

    def cells():
        for n, row in enumerate(_checked(path, rows, len(header), cut=cut)):
            if n == 0 and not row[0].strip():  # the units row: identity columns are empty
                found["units"] = row
                continue
            yield from (row[i] for i in evidence)

    inferred = _separators(cells(), None)  # reads every row once
    thousands, decimal = _separators((), locale) if locale else inferred
    units = found.get("units") or [""] * len(header)
    return _raw_kernels(path, header, wanted, units, thousands, decimal, skip_units="units" in found, cut=cut)


def _raw_kernels(path: Path, header, wanted, units, thousands, decimal, skip_units: bool, cut: dict | None = None) -> Iterator[dict]:
    for n, row in enumerate(_body(path, cut)):
        if n == 0 and skip_units:
            continue
        kernel = _identity(dict(zip(header, row)))
        kernel["metrics"] = {header[i]: (_number(row[i], thousands, decimal), units[i] if i < len(units) else "") for i in wanted}
        yield kernel


def _details(path: Path, header: list[str], rows, locale, cut: dict | None = None) -> list[dict]:
    """Two passes as :func:`_raw`: widths and number format first, then the
    metrics headcount reads, per kernel."""
    col = {name: i for i, name in enumerate(header)}
    need = max(col["Metric Name"], col["Metric Value"], col.get("Metric Unit", 0))
    inferred = _separators((r[col["Metric Value"]] for r in _checked(path, rows, need, at_least=True, cut=cut)), None)
    thousands, decimal = _separators((), locale) if locale else inferred
    kernels: dict[str, dict] = {}
    for row in _body(path, cut):
        record = dict(zip(header, row))
        key = record["ID"]
        kernel = kernels.get(key)
        if kernel is None:
            kernel = kernels[key] = {**_identity(record), "metrics": {}}
        name = record["Metric Name"]
        metric = DISPLAY_NAMES.get(name, name)
        if metric not in _READ or (metric in kernel["metrics"] and name in DISPLAY_NAMES):
            continue  # not read; or a display name repeated in another section: keep the first
        kernel["metrics"][metric] = (_number(record["Metric Value"], thousands, decimal), record.get("Metric Unit", ""))
    return list(kernels.values())
