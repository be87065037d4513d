"""What the user sees of long work while it runs: on a terminal a live bar (rich) — the phase, bytes read of
the inputs' total, files done of N, elapsed time and an estimate of what is left; elsewhere (a log, a pipe) plain
lines, one as each tenth of the bytes is read and one per phase, so a log shows the work moving without a line
per refresh.

The bytes come from :mod:`headcount.common.progress` (counted by whichever process reads); a file whose reader
cannot count (SQLite, ncu_report) counts as read once it is staged. Nothing here decides anything: a view only.
"""

from __future__ import annotations

import threading
import time

from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headcount.common import progress, stopping

SHOWN_FROM_BYTES = 8 << 20  # inputs smaller than this together (a gzip trace ~10× more) parse in about a second: no bar, no lines
REFRESH_S = 0.25  # how often the terminal bar is redrawn from the counts
PLAIN_STEP_PCT = 10  # off a terminal: a line each time this much more of the bytes is read


def size(n: float) -> str:
    """Bytes for a person: ``2.2 GB``, ``340 MB``, ``12 kB`` (powers of 1000, as ``ls -h --si``)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


class Meter:
    """The progress of reading ``sizes`` (bytes of each input, in order) into a report, ``what`` naming them.

    Use as a context manager around the work, :meth:`file_done` as each input is staged. Opens the shared count
    on entry (:func:`headcount.common.progress.share`) and closes it on exit; its thread starts only once the
    worker processes have (:func:`~headcount.common.progress.workers_started`). The phase shown follows the
    counts: ``reading`` while an input is part read (or none has begun), ``building tables`` while every input
    begun is read but not yet staged, ``writing the report`` once all are staged.
    """

    def __init__(self, console, sizes: list[int], what: str):
        self.console, self.sizes, self.what = console, [max(0, int(s)) for s in sizes], what
        self.total = sum(self.sizes)
        self.shown = self.total >= SHOWN_FROM_BYTES
        self.finished = [False] * len(sizes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Progress | None = None
        self._task = None
        self._started = time.monotonic()
        self._said_pct = 0
        self._said_state = "reading"

    def __enter__(self) -> "Meter":
        if self.shown:
            progress.share(len(self.sizes), listener=self._advanced, ready=self._start)
        if self.shown:  # the inputs named once: on a terminal the bar then holds only what moves, and fits 80 columns
            self.console.print(f"reading {self.what} ({size(self.total)})…", highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # is_alive, not `is not None`: a Ctrl-C inside Thread.start leaves a thread that join refuses
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=2 * REFRESH_S)
        if self._bar is not None:
            if exc[0] is None:
                self._draw()
            self._bar.stop()
        if self.shown:
            progress.close()

    def file_done(self, index: int) -> None:
        """Input ``index`` is staged (or failed): all its bytes count as read."""
        self.finished[index] = True
        self._advanced()

    def now(self) -> tuple[int, str]:
        """``(bytes read, phase)``: a staged input counts whole, the others as far as their readers counted."""
        read = [size if done else min(size, progress.read(i)) for i, (size, done) in enumerate(zip(self.sizes, self.finished))]
        begun = [(got, size) for got, size, done in zip(read, self.sizes, self.finished) if not done and got > 0]
        if all(self.finished):
            state = "writing the report"
        elif begun and all(got >= size for got, size in begun):
            state = "building tables"
        else:
            state = "reading"
        return sum(read), state

    def _start(self) -> None:
        """Every worker process has started: the bar (on a terminal) and the thread that follows the workers'
        counts may run now."""
        if self.console.is_terminal:
            # elapsed and left are this view's own: rich's stop counting once the bytes are read, the work does not
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20), DownloadColumn(),
                                 TextColumn("{task.fields[files]}"), TextColumn("{task.fields[times]}"),
                                 console=self.console, auto_refresh=False, transient=False)
            self._task = self._bar.add_task("reading", total=self.total or 1, files=self._files(), times="")
            self._bar.start()
        self._thread = threading.Thread(target=self._refresh, name="headcount-progress", daemon=True)
        stopping.start_helper(self._thread)

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            if self._bar is not None:
                self._draw()
            else:
                self._advanced()

    def _files(self) -> str:
        return f"{sum(self.finished)}/{len(self.finished)} files" if len(self.finished) > 1 else ""

    def _draw(self) -> None:
        with self._lock:
            done, state = self.now()
            self._bar.update(self._task, completed=done, files=self._files(), description=state,
                             times=self._times(done, state, short=True))
            self._bar.refresh()

    def _advanced(self) -> None:
        """Something moved: off a terminal, a line at each further tenth of the bytes and at each new phase."""
        if self.console.is_terminal or not self.shown:  # the bar's thread draws; small inputs: nothing to follow
            return
        with self._lock:
            done, state = self.now()
            pct = 100 * done // self.total if self.total else 100
            if pct >= self._said_pct + PLAIN_STEP_PCT or (pct == 100 and self._said_pct < 100):
                self._said_pct = pct - pct % PLAIN_STEP_PCT if pct < 100 else 100
                files = f"; {sum(self.finished)} of {len(self.finished)} files staged" if len(self.finished) > 1 else ""
                self.console.print(f"read {pct}% ({size(done)} of {size(self.total)}{files}), {self._times(done, state)}",
                                   highlight=False, soft_wrap=True)
            if state != self._said_state:
                self._said_state = state
                self.console.print(f"{state} ({self._times(done, state)})…", highlight=False, soft_wrap=True)

    def _times(self, done: int, state: str, short: bool = False) -> str:
        """``12 s elapsed, about 20 s left`` (``short``, for the bar: ``~20 s left``): what is left estimated from
        the rate of reading, while reading."""
        elapsed = time.monotonic() - self._started
        about = "~" if short else "about "
        left = f", {about}{_seconds(elapsed * (self.total - done) / done)} left" if state == "reading" and 0 < done < self.total else ""
        return f"{_seconds(elapsed)} elapsed{left}"


class Steps:
    """The progress of work counted in ``total`` ``unit`` (rows exported, tables read) with no worker process:
    on a terminal a bar (rich, its own refresh thread) with done of total and elapsed time, elsewhere a line per
    :meth:`phase` and at each further tenth done. Nothing is shown of work of fewer than ``shown_from`` units."""

    def __init__(self, console, total: int, what: str, unit: str, shown_from: int = 0):
        self.console, self.total, self.what, self.unit = console, max(0, int(total)), what, unit
        self.shown = self.total >= shown_from
        self._bar: Progress | None = None
        self._task = None
        self._done = 0
        self._drawn = 0
        self._said_pct = 0
        self._started = time.monotonic()

    def __enter__(self) -> "Steps":
        if self.shown and self.console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                                 TimeElapsedColumn(), console=self.console, transient=False)
            self._task = self._bar.add_task(self.what, total=self.total or 1)
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            if exc[0] is None:
                self._bar.update(self._task, completed=self._done)
            self._bar.stop()
        elif self.shown and exc[0] is None and self._said_pct < 100 and self._done >= self.total:
            self._say(100)

    def _say(self, pct: int) -> None:
        self._said_pct = pct - pct % PLAIN_STEP_PCT
        self.console.print(f"{pct}% ({self._done} of {self.total} {self.unit}), {_seconds(time.monotonic() - self._started)} "
                           "elapsed", highlight=False, soft_wrap=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done (the bar is moved at most every hundredth of the total: a call per row stays cheap)."""
        self._done += n
        if self._done - self._drawn < max(1, self.total // 100) or not self.shown:
            return
        self._drawn = self._done
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done)
            return
        pct = 100 * self._done // self.total
        if pct >= self._said_pct + PLAIN_STEP_PCT:  # off a terminal: a line at each further tenth
            self._say(pct)

    def phase(self, text: str) -> None:
        """Name what the work does now: the bar's label on a terminal, a line elsewhere."""
        if self._bar is not None:
            self._bar.update(self._task, description=text)
        elif self.shown:
            self.console.print(f"{text} ({self._done} of {self.total} {self.unit}, {_seconds(time.monotonic() - self._started)} "
                               "elapsed)…", highlight=False, soft_wrap=True)
