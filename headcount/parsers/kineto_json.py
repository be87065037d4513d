"""Read a torch.profiler (Kineto) Chrome trace into one events table.

The trace is the file ``torch.profiler.profile.export_chrome_trace`` writes,
the same one Holistic Trace Analysis reads. Timestamps are microseconds with
three decimals relative to ``baseTimeNanoseconds``; they become integer
nanoseconds exactly: from their float64 parse where that pins one nanosecond
(:func:`~headcount.parsers.kineto_times.exact_nanoseconds`), else from the number's own digits (msgspec, as
``Decimal``; a float64 of ~5e12 µs with three decimals is at the edge of its
precision). Only the fields the table needs are decoded.

Output columns (one row per complete ``"ph": "X"`` event):

====================  =========================================================
``kind``              ``op`` (CPU operator), ``range`` (record_function /
                      user annotation), ``kernel``, ``memcpy``, ``memset``
                      (GPU activity), ``runtime`` (CUDA runtime/driver call)
``name``              event name
``pid``, ``tid``      process and thread as the trace gives them
``start_ns``          start, ns since the trace's base time
``end_ns``            end, ns
``correlation_id``    launch correlation (GPU activity and runtime calls)
``device``, ``stream``  GPU activity only
``grid``, ``block``   launch configuration, e.g. ``"(256, 1, 1)"``
``registers_per_thread``, ``shared_memory_bytes``, ``est_achieved_occupancy_pct``
``args``              the op's recorded inputs (``Input Dims``, ``Input type``,
                      ``Concrete Inputs``) for attention operators and the
                      softmax and batched-matmul operators of eager attention
                      only (what :mod:`headcount.attribute.untagged` needs), else null
``sequence``          a CPU op's autograd ``Sequence number`` (a backward op carries
                      its forward op's); null otherwise
``graph_node_id``     a kernel replayed from a CUDA graph: its node (Kineto's
                      ``graph node id``); null otherwise
``external_ref``      Kineto's ``External id`` of a kernel and of an op with estimates
                      (a kernel's is that of the operator that launched it)
``estimated_flop``, ``estimated_num_gb``  Inductor's ``kernel_flop`` / ``kernel_num_gb``
                      (GB = 1e9 bytes) where the op or kernel carries them; null otherwise
``graph_annotation``, ``autograd_phase``  a replayed kernel's CUDA-graph annotation baked into
                      its args (``name``, ``autograd_phase``); null otherwise
====================  =========================================================

``kind`` ``module`` marks an ``nn.Module: <Class>_<k>`` range of a trace
recorded ``with_modules=True``. Files may be gzip-compressed (``.json.gz``).
:func:`read_trace` also returns the trace's ``deviceProperties`` and its
``distributedInfo``'s rank. The file is read, decoded and tabulated
:data:`CHUNK_BYTES` at a time (its whole text and decoded events took four
times the memory of its bytes): the events table is built as it is read.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from headcount.common import signals
from headcount.common.device import Device
from headcount.common.errors import DAMAGED, HeadcountError
from headcount.parsers.files import damaged, read_chunk, unreadable
from headcount.parsers.kineto_counters import counter_rows
from headcount.parsers.kineto_events import Args, Event, ExactEvent
from headcount.parsers.kineto_times import exact_nanoseconds

_KIND_BY_CAT = {
    "cpu_op": "op",
    "user_annotation": "range",
    "gpu_user_annotation": "gpu_annotation",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
}

COLUMNS = [
    "kind", "name", "pid", "tid", "start_ns", "end_ns", "correlation_id", "device", "stream",
    "grid", "block", "registers_per_thread", "shared_memory_bytes", "est_achieved_occupancy_pct", "args", "graph_node_id",
    "sequence", "external_ref",
]
OPTIONAL = ["estimated_flop", "estimated_num_gb", "graph_annotation", "autograd_phase"]  # only in pieces that have them
_GPU_SIDE = {"kernel", "memcpy", "memset", "runtime"}
MODULE_PREFIX = "nn.Module: "


def _message(a: Args) -> dict:
    """A collective kernel's message, kept in the ``args`` column (a few rows: no column for every event)."""
    return {"Collective name": a.collective, "In msg nelems": a.in_nelems, "Out msg nelems": a.out_nelems,
            "Group size": a.group_size, "dtype": a.dtype}


