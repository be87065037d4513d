"""Opening a recording: the one way a reader looks at a file's first bytes, with the errors users get.

Every format's reader checks its file here first (:func:`head_bytes`, :func:`readable`), so that a
missing or unreadable input is the same one line whatever the format: ``PATH: permission denied``
with what to do. A recording that is cut or partly unreadable is refused with :func:`damaged`
unless ``--salvage`` (:attr:`headcount.parsers.options.ReadOptions.salvage`) asks for what could be
read; the reader then says what was lost in a notice that starts with :data:`headcount.common.errors.DAMAGED`.
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.common import progress
from headcount.common.errors import HeadcountError


def unreadable(path: Path, exc: OSError) -> HeadcountError:
    """The error for ``exc``, raised opening or reading ``path``: no such file, permission denied, or the system's words."""
    if isinstance(exc, FileNotFoundError):
        return HeadcountError(f"{path}: no such file", hint="check the path")
    if isinstance(exc, PermissionError):
        what = "directory" if _is_dir(path) else "file"
        return HeadcountError(f"{path}: permission denied (the {what} cannot be read by this user)",
                              hint=f"make it readable (chmod a+r{'x' if what == 'directory' else ''} {path}), "
                                   "or copy it somewhere you can read")
    return HeadcountError(f"{path}: cannot be read ({exc.strerror or exc})", hint="check the path and its permissions")


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a path whose parent cannot be searched
        return False


def head_bytes(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` (fewer for a shorter file).

    Raises:
        HeadcountError: no such file, or it cannot be read (permissions, a directory).
    """
    try:
        with path.open("rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise unreadable(path, exc) from exc


def readable(path: Path) -> None:
    """Check that ``path`` can be read: a file opened, a directory (a parquetdir export) listed and each file in it opened.

    Raises:
        HeadcountError: as :func:`head_bytes`, naming the first file that cannot be read.
    """
    if not path.is_dir():
        head_bytes(path, 1)
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise unreadable(path, exc) from exc
    for name in names:
        if (path / name).is_file():
            head_bytes(path / name, 1)


def damaged(path: Path, what: str, kept: str | None = None) -> HeadcountError:
    """The error for a cut or partly unreadable recording: ``what`` says what is wrong (with counts);
    ``kept``: what ``--salvage`` would keep (``None``: nothing can be salvaged)."""
    hint = "copy it again in full, or record it again"
    if kept:
        hint += f"; `headcount parse --salvage` keeps {kept}, with a notice of what was lost"
    return HeadcountError(f"{path}: {what}", hint=hint)


def read_chunk(fh, size: int, cut: dict | None = None) -> bytes:
    """Up to ``size`` bytes of ``fh`` (``b""`` at its end), the bytes of the file as stored that it took counted
    (:func:`headcount.common.progress.advance`: a gzip file's compressed bytes). With ``cut`` (``--salvage``), a
    gzip stream cut short gives what it holds before the cut, then ``b""``, and ``cut["cut"]`` says so.

    Raises:
        EOFError: a gzip stream cut short (without ``cut``). OSError: the file cannot be read, or is not gzip.
    """
    import gzip

    if size <= 0:
        return b""
    stored = getattr(fh, "fileobj", fh)  # under a GzipFile, the file it decompresses
    before = stored.tell()
    if cut is None or not isinstance(fh, gzip.GzipFile):
        data = fh.read(size)
    else:
        data, ended = read_to_cut(fh, size)
        if ended:
            cut["cut"] = "the gzip stream ends before its end marker"
    progress.advance(stored.tell() - before)
    return data


def read_to_cut(fh, size: int) -> tuple[bytes, bool]:
    """Up to ``size`` bytes of a gzip stream ``fh``, one decompressed block at a time, so that a stream cut short
    loses nothing before the cut: ``(data, cut)``, ``cut`` true where the stream ended without its end marker.

    Raises:
        OSError: the stream is not gzip or is damaged (not merely cut).
    """
    parts, got = [], 0
    while got < size:
        try:
            part = fh.read1(size - got)
        except EOFError:
            return b"".join(parts), True
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts), False


def stored_bytes(path: Path) -> int:
    """The bytes ``path`` holds as stored: a file's size, a directory's files together (0 where it cannot be read)."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0
