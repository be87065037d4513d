"""What the eager tagger and the compiled path share: the active taggers and what tracing may read.

:mod:`headcount.tagging.tagger` pushes and pops taggers here;
:mod:`headcount.tagging.compiled` reads them, so neither imports the other's
internals. Dynamo reads :data:`MODE` and :data:`LAYERS` while tracing (and
guards on them by value), so they change only when a tagger starts or stops
and when a layer is first named: a new profiler of the same mode reuses the
compiled graph.

Torch-free: the operators that run inside a compiled graph reach the tagger
through :class:`SiteTagger`, the two methods every tagger has.
"""

from __future__ import annotations

import threading
from typing import Protocol

MODE: str | None = None
"""``layer`` or ``head`` while a tagger is active (the innermost one's), else ``None``."""

LAYERS: dict[int, tuple[str, int | None, str]] = {}
"""``id(attention module)`` → (layer name, layer index, model class), for traced code."""

LOCK = threading.RLock()
"""Held while taggers start and stop (they patch a class attribute shared by all)."""

ACTIVE: list["SiteTagger"] = []
"""The active taggers, innermost last: read it (the attention dispatch checks it on every call); change it with :func:`push` and :func:`pop`."""


class SiteTagger(Protocol):
    """What a compiled graph's range operators call on the active tagger."""

    mode: str

    def open_site(self, site: str, phase: str, head: int, kv_head: int, dims: list[int]) -> list:
        """Log a compiled call site's call and push its ranges; returns their tokens."""

    def close_site(self, tokens: list) -> None:
        """Pop the ranges :meth:`open_site` pushed."""


def current() -> SiteTagger | None:
    """The innermost active tagger, or ``None``."""
    return ACTIVE[-1] if ACTIVE else None


def push(tagger: SiteTagger) -> bool:
    """Make ``tagger`` the innermost active one (call under :data:`LOCK`); True when it is the first."""
    global MODE
    first = not ACTIVE
    ACTIVE.append(tagger)
    MODE = tagger.mode
    return first


def pop(tagger: SiteTagger) -> bool:
    """Stop ``tagger`` (call under :data:`LOCK`); True when no tagger is left active."""
    global MODE
    if tagger in ACTIVE:
        ACTIVE.remove(tagger)
    MODE = ACTIVE[-1].mode if ACTIVE else None
    return not ACTIVE


def share_layer(module_id: int, entry: tuple[str, int | None, str]) -> None:
    """Publish a layer's name for traced code, unchanged when it is already there (Dynamo guards on it)."""
    if LAYERS.get(module_id) != entry:
        LAYERS[module_id] = entry