def _launch_dims(value) -> str | None:
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(int(v)) for v in value) + ")"
    return None if value is None else str(value)


_NOT_A_TRACE = "pass the file written by torch.profiler's export_chrome_trace"


def _open(path: Path):
    """The trace file as a binary stream (gzip's decompressed on the fly).

    Raises:
        HeadcountError: missing or unreadable file.
    """
    try:
        fh = path.open("rb")
        gzipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    return gzip.GzipFile(fileobj=fh) if gzipped else fh


EVENT_BATCH = 100_000  # events decoded at a time where the events array is not found by its key (:func:`_whole`)
CHUNK_BYTES = 8 << 20  # of the trace's text read, decoded and tabulated at a time: the file is never held whole
BOUNDARY_TRIES = 64  # candidate ends of an event tried, from a piece's end back, before more of the file is read


class _Document(msgspec.Struct):
    """A trace's fields besides its events (the events array read apart, :func:`_event_pieces`)."""

    traceEvents: list[msgspec.Raw]
    deviceProperties: Any = None
    distributedInfo: Any = None  # {"rank", "world_size", "backend", …} where torch.distributed ran


_DECODERS = {False: msgspec.json.Decoder(list[Event]), True: msgspec.json.Decoder(list[ExactEvent])}
_SYNTAX = msgspec.json.Decoder(list[msgspec.Raw])  # a piece's JSON checked, not decoded
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_END = re.compile(rb"\}\s*,\s*\{")  # where one event may end and the next begin (checked by decoding)
_AT = re.compile(r"`\$\[(\d+)\]")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")  # msgspec: where the text after a closed array begins


def _invalid(path: Path, exc: msgspec.ValidationError, offset: int = 0) -> HeadcountError:
    """The error for a trace that does not fit (``offset``: the first event of the piece that failed)."""
    where = _AT.sub(lambda m: f"`$.traceEvents[{int(m.group(1)) + offset}]", str(exc))  # msgspec names the place
    if where.endswith((".ts`", ".dur`")):
        return HeadcountError(f"{path}: an event has no valid ts/dur ({where})", hint="the trace is damaged; record it again")
    if "`traceEvents`" in where or where.endswith("at `$.traceEvents`"):
        return HeadcountError(f"{path}: not a torch.profiler trace (no traceEvents list)", hint=_NOT_A_TRACE)
    return HeadcountError(f"{path}: not a torch.profiler trace ({where})", hint=_NOT_A_TRACE)


def _too_deep(path: Path) -> HeadcountError:
    return HeadcountError(f"{path}: not a torch.profiler trace (JSON nested too deep to read: values inside values more "
                          "than about a thousand levels down)", hint=_NOT_A_TRACE)


def _not_json(path: Path, exc: Exception) -> HeadcountError:
    if "truncated" in str(exc):  # msgspec: the text ends inside a value
        return damaged(path, f"truncated torch.profiler trace: its JSON ends early ({exc})")
    return HeadcountError(f"{path}: not a torch.profiler trace (invalid JSON: {exc})", hint=_NOT_A_TRACE)


def _whole(path: Path, text: bytes) -> _Document:
    """The trace's JSON decoded whole (its events kept as text).

    Raises:
        HeadcountError: invalid JSON, no ``traceEvents`` list.
    """
    try:
        return msgspec.json.decode(text, type=_Document)
    except msgspec.ValidationError as exc:
        raise _invalid(path, exc) from exc
    except msgspec.DecodeError as exc:
        raise _not_json(path, exc) from exc


