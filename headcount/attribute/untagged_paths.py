"""Layer numbers of untagged attention calls from the recording's own module paths, for calls
that no ``nn.Module`` range numbers (:func:`number`; :mod:`headcount.attribute.untagged`).

Two kinds of range name a block by its module path (``model.layers.12``, ``h.5``, ``blocks.9``,
``encoder.block.9.layer.0``: the path ``named_modules`` gives, whose first integer is the index in
the model's block list):

- **an enclosing range** named by such a path (``model.layers.12``, ``model.layers.12.self_attn``,
  a torchtitan ``layers.3``; also ``Block 3``, ``Layer 3``): the call is inside the block;
- **FSDP's hook ranges** (``FSDP::pre_forward (blocks.9._checkpoint_wrapped_module)``,
  ``FSDP::pre_backward (…)``, ``FSDP::post_forward (…)``, ``FSDP::post_backward_reduce (…)``):
  short ranges at the block's edges that enclose none of its work, so a block's window on a thread
  runs from its pre-hook to its post-hook. A post-hook whose pre-hook the recording lacks (it began
  inside the block) closes a window opened before the recording: the calls before it are the
  block's last ones.

The layer index is the block's; the layer name is headcount's (``layer.9``, with the stack where the
process shows several: ``encoder.layer.9``, ``decoder.layer.9``), so that a recording tagged by
headcount and one numbered here name the same layer alike. Where a window holds several calls
(two attention calls per block), each call's position in its block is its role
(``layer.9.call0``, ``layer.9.call1``), so calls of different work never share a layer row; a
backward call counts from the block's end (the block's last forward call is the first to run
backward). The call's ``found_as`` starts with the module path as the recording wrote it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headcount.attribute.untagged_calls import MODULE_RANGES, _Call

_LIST = r"(?:layers?|h|blocks?|resblocks|[A-Za-z]\w*_(?:layers|blocks))"
"""Names of the block lists of common models (HF ``layers``/``h``/``layer``/``block``, timm ``blocks``,
diffusers ``transformer_blocks``): an integer after one of them is a block's index."""
_PATH = re.compile(rf"^(?P<stack>(?:[A-Za-z_]\w*\.)*?{_LIST})\.(?P<idx>\d+)(?P<rest>(?:\.\w+)*)$")
_TITLED = re.compile(r"^(?P<stack>(?:\w+ )?(?:Block|Layer)) (?P<idx>\d+)$")
_HOOK = re.compile(r"^FSDP::(?P<edge>pre|post)_(?P<pass>forward|backward)\w* \((?P<paths>[^()]*)\)")
_WRAPPER = re.compile(r"^(?:_\w*wrapped_module|_orig_mod)$")
"""Components that FSDP, activation checkpointing and torch.compile add to a module's path."""


@dataclass(frozen=True)
class Block:
    """A block the recording names: ``stack`` (the path before the index, wrappers left out: ``blocks``,
    ``encoder.block``), ``index``, and ``path`` as written (``blocks.9._checkpoint_wrapped_module``)."""

    stack: str
    index: int
    path: str


def block_of(path: str) -> Block | None:
    """The block a module path names (its first index after a block list), or ``None``."""
    text = path.strip()
    m = _TITLED.match(text)
    if m:
        return Block(m.group("stack"), int(m.group("idx")), text)
    kept = ".".join(c for c in text.split(".") if not _WRAPPER.match(c))
    m = _PATH.match(kept)
    return Block(m.group("stack"), int(m.group("idx")), text) if m else None


def hook_of(name: str) -> tuple[str, str, Block] | None:
    """An FSDP hook range's edge (``pre``/``post``), pass (``forward``/``backward``) and the first block among
    the module paths it names; ``None`` for any other name, or a hook of no block (the root module's)."""
    m = _HOOK.match(name)
    if not m:
        return None
    block = next((b for b in map(block_of, m.group("paths").split(",")) if b is not None), None)
    return (m.group("edge"), m.group("pass"), block) if block is not None else None


