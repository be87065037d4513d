"""The SHA-256 of a parsed recording (its ``runs`` row): hashed once per file and process, and where a
core would otherwise wait, ahead of the parse on a thread of its own (:class:`HashAhead`).

Hashing a 600 MB export costs about 0.4 s of one core. Done when the run's metadata is made, it sat
on the critical path (the workers of a sharded nsys export or of a large trace's step groups waited
for it); started as soon as the inputs are known, it runs beside the imports and the export's plan
(hashlib and file reads release the GIL). A thread must not live through a fork: :func:`pause`
stops it (between two chunks) before the parse's workers fork; what it hashed is kept, and the
file's hash resumes from there when it is asked for (in this process, or a forked worker).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

HASH_CHUNK_BYTES = 1 << 20  # read and hashed at a time: a multi-GB recording is never held
# ahead, a chunk per turn of the GIL (the thread waits up to the 5 ms switch interval for it between chunks):
# 1 MiB chunks hashed ahead at ~0.2 GB/s beside the imports, 16 MiB at ~1 GB/s
AHEAD_CHUNK_BYTES = 16 << 20

_DONE: dict[tuple, tuple[int, str]] = {}  # (path, stamp) → (bytes, sha256 hex)
_PARTIAL: dict[tuple, tuple] = {}  # (path, stamp) of a plain file → (hash so far, bytes hashed)
_AHEAD: list["HashAhead"] = []  # the thread hashing ahead, while one runs


def stamp_of(path: Path) -> tuple:
    """What identifies ``path``'s contents without reading them: ``(relative path, size, mtime)`` of each of its files
    (a directory: its files in sorted order of their relative paths; a file: itself, as ``.``).

    Raises:
        OSError: ``path`` cannot be read.
    """
    if path.is_dir():
        files = sorted((f for f in path.rglob("*") if f.is_file()), key=lambda f: f.relative_to(path).as_posix())
        return tuple((f.relative_to(path).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    stat = path.stat()
    return ((".", stat.st_size, stat.st_mtime_ns),)


def digest(path: str, stamp: tuple) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of the file or directory ``path`` whose files are ``stamp`` (:func:`stamp_of`):
    a directory's files each as ``<relative path> NUL <size> NUL <contents>``. Remembered for the process;
    a file hashed in part ahead (:class:`HashAhead`) is hashed on from where that stopped.

    Raises:
        OSError: a file cannot be read.
    """
    key = (path, stamp)
    if key in _DONE:
        return _DONE[key]
    pause()  # the thread ahead, if any, is let go first: never two readers of one hash
    if key in _DONE:
        return _DONE[key]
    h, total = hashlib.sha256(), 0
    for name, size, _ in stamp:
        if name == ".":  # a plain file: on from where the thread ahead stopped, if it began it
            h, total = _PARTIAL.pop(key, None) or (h, total)
            total = _hash_on(h, path, total)
        else:
            h.update(f"{name}\0{size}\0".encode())
            total += _hash_on(h, os.path.join(path, name))
    _DONE[key] = (total, h.hexdigest())
    return _DONE[key]


def _hash_on(h, file: str, offset: int = 0, stop: threading.Event | None = None, chunk: int = HASH_CHUNK_BYTES) -> int:
    """Hash ``file`` from byte ``offset`` into ``h``, to its end or until ``stop`` is set (checked between chunks of
    ``chunk`` bytes). Returns the offset reached."""
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(file, "rb", buffering=0) as fh:
        fh.seek(offset)
        while not (stop is not None and stop.is_set()) and (n := fh.readinto(buffer)):
            h.update(view[:n])
            offset += n
    return offset


class HashAhead:
    """Hash the plain files of ``paths``, in order, on a daemon thread, while the parse starts
    (:func:`pause` stops it; directories and unreadable files are left to :func:`digest`)."""

    def __init__(self, paths: list[str]):
        self._paths = list(paths)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headcount-hash-ahead", daemon=True)

    def start(self) -> "HashAhead":
        from headcount.common import stopping

        pause()
        _AHEAD.append(self)
        stopping.start_helper(self._thread)
        return self

    def _run(self) -> None:
        for path in self._paths:
            if self._stop.is_set():
                return
            try:
                if not os.path.isfile(path):
                    continue
                stamp = stamp_of(Path(path))
                key = (path, stamp)
                if key in _DONE:
                    continue
                h, total = _PARTIAL.pop(key, None) or (hashlib.sha256(), 0)  # hashed on where an earlier thread stopped
                total = _hash_on(h, path, total, stop=self._stop, chunk=AHEAD_CHUNK_BYTES)
            except OSError:  # said by the parse and by digest(), not here
                continue
            if total == stamp[0][1]:
                _DONE[key] = (total, h.hexdigest())
            else:  # stopped part way (or the file is growing): hashed on from here when asked
                _PARTIAL[key] = (h, total)

    def stop(self) -> None:
        """Stop between two chunks and wait for the thread; what it hashed is kept."""
        self._stop.set()
        self._thread.join()
        if self in _AHEAD:
            _AHEAD.remove(self)


def hash_ahead(paths: list[str]) -> HashAhead:
    """Start hashing ``paths`` ahead (see :class:`HashAhead`), on from where an earlier thread stopped; the one
    already hashing them, if it still runs."""
    paths = [str(p) for p in paths]
    running = next((a for a in _AHEAD if a._paths == paths), None)
    return running or HashAhead(paths).start()


def pause() -> None:
    """Stop the thread hashing ahead, if one runs (before a fork, or before this process hashes a file itself)."""
    for ahead in list(_AHEAD):
        ahead.stop()
