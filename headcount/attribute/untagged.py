"""Attention calls of a recording made without headcount's tags (a serving
framework's torch.profiler trace, an eager Hugging Face model, an nsys export
of PyTorch's ``emit_nvtx`` ranges), found by the signals of
:mod:`headcount.attribute.signals`.

Each call becomes what headcount's tagger would have emitted: a ``fwd`` (or
``bwd``) range around a ``layer.N`` range spanning the call on its thread
(so the kernels it launched are attributed by the one launch rule every
source uses) and a call-log entry with its shapes, its ``signal`` and the
names the recording gives it (``found_as``).

- **Extent.** An operator call spans the operator (nested attention
  operators count once: the outermost); a module call spans the module's
  ``nn.Module`` range, projections included where the module holds them; a
  kernel call spans the runtime call that launched the kernel.
- **Module around a core call.** A forward operator or kernel call inside an
  attention module (the outermost: ``Qwen2Attention_3``, ``Qwen3Attention_7``
  around SGLang's ``RadixAttention_7``) that holds no other call gets a
  ``module`` range around its phase range, spanning the module: the layer's
  whole attention (projections, rotary embedding, copies) beside its core.
- **Layer index** ``N``: the instance suffix of the nearest enclosing module
  named like a repeated block (``Qwen3DecoderLayer_5``, ``GPT2Block_3``), else
  of the nearest attention module (``RadixAttention_5``): ``provenance``
  ``module ranges``. Without modules, the call's position (0, 1, …) among
  the calls of its phase inside the outermost annotation around it (a
  ``ProfilerStep#N``, vLLM's ``execute_…``; the whole process without one):
  ``provenance`` ``call order``.
- **Backward.** A backward call (an operator named so) belongs to the
  forward call whose operators carry its autograd sequence number (Kineto's
  ``Sequence number``, ``emit_nvtx``'s ``stashed seq``): it gets that call's
  layer and shapes. A module's backward is the stretch, on the backward
  thread, from the first to the last autograd function whose sequence
  number is one of the module's forward operators (other autograd work the
  engine ran in between counts with it). Unlinked backward calls are
  numbered by their order.
- **Shapes** only from recorded input dims (``record_shapes=True``):
  an operator's q/k/v by its layout; an eager module's from its softmax
  input ``(batch, heads, q_len, kv_len)`` and the q·kᵀ / ·v matmuls around it
  (head dims). Packed variable-length inputs ``(tokens, heads, head_dim)``
  (vLLM, SGLang, FlashInfer) give heads and head dims but no batch or
  lengths: FLOPs and analytic bytes stay null, with a notice. Nothing is guessed.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headcount.common import signals
from headcount.common.call_log import CallLog, CallShape
from headcount.common.naming import DOMAIN, MODULE

_DTYPES = {"c10::BFloat16": ("bfloat16", 2), "c10::Half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8),
           "c10::Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e5m2": ("float8_e5m2", 1)}
_KERNEL_NAME_CHARS = 80
MODULE_RANGES, CALL_ORDER = "module ranges", "call order"
REPLAY_LANE = " (graph replay)"
"""Suffix of the ``tid`` of a graph replay's call ranges: the launching thread's id, then this."""
CALL_KEY = "call_key"
"""Column of :attr:`Found.ranges`: which call's kernels are assigned to the range by name (-1: none, the launch rule)."""


@dataclass
class Found:
    """What :func:`find_calls` found.

    Attributes:
        ranges: rows of the events table (``kind`` ``range``), named ``headcount@fwd`` /
            ``headcount@bwd`` around ``headcount@layer.N``, one pair per call.
        calls: one :class:`~headcount.common.call_log.CallLog` per call, in time order.
        notices: what the reader should know (signals used, shapes not recorded, kernels left out).
        assigned: kernels given to a call by name, not by their launch (a graph replay's attention
            kernels): the kernel's position in the events table → the :data:`CALL_KEY` of the call's
            ``layer.N`` range in ``ranges`` (-1 there for every other range).
    """

    ranges: pd.DataFrame
    calls: list[CallLog] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    assigned: dict[int, int] = field(default_factory=dict)


@dataclass
class _Call:
    pid: object
    tid: object
    start: int
    end: int
    phase: str
    signal: str
    row: signals.Signal | None
    found_as: str
    shape: CallShape | None = None
    layer: int | None = None
    layer_name: str | None = None
    numbered_by: str = CALL_ORDER
    sequences: frozenset = frozenset()
    forward: "_Call | None" = None   # a backward call: the forward call it belongs to
    module: tuple[int, int] | None = None  # the attention module around a forward core call: its start and end
    replayed: list[int] | None = None  # a call inside a graph replay: its kernels (events positions), theirs by name
    model: str | None = None  # the model (outermost module instance, or compiled graph) that made the call
    model_at: int | None = None  # the position of that model's module range on the call's thread (None: not a module)


class _Thread:
    """One thread's events of a kind, sorted by start, for containment queries."""

    def __init__(self, frame: pd.DataFrame):
        frame = frame.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
        self.frame = frame
        self.start = frame["start_ns"].to_numpy(np.int64)
        self.end = frame["end_ns"].to_numpy(np.int64)
        self._columns: dict[str, np.ndarray] = {}

    def column(self, name: str) -> np.ndarray:
        """A column of the events in start order, as an array (taken once: a row at a time from the frame is slow)."""
        if name not in self._columns:
            self._columns[name] = self.frame[name].to_numpy(object)
        return self._columns[name]

    def inside(self, start: int, end: int) -> np.ndarray:
        """Positions of the events wholly inside ``[start, end]``."""
        lo, hi = np.searchsorted(self.start, [start, end + 1])
        pos = np.arange(lo, hi)
        return pos[self.end[pos] <= end]

    def around(self, starts, ends) -> list[list[int]]:
        """For each query interval, the positions of the events that contain it,
        outermost first: one sweep over the events in start order with a stack of
        the open ones (events on one thread nest), so many queries cost one pass."""
        out: list[list[int]] = [[] for _ in range(len(starts))]
        stack: list[int] = []
        i, n = 0, len(self.start)
        for q in np.argsort(np.asarray(starts, dtype=np.int64), kind="stable"):
            qs, qe = starts[q], ends[q]
            while i < n and self.start[i] <= qs:
                while stack and self.end[stack[-1]] < self.start[i]:
                    stack.pop()
                stack.append(i)
                i += 1
            while stack and self.end[stack[-1]] < qs:
                stack.pop()
            out[q] = [p for p in stack if self.end[p] >= qe]  # an event left open below the top but ended: not around
        return out