class _NotAnEnd(Exception):
    """A piece of the events array cut where no event ends: inside an event, or past the array's end."""


def _decode_events(path: Path, text, first: int, exact: bool = False) -> list:
    """The events of ``text`` (a JSON array of the file's events from index ``first`` on).

    Raises:
        HeadcountError: an event that does not fit (a malformed ``ts``/``dur``), invalid JSON.
        _NotAnEnd: ``text`` is cut inside an event, or past the events array's end.
    """
    try:
        return _DECODERS[exact].decode(text)
    except msgspec.ValidationError as exc:
        try:
            _SYNTAX.decode(text)
        except msgspec.DecodeError:
            raise _NotAnEnd from None  # a place inside an event: the error may be of the cut, not the file
        raise _invalid(path, exc, first) from exc
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc) or "trailing characters" in str(exc):  # cut inside an event, or past the array
            raise _NotAnEnd from None
        raise _not_json(path, exc) from exc  # e.g. invalid UTF-8 in a name


def _last_events(path: Path, text: bytearray, first: int) -> tuple[int, list, bytes] | None:
    """Where the last whole event of ``text`` (``[`` then events, comma-separated) ends, the events
    before it, decoded, and their text (a JSON array, which they refer to): the last place that reads
    as an event's end (``},{``) and leaves valid JSON before it (one inside a string or a nested value
    does not). ``None``: none among the last :data:`BOUNDARY_TRIES`.

    Raises:
        HeadcountError: as :func:`_decode_events`.
    """
    ends = [m.start() + 1 for m in _EVENT_END.finditer(text, max(0, len(text) - (1 << 20)))]
    if len(ends) < BOUNDARY_TRIES and len(text) > 1 << 20:
        ends = [m.start() + 1 for m in _EVENT_END.finditer(text)]
    for end in reversed(ends[-BOUNDARY_TRIES:]):
        kept = text[end]
        text[end] = ord("]")  # the character after the event's "}" ends the array
        try:
            with memoryview(text) as view:
                piece = bytes(view[:end + 1])  # a copy: the events' inputs (msgspec.Raw) point into it
            return end, _decode_events(path, piece, first), piece
        except _NotAnEnd:
            continue
        finally:
            text[end] = kept
    return None


SPLIT_BYTES = 64 << 20  # plain trace files from this size are read in spans by several workers (:func:`spans`)
_SPAN_START = re.compile(rb'\}\s*,\s*(\{\s*"ph"\s*:)')  # an event's start, as Kineto writes them ("ph" first)
_HEAD_BYTES = 16 << 20  # where the events array must begin for a file to be read in spans


@dataclass(frozen=True)
class Span:
    """A stretch of a plain trace file's events array, read by one worker (:func:`spans`).

    Attributes:
        index: its place among the file's spans.
        start: the offset of its first event's ``{`` (``None``: the first span, read from the file's start).
        stop: the next span's ``start`` (``None``: the last span, read to the file's end).
        head: the file's text before its events array (the last span reads the trace's other fields from it).
    """

    index: int
    start: int | None
    stop: int | None
    head: bytes = b""


class Misaligned(HeadcountError):
    """A span's bounds are not between two events (read the file whole instead)."""


