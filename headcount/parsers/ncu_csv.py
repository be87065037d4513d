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

from headcount.common.errors import HeadcountError
from headcount.parsers.files import head_bytes
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


def _rows(path: Path):
    """The CSV's rows, read as a stream (never the whole file at once): a file
    that stops being CSV fails at that row, whatever its size. ncu's own
    ``==PROF==`` lines are skipped; a byte-order mark is dropped.

    Raises:
        HeadcountError: missing, unreadable, binary, or malformed at some row.
    """
    head = head_bytes(path, 4096)
    if b"\x00" in head:
        raise HeadcountError(f"{path}: not an ncu CSV (binary data)", hint="for a .ncu-rep report, pass the .ncu-rep file itself")
    with path.open("r", encoding="utf-8-sig", errors="replace", newline="") as fh:
        lines = (line for line in fh if not line.startswith("=="))
        try:
            for row in csv.reader(lines, strict=True):
                if row:
                    yield row
        except csv.Error as exc:
            raise HeadcountError(f"{path}: malformed CSV ({exc}); the file may be cut mid-row",
                                 hint="export it again with `ncu --import … --csv`") from exc


def read_csv(path: str | Path, locale: str | None = None) -> pd.DataFrame:
    """Read an ncu CSV (raw or details page) into headcount's kernels table.

    Args:
        locale: the exporting machine's locale (``C``, ``en_US``, ``de_DE``, …);
            inferred from the numbers when omitted.

    Raises:
        HeadcountError: empty, not an ncu CSV, cut mid-row, or holding no kernel.
    """
    path = Path(path)
    rows = _rows(path)
    first = next(rows, None)
    if first is None:
        raise HeadcountError(f"{path}: empty file", hint="export the report with `ncu --import R --csv --page raw`")
    header = [h.strip() for h in first]
    if "ID" not in header:
        raise HeadcountError(f"{path}: not an ncu CSV (no ID column)", hint="export with `ncu --import R --csv --page raw`")
    if len(set(header)) != len(header):
        raise HeadcountError(f"{path}: not an ncu CSV (a column name repeats)", hint="export it again with `ncu --import … --csv`")
    if "Metric Name" in header and "Metric Value" in header:
        kernels = _details(path, header, rows, locale)
    elif "ID" in header and "Kernel Name" in header:
        kernels = _raw(path, header, rows, locale)
    else:
        raise HeadcountError(f"{path}: not an ncu CSV (no ID / Kernel Name columns)", hint="export with `ncu --import R --csv --page raw`")
    frame = kernels_frame(kernels, "ncu")
    if frame.empty:
        raise HeadcountError(f"{path}: holds no profiled kernel", hint="check that ncu profiled something (see its ==PROF== output)")
    return frame


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


def _checked(path: Path, rows, width: int, at_least: bool = False):
    """``rows``, each checked as it is read: ``width`` columns (or more than
    ``width`` with ``at_least``); the first row that is not is an error."""
    for n, row in enumerate(rows, start=2):
        if (len(row) <= width) if at_least else (len(row) != width):
            raise HeadcountError(f"{path}: row {n} has {len(row)} columns where {'more than ' if at_least else ''}{width} "
                                 "belong (a file cut mid-row, or not ncu's CSV past that point)", hint="export it again")
        yield row


# the metrics the kernels table is built from: only these are kept per kernel (a raw page may hold ~1,000 columns)
_READ = {name for names in METRICS.values() for name in names}


def _body(path: Path):
    """The rows after the header, read again from the file (the second pass)."""
    rows = _rows(path)
    next(rows, None)
    return rows


def _raw(path: Path, header: list[str], rows, locale) -> Iterator[dict]:
    """Two passes over the file, neither keeping its rows: the first checks every
    row's width, finds the units row and infers the number format; the second
    yields, per kernel, its identity and the metrics headcount reads."""
    evidence = [i for i, name in enumerate(header) if "__" in name]
    wanted = [i for i, name in enumerate(header) if name in _READ]
    found: dict = {}

    def cells():
        for n, row in enumerate(_checked(path, rows, len(header))):
            if n == 0 and not row[0].strip():  # the units row: identity columns are empty
                found["units"] = row
                continue
            yield from (row[i] for i in evidence)

    inferred = _separators(cells(), None)  # reads every row once
    thousands, decimal = _separators((), locale) if locale else inferred
    units = found.get("units") or [""] * len(header)
    return _raw_kernels(path, header, wanted, units, thousands, decimal, skip_units="units" in found)


def _raw_kernels(path: Path, header, wanted, units, thousands, decimal, skip_units: bool) -> Iterator[dict]:
    for n, row in enumerate(_body(path)):
        if n == 0 and skip_units:
            continue
        kernel = _identity(dict(zip(header, row)))
        kernel["metrics"] = {header[i]: (_number(row[i], thousands, decimal), units[i] if i < len(units) else "") for i in wanted}
        yield kernel


def _details(path: Path, header: list[str], rows, locale) -> list[dict]:
    """Two passes as :func:`_raw`: widths and number format first, then the
    metrics headcount reads, per kernel."""
    col = {name: i for i, name in enumerate(header)}
    need = max(col["Metric Name"], col["Metric Value"], col.get("Metric Unit", 0))
    inferred = _separators((r[col["Metric Value"]] for r in _checked(path, rows, need, at_least=True)), None)
    thousands, decimal = _separators((), locale) if locale else inferred
    kernels: dict[str, dict] = {}
    for row in _body(path):
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
