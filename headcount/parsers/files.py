"""Opening a recording: the one way a reader looks at a file's first bytes, with the errors users get."""

from __future__ import annotations

from pathlib import Path

from headcount.common.errors import HeadcountError


def head_bytes(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` (fewer for a shorter file).

    Raises:
        HeadcountError: no such file, or it cannot be read (permissions, a directory).
    """
    try:
        with path.open("rb") as fh:
            return fh.read(n)
    except FileNotFoundError as exc:
        raise HeadcountError(f"{path}: no such file", hint="check the path") from exc
    except OSError as exc:
        raise HeadcountError(f"{path}: cannot be read ({exc.strerror})", hint="check its permissions") from exc