def spans(path: str | Path, parts: int) -> list[Span] | None:
    """Where ``parts`` workers may each read a stretch of ``path``'s events: bounds a few bytes past
    evenly spaced offsets, each where an event begins (``},`` then ``{"ph":``). ``None`` where the file
    is read whole: fewer than 2 parts, under :data:`SPLIT_BYTES`, gzip (no seeking), or no events
    array near its top. A bound inside a string cannot be told from here: the span readers then
    fail (:class:`Misaligned` or another error) and the caller reads the file whole."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if parts < 2 or size < SPLIT_BYTES:
            return None
        with path.open("rb") as fh:
            top = fh.read(_HEAD_BYTES)
            found = _ARRAY_START.search(top)
            if top[:2] == b"\x1f\x8b" or found is None:
                return None
            starts = []
            for k in range(1, parts):
                at = found.end() + (size - found.end()) * k // parts
                fh.seek(at)
                start = _SPAN_START.search(fh.read(1 << 20))
                if start is None:
                    return None
                starts.append(at + start.start(1))
    except OSError:
        return None  # the whole-file read names the problem
    if any(b <= a for a, b in zip([found.end(), *starts], starts)):
        return None
    return [Span(k, begin, end, top[:found.end()]) for k, (begin, end) in enumerate(zip([None, *starts], [*starts, None]))]


def _event_pieces(path: Path, into: dict, span: Span | None = None, salvage: bool = False):
    """The ``traceEvents`` array of a trace (or the ``span`` of it), read :data:`CHUNK_BYTES` at a
    time: yields ``(events, text, first)`` — the decoded events of a piece, its text (a JSON array)
    and the index of its first event in the file (in the span) — then, reading to the file's end,
    puts the trace's other fields in ``into["document"]`` (:class:`_Document`, no events).

    A file cut short (a gzip stream without its end, an events array that never closes) is refused,
    or with ``salvage`` read to its last whole event, ``into["cut"]`` saying how it ends.

    Raises:
        HeadcountError: unreadable, truncated or invalid JSON; no ``traceEvents`` list; an event that
            does not fit. Misaligned: the span does not end between two events.
    """
    with _open(path) as fh:
        def read() -> bytes:
            size = min(CHUNK_BYTES, 64 << 20)  # a piece may take several reads
            if span is not None and span.stop is not None:
                size = min(size, span.stop - fh.tell())
            try:
                return read_chunk(fh, size, into if salvage else None)  # salvage: a cut stream's data kept, into["cut"] set
            except EOFError as exc:
                raise damaged(path, "truncated torch.profiler trace: the gzip stream ends before its end marker",
                              kept="the events before the cut") from exc
            except OSError as exc:  # gzip.BadGzipFile is an OSError
                raise HeadcountError(f"{path}: not a torch.profiler trace ({exc})", hint=_NOT_A_TRACE) from exc

        if span is not None and span.start is not None:
            fh.seek(span.start)
            yield from _array_pieces(path, into, bytearray(b"["), span.head, read, span.stop is None, salvage)
            return
        text, searched = bytearray(), 0
        while (start := _ARRAY_START.search(text, searched)) is None:  # the key is near the top in torch's files
            searched = max(0, len(text) - 64)  # the key may straddle two reads
            more = read()
            if not more:  # no events array where expected: the whole document says what it is
                document = _whole(path, bytes(text))
                for lo in range(0, len(document.traceEvents), EVENT_BATCH):
                    piece = b"[" + b",".join(document.traceEvents[lo:lo + EVENT_BATCH]) + b"]"
                    yield _decode_events(path, piece, lo), piece, lo
                document.traceEvents = []
                into["document"] = document
                return
            text += more
        head, text = bytes(text[:start.end()]), bytearray(b"[") + text[start.end():]
        yield from _array_pieces(path, into, text, head, read, span is None or span.stop is None, salvage)


def _array_pieces(path: Path, into: dict, text: bytearray, head: bytes, read, to_the_end: bool, salvage: bool = False):
    """:func:`_event_pieces` from ``text`` (``[`` and what was read of the events array so far) on,
    ``read`` giving more: to the array's end and the document after it (``to_the_end``), else to
    where ``read`` stops, which must be just past an event and its comma (a span's end)."""
    first, ended = 0, False
    while not ended:
        more = read()
        ended = not more
        text += more
        if len(text) < CHUNK_BYTES and not ended:
            continue
        found = _last_events(path, text, first)
        if found is None:
            if not ended:
                continue  # an event longer than a chunk: read on
            break
        end, events, piece = found
        text = bytearray(b"[") + text[end:].lstrip()[1:]  # past the comma after the event
        yield events, piece, first
        first += len(events)
        del events, piece
    if not to_the_end:  # a span's end: its last event, then the comma before the next span's first
        body = bytes(text).rstrip()
        try:
            if not body.endswith(b","):
                raise _NotAnEnd
            events = _decode_events(path, body[:-1] + b"]", first) if len(body) > 2 else []
        except (_NotAnEnd, HeadcountError) as exc:
            raise Misaligned(f"{path}: a span of the events array does not end between two events",
                             hint="read the file whole") from exc
        if events:
            yield events, body[:-1] + b"]", first
        return
    # the file's end: its last events, the array's end, the document's other fields
    for close in _array_ends(text):
        piece = bytes(text[:close + 1])
        try:
            events = _decode_events(path, piece, first)
        except _NotAnEnd:
            continue
        if events:
            yield events, piece, first
        try:
            into["document"] = _whole(path, head + b"]" + bytes(text[close + 1:]))
        except HeadcountError:
            if not salvage:
                raise
            into["document"], into["cut"] = _whole(path, head + b"]}"), "the fields after its events are cut"
        return
    if not salvage:
        raise damaged(path, f"truncated or damaged torch.profiler trace: its events array breaks off after event {first} "
                      "and never closes", kept="the events before the break")
    found = _last_events(path, text, first)  # the events before the cut: the document's other fields came before them
    if found:
        yield found[1], found[2], first
    into["document"] = _whole(path, head + b"]}")
    into.setdefault("cut", "its events array breaks off and never closes")


def _array_ends(text: bytearray):
    """Where the events array that ``text`` starts may end (a ``]``): where msgspec says the text after
    the closed array begins, else (no such place: a damaged file) every ``]`` from the first on."""
    try:
        _SYNTAX.decode(text)
    except msgspec.DecodeError as exc:
        if at := _TRAILING.search(str(exc)):
            close = text.rfind(b"]", 0, int(at.group(1)))
            if close >= 0:
                yield close
    except msgspec.ValidationError:
        pass
    else:
        yield len(text) - 1  # the file ends with the array (no document around it)
    yield from (m.start() for m in re.finditer(rb"\]", text))


def _batch_frame(path: Path, events: list, text: bytes | bytearray, first: int) -> pd.DataFrame:
    """The events table of a piece: its events decoded with float times, and once more from the digits
    (``text``) where they are not exact.

    Raises:
        HeadcountError: an event that does not fit, invalid text in it.
    """
    try:
        return events_frame(events, source=str(path))
    except _Inexact:  # times with more than three decimals: as their decimal digits say
        return events_frame(_decode_events(path, text, first, exact=True), source=str(path))


def frames(path: str | Path, into: dict, span: Span | None = None, salvage: bool = False):
    """The events table of a trace file (or of a :class:`Span` of it) in pieces, as the file is read
    (:data:`CHUNK_BYTES` of its text each, :func:`_event_pieces`); then, where the file was read to
    its end, ``into`` gets ``devices`` and ``distributed`` (as :func:`read_trace` returns them), and
    (a cut file read with ``salvage``) ``damaged``: what was lost, a notice. ``into["counters"]``: the
    GPU counter events read (:func:`headcount.parsers.kineto_counters.counter_rows`).

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace (Misaligned: the span's
            bounds are not between two events).
    """
    path, document, events_read = Path(path), {}, 0
    pieces = _event_pieces(path, document, span, salvage)
    while True:
        try:
            events, text, first = next(pieces)
            frame = _batch_frame(path, events, text, first)
        except StopIteration:
            break
        except RecursionError:  # msgspec decodes nested arrays and objects recursively
            raise _too_deep(path) from None
        events_read += len(events)
        into.setdefault("counters", []).extend(counter_rows(events))
        del events, text
        if len(frame):
            yield frame
    if "document" in document:
        into.update(_described(document["document"]))
    if "cut" in document:
        into["damaged"] = f"{DAMAGED}the file is cut ({document['cut']}): its {events_read} events before the cut read, the rest lost"


def _described(trace: _Document) -> dict:
    """``devices`` and ``distributed`` of a trace's fields besides its events (see :func:`read_trace`)."""
    devices = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []
    info = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    distributed = {key: info[key] for key in ("rank", "world_size")
                   if isinstance(info.get(key), int) and not isinstance(info[key], bool) and 0 <= info[key] < 2**31}
    return {"devices": [d for d in devices if isinstance(d, dict)], "distributed": distributed}


def _frame_of(path: Path) -> tuple[pd.DataFrame, dict]:
    """The events table of a trace file, built a piece at a time, and what else it holds (:func:`frames`)."""
    into: dict = {}
    pieces = list(frames(path, into))
    if not pieces:
        return events_frame([], source=str(path)), into
    return (pieces[0] if len(pieces) == 1 else pd.concat(pieces, ignore_index=True)), into


def load_trace(path: str | Path) -> pd.DataFrame:
    """Parse a Kineto Chrome trace file (plain or gzip) into the events table described above.

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace.
    """
    return _frame_of(Path(path))[0]


def read_trace(path: str | Path) -> dict:
    """A trace file as ``{"events": events table, "devices": deviceProperties (list of dicts, empty for a CPU
    trace), "distributed": {"rank", "world_size"} from its ``distributedInfo``, those that are whole numbers
    (empty for one process), "counters": its GPU counter events}`` (:func:`frames`).

    Raises:
        HeadcountError: the file is missing, not JSON, or not a Chrome trace.
    """
    events, described = _frame_of(Path(path))
    return {"events": events, **described}


def run_device(devices: list[dict]) -> Device | None:
    """The run's device from a trace's ``deviceProperties`` (:meth:`~headcount.common.device.Device.from_kineto`);
    ``None`` for a CPU trace."""
    return Device.from_kineto(devices)


class _Inexact(Exception):
    """A time that its float64 parse does not pin to one nanosecond (decode the digits instead)."""


def _times(kept: list, source: str) -> tuple[np.ndarray, np.ndarray]:
    """``(start_ns, end_ns)`` of the kept events, exactly.

    Raises:
        _Inexact: float-decoded times that do not pin an exact nanosecond.
        HeadcountError: a missing ``ts``, or a time outside int64 nanoseconds.
    """
    ts = [ev.ts for ev in kept]
    dur = [ev.dur for ev in kept]
    missing = next((ev for ev in kept if ev.ts is None), None)
    if missing is not None:
        raise HeadcountError(f"{source}: event {missing.name!r} has no valid ts/dur", hint="the trace is damaged; record it again")
    try:
        if kept and isinstance(kept[0], ExactEvent):  # microseconds with three decimals → integer nanoseconds, from the digits
            start = np.array([int(v.scaleb(3)) for v in ts], dtype=np.int64)
            length = np.array([int(v.scaleb(3)) if v is not None else 0 for v in dur], dtype=np.int64)
        else:
            start = exact_nanoseconds(np.array(ts, dtype=np.float64))
            length = exact_nanoseconds(np.nan_to_num(np.array(dur, dtype=np.float64), nan=0.0))  # no dur: 0
            if start is None or length is None:
                raise _Inexact
    except (OverflowError, ValueError, ArithmeticError) as exc:  # inf/nan decimals, or beyond int64
        raise HeadcountError(f"{source}: an event's ts/dur is out of range ({exc})", hint="the trace is damaged; record it again") from exc
    return start, start + length


def _spread(values: list, rows: list[int], n: int, dtype) -> pd.Series | pd.api.extensions.ExtensionArray:
    """A column of ``n`` rows holding ``values`` at ``rows``, null elsewhere: text (``dtype`` object),
    else numbers as ``dtype`` (``Int64``/``Float64``; a value that is no number is null)."""
    if dtype is object:
        out = np.full(n, np.nan, dtype=object)  # null as pandas writes it for text
        out[rows] = values
        return pd.Series(out, dtype=object)
    try:
        part = pd.array(values, dtype=dtype)  # the file's numbers as they are (fast)
    except (TypeError, ValueError):  # text or lists in a damaged or hand-made trace
        part = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype(dtype).array
    numpy_type = part.dtype.numpy_dtype
    data, mask = np.zeros(n, dtype=numpy_type), np.ones(n, dtype=bool)
    if len(rows):
        data[rows] = part.to_numpy(numpy_type, na_value=0)
        mask[rows] = part.isna()
    return pd.array(data, dtype=dtype) if not mask.any() else type(part)(data, mask)


def _dims(values: list) -> list:
    """:func:`_launch_dims` of each value, worked out once per distinct launch shape."""
    done: dict = {}
    out = []
    for value in values:
        key = tuple(value) if type(value) is list else value
        try:
            text = done[key]
        except KeyError:
            text = done[key] = _launch_dims(value)
        except TypeError:  # an unhashable value (a damaged trace)
            text = _launch_dims(value)
        out.append(text)
    return out


_SIMPLE = {str, int, float, type(None)}


def _as_text(values: list) -> np.ndarray:
    """``values`` as an object array of ``str``, converted once per distinct value
    (pid/tid can be numbers or text such as ``"stream 7"``)."""
    codes, uniques = pd.factorize(_objects(values), use_na_sentinel=False)
    return np.array([str(u) for u in uniques], dtype=object)[codes]


def _objects(values: list) -> np.ndarray:
    """``values`` as a 1-D object array (lists and dicts of a damaged trace as their text)."""
    if set(map(type, values)) <= _SIMPLE:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.array(_hashable(values), dtype=object)


def _hashable(values: list) -> list:
    """``values`` with lists and dicts (a damaged or hand-made trace) as their text."""
    return [v if v is None or isinstance(v, (str, int, float)) else repr(v) for v in values]


def _json(value):
    """An input field's value: decoded from its JSON text (:class:`Args`), as is when given decoded."""
    return msgspec.json.decode(value) if isinstance(value, msgspec.Raw) else value


def events_frame(events: list, source: str = "trace") -> pd.DataFrame:
    """Turn a trace's events (decoded, or Chrome-trace dicts) into the events
    table (complete ``X`` events of the kinds above).

    Raises:
        HeadcountError: a kept event without a ``ts``, or a time that does not fit in int64 nanoseconds.
        _Inexact: (decoded events with float times) a time not pinned to one nanosecond.
    """
    if events and isinstance(events[0], dict):
        text = msgspec.json.encode(events)  # as the file would hold them: the inputs are kept as JSON text (Args)
        try:
            return events_frame(_DECODERS[False].decode(text), source)
        except msgspec.ValidationError as exc:
            raise HeadcountError(f"{source}: an event does not fit a Chrome trace ({exc})", hint=_NOT_A_TRACE) from exc
        except _Inexact:  # times with more than three decimals: as their decimal digits say
            return events_frame(_DECODERS[True].decode(text), source)
    # the kind of each distinct category once (Kineto writes them in lower case), then per event by code
    codes, cats = pd.factorize(_objects([ev.cat for ev in events]), use_na_sentinel=False)
    kind_of = np.array([_KIND_BY_CAT.get(c) or _KIND_BY_CAT.get(str(c).lower()) or
                        ("module?" if str(c).lower() == "python_function" else None) for c in cats], dtype=object)
    kind_all = kind_of[codes]
    candidates = np.flatnonzero(kind_all != None)  # noqa: E711 (element-wise)
    kept, kinds = [], []
    for i in candidates.tolist():
        ev, kind = events[i], kind_all[i]
        if ev.ph != "X":
            continue
        if kind == "module?":
            if not str(ev.name).startswith(MODULE_PREFIX):
                continue
            kind = "module"
        kept.append(ev)
        kinds.append(kind)
    start, end = _times(kept, source)
    n = len(kept)
    names = [ev.name if type(ev.name) is str else str(ev.name) for ev in kept]
    # launch arguments belong to GPU activity and runtime calls (the columns are null for CPU ops and ranges)
    gpu = [i for i, k in enumerate(kinds) if k in _GPU_SIDE and kept[i].args is not None]
    gpu_args = [kept[i].args for i in gpu]

    def column(values, dtype):
        return _spread(values, gpu, n, dtype)

    ops = [i for i, k in enumerate(kinds) if k == "op" and kept[i].args is not None]
    shaped = signals.shaped_names(set(names[i] for i in ops))
    inputs = {i: {"Input Dims": _json(kept[i].args.input_dims), "Input type": _json(kept[i].args.input_type),
                  "Concrete Inputs": _json(kept[i].args.concrete)} for i in ops if names[i] in shaped}
    inputs.update({i: _message(kept[i].args) for i in gpu if kept[i].args.collective is not None and kinds[i] == "kernel"})
    sequence = _spread([kept[i].args.sequence for i in ops], ops, n, "Int64")
    # Inductor's estimates: on the operator around a Triton launch, or on the kernel itself (an augmented trace)
    estimated_ops = [i for i in ops if kept[i].args.kernel_flop is not None or kept[i].args.kernel_num_gb is not None]
    estimated = estimated_ops + [i for i in gpu if kept[i].args.kernel_flop is not None or kept[i].args.kernel_num_gb is not None]
    refs = estimated_ops + [i for i in gpu if kinds[i] == "kernel"]
    frame = pd.DataFrame({
        "kind": kinds,
        "name": names,
        "pid": _as_text([ev.pid for ev in kept]),
        "tid": _as_text([ev.tid for ev in kept]),
        "start_ns": start,
        "end_ns": end,
        "correlation_id": column([a.correlation for a in gpu_args], "Int64"),
        "device": column([a.device for a in gpu_args], "Int64"),
        "stream": column([a.stream for a in gpu_args], "Int64"),
        "grid": column(_dims([a.grid for a in gpu_args]), object),
        "block": column(_dims([a.block for a in gpu_args]), object),
        "registers_per_thread": column([a.registers for a in gpu_args], "Int64"),
        "shared_memory_bytes": column([a.shared for a in gpu_args], "Int64"),
        "est_achieved_occupancy_pct": column([a.occupancy for a in gpu_args], "Float64"),
        "args": [inputs.get(i) for i in range(n)] if inputs else [None] * n,
        "graph_node_id": column([a.graph_node or None for a in gpu_args], "Int64"),  # 0: not from a graph
        "sequence": sequence,
        "external_ref": _spread([kept[i].args.external for i in refs], refs, n, "Int64"),
    }, columns=COLUMNS)
    _optional_columns(frame, kept, estimated, gpu, gpu_args)
    return frame


def _optional_columns(frame: pd.DataFrame, kept: list, estimated: list[int], gpu: list[int], gpu_args: list) -> None:
    """:data:`OPTIONAL`'s columns, made (in place) only where the piece has them: most traces fill none, and a piece
    without them is not held wider (absent: null)."""
    n = len(frame)
    if estimated:
        frame["estimated_flop"] = _spread([kept[i].args.kernel_flop for i in estimated], estimated, n, "Float64")
        frame["estimated_num_gb"] = _spread([kept[i].args.kernel_num_gb for i in estimated], estimated, n, "Float64")
    labelled = [k for k, a in enumerate(gpu_args) if a.annotation is not None]
    if labelled:
        rows = [gpu[k] for k in labelled]
        frame["graph_annotation"] = _spread([str(gpu_args[k].annotation) for k in labelled], rows, n, object)
        frame["autograd_phase"] = _spread([None if gpu_args[k].autograd_phase is None else str(gpu_args[k].autograd_phase)
                                           for k in labelled], rows, n, object)
