"""A torch.profiler trace's events, held a piece at a time and cut into groups of whole steps.

The events table of a trace (:func:`headcount.parsers.kineto_json.frames`) is built as the
file is read, a piece at a time. :class:`Pieces` keeps those pieces — in memory while
they are small, in a temporary directory once they pass :data:`HELD_BYTES` — with a
compact index of every row: its kind, times and launch correlation. From the index the
trace is cut into *slices*: its steps (headcount's step ranges, else torch.profiler's
``ProfilerStep#N``) and the time outside them, cut only where no CPU event (operator,
range, module, runtime call) is open, so a step that an open event crosses stays with its
neighbour. GPU work goes with its launch call (work whose launch the trace lacks: by its
own start). Consecutive steps, with the time after them up to the next step, are gathered
into groups of about :data:`GROUP_ROWS` rows. The build attributes one group at a time
(:func:`headcount.build.kineto.kineto_pieces`): memory follows the largest group, not the file.

A trace without steps is one group (attribution needs its ranges and launches together).
"""

from __future__ import annotations

import pickle
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.common.errors import HeadcountError
from headcount.common.naming import STEP_DOMAIN
from headcount.parsers import kineto_json as kineto
from headcount.parsers.plausible import drop_implausible

GROUP_ROWS = 200_000  # events attributed together (a group of whole steps): ~0.3 GB at the build's peak
CROSS_LIMIT = 4  # a group of pipelined steps grows up to this many GROUP_ROWS before it is cut across GPU work
HELD_BYTES = 192 << 20  # of event pieces held in memory; past it every piece goes to a temporary directory

_CPU_KINDS = ("op", "range", "module", "runtime")
_GPU_KINDS = ("kernel", "memcpy", "memset")
_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")
_INDEX = ("start", "end", "cpu", "gpu", "runtime", "correlation")


