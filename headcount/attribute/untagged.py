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
  ``module ranges``. Without them, the block index of a range around the call
  named by its module path (``model.layers.12``), else of the FSDP hooks
  (``FSDP::pre_forward (blocks.9…)``) whose window on the thread holds it, with
  the call's position in the block where a block holds several
  (``layer.9.call1``; :mod:`headcount.attribute.untagged_paths`): also
  ``module ranges``. Without any, the call's position (0, 1, …) among
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

The shapes are read by :mod:`headcount.attribute.untagged_shapes`, the calls
found by kernel names by :mod:`headcount.attribute.untagged_kernels`; an nsys
export becomes the events table here through
:mod:`headcount.attribute.untagged_nsys`.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headcount.attribute import untagged_modules, untagged_paths
from headcount.attribute.untagged_calls import CALL_ORDER, MODULE_RANGES, _Call, _Spans
from headcount.attribute.untagged_kernels import _kernel_calls, _Replays
from headcount.attribute.untagged_shapes import eager_shape, operator_shape
from headcount.common import signals
from headcount.common.call_log import CallLog
from headcount.common.naming import DOMAIN, MODULE
from headcount.common.process_ids import REPLAY_LANE

CALL_KEY = "call_key"
"""Column of :attr:`Found.ranges`: which call's kernels are assigned to the range by name (-1: none, the launch rule)."""
TORCH_PROFILER, NSYS = "torch.profiler", "nsys"
"""The recorders :func:`find_calls` gives advice for (a torch.profiler trace; an nsys export)."""
_MODULES_ADVICE = {
    TORCH_PROFILER: "record nn.Module ranges (torch.profiler.profile(with_modules=True, with_stack=True)) to number them by module",
    # nsys records no nn.Module range of its own: a range named by the block's path numbers it (untagged_paths)
    NSYS: "in an nsys recording, name each block with an NVTX range of its module path (model.layers.N, as FSDP's "
          "FSDP::pre_forward (…) hooks do) around its forward, with torch.autograd.profiler.emit_nvtx(record_shapes=True) "
          "around the step, or run headcount run --backend nsys -o out/ -- python train.py, which tags attention itself",
}
_SHAPES_ADVICE = {
    TORCH_PROFILER: "record with record_shapes=True",
    NSYS: "record with torch.autograd.profiler.emit_nvtx(record_shapes=True) around the step",
}


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