@dataclass(eq=False)
class _Window:
    """One block's stretch on a thread and the calls inside it, with the module path each was found in
    (``paths``: ``id(call)`` → the path as written: a sub-module's, where its range was the innermost)."""

    block: Block
    hooked: str = ""  # the pass of the hooks that opened it (FSDP's forward or backward), "" for a range around
    start_seen: bool = True
    end_seen: bool = True
    calls: list = field(default_factory=list)
    paths: dict = field(default_factory=dict)

    def add(self, call: _Call, path: str) -> None:
        self.calls.append(call)
        self.paths[id(call)] = path


def number(calls: list[_Call], annotation_threads: dict) -> None:
    """Give each call without a layer (and without a forward call to take one from) the block that
    an enclosing module-path range, else FSDP's hooks on its thread, place it in (in place;
    ``numbered_by`` :data:`~headcount.attribute.untagged_calls.MODULE_RANGES`).

    Args:
        calls: the calls found so far.
        annotation_threads: ``(pid, tid)`` → the thread's annotations
            (:class:`~headcount.attribute.untagged._Thread`: ``frame``, ``start``, ``end``, ``around``).
    """
    todo = [c for c in calls if c.layer_name is None and c.forward is None]
    if not todo:
        return
    windows: list[_Window] = []
    rest = _enclosed(todo, annotation_threads, windows)
    by_thread: dict = {}
    for c in rest:
        by_thread.setdefault((c.pid, c.tid), []).append(c)
    for key, thread_calls in by_thread.items():
        thread = annotation_threads.get(key)
        if thread is not None:
            _hooked(thread_calls, thread, windows)
    _name(windows)


def _enclosed(todo: list[_Call], annotation_threads: dict, windows: list[_Window]) -> list[_Call]:
    """Calls inside a range named by a block's path join that block's window (the outermost range of the
    block around them); the calls left are returned."""
    rest, by_range = [], {}
    by_thread: dict = {}
    for c in todo:
        by_thread.setdefault((c.pid, c.tid), []).append(c)
    for key, thread_calls in by_thread.items():
        thread = annotation_threads.get(key)
        if thread is None:
            rest += thread_calls
            continue
        names = thread.column("name")
        for c, around in zip(thread_calls, thread.around([c.start for c in thread_calls], [c.end for c in thread_calls])):
            blocks = [(p, block_of(str(names[p]))) for p in around]
            inner = next((b for _, b in reversed(blocks) if b is not None), None)
            if inner is None:
                rest.append(c)
                continue
            # the outermost range of the same block: a block's sub-module ranges share its window
            at = next(p for p, b in blocks if b is not None and (b.stack, b.index) == (inner.stack, inner.index))
            window = by_range.get((key, at))
            if window is None:
                window = by_range[(key, at)] = _Window(inner)
                windows.append(window)
            window.add(c, inner.path)
    return rest