def _around(threads: dict, calls: list["_Call"]) -> list[list[int]]:
    """:meth:`_Thread.around` for each call on its own thread (empty where the thread has no events)."""
    out: list[list[int]] = [[] for _ in calls]
    by_thread: dict = {}
    for i, c in enumerate(calls):
        by_thread.setdefault((c.pid, c.tid), []).append(i)
    for key, idx in by_thread.items():
        thread = threads.get(key)
        if thread is None:
            continue
        for i, found in zip(idx, thread.around([calls[i].start for i in idx], [calls[i].end for i in idx])):
            out[i] = found
    return out


class _Spans:
    """Disjoint intervals per thread, for "is this inside one of them / does it overlap one" queries."""

    def __init__(self):
        self._by_thread: dict = {}

    def add(self, key, start: int, end: int) -> None:
        bisect.insort(self._by_thread.setdefault(key, []), (start, end))

    def _near(self, key, start: int) -> list:
        spans = self._by_thread.get(key, [])
        at = bisect.bisect_right(spans, (start, float("inf")))
        return spans[max(at - 1, 0):at + 1]

    def holds(self, key, start: int, end: int) -> bool:
        return any(s <= start and end <= e for s, e in self._near(key, start))

    def overlaps(self, key, start: int, end: int) -> bool:
        return any(start <= e and s <= end for s, e in self._near(key, start))


def _threads(frame: pd.DataFrame) -> dict:
    return {key: _Thread(part) for key, part in frame.groupby(["pid", "tid"], sort=False, observed=True)} if len(frame) else {}


