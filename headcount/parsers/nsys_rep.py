"""``.nsys-rep`` reports: exported to SQLite by the ``nsys`` on PATH, then read
process by process as any export (:func:`headcount.build.nsys.nsys_processes`).

A report nsys cannot open (damaged, cut, not a report at all, or written by a
newer nsys) is one line: headcount's explanation first, then what nsys said,
boiled down to its own sentence (``(nsys said: …)``: its build paths,
throwing functions and C++ exception types left out).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from headcount.common import nsight
from headcount.common.errors import HeadcountError
from headcount.parsers.files import head_bytes


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
    head_bytes(path, 1)  # unreadable: the one line every format gives, before nsys is asked
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
            raise HeadcountError(
                f"{path}: nsys could not open it as a report: damaged, truncated or not an .nsys-rep "
                f"(nsys said: {nsys_said(done.stderr or done.stdout, done.returncode)})",
                hint="copy or record it again; a report from a newer nsys needs that nsys: export it to SQLite "
                     "(`nsys export --type sqlite`) where it was recorded",
            )
        yield out


_NOISE = (re.compile(r"/\S+\.(?:cpp|h|hpp)\(\d+\):?"), re.compile(r"Throw in function .*?(?=Dynamic exception type|$)"),
          re.compile(r"Dynamic exception type: \S+"), re.compile(r"std::exception::what:"))


def nsys_said(text: str | None, returncode: int) -> str:
    """What nsys said on failing, in its own words but without its build paths, throwing
    functions and C++ exception types (one line, at most 200 characters)."""
    said = " ".join((text or "").split())
    for noise in _NOISE:
        said = noise.sub(" ", said)
    said = " ".join(said.split()).removeprefix("Exportation error:").strip()
    return said[:200] or f"exit status {returncode}"
