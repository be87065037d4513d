"""Push and pop headcount's ranges: NVTX for the Nsight tools and CUPTI,
``record_function`` for torch.profiler.

Both are thread-local stacks, so a range must be popped on the thread that
pushed it; the tagger guarantees that (backward ranges are pushed and popped
by autograd nodes that run on the same engine thread).

Cost matters: this sits on every attention call. NVTX event attributes are
built once per name and reused (they also register the name as an NVTX
registered string, which is how nsys stores it: ``StringIds`` via ``textId``).
With no tool attached a push/pop pair costs a fraction of a microsecond.
"""

from __future__ import annotations

import threading

import torch

from headcount.collector.naming import DOMAIN

try:  # the low-level entry points skip a cache lookup and an attribute build per call
    import nvtx as _nvtx
    from nvtx._lib import pop_range as _nvtx_pop
    from nvtx._lib import push_range as _nvtx_push

    _NVTX_FAST = True
except ImportError:  # pragma: no cover - depends on the installed nvtx build
    try:
        import nvtx as _nvtx
    except ImportError:
        _nvtx = None
    _NVTX_FAST = False

_record_enter = torch.ops.profiler._record_function_enter_new
_record_exit = torch.ops.profiler._record_function_exit
_profiler_enabled = torch._C._autograd._profiler_enabled


class RangeEmitter:
    """Emits nested ranges under one NVTX domain and, while torch.profiler
    records, as ``<domain>@<name>`` record_function ranges.

    Args:
        domain: NVTX domain name.
        nvtx: emit NVTX ranges (needs the ``nvtx`` package).
        torch_ranges: emit ``record_function`` ranges while a torch profiler is active.
    """

    def __init__(self, domain: str = DOMAIN, nvtx: bool = True, torch_ranges: bool = True):
        self.use_nvtx = bool(nvtx and _nvtx is not None)
        self.use_torch = torch_ranges
        self._domain_name = domain
        self._torch_prefix = domain + "@"
        self._attrs: dict[str, object] = {}
        self._local = threading.local()
        if self.use_nvtx:
            self._domain = _nvtx.get_domain(domain)
            self._handle = self._domain.handle if _NVTX_FAST else None

    def _attributes(self, name: str):
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self._domain.get_event_attributes(name, None, None, None)
            self._attrs[name] = attrs
        return attrs

    def _torch_stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def push(self, name: str) -> None:
        """Open range ``name`` on this thread."""
        if self.use_nvtx:
            if _NVTX_FAST:
                _nvtx_push(self._attributes(name), self._handle)
            else:
                _nvtx.push_range(name, domain=self._domain_name)
        if self.use_torch:
            # None marks "no torch range opened" so that pops stay balanced when
            # the profiler starts or stops between a push and its pop.
            handle = _record_enter(self._torch_prefix + name, None) if _profiler_enabled() else None
            self._torch_stack().append(handle)

    def pop(self) -> None:
        """Close the innermost range this emitter opened on this thread."""
        if self.use_torch:
            stack = self._torch_stack()
            handle = stack.pop() if stack else None
            if handle is not None:
                _record_exit(handle)
        if self.use_nvtx:
            if _NVTX_FAST:
                _nvtx_pop(self._handle)
            else:
                _nvtx.pop_range(domain=self._domain_name)