def _outermost(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows not nested inside another row of ``frame`` on their thread."""
    keep = []
    for _, part in frame.groupby(["pid", "tid"], sort=False, observed=True):
        part = part.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
        reach = -1
        for idx, end in zip(part.index, part["end_ns"].to_numpy(np.int64)):
            if end > reach:
                keep.append(idx)
                reach = end
    return frame.loc[sorted(keep)] if keep else frame.iloc[:0]


# ---------------------------------------------------------------- shapes
def _dtype(types, i: int) -> tuple[str | None, int | None]:
    name = types[i] if types and len(types) > i else None
    if not name:
        return None, None
    known = _DTYPES.get(str(name))
    return known if known else (str(name), None)


def _is_dims(d, rank: int | None = None) -> bool:
    return isinstance(d, list) and len(d) > 0 and all(isinstance(v, int) for v in d) and (rank is None or len(d) == rank)


def operator_shape(args: dict | None, row: signals.Signal) -> CallShape | None:
    """Shapes of a forward attention operator from its recorded inputs, by the
    row's ``layout``; ``None`` where the inputs were not recorded or do not fit."""
    dims = (args or {}).get("Input Dims") or []
    if len(dims) < 3 or not all(_is_dims(d) for d in dims[:3]):
        return None
    q, k, v = dims[:3]
    types = (args or {}).get("Input type") or []
    concrete = (args or {}).get("Concrete Inputs") or []
    dtype, size = _dtype(types, 0)
    impl = row.implementation or "unknown"
    if len(q) == 3 and len(k) == 3 and len(v) == 3:  # packed tokens: (tokens, heads, head dim)
        return CallShape(impl, None, q[1], k[1], None, None, q[2], v[2], dtype, size, None)
    if not (len(q) == len(k) == len(v) == 4):
        return None
    if row.layout == "bhsd":
        (b, hq, sq, d), (_, hkv, sk, _), dv = q, k, v[3]
    else:  # bshd
        (b, sq, hq, d), (_, sk, hkv, _), dv = q, k, v[3]
    causal = None
    if row.causal_arg is not None and len(concrete) > row.causal_arg:
        flag = str(concrete[row.causal_arg]).strip()
        causal = True if flag == "True" else False if flag == "False" else None
    mask = dims[3] if row.layout == "bhsd" and len(dims) > 3 and _is_dims(dims[3]) else []
    return CallShape(impl, b, hq, hkv, sq, sk, d, dv, dtype, size, bool(causal and sq > 1) if causal is not None else None,
                     mask_elements=math.prod(mask) if mask else 0, mask_dtype_bytes=1 if mask else 0)


def eager_shape(ops: pd.DataFrame) -> CallShape | None:
    """Shapes of eager attention from the operators inside one module call (in
    time order): the first 4-D softmax input ``(b, h, q_len, kv_len)``, the
    matmul ``(…, q_len, d) × (…, d, kv_len)`` before it and ``(…, q_len, kv_len)
    × (…, kv_len, dv)`` after it; ``None`` unless all three are recorded and agree."""
    names = [signals.operator_name(str(n)) for n in ops["name"]]
    args = ops["args"].to_numpy(object)
    soft = next((i for i, n in enumerate(names) if n in signals.SOFTMAX_OPS and args[i]
                 and _is_dims((args[i].get("Input Dims") or [None])[0], 4)), None)
    if soft is None:
        return None
    b, h, sq, sk = args[soft]["Input Dims"][0]

    def matmul(rng, want):
        for i in rng:
            if names[i] in signals.MATMUL_OPS and args[i]:
                dims = args[i].get("Input Dims") or []
                if len(dims) >= 2 and _is_dims(dims[0]) and _is_dims(dims[1]) and len(dims[0]) >= 3 and len(dims[1]) >= 3:
                    got = want(dims[0], dims[1])
                    if got is not None and math.prod(dims[0][:-2]) == b * h:
                        return got, i
        return None, None

    d, at = matmul(range(soft - 1, -1, -1), lambda a, c: a[-1] if a[-2] == sq and c[-1] == sk and c[-2] == a[-1] else None)
    dv, _ = matmul(range(soft + 1, len(names)), lambda a, c: c[-1] if a[-2:] == [sq, sk] and c[-2] == sk else None)
    if d is None or dv is None:
        return None
    dtype, size = _dtype(args[at].get("Input type") or [], 0)
    # eager attention computes every (query, key) score whatever the mask: not causal for the work done
    return CallShape("eager", b, h, h, sq, sk, d, dv, dtype, size, False)


# ---------------------------------------------------------------- finding
def find_calls(events: pd.DataFrame) -> Found:
    """The attention calls of an untagged recording.

    Args:
        events: the events table (:func:`headcount.parsers.kineto.events_frame`
            layout: ``kind`` ``op`` / ``module`` / ``range`` / ``kernel`` /
            ``runtime``, ``name``, ``pid``, ``tid``, ``start_ns``, ``end_ns``,
            ``correlation_id``, ``args``, ``sequence``, ``graph_node_id``).

    Returns:
        A :class:`Found`; its ``ranges`` empty when no signal found a call.
    """
    kind = events["kind"].astype(object)
    ops = events[(kind == "op").to_numpy()]
    modules = events[(kind == "module").to_numpy()]
    annotations = events[(kind == "range").to_numpy() & ~events["name"].astype(str).str.startswith(DOMAIN + "@", na=False).to_numpy(dtype=bool)]
    op_threads, module_threads, annotation_threads = _threads(ops), _threads(modules), _threads(annotations)
    found = Found(pd.DataFrame(columns=events.columns))

    calls = _operator_calls(ops)
    calls += _module_calls(modules, op_threads, calls)
    _number_by_modules(calls, module_threads)
    calls += _module_backward(ops, calls)
    calls = _without_overlaps(calls, found)  # disjoint on each thread from here on
    calls = _not_captured(events, calls, found.notices)
    replays = _Replays()
    calls += _kernel_calls(events, calls, replays)
    _link_backward(calls, op_threads)
    _models(calls, module_threads, annotation_threads)
    _number_by_position(calls, annotation_threads, found.notices)
    for c in calls:
        if c.forward is not None:  # a backward call: its forward call's layer, shapes and model
            f = c.forward
            c.layer, c.layer_name, c.numbered_by, c.shape, c.model = f.layer, f.layer_name, f.numbered_by, f.shape, f.model
    _models_apart(calls, found.notices)
    _attention_modules(calls, module_threads)

    if replays.unlaunched:
        found.notices.append(f"{replays.unlaunched} attention kernels have no launch call in the recording (launched before it "
                             "began): counted in kernels, not as attention calls")
    if replays.calls:
        found.notices.append(
            f"{replays.calls} attention calls found inside {replays.launches} CUDA/HIP graph replays by kernel names: each call is "
            f"a run of consecutive attention kernels in the replay ({replays.attention_kernels} of the replays' "
            f"{replays.kernels} kernels); the replays' other kernels count for no attention call")
    if not calls:
        return found
    calls.sort(key=lambda c: c.start)
    rows = []
    for n, c in enumerate(calls):
        # as headcount tags a call: phase around layer.N (1 ns wider, so that the two nest unambiguously)
        if c.module is not None:  # around the phase range: the whole module (projections, rotary, copies) besides the core
            rows.append(_range(events, MODULE, c.pid, c.tid, min(c.module[0], c.start - 2), max(c.module[1], c.end + 2)))
        # a replay's calls on a lane of their own beside the launching thread: their kernels are theirs by name, and
        # no range of the thread (an nsys export's may overlap without nesting) re-attributes them by launch
        replay = c.replayed is not None
        tid = f"{c.tid}{REPLAY_LANE}" if replay else c.tid
        rows.append(_range(events, c.phase, c.pid, tid, c.start - 1, c.end + 1))
        rows.append(_range(events, c.layer_name, c.pid, tid, c.start, c.end, n if replay else -1))
        if replay:
            found.assigned.update((k, n) for k in c.replayed)
        found.calls.append(CallLog(thread_id=0, phase=c.phase, layer_name=c.layer_name, layer=c.layer, head=None, kv_head=None,
                                   shape=c.shape, model=c.model, signal=c.signal, found_as=c.found_as, numbered_by=c.numbered_by))
    ranges = pd.DataFrame(rows, columns=[*events.columns, CALL_KEY])
    ranges["start_ns"] = ranges["start_ns"].astype("int64")
    ranges["end_ns"] = ranges["end_ns"].astype("int64")
    ranges[CALL_KEY] = ranges[CALL_KEY].astype("int64")
    found.ranges = ranges
    found.notices[:0] = _summary(calls)
    return found


_CAPTURE = re.compile(r"StreamBeginCapture|StreamEndCapture")
CAPTURED = "attention calls were captured into a CUDA/HIP "
"""The words of the notice of calls captured, not run (:func:`_not_captured`)."""


def _not_captured(events: pd.DataFrame, calls: list[_Call], notices: list[str]) -> list[_Call]:
    """The calls, less those made while their thread captured a CUDA/HIP graph (between its
    ``…StreamBeginCapture`` and ``…StreamEndCapture``): their kernels were recorded into a
    graph, not run, so they have no GPU time; a notice says how many."""
    kind = events["kind"].astype(object)
    runtime = events[(kind == "runtime").to_numpy()]
    if not len(runtime):
        return calls
    names = runtime["name"].astype(str)
    marks = runtime[names.str.contains(_CAPTURE).to_numpy(dtype=bool)].sort_values("start_ns", kind="stable")
    if not len(marks):
        return calls
    windows: dict = {}
    for (pid, tid), part in marks.groupby(["pid", "tid"], sort=False):
        begin = None
        for name, start, end in zip(part["name"].astype(str), part["start_ns"].astype("int64"), part["end_ns"].astype("int64")):
            if "Begin" in name:
                begin = int(start)
            elif begin is not None:
                windows.setdefault((pid, tid), []).append((begin, int(end)))
                begin = None
    kept = [c for c in calls if not any(s <= c.start and c.end <= e for s, e in windows.get((c.pid, c.tid), ()))]
    if len(kept) < len(calls):
        notices.append(f"{len(calls) - len(kept)} {CAPTURED}graph in this recording (made "
                       "between …StreamBeginCapture and …StreamEndCapture), not run: they ran no kernel here, so they get no "
                       "time, busy or attention figures; profile the graph's replays to measure them")
    return kept


_COMPILED_REGION = re.compile(r"^## Call CompiledFxGraph (\w{1,12})")


def _models(calls: list[_Call], module_threads: dict, annotation_threads: dict) -> None:
    """Each forward call's model: the outermost module instance around it (``CLIPTextModelWithProjection_1``,
    ``T5EncoderModel_0``), unless that is itself a block or attention module (layers called one by one);
    else the compiled graph whose call holds it (``CompiledFxGraph fp5r5pk7``); else none."""
    todo = [c for c in calls if c.forward is None]
    for call, around in zip(todo, _around(module_threads, todo)):
        if around:
            name = str(module_threads[(call.pid, call.tid)].frame["name"].iloc[around[0]]).removeprefix("nn.Module: ")
            if not (signals.LAYER_MODULE.search(name) or signals.match("module", name)):
                call.model, call.model_at = name, around[0]
    rest = [c for c in todo if c.model is None]
    for call, around in zip(rest, _around(annotation_threads, rest)):
        frame = annotation_threads[(call.pid, call.tid)].frame if around else None
        for p in around:
            m = _COMPILED_REGION.match(str(frame["name"].iloc[p]))
            if m:
                call.model = f"CompiledFxGraph {m.group(1)[:8]}"
                break


def _models_apart(calls: list[_Call], notices: list[str]) -> None:
    """Where the calls come from several models, each layer name says its model
    (``CLIPTextModelWithProjection_1.layer.12``), so that two models' layers never share a row."""
    models = {c.model for c in calls if c.model is not None}
    if len(models) < 2:
        return
    for c in calls:
        if c.model is not None:
            c.layer_name = f"{c.model}.{c.layer_name}"
    unknown = sum(1 for c in calls if c.model is None)
    notices.append(f"attention calls from {len(models)} models ({', '.join(sorted(models))}): each layer is named with its "
                   "model (the outermost module, or the compiled graph, around it)"
                   + (f"; {unknown} calls have neither and keep plain layer.N names" if unknown else ""))


def _attention_modules(calls: list[_Call], module_threads: dict) -> None:
    """Give each forward call found by its operator or kernel the outermost attention module around it
    (``Qwen2Attention_3``; ``Qwen3Attention_7`` around SGLang's ``RadixAttention_7``), where that module
    holds no other call: the call is then the attention core, and the module what the layer's attention
    costs in all."""
    core = [c for c in calls if c.phase == "fwd" and c.signal != "module"]
    held: dict = {}
    for call, around in zip(core, _around(module_threads, core)):
        frame = module_threads[(call.pid, call.tid)].frame if around else None
        # the outermost: Qwen3Attention (projections, rotary) around SGLang's RadixAttention (the kernel's call alone)
        inner = next((p for p in around if signals.match("module", str(frame["name"].iloc[p]))), None)
        if inner is not None:
            held.setdefault((call.pid, call.tid, inner), []).append(call)
    for (pid, tid, inner), held_calls in held.items():
        if len(held_calls) == 1:  # a module that holds two calls is neither's
            frame = module_threads[(pid, tid)].frame
            held_calls[0].module = (int(frame["start_ns"].iloc[inner]), int(frame["end_ns"].iloc[inner]))


def _range(events: pd.DataFrame, name: str, pid, tid, start: int, end: int, key: int = -1) -> dict:
    return {**{c: None for c in events.columns}, "kind": "range", "name": f"{DOMAIN}@{name}", "pid": pid, "tid": tid,
            "start_ns": start, "end_ns": end, CALL_KEY: key}


def _operator_calls(ops: pd.DataFrame) -> list[_Call]:
    """One call per outermost operator the table names (forward or backward)."""
    if not len(ops):
        return []
    names = ops["name"].astype(str)
    distinct = names.unique()
    row_of = {n: signals.match("operator", signals.operator_name(n)) for n in distinct}
    hits = ops[names.map(row_of).notna().to_numpy()]
    if not len(hits):
        return []
    top = _outermost(hits)
    hit_threads = _threads(hits)
    calls = []
    for op in top.itertuples():
        name = signals.operator_name(str(op.name))
        row = row_of[str(op.name)]
        backward = bool(signals.BACKWARD.search(name))
        call = _Call(op.pid, op.tid, int(op.start_ns), int(op.end_ns), "bwd" if backward else "fwd", "operator", row, name)
        if not backward:
            thread = hit_threads[(op.pid, op.tid)]
            names_in, args_in = thread.column("name"), thread.column("args")
            for pos in thread.inside(op.start_ns, op.end_ns):
                call.shape = operator_shape(args_in[pos], row_of[str(names_in[pos])])
                if call.shape is not None:
                    break
        calls.append(call)
    return calls


def _module_calls(modules: pd.DataFrame, op_threads: dict, taken: list[_Call]) -> list[_Call]:
    """One call per innermost attention module that holds no forward operator call."""
    if not len(modules):
        return []
    names = modules["name"].astype(str)
    row_of = {n: signals.match("module", n) for n in names.unique()}
    attention = modules[names.map(row_of).notna().to_numpy()]
    calls = []
    fwd_ops = _Spans()
    for c in taken:
        if c.phase == "fwd":
            fwd_ops.add((c.pid, c.tid), c.start, c.end)
    for key, part in attention.groupby(["pid", "tid"], sort=False, observed=True):
        thread = _Thread(part)
        op_thread = op_threads.get(key)
        for pos, m in enumerate(thread.frame.itertuples()):
            if len(thread.inside(m.start_ns, m.end_ns)) > 1:  # holds another attention module: not the innermost
                continue
            if fwd_ops.overlaps(key, m.start_ns, m.end_ns):
                continue  # an operator inside is the call
            name = str(m.name).removeprefix("nn.Module: ")
            call = _Call(m.pid, m.tid, int(m.start_ns), int(m.end_ns), "fwd", "module", row_of[str(m.name)], name)
            if op_thread is not None:
                inside = op_thread.frame.iloc[op_thread.inside(m.start_ns, m.end_ns)]
                call.shape = eager_shape(inside)
                call.sequences = frozenset(int(s) for s in inside["sequence"].dropna()) if "sequence" in inside else frozenset()
            calls.append(call)
    return calls


def _number_by_modules(calls: list[_Call], module_threads: dict) -> None:
    """Layer index from the enclosing modules (innermost first): a block's suffix, else an attention module's."""
    for call, around in zip(calls, _around(module_threads, calls)):
        if not around:
            continue
        frame = module_threads[(call.pid, call.tid)].frame
        names = [str(n).removeprefix("nn.Module: ") for n in frame["name"].iloc[around]]
        index = None
        for pattern in (signals.LAYER_MODULE, signals.ATTENTION_MODULE):
            for n in reversed(names):  # innermost first
                m = pattern.search(n)
                if m:
                    index = int(m.group(1))
                    break
            if index is not None:
                break
        if index is None:
            continue
        call.layer, call.layer_name, call.numbered_by = index, f"layer.{index}", MODULE_RANGES
        outer = [n for n in names if signals.LAYER_MODULE.search(n) or signals.match("module", n)]
        if call.signal == "module":
            outer = [n for n in outer if n != call.found_as]
        call.found_as = "/".join([*outer, call.found_as])


def _module_backward(ops: pd.DataFrame, calls: list[_Call]) -> list[_Call]:
    """The backward of each module call: the autograd functions carrying its forward operators' sequence numbers."""
    module_calls = [c for c in calls if c.signal == "module" and c.sequences]
    if not module_calls or "sequence" not in ops or not ops["sequence"].notna().any():
        return []
    wanted = pd.DataFrame([(i, c.pid, s, c.end) for i, c in enumerate(module_calls) for s in c.sequences],
                          columns=["call", "pid", "sequence", "forward_end"])
    seq_ops = ops.loc[ops["sequence"].notna().to_numpy(), ["pid", "tid", "sequence", "start_ns", "end_ns"]]
    seq_ops = seq_ops.astype({"pid": object, "sequence": "int64"})
    mine = wanted.astype({"pid": object}).merge(seq_ops, on=["pid", "sequence"])
    mine = mine[mine["start_ns"] > mine["forward_end"]]
    out = []
    for i, part in mine.groupby("call", sort=True):
        call = module_calls[i]
        part = part[part["tid"] == part.sort_values("start_ns")["tid"].iloc[0]]  # one backward thread per call
        out.append(_Call(call.pid, part["tid"].iloc[0], int(part["start_ns"].min()), int(part["end_ns"].max()), "bwd", "module",
                         call.row, call.found_as, forward=call))
    return out


_GRAPH_LAUNCH = re.compile(r"[Gg]raph_?Launch")
"""A runtime call that replays a CUDA/HIP graph (``cudaGraphLaunch``, ``hipGraphLaunch``, ``cuGraphLaunch``)."""


@dataclass
class _Replays:
    """What :func:`_kernel_calls` found inside graph replays."""

    launches: int = 0          # graph launches holding attention kernels
    calls: int = 0             # calls found in them
    attention_kernels: int = 0  # their attention kernels (companions included)
    kernels: int = 0           # every kernel of those replays
    unlaunched: int = 0        # attention kernels with neither a launch nor a replay in the recording


def _kernel_calls(events: pd.DataFrame, calls: list[_Call], replays: _Replays) -> list[_Call]:
    """Calls found by kernel names, launched outside every call found so far.

    Outside graphs, a run of attention kernels launched one after another on a
    thread (no other kernel launched between them, one phase) is one call,
    spanning its launch calls. Inside a graph replay (the kernels of one
    ``…GraphLaunch``, or kernels with a ``graph node id``) every kernel shares
    the one launch call, so the launch cannot be the call: each run of
    attention kernels among the replay's kernels (in GPU order) is one call,
    and those kernels are assigned to it by name (``_Call.replayed``), never
    the replay's other kernels."""
    kind = events["kind"].astype(object)
    kernel_rows = np.flatnonzero((kind == "kernel").to_numpy())
    if not len(kernel_rows):
        return []
    kernels = events.iloc[kernel_rows]
    names = kernels["name"].astype(str).to_numpy(object)
    distinct = pd.unique(names)
    row_of = {n: signals.match("kernel", n) for n in distinct}
    if not any(r is not None for r in row_of.values()):
        return []
    companion = {n for n in distinct if row_of[n] is None and signals.match("companion", n) is not None}
    prologue_names = {n for n in distinct if row_of[n] is None and signals.match("prologue", n) is not None}
    hit = np.array([row_of[n] is not None for n in names], dtype=bool)
    prologue = np.array([n in prologue_names for n in names], dtype=bool)
    joins = hit | prologue | np.array([n in companion for n in names], dtype=bool)
    runtime = events[(kind == "runtime").to_numpy() & events["correlation_id"].notna().to_numpy()]
    runtime = runtime.sort_values("start_ns", kind="stable").drop_duplicates("correlation_id")
    by_corr = pd.DataFrame({"correlation_id": pd.array(kernels["correlation_id"], dtype="Int64")}).merge(
        pd.DataFrame({"correlation_id": pd.array(runtime["correlation_id"], dtype="Int64"), "lpid": runtime["pid"].to_numpy(object),
                      "ltid": runtime["tid"].to_numpy(object), "a_s": pd.array(runtime["start_ns"], dtype="Int64"),
                      "a_e": pd.array(runtime["end_ns"], dtype="Int64"), "api": runtime["name"].astype(str).to_numpy(object)}),
        on="correlation_id", how="left")
    launched = by_corr["a_s"].notna().to_numpy()
    replays.unlaunched += int((hit & ~launched).sum())
    api = by_corr["api"].to_numpy(object)
    graph_api = {a: bool(_GRAPH_LAUNCH.search(a)) for a in pd.unique(api[launched])}
    node = (pd.array(kernels["graph_node_id"], dtype="Int64").to_numpy(np.int64, na_value=0)
            if "graph_node_id" in kernels else np.zeros(len(kernels), np.int64))
    in_graph = launched & ((node > 0) | np.array([graph_api.get(a, False) for a in api], dtype=bool))
    starts = kernels["start_ns"].to_numpy(np.int64)
    lpid, ltid = by_corr["lpid"].to_numpy(object), by_corr["ltid"].to_numpy(object)
    a_s = pd.array(by_corr["a_s"], dtype="Int64").to_numpy(np.int64, na_value=0)
    a_e = pd.array(by_corr["a_e"], dtype="Int64").to_numpy(np.int64, na_value=0)
    corr = pd.array(kernels["correlation_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    spans = _Spans()
    for c in calls:
        spans.add((c.pid, c.tid), c.start, c.end)
    held = np.zeros(len(kernels), dtype=bool)  # launched inside a call already found: that call's
    for i in np.flatnonzero(joins & launched):
        held[i] = spans.holds((lpid[i], ltid[i]), int(a_s[i]), int(a_e[i]))
    out: list[_Call] = []

    def runs(order):
        """Runs of attention kernels of one phase among ``order`` (positions, in order; a companion
        joins the run before it, any other kernel ends it)."""
        run, phase, waiting, since = [], None, None, 0
        for i in order:
            if waiting is not None and (i < 0 or not joins[i] or held[i]) and since < signals.PROLOGUE_REACH:
                since += 1  # between a prologue and its attention kernel: neither part of the call nor an end to it
                continue
            waiting = None
            if i < 0:  # kernels skipped between (none of them attention): the run ends
                if run:
                    yield run, phase
                run, phase = [], None
            elif hit[i] and not held[i]:
                this = "bwd" if signals.BACKWARD_KERNEL.search(names[i]) else "fwd"
                if run and phase is not None and this != phase:  # the other phase: a call of its own
                    yield run, phase
                    run = []
                run.append(i)  # to the run of its phase, or to the prologue waiting for it (phase None)
                phase = this
            elif prologue[i] and not held[i]:
                if run:
                    yield run, phase
                run, phase, waiting, since = [i], None, i, 0
            elif joins[i] and not held[i] and run and phase is not None:
                run.append(i)
            elif run:
                if phase is not None:
                    yield run, phase
                run, phase = [], None
        if run and phase is not None:
            yield run, phase

    # outside graphs: each thread's launches in order; only the neighbourhood of attention kernels matters
    single = np.flatnonzero(launched & ~in_graph)
    if len(single) and (joins[single]).any():
        frame = pd.DataFrame({"pid": lpid[single], "tid": ltid[single], "a_s": a_s[single], "k": starts[single], "i": single})
        frame = frame.sort_values(["a_s", "k"], kind="stable")
        for (pid, tid), part in frame.groupby(["pid", "tid"], sort=False):
            order = part["i"].to_numpy()
            near = np.flatnonzero(joins[order])
            reach = np.flatnonzero(prologue[order])  # a prologue's attention kernel may come a few kernels later
            keep = np.unique(np.concatenate([near, np.minimum(near + 1, len(order) - 1),
                                             *(np.minimum(reach + k, len(order) - 1) for k in range(1, signals.PROLOGUE_REACH + 2))]))
            for run, phase in runs(order[keep] if len(keep) == len(order) else _with_breaks(order, keep)):
                main = next(i for i in run if hit[i])
                start, end = int(a_s[run[0]]), int(max(a_e[i] for i in run))
                if spans.overlaps((pid, tid), start, end):  # a run across another call: its first attention launch alone
                    run, start, end = [main], int(a_s[main]), int(a_e[main])
                spans.add((pid, tid), start, end)
                out.append(_Call(pid, tid, start, end, phase, "kernel", row_of[names[main]], names[main][:_KERNEL_NAME_CHARS]))

    # graph replays holding attention: one launch call (pid, correlation) for all the replay's kernels
    graph = np.flatnonzero(in_graph)
    keys = pd.Series(list(zip(lpid[graph], corr[graph])), dtype=object) if len(graph) else pd.Series([], dtype=object)
    with_attention = set(keys[joins[graph]]) if len(graph) else set()
    for key, part in pd.Series(graph).groupby(keys.to_numpy(), sort=False) if with_attention else ():
        if key not in with_attention:
            continue
        members = sorted(part.to_numpy().tolist(), key=lambda i: starts[i])
        found = list(runs(members))
        if not found:
            continue
        pid, tid, lo_ns, hi_ns = lpid[members[0]], ltid[members[0]], int(a_s[members[0]]), int(a_e[members[0]])
        replays.launches += 1
        replays.calls += len(found)
        replays.attention_kernels += sum(len(run) for run, _ in found)
        replays.kernels += len(members)
        # each call a slice of the launch call's time on its thread: disjoint ranges that nest as tags do
        width = max(3, (hi_ns - lo_ns) // len(found))
        for n, (run, phase) in enumerate(found):
            lo, main = lo_ns + n * width, next(i for i in run if hit[i])
            out.append(_Call(pid, tid, lo + 1, lo + width - 2, phase, "kernel", row_of[names[main]],
                             names[main][:_KERNEL_NAME_CHARS], replayed=[int(kernel_rows[i]) for i in run]))
        spans.add((pid, tid), lo_ns, max(hi_ns, lo_ns + width * len(found)))
    return out


def _with_breaks(order: np.ndarray, keep: np.ndarray) -> list:
    """``order`` at the positions ``keep``, with ``-1`` (no kernel: ends a run) where positions were skipped."""
    out, last = [], -2
    for k in keep.tolist():
        if k != last + 1:
            out.append(-1)
        out.append(int(order[k]))
        last = k
    return out


def _without_overlaps(calls: list[_Call], found: Found) -> list[_Call]:
    """The calls, less any that overlaps an earlier-found one on its thread (a backward stretch
    crossing another call): ranges must nest."""
    kept, dropped = [], 0
    spans = _Spans()
    for c in calls:
        if spans.overlaps((c.pid, c.tid), c.start, c.end):
            dropped += 1
            continue
        spans.add((c.pid, c.tid), c.start, c.end)
        kept.append(c)
    if dropped:
        found.notices.append(f"{dropped} backward stretches of attention modules overlap another attention call: left out")
    return kept


def _link_backward(calls: list[_Call], op_threads: dict) -> None:
    """Backward operator calls: the forward call their sequence number names (whose layer and shapes they take)."""
    backward = [c for c in calls if c.phase == "bwd" and c.signal == "operator"]
    if not backward:
        return
    forward = [c for c in calls if c.phase == "fwd"]
    by_sequence: dict = {}
    for c in sorted(forward, key=lambda c: c.start):
        thread = op_threads.get((c.pid, c.tid))
        if thread is None or "sequence" not in thread.frame:
            continue
        for s in thread.frame["sequence"].iloc[thread.inside(c.start, c.end)].dropna():
            by_sequence[(c.pid, int(s))] = c  # the latest forward call with that number wins
    for c, around in zip(backward, _around(op_threads, backward)):
        thread = op_threads.get((c.pid, c.tid))
        if thread is None or "sequence" not in thread.frame:
            continue
        seqs = thread.frame["sequence"].iloc[around].dropna()
        if not len(seqs):
            continue
        fwd = by_sequence.get((c.pid, int(seqs.iloc[-1])))  # the innermost op with a number: the autograd function's
        if fwd is not None and fwd.start < c.start:
            c.forward = fwd
            if fwd.found_as and "/" in fwd.found_as:
                c.found_as = fwd.found_as.rsplit("/", 1)[0] + "/" + c.found_as


def _number_by_position(calls: list[_Call], annotation_threads: dict, notices: list[str]) -> None:
    """Calls without a layer yet: a forward call's position among the forward calls inside the same
    outermost annotation around it and the same call of its model's outermost module; a backward
    call without a forward it links to takes, in reverse order, the layer of the forward calls of its
    step (the first backward call is the last layer's), where their counts agree; else its own count, reversed."""
    todo = sorted((c for c in calls if c.layer_name is None and c.forward is None), key=lambda c: c.start)
    if not todo:
        return
    group = dict(zip(map(id, calls), _step_groups(calls, annotation_threads)))
    counters: dict = {}
    backward: dict = {}
    for c in todo:
        g = group[id(c)]
        if c.phase == "bwd":
            backward.setdefault((c.pid, g), []).append(c)
            continue
        key = (c.pid, c.tid, g, c.model_at)
        c.layer = counters.get(key, 0)
        counters[key] = c.layer + 1
        c.layer_name = f"layer.{c.layer}"
    if not backward:
        return
    forward_of: dict = {}
    for c in calls:
        if c.phase == "fwd" and c.layer_name is not None:
            forward_of.setdefault((c.pid, group[id(c)]), []).append(c)
    matched = unmatched = 0
    for key, bwd in backward.items():
        fwd = sorted(forward_of.get(key, []), key=lambda c: c.start)
        for k, c in enumerate(bwd):
            if len(fwd) == len(bwd):
                f = fwd[len(fwd) - 1 - k]
                c.layer, c.layer_name, c.numbered_by, c.model = f.layer, f.layer_name, f.numbered_by, f.model
                matched += 1
            else:
                c.layer = len(bwd) - 1 - k
                c.layer_name = f"layer.{c.layer}"
                unmatched += 1
    if matched:
        notices.append(f"{matched} backward attention calls are linked to no forward call (no shared autograd sequence number "
                       "in the recording): each takes the layer of the forward calls of its step in reverse order (the first "
                       "backward call is the last forward call's layer)")
    if unmatched:
        notices.append(f"{unmatched} backward attention calls are linked to no forward call and their step holds a different "
                       "number of forward calls: numbered by their own order, reversed (the first is the highest layer)")


def _step_groups(calls: list[_Call], annotation_threads: dict) -> list:
    """Per call, the outermost annotation around it on its thread, as ``(start, end)``; for a call on a
    thread with none there (autograd's backward thread), the outermost annotation of its process
    that holds its start on any thread; else ``None``."""
    out: list = [None] * len(calls)
    tops: dict = {}
    for (pid, _), thread in annotation_threads.items():
        reach = -1
        for s, e in zip(thread.start.tolist(), thread.end.tolist()):
            if e > reach:
                tops.setdefault(pid, []).append((s, e))
                reach = e
    for key in tops:
        tops[key].sort()
    for i, (c, around) in enumerate(zip(calls, _around(annotation_threads, calls))):
        if around:
            thread = annotation_threads[(c.pid, c.tid)]
            out[i] = (int(thread.start[around[0]]), int(thread.end[around[0]]))
            continue
        spans = tops.get(c.pid, [])
        at = bisect.bisect_right(spans, (c.start, float("inf"))) - 1
        while at >= 0 and spans[at][1] < c.start:
            at -= 1
        if at >= 0 and spans[at][0] <= c.start <= spans[at][1]:
            out[i] = spans[at]
    return out


def _summary(calls: list[_Call]) -> list[str]:
    """Notices: which signals found how many calls, how layers were numbered, which shapes are missing."""
    lines = []
    by_signal: dict = {}
    for c in calls:
        by_signal.setdefault(c.signal, {}).setdefault(c.row.framework if c.row else c.signal, 0)
        by_signal[c.signal][c.row.framework if c.row else c.signal] += 1
    parts = [f"{sum(v.values())} by {s} ({', '.join(f'{k}: {n}' for k, n in v.items())})" for s, v in by_signal.items()]
    lines.append(f"attention found without headcount's tags: {len(calls)} calls, " + "; ".join(parts))
    by_order = sum(1 for c in calls if c.numbered_by == CALL_ORDER)
    if by_order:
        lines.append(f"{by_order} attention calls have no nn.Module range naming their layer: layer.N is the call's position "
                     "inside its step (or enclosing annotation); record nn.Module ranges (torch.profiler.profile("
                     "with_modules=True, with_stack=True)) to number them by module")
    no_shape = sum(1 for c in calls if c.shape is None)
    packed = sum(1 for c in calls if c.shape is not None and c.shape.q_len is None)
    if no_shape:
        lines.append(f"{no_shape} attention calls have no recorded shapes (record with record_shapes=True; kernel-only and "
                     "unlinked backward calls never have them): their FLOPs and analytic bytes are null")
    if packed:
        lines.append(f"{packed} attention calls have packed variable-length inputs (tokens, heads, head dim): heads and head "
                     "dim are known, batch and sequence lengths are not recorded, so FLOPs and analytic bytes are null")
    return lines


# ---------------------------------------------------------------- nsys exports
_NVTX_SEQ = re.compile(r", (?:stashed seq = (\d+)|seq = (\d+))")
_NVTX_SIZES = re.compile(r", sizes = (\[.*?\]\])")


def _nvtx_name(name: str) -> tuple[str | None, int | None, dict | None]:
    """An NVTX range name's kind (``op``, ``module`` or ``None``: an annotation), the
    autograd sequence number and the input sizes ``emit_nvtx`` wrote into it."""
    base = signals.operator_name(name)
    if "::" in base:
        m = _NVTX_SEQ.search(name)
        seq = int(m.group(1) or m.group(2)) if m else None
        args = None
        if base in signals.SOFTMAX_OPS or base in signals.MATMUL_OPS or signals.match("operator", base):
            sizes = _NVTX_SIZES.search(name)
            if sizes:
                try:
                    args = {"Input Dims": json.loads(sizes.group(1))}
                except ValueError:
                    args = None
        return "op", seq, args
    if base.startswith("nn.Module: ") or (signals.MODULE_INSTANCE.match(base)
                                         and (signals.LAYER_MODULE.search(base) or signals.match("module", base))):
        return "module", None, None
    if signals.BACKWARD.search(base) and (", seq = " in name or ", stashed seq = " in name):
        m = _NVTX_SEQ.search(name)  # an autograd node's range (``SoftmaxBackward0, seq = 12, …``)
        return "op", int(m.group(1) or m.group(2)) if m else None, None
    return None, None, None


def nvtx_events(ranges: pd.DataFrame, runtime: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame | None:
    """One process of an nsys export (:class:`~headcount.common.tables.Timeline`'s
    ``ranges``, ``runtime``, ``gpu``) as the events table :func:`find_calls` reads:
    NVTX ranges named after operators (PyTorch's ``emit_nvtx``: ``aten::x, seq = N,
    op_id = M, sizes = […]``) are operators with their sequence number and input
    sizes (no dtypes: analytic bytes stay null), ranges named like module classes
    (``nn.Module: X_3``, ``CoreAttention``, ``…DecoderLayer_5``) are modules, other
    ranges annotations; runtime calls and kernels as they are.

    Returns:
        The events, or ``None`` when no range or kernel name can be a signal (nothing to find).
    """
    names = ranges["name"] if isinstance(ranges["name"].dtype, pd.CategoricalDtype) else ranges["name"].astype("category")
    distinct = [str(c) for c in names.cat.categories]
    parsed = [_nvtx_name(n) for n in distinct]  # once per distinct name
    kernel_names = gpu.loc[(gpu["kind"].astype(object) == "kernel").to_numpy(), "name"].astype(str).unique() if len(gpu) else []
    named = any(p[0] == "module" or (p[0] == "op" and signals.match("operator", signals.operator_name(n)))
                for n, p in zip(distinct, parsed))
    if not named and not any(signals.match("kernel", k) for k in kernel_names):
        return None
    codes = names.cat.codes.to_numpy()
    text = np.array(distinct + [""], dtype=object)[codes]  # code -1 (no name): ""
    kinds = np.array([p[0] or "range" for p in parsed] + ["range"], dtype=object)[codes]
    args = np.array([p[2] for p in parsed] + [None], dtype=object)[codes]
    sequence = pd.array([p[1] for p in parsed] + [None], dtype="Int64")[codes]
    out = pd.DataFrame({
        "kind": kinds, "name": text,
        "pid": ranges["pid"].astype(object).to_numpy(), "tid": ranges["tid"].astype(object).to_numpy(),
        "start_ns": ranges["start_ns"].to_numpy(np.int64), "end_ns": ranges["end_ns"].to_numpy(np.int64),
        "correlation_id": pd.array([pd.NA] * len(ranges), dtype="Int64"),
        "args": args, "sequence": sequence,
        "graph_node_id": pd.array([pd.NA] * len(ranges), dtype="Int64"),
    })
    calls = pd.DataFrame({"kind": "runtime", "name": runtime["name"].astype(object).to_numpy(),
                          "pid": runtime["pid"].astype(object).to_numpy(), "tid": runtime["tid"].astype(object).to_numpy(),
                          "start_ns": runtime["start_ns"].to_numpy(np.int64), "end_ns": runtime["end_ns"].to_numpy(np.int64),
                          "correlation_id": pd.array(runtime["correlation_id"], dtype="Int64")})
    kernels = gpu[(gpu["kind"].astype(object) == "kernel").to_numpy()]
    work = pd.DataFrame({"kind": "kernel", "name": kernels["name"].astype(object).to_numpy(),
                         GPU_ROW: np.flatnonzero((gpu["kind"].astype(object) == "kernel").to_numpy()),
                         "pid": kernels["pid"].astype(object).to_numpy(), "tid": None,
                         "start_ns": kernels["start_ns"].to_numpy(np.int64), "end_ns": kernels["end_ns"].to_numpy(np.int64),
                         "correlation_id": pd.array(kernels["correlation_id"], dtype="Int64"),
                         "graph_node_id": pd.array(kernels["graph_node_id"], dtype="Int64") if "graph_node_id" in kernels
                         else pd.array([pd.NA] * len(kernels), dtype="Int64")})
    return pd.concat([f for f in (out, calls, work) if len(f)] or [out], ignore_index=True)


GPU_ROW = "gpu_row"
"""Column of :func:`nvtx_events`' kernel rows: the row's position in the export's ``gpu`` table."""


def assigned_keys(found: Found, rows: int, at: np.ndarray | None = None) -> np.ndarray | None:
    """Per row of a table of ``rows`` rows, the :data:`CALL_KEY` of the call its kernel is assigned to by name
    (:attr:`Found.assigned`: a graph replay's attention kernels), -1 elsewhere; ``None`` where none is.

    Args:
        at: each events position's row in that table (an nsys export's ``gpu``: :func:`nvtx_events`'
            :data:`GPU_ROW`); ``None``: the table is the events table itself (a Kineto trace's).
    """
    if not found.assigned:
        return None
    keys = np.full(rows, -1, dtype=np.int64)
    positions = np.fromiter(found.assigned, np.int64, len(found.assigned))
    keys[positions if at is None else np.asarray(at)[positions].astype(np.int64)] = np.fromiter(
        found.assigned.values(), np.int64, len(found.assigned))
    return keys


def with_nvtx_ranges(ranges: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """An nsys export's NVTX ranges (:class:`~headcount.common.tables.Timeline` ``ranges``) plus the
    ranges of the calls :func:`find_calls` found there, as ranges of headcount's domain
    (new ``range_id`` s after the export's own), with their :data:`CALL_KEY` where a graph replay's kernels
    are assigned by name (null for the export's own ranges)."""
    first = int(ranges["range_id"].max()) + 1 if len(ranges) else 1
    ours = pd.DataFrame({"range_id": np.arange(first, first + len(found), dtype=np.int64), "pid": found["pid"].to_numpy(object),
                         "tid": found["tid"].to_numpy(object), "domain": DOMAIN,
                         "name": [n.split("@", 1)[1] for n in found["name"]], "style": "PushPop",
                         "start_ns": found["start_ns"].to_numpy(np.int64), "end_missing": False,
                         "end_ns": found["end_ns"].to_numpy(np.int64)})
    if CALL_KEY in found and (found[CALL_KEY] >= 0).any():
        ours[CALL_KEY] = pd.array(found[CALL_KEY].to_numpy(np.int64), dtype="Int64")
    text = [c for c in ("pid", "tid", "domain", "name", "style") if c in ranges]
    both = pd.concat([ranges.astype({c: object for c in text}), ours], ignore_index=True)
    return both.astype({c: "category" for c in text})