class Pieces:
    """The events table of one trace file, held a piece at a time (a context manager: the pieces
    written to a temporary directory it made are removed on exit, a Ctrl-C included).

    Read whole (:meth:`read`), or in spans by several workers (:meth:`read` of a
    :class:`~headcount.parsers.kineto_json.Span` each, writing into one ``directory``) whose parts one
    :meth:`add` gathers in order before :meth:`cut`. Pickled (to a worker) it carries the files of
    its pieces, not the directory's ownership.

    Attributes:
        path: the trace file.
        notices: what the reader should know about its events (implausible rows dropped; with ``salvage``, what a
            cut file lost).
        described: ``devices`` and ``distributed`` of the trace (:func:`headcount.parsers.kineto_json.read_trace`).
        launched: some GPU work of the trace has its launch call in it (see :func:`headcount.build.shared.tables_from_events`).
        count: the groups, once cut.
        counters: the trace's GPU counter events (:func:`headcount.parsers.kineto_counters.counter_rows`).
        pm: its PM samples, as the build made them of ``counters`` (:func:`headcount.build.in_process.trace_samples`).
    """

    def __init__(self, path: str | Path, group_rows: int | None = None, held_bytes: int | None = None,
                 directory: str | Path | None = None, salvage: bool = False):
        self.path = Path(path)
        self.salvage = salvage  # a cut trace read to its last whole event, with a notice (else refused)
        self.group_rows = GROUP_ROWS if group_rows is None else group_rows
        self.held_bytes = HELD_BYTES if held_bytes is None else held_bytes
        self.notices: list[str] = []
        self.described: dict = {"devices": [], "distributed": {}}
        self.launched = False
        self.count = 0
        self.counters: list[tuple] = []
        self.pm = None
        self._held: list[pd.DataFrame | Path] = []  # a piece, or the file it was written to
        self._index: dict[str, list[np.ndarray]] = {name: [] for name in _INDEX}
        self._steps: dict[str, list[np.ndarray]] = {"headcount": [], "profiler": []}
        self._bytes = 0
        self._directory = Path(directory) if directory is not None else None  # where pieces are written
        self._owned: tempfile.TemporaryDirectory | None = None  # the directory, when this made it
        self._name = "piece"
        self._groups: list[np.ndarray] = []  # each piece's rows: their group

    def __enter__(self) -> "Pieces":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_owned": None}

    def close(self) -> None:
        """Remove the pieces written to the temporary directory this made."""
        self._held = []
        if self._owned is not None:
            self._owned.cleanup()
            self._owned = None

    @property
    def spilled(self) -> bool:
        """Whether pieces went to disk."""
        return any(isinstance(held, Path) for held in self._held)

    def read(self, span=None) -> "Pieces":
        """Read the trace (or its ``span``, :class:`~headcount.parsers.kineto_json.Span`), a piece at a time;
        the whole trace is then cut into groups (:attr:`count` of them).

        Raises:
            HeadcountError: the file is missing, not a trace, or holds no complete event; no room
                on disk for its pieces.
        """
        if span is not None:
            self._name = f"span{span.index}"
        for frame in kineto.frames(self.path, self.described, span, salvage=self.salvage):
            self._add(drop_implausible(frame, "events", self.notices))
        self.counters += self.described.pop("counters", [])
        if "damaged" in self.described:  # salvaged: what was lost, said first
            self.notices.insert(0, self.described.pop("damaged"))
        if span is None:
            self.cut()
        return self

    def add(self, part: "Pieces") -> None:
        """Take ``part``'s pieces (a span read by a worker into this one's directory) after this one's."""
        self._held += part._held
        for name in _INDEX:
            self._index[name] += part._index[name]
        for source in self._steps:
            self._steps[source] += part._steps[source]
        self.notices += part.notices
        self.counters += part.counters
        if part.described["devices"] or part.described["distributed"]:
            self.described = part.described

    def _add(self, frame: pd.DataFrame) -> None:
        kind = frame["kind"].to_numpy(object)
        correlation = pd.array(frame["correlation_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)
        index = {"start": frame["start_ns"].to_numpy(np.int64), "end": frame["end_ns"].to_numpy(np.int64),
                 "cpu": np.isin(kind, _CPU_KINDS), "gpu": np.isin(kind, _GPU_KINDS), "runtime": kind == "runtime",
                 "correlation": correlation}
        for name, values in index.items():
            self._index[name].append(values)
        ranges = np.flatnonzero(kind == "range")
        if len(ranges):
            names = frame["name"].to_numpy(object)[ranges]
            for source, hit in (("headcount", [str(n).startswith(STEP_DOMAIN + "@") for n in names]),
                                ("profiler", [_PROFILER_STEP.fullmatch(str(n)) is not None for n in names])):
                rows = ranges[np.asarray(hit, dtype=bool)]
                self._steps[source].append(np.stack([index["start"][rows], index["end"][rows]], axis=1))
        self._held.append(frame)
        self._bytes += int(frame.memory_usage(index=False).sum())
        if self._bytes > self.held_bytes:
            self._spill()

    def _spill(self) -> None:
        """Every piece held in memory to the directory (a temporary one, made on the first call, if none was given)."""
        try:
            if self._directory is None:
                self._owned = tempfile.TemporaryDirectory(prefix="headcount-trace-")
                self._directory = Path(self._owned.name)
            for i, held in enumerate(self._held):
                if isinstance(held, pd.DataFrame):
                    target = self._directory / f"{self._name}-{i}.pickle"
                    with target.open("wb") as fh:
                        pickle.dump(held, fh, protocol=pickle.HIGHEST_PROTOCOL)
                    self._held[i] = target
        except OSError as exc:
            raise HeadcountError(f"{self.path}: cannot hold the trace's events in {self._directory} ({exc.strerror or exc})",
                                 hint="free space there, or point TMPDIR at a writable folder with room for half the trace's JSON") from exc
        self._bytes = 0

    def cut(self) -> None:
        """Each row's group: consecutive steps (and the time after them) up to :attr:`group_rows` rows.

        Raises:
            HeadcountError: the trace holds no complete event.
        """
        self.notices[:] = merged(self.notices)
        if not sum(len(a) for a in self._index["start"]):
            raise HeadcountError(f"{self.path}: the trace holds no complete event (ph \"X\")",
                                 hint="record with torch.profiler.profile() around some work")
        start, end, cpu, gpu, runtime, correlation = (np.concatenate(self._index[name]) for name in _INDEX)
        steps = _steps(self._steps)
        bounds = _open_free(steps.ravel(), start[cpu], end[cpu]) if len(steps) else np.empty(0, np.int64)
        interval = np.searchsorted(bounds, start, side="right")  # 0 … len(bounds)
        is_step = np.zeros(len(bounds) + 1, dtype=bool)
        if len(steps):
            is_step[np.searchsorted(bounds, steps[:, 0], side="right")] = True
        # GPU work: the interval of its launch call (correlation ids are unique among the runtime calls)
        launches = np.flatnonzero(runtime & (correlation >= 0))
        order = launches[np.argsort(correlation[launches], kind="stable")]
        sorted_ids = correlation[order]
        gpu_rows = np.flatnonzero(gpu)
        ids = correlation[gpu_rows]
        at = np.zeros(len(gpu_rows), dtype=np.int64)
        has_launch = np.zeros(len(gpu_rows), dtype=bool)
        if len(order):
            at = np.minimum(np.searchsorted(sorted_ids, ids), len(order) - 1)
            has_launch = (ids >= 0) & (sorted_ids[at] == ids)
        self.launched = bool(has_launch.any())
        interval[gpu_rows[has_launch]] = interval[order[at[has_launch]]]  # without a launch: by its own start
        counts = np.bincount(interval, minlength=len(is_step))
        clear = _clear_cuts(interval[gpu_rows], start[gpu_rows], end[gpu_rows], len(is_step))
        group_of = np.zeros(len(is_step), dtype=np.int32)
        group, held, crossed = -1, self.group_rows, 0
        for i in range(len(is_step)):  # time outside the steps goes with the steps before it (the first group's: before them)
            # a cut only where the GPU work before it has ended before the work after it starts (pipelined steps stay
            # together: a step's busy time is the device's, its neighbours' work included), unless a group grows past
            # CROSS_LIMIT times its size
            if is_step[i] and held >= self.group_rows and (clear[i] or held >= CROSS_LIMIT * self.group_rows):
                crossed += int(group >= 0 and not clear[i])
                group, held = group + 1, 0
            group_of[i] = max(group, 0)
            held += int(counts[i])
        if crossed:
            self.notices.append(f"{crossed} of the trace's {group} cuts into step groups fall where one step's GPU work still "
                                "ran beside the next one's (pipelined steps over more than "
                                f"{CROSS_LIMIT * self.group_rows:,} events): the steps at those cuts count only their own "
                                "group's work on the device")
        self.count = max(group + 1, 1)
        row_group = group_of[interval]
        sizes = np.cumsum([0, *(len(a) for a in self._index["start"])])
        self._groups = [row_group[lo:hi] for lo, hi in zip(sizes[:-1], sizes[1:])]
        self._index = {}  # not needed past the cut

    def groups(self, which=None):
        """``(group number, events table)`` of each group (of those numbered in ``which``), in order
        (rows in the file's order)."""
        for group in range(self.count) if which is None else which:
            parts = []
            for held, of_rows in zip(self._held, self._groups):
                mine = of_rows == group
                if not mine.any():
                    continue
                frame = _load(held) if isinstance(held, Path) else held
                parts.append(frame[mine] if not mine.all() else frame)
                del frame
            yield group, parts[0].reset_index(drop=True) if len(parts) == 1 else pd.concat(parts, ignore_index=True)
            del parts


def _clear_cuts(interval: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """Per interval i (0 … n-1): whether every GPU operation of the intervals before it ends no later than every one of
    the intervals from it starts (the device's work does not cross a cut there)."""
    if not len(interval):
        return np.ones(n, dtype=bool)
    last_end = np.full(n, -np.inf)
    np.maximum.at(last_end, interval, end.astype(np.float64))
    first_start = np.full(n, np.inf)
    np.minimum.at(first_start, interval, start.astype(np.float64))
    before = np.r_[-np.inf, np.maximum.accumulate(last_end)[:-1]]  # the latest end of the intervals before i
    after = np.minimum.accumulate(first_start[::-1])[::-1]  # the earliest start of intervals i …
    return before <= after


def _load(path: Path) -> pd.DataFrame:
    with path.open("rb") as fh:
        return pickle.load(fh)


def _steps(found: dict[str, list[np.ndarray]]) -> np.ndarray:
    """The trace's steps as ``(start, end)`` rows in time order, overlapping ones merged: headcount's
    step ranges, else torch.profiler's ``ProfilerStep#N`` (as :func:`headcount.build.kineto.tables_from_kineto` takes them)."""
    for source in ("headcount", "profiler"):
        spans = np.concatenate(found[source]) if found[source] else np.empty((0, 2), np.int64)
        if len(spans):
            break
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    merged_spans: list[list[int]] = []
    for s, e in spans.tolist():
        if merged_spans and s < merged_spans[-1][1]:
            merged_spans[-1][1] = max(merged_spans[-1][1], e)
        else:
            merged_spans.append([s, e])
    return np.array(merged_spans, dtype=np.int64).reshape(-1, 2)


def _open_free(candidates: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The candidate times (sorted, distinct) that no CPU event is open across (one that
    starts before and ends after): where the trace can be cut."""
    candidates = np.unique(candidates)
    if not len(start):
        return candidates
    order = np.argsort(start, kind="stable")
    reach = np.maximum.accumulate(end[order])  # the latest end among the events started so far
    before = np.searchsorted(start[order], candidates, side="left")  # events starting before each candidate
    open_across = (before > 0) & (reach[np.maximum(before - 1, 0)] > candidates)
    return candidates[~open_across]


_NUMBER = re.compile(r"(?<![\w.:])\d+(?![\w.])")


def merged(notices: list[str]) -> list[str]:
    """Notices of several pieces or groups as one: lines that differ only in their counts (whole
    numbers standing alone, not in a name or a version) become one line with the counts summed,
    where the first of them stood; other lines kept once each, in order."""
    out: list[str] = []
    at: dict[str, int] = {}
    counts: dict[str, list[int]] = {}
    for line in notices:
        template = _NUMBER.sub("\0", line)
        numbers = [int(n) for n in _NUMBER.findall(line)]
        if template in at:
            if numbers:
                counts[template] = [a + b for a, b in zip(counts[template], numbers)]
            continue
        at[template], counts[template] = len(out), numbers
        out.append(template)
    for template, i in at.items():
        numbers = iter(counts[template])
        out[i] = re.sub("\0", lambda _: str(next(numbers)), template)
    return out
