"""``.nsys-rep`` reports: exported to SQLite by the ``nsys`` on PATH, then read
process by process as any export (:func:`headcount.build.nsys.nsys_processes`).

A report written by a newer nsys cannot be opened by an older one; nsys's own
message is passed on with the hint to export on the machine that recorded it.
"""

from __future__ import annotations

import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from headcount.common import nsight
from headcount.common.errors import HeadcountError


@contextmanager
def exported(path: str | Path, timeout_s: int = 1800):
    """Export ``path`` to SQLite in a temporary directory; yields the SQLite file's path
    (removed on exit).

    Raises:
        HeadcountError: no nsys (exit 3), the file is missing, or nsys cannot
            export it (damaged, or written by a newer nsys).
    """
    path = Path(path)
    if not path.is_file():
        raise HeadcountError(f"{path}: no such file", hint="check the path")
    nsys = nsight.find("nsys")  # the one lookup ($HEADCOUNT_NSYS, else PATH); missing: exit 3
    with tempfile.TemporaryDirectory(prefix="headcount-nsys-") as tmp:
        out = Path(tmp) / "export.sqlite"
        try:
            done = subprocess.run(
                [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(path)],
                capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise HeadcountError(f"{path}: nsys export did not finish in {timeout_s} s", hint="export it yourself with `nsys export --type sqlite`") from exc
        if done.returncode != 0 or not out.exists():
            detail = " ".join((done.stderr or done.stdout or "").split())[:300] or f"exit status {done.returncode}"
            raise HeadcountError(
                f"{path}: nsys could not export the report ({detail})",
                hint="a report from a newer nsys needs that nsys: export it to SQLite where it was recorded",
            )
        yield out
