"""How much of each input has been read, counted by whichever process reads it.

A command that reads inputs (``parse``, ``diff`` of recordings) opens a count of its inputs (:func:`share`)
before any worker process starts; the pool hands it to each worker (:func:`attach`); a task counts into its
input's slot (:func:`task`, :func:`reading`) and a reader says how many bytes of the file it has just read
(:func:`advance`). The parent's view of it (:class:`headcount.reports.progress_view.Meter`) reads the slots
(:func:`read`). A reader that cannot say how far it is (SQLite, ncu_report: the library reads) counts nothing:
its file counts as read once it is staged.

Counts are bytes of the file as stored (a gzip file's compressed bytes), so a file's count ends at its size.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

_counts = None  # multiprocessing.Array("q"): bytes read of each input, shared with the worker processes
_slot: int | None = None  # the input this process reads now
_listener: Callable[[], None] | None = None  # told of each advance made in the process that opened the count
_ready: Callable[[], None] | None = None  # told once every worker process has started


def share(inputs: int, listener: Callable[[], None] | None = None, ready: Callable[[], None] | None = None):
    """Open a count of ``inputs`` inputs (every slot 0) in this process, before its worker processes start
    (they inherit it through :func:`attach`); ``listener`` is called after each advance made in this process,
    ``ready`` once by :func:`workers_started`."""
    import multiprocessing as mp

    global _counts, _listener, _ready
    _counts = mp.Array("q", max(1, inputs))
    _counts._headcount_context = mp.get_start_method()
    _listener, _ready = listener, ready
    return _counts


def workers_started() -> None:
    """Every worker process of the work has started (or none will): from here a thread in this process is safe
    (a process forked later would inherit its locks), so the view may start its own."""
    global _ready
    ready, _ready = _ready, None
    if ready is not None:
        ready()


def shared(context=None):
    """The count a worker pool of multiprocessing ``context`` hands to its workers (``None``: nothing is counted).
    A count's lock belongs to the context that made it (a fork's cannot go to a forkserver's workers): opened
    in another, it is made again in ``context``, what it had counted carried over."""
    global _counts
    if _counts is None or context is None or getattr(_counts, "_headcount_context", None) == context.get_start_method():
        return _counts
    again = context.Array("q", len(_counts))
    again[:] = _counts[:]
    again._headcount_context = context.get_start_method()
    _counts = again
    return _counts


def close() -> None:
    """Forget the count (the command is over)."""
    global _counts, _listener, _ready, _slot
    _counts, _listener, _ready, _slot = None, None, None, None


def attach(counts) -> None:
    """In a worker process: count into ``counts`` (the parent's :func:`share`), told nothing of it here."""
    global _counts, _listener
    _counts, _listener = counts, None


@contextmanager
def reading(slot: int):
    """Inside it, what this process reads counts for input ``slot``."""
    global _slot
    before, _slot = _slot, slot
    try:
        yield
    finally:
        _slot = before


def task(slot: int, fn, *args):
    """``fn(*args)`` counting for input ``slot``: what a worker process runs for one input (or a part of it)."""
    with reading(slot):
        return fn(*args)


def advance(nbytes: int) -> None:
    """``nbytes`` more of the current input were read (nothing happens outside :func:`reading`, or with no count open)."""
    if _counts is None or _slot is None or nbytes <= 0 or _slot >= len(_counts):
        return
    with _counts.get_lock():  # two workers may read two spans of one file
        _counts[_slot] += nbytes
    if _listener is not None:
        _listener()


def read(slot: int) -> int:
    """Bytes of input ``slot`` counted so far (0 with no count open). Read without the count's lock: a worker
    killed while it held the lock (a stopped command's) must not leave the view waiting for it."""
    return int(_counts.get_obj()[slot]) if _counts is not None and slot < len(_counts) else 0
