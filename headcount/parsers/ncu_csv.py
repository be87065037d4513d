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
import io
import re
from pathlib import Path

import pandas as pd

from headcount.errors import HeadcountError
from headcount.parsers.ncu_metrics import DEVICE_NAME, DISPLAY_NAMES, kernels_frame, to_float

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


def _rows(path: Path) -> list[list[str]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise HeadcountError(f"{path}: no such file", hint="check the path") from exc
    except OSError as exc:
        raise HeadcountError(f"{path}: cannot be read ({exc.strerror})", hint="check its permissions") from exc
    if b"\x00" in raw[:4096]:
        raise HeadcountError(f"{path}: not an ncu CSV (binary data)", hint="for a .ncu-rep report, pass the .ncu-rep file itself")
    text = raw.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    try:
        return [row for row in csv.reader(io.StringIO("\n".join(lines)), strict=True) if row]
    except csv.Error as exc:
        raise HeadcountError(f"{path}: malformed CSV ({exc}); the file may be cut mid-row", hint="export it again with `ncu --import … --csv`") from exc


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
    if not rows:
        raise HeadcountError(f"{path}: empty file", hint="export the report with `ncu --import R --csv --page raw`")
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        kernels = _details(path, header, rows[1:], locale)
    elif "ID" in header and "Kernel Name" in header:
        kernels = _raw(path, header, rows[1:], locale)
    else:
        raise HeadcountError(f"{path}: not an ncu CSV (no ID / Kernel Name columns)", hint="export with `ncu --import R --csv --page raw`")
    if not kernels:
        raise HeadcountError(f"{path}: holds no profiled kernel", hint="check that ncu profiled something (see its ==PROF== output)")
    return kernels_frame(kernels, "ncu")


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


def _raw(path: Path, header: list[str], rows: list[list[str]], locale) -> list[dict]:
    units = [""] * len(header)
    if rows and not rows[0][0].strip():  # the units row: identity columns are empty
        units, rows = rows[0], rows[1:]
    wanted = [i for i, name in enumerate(header) if "__" in name]
    thousands, decimal = _separators((r[i] for r in rows if len(r) == len(header) for i in wanted), locale)
    kernels = []
    for n, row in enumerate(rows, start=3):
        if len(row) != len(header):
            where = "the last row" if n == len(rows) + 2 else f"row {n}"
            raise HeadcountError(f"{path}: {where} has {len(row)} of {len(header)} columns (file cut mid-row?)", hint="export it again")
        record = dict(zip(header, row))
        kernel = _identity(record)
        kernel["metrics"] = {header[i]: (_number(row[i], thousands, decimal), units[i] if i < len(units) else "") for i in wanted}
        kernels.append(kernel)
    return kernels


def _details(path: Path, header: list[str], rows: list[list[str]], locale) -> list[dict]:
    col = {name: i for i, name in enumerate(header)}
    need = max(col["Metric Name"], col["Metric Value"], col.get("Metric Unit", 0))
    for n, row in enumerate(rows, start=2):
        if len(row) <= need:
            raise HeadcountError(f"{path}: row {n} has {len(row)} columns, fewer than a metric needs (file cut mid-row?)", hint="export it again")
    thousands, decimal = _separators((r[col["Metric Value"]] for r in rows), locale)
    kernels: dict[str, dict] = {}
    for row in rows:
        record = dict(zip(header, row))
        key = record["ID"]
        kernel = kernels.get(key)
        if kernel is None:
            kernel = kernels[key] = {**_identity(record), "metrics": {}}
        name = record["Metric Name"]
        metric = DISPLAY_NAMES.get(name, name)
        if metric in kernel["metrics"] and name in DISPLAY_NAMES:
            continue  # a display name repeated in another section: keep the first
        kernel["metrics"][metric] = (_number(record["Metric Value"], thousands, decimal), record.get("Metric Unit", ""))
    return list(kernels.values())