# ---------------------------------------------------------------- finding
def find_calls(events: pd.DataFrame, recorder: str = TORCH_PROFILER) -> Found:
    """The attention calls of an untagged recording.

    Args:
        events: the events table (:func:`headcount.parsers.kineto_json.events_frame`
            layout: ``kind`` ``op`` / ``module`` / ``range`` / ``kernel`` /
            ``runtime``, ``name``, ``pid``, ``tid``, ``start_ns``, ``end_ns``,
            ``correlation_id``, ``args``, ``sequence``, ``graph_node_id``).
        recorder: what recorded it (:data:`TORCH_PROFILER` or :data:`NSYS`): the notices' advice on
            recording module ranges and shapes is that recorder's.

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
    left_out: dict[str, int] = {}
    calls += _module_calls(modules, op_threads, calls, untagged_modules.ModuleLaunches(events) if len(modules) else None, left_out)
    found.notices += untagged_modules.notices(left_out)
    _number_by_modules(calls, module_threads)
    calls += _module_backward(ops, calls)
    calls = _without_overlaps(calls, found)  # disjoint on each thread from here on
    calls = _not_captured(events, calls, found.notices)
    replays = _Replays()
    calls += _kernel_calls(events, calls, replays)
    _link_backward(calls, op_threads)
    _models(calls, module_threads, annotation_threads)
    untagged_paths.number(calls, annotation_threads)  # the trace's own module paths (FSDP's hooks among them)
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
                                   shape=c.shape, model=c.model, signal=c.signal, found_as=c.found_as, numbered_by=c.numbered_by,
                                   implementation=c.row.implementation if c.shape is None and c.row is not None else None))
    ranges = pd.DataFrame(rows, columns=[*events.columns, CALL_KEY])
    ranges["start_ns"] = ranges["start_ns"].astype("int64")
    ranges["end_ns"] = ranges["end_ns"].astype("int64")
    ranges[CALL_KEY] = ranges[CALL_KEY].astype("int64")
    found.ranges = ranges
    found.notices[:0] = _summary(calls, _shapes_recorded(ops), recorder)
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


def _module_calls(modules: pd.DataFrame, op_threads: dict, taken: list[_Call], launches=None,
                  left_out: dict | None = None) -> list[_Call]:
    """One call per innermost attention module that holds no forward operator call, and whose GPU launches make it
    the attention (:func:`headcount.attribute.untagged_modules.verdict`: one that launched an attention kernel leaves
    the call to the kernel signal; one whose attention ran elsewhere, or that launched nothing, is no call; counted in
    ``left_out``)."""
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
            inside = op_thread.frame.iloc[op_thread.inside(m.start_ns, m.end_ns)] if op_thread is not None else None
            said = untagged_modules.verdict(launches, m.pid, m.tid, int(m.start_ns), int(m.end_ns), inside) if launches else None
            if said is not None:
                if left_out is not None:
                    left_out[said] = left_out.get(said, 0) + 1
                continue
            if inside is not None:
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


def _shapes_recorded(ops: pd.DataFrame) -> bool:
    """Whether the recording kept operators' input dims (``record_shapes=True``): some softmax, matmul or attention
    operator carries them (the only operators whose inputs are kept)."""
    if "args" not in ops or not len(ops):
        return False
    return any(isinstance(a, dict) and bool(a.get("Input Dims")) for a in ops["args"].to_numpy(object))


def _summary(calls: list[_Call], shapes_recorded: bool = False, recorder: str = TORCH_PROFILER) -> list[str]:
    """Notices: which signals found how many calls, how layers were numbered, which shapes are missing
    (the advice that of ``recorder``: :data:`TORCH_PROFILER` or :data:`NSYS`)."""
    lines = []
    by_signal: dict = {}
    for c in calls:
        by_signal.setdefault(c.signal, {}).setdefault(c.row.framework if c.row else c.signal, 0)
        by_signal[c.signal][c.row.framework if c.row else c.signal] += 1
    parts = [f"{sum(v.values())} by {s} ({', '.join(f'{k}: {n}' for k, n in v.items())})" for s, v in by_signal.items()]
    lines.append(f"attention found without headcount's tags: {len(calls)} calls, " + "; ".join(parts))
    by_order = sum(1 for c in calls if c.numbered_by == CALL_ORDER)
    if by_order:
        ranges = "nn.Module range" if recorder == TORCH_PROFILER else "range of a module (nn.Module, module path, FSDP hook)"
        lines.append(f"{by_order} attention calls have no {ranges} naming their layer: layer.N is the call's position "
                     "inside its step (or enclosing annotation); " + _MODULES_ADVICE[recorder])
    no_shape = sum(1 for c in calls if c.shape is None)
    packed = sum(1 for c in calls if c.shape is not None and c.shape.q_len is None)
    if no_shape:
        recorded = shapes_recorded or any(c.shape is not None for c in calls)  # some operator carried its input dims
        lines.append(f"{no_shape} attention calls have no shapes: " + (
            "the trace recorded shapes, but these calls were found by module or kernel names with no attention operator "
            "carrying input dims (kernel-only and unlinked backward calls never have them)" if recorded else
            _SHAPES_ADVICE[recorder] + " (kernel-only and unlinked backward calls never have them)")
            + ": their FLOPs and analytic bytes are null")
    if packed:
        lines.append(f"{packed} attention calls have packed variable-length inputs (tokens, heads, head dim): heads and head "
                     "dim are known, batch and sequence lengths are not recorded, so FLOPs and analytic bytes are null")
    return lines




def assigned_keys(found: Found, rows: int, at: np.ndarray | None = None) -> np.ndarray | None:
    """Per row of a table of ``rows`` rows, the :data:`CALL_KEY` of the call its kernel is assigned to by name
    (:attr:`Found.assigned`: a graph replay's attention kernels), -1 elsewhere; ``None`` where none is.

    Args:
        at: each events position's row in that table (an nsys export's ``gpu``:
            :func:`~headcount.attribute.untagged_nsys.nvtx_events`' :data:`~headcount.attribute.untagged_nsys.GPU_ROW`);
            ``None``: the table is the events table itself (a Kineto trace's).
    """
    if not found.assigned:
        return None
    keys = np.full(rows, -1, dtype=np.int64)
    positions = np.fromiter(found.assigned, np.int64, len(found.assigned))
    keys[positions if at is None else np.asarray(at)[positions].astype(np.int64)] = np.fromiter(
        found.assigned.values(), np.int64, len(found.assigned))
    return keys