def _hooked(thread_calls: list[_Call], thread, windows: list[_Window]) -> None:
    """Calls of one thread in the windows FSDP's hooks open and close there: one sweep in time order over
    the hooks (a stack of the open windows) and the calls (each in the innermost open window)."""
    names = thread.column("name")
    distinct = {n: hook_of(str(n)) for n in pd.unique(names)}  # once per distinct name: a thread holds millions of ranges
    hit = pd.Series(names, dtype=object).map({n: h is not None for n, h in distinct.items()}).to_numpy(bool)
    hooks = [(int(thread.start[i]), int(i), distinct[names[i]]) for i in np.flatnonzero(hit)]
    if not hooks:
        return
    order = np.argsort([c.start for c in thread_calls], kind="stable")
    events = sorted([(s, 0, i, h) for s, i, h in hooks] + [(thread_calls[k].start, 1, int(k), None) for k in order])
    stack: list[tuple[str, _Window]] = []  # (path as written, its window), innermost last
    pending: list[_Call] = []  # calls in no open window since the last hook: a post-hook may claim them
    last: _Window | None = None  # the thread's latest window
    for _, is_call, i, hook in events:
        if is_call:
            if stack:
                stack[-1][1].add(thread_calls[i], stack[-1][0])
            else:
                pending.append(thread_calls[i])
            continue
        edge, hooked, block = hook
        if edge == "pre":
            same = (block.stack, block.index, hooked)
            if stack and _key(stack[-1][1]) == same:
                window = stack[-1][1]  # a sub-module of the open block: the same window
            elif not stack and not pending and last is not None and _key(last) == same:
                window = last  # the block's next sub-module (T5's layer.0, then layer.1): the block goes on
            else:
                window = _Window(block, hooked)
                windows.append(window)
            window.end_seen = False
            stack.append((block.path, window))
            last = window
        else:
            opened = [k for k, (path, _) in enumerate(stack) if path == block.path]
            if opened:
                stack[opened[-1]][1].end_seen = True
                del stack[opened[-1]:]  # and whatever opened inside it and did not close
            elif pending:  # opened before the recording began: the calls so far are its last ones
                last = _Window(block, hooked, start_seen=False)
                for c in pending:
                    last.add(c, block.path)
                windows.append(last)
        pending = []


def _key(w: _Window) -> tuple:
    return w.block.stack, w.block.index, w.hooked


def _name(windows: list[_Window]) -> None:
    """Layer, layer name and ``found_as`` of the windows' calls."""
    windows = [w for w in windows if w.calls]
    if not windows:
        return
    stacks = _stack_names({w.block.stack for w in windows})
    # several calls in one block: each named by its position there, in every block alike
    roles = max(len(calls) for w in windows for calls in _split_phases(w).values()) > 1
    whole: dict[str, Counter] = {}
    for w in windows:
        if w.start_seen and w.end_seen:
            for phase, calls in _split_phases(w).items():
                whole.setdefault(phase, Counter())[len(calls)] += 1
    for w in windows:
        base = f"{stacks[w.block.stack]}.layer.{w.block.index}" if stacks[w.block.stack] else f"layer.{w.block.index}"
        for phase, calls in _split_phases(w).items():
            usual = whole[phase].most_common(1)[0][0] if phase in whole else len(calls)
            for i, c in enumerate(calls):
                c.layer, c.numbered_by = w.block.index, MODULE_RANGES
                c.layer_name = f"{base}.call{_position(w, phase, i, len(calls), usual)}" if roles else base
                c.found_as = f"{w.paths[id(c)]}/{c.found_as}"


def _split_phases(w: _Window) -> dict[str, list[_Call]]:
    out: dict[str, list[_Call]] = {}
    for c in sorted(w.calls, key=lambda c: c.start):
        out.setdefault(c.phase, []).append(c)
    return out


def _position(w: _Window, phase: str, i: int, m: int, usual: int) -> int:
    """The ``i``-th of a window's ``m`` calls of ``phase``: its position in the block, forward order (the
    block's first forward call is 0). A window cut by the recording's start (or, for backward, its end)
    is aligned to the other end, where the whole windows hold ``usual`` calls."""
    if phase != "bwd":
        return i if w.start_seen or not w.end_seen or m > usual else usual - m + i
    if w.end_seen or not w.start_seen or m > usual:  # backward runs the block's calls last to first
        return m - 1 - i
    return usual - 1 - i


def _stack_names(stacks: set[str]) -> dict[str, str]:
    """Each stack's part of a layer name: none for one stack (``layer.9``, as headcount's tagger names a
    one-stack model), else the components that tell it from the others (``encoder``, ``decoder``)."""
    if len(stacks) < 2:
        return {s: "" for s in stacks}
    parts = {s: s.replace(" ", "_").split(".") for s in stacks}
    out = {}
    for s, p in parts.items():
        distinct = [c for i, c in enumerate(p) if any(len(o) <= i or o[i] != c for t, o in parts.items() if t != s)]
        out[s] = ".".join(distinct) or ".".join(p)
    return out
