"""Push and pop headcount's ranges: NVTX for the Nsight tools and CUPTI,
``record_function`` for torch.profiler.

Both are thread-local stacks, so a range must be popped on the thread that
pushed it; the tagger guarantees that (backward ranges are pushed and popped
by autograd nodes that run on the same engine thread). ``push`` returns a
token (the record_function handle, or ``None`` when torch.profiler is not
recording) that the matching ``pop`` takes, so the two stay balanced even if
the profiler starts or stops in between.

Cost matters: this sits on every attention call. NVTX event attributes are
built once per name and reused (they also register the name as an NVTX
registered string, which is how nsys stores it: ``StringIds`` via ``textId``).
With no tool attached a push/pop pair costs a fraction of a microsecond.
"""

from __future__ import annotations

import torch

from headcount.common.naming import DOMAIN

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
        if self.use_nvtx:
            self._domain = _nvtx.get_domain(domain)
            self._handle = self._domain.handle if _NVTX_FAST else None
        if self.use_nvtx and _NVTX_FAST:
            self._specialize()

    def _specialize(self) -> None:
        """Replace push2/pop2 by closures over their constants: every attribute
        lookup saved is felt on each attention call."""
        attrs, handle, prefix, use_torch, build = self._attrs, self._handle, self._torch_prefix, self.use_torch, self._attributes
        push, pop, enabled, enter, leave = _nvtx_push, _nvtx_pop, _profiler_enabled, _record_enter, _record_exit

        def push2(outer: str, inner: str):
            push(attrs.get(outer) or build(outer), handle)
            push(attrs.get(inner) or build(inner), handle)
            if use_torch and enabled():
                return (enter(prefix + outer, None), enter(prefix + inner, None))
            return None

        def pop2(tokens=None) -> None:
            if tokens is not None:
                leave(tokens[1])
                leave(tokens[0])
            pop(handle)
            pop(handle)

        self.push2 = push2
        self.pop2 = pop2

    def _attributes(self, name: str):
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self._attrs[name] = self._domain.get_event_attributes(name, None, None, None)
        return attrs

    def push(self, name: str):
        """Open range ``name`` on this thread; returns the token :meth:`pop` needs."""
        if self.use_nvtx:
            if _NVTX_FAST:
                _nvtx_push(self._attrs.get(name) or self._attributes(name), self._handle)
            else:
                _nvtx.push_range(name, domain=self._domain_name)
        if self.use_torch and _profiler_enabled():
            return _record_enter(self._torch_prefix + name, None)
        return None

    def pop(self, token=None) -> None:
        """Close the innermost range opened on this thread; ``token`` is what :meth:`push` returned."""
        if token is not None:
            _record_exit(token)
        if self.use_nvtx:
            if _NVTX_FAST:
                _nvtx_pop(self._handle)
            else:
                _nvtx.pop_range(domain=self._domain_name)

    def push2(self, outer: str, inner: str):
        """Open ``outer`` then ``inner`` (one call: this is the per-attention hot path)."""
        if self.use_nvtx and _NVTX_FAST:
            attrs = self._attrs
            _nvtx_push(attrs.get(outer) or self._attributes(outer), self._handle)
            _nvtx_push(attrs.get(inner) or self._attributes(inner), self._handle)
        elif self.use_nvtx:
            _nvtx.push_range(outer, domain=self._domain_name)
            _nvtx.push_range(inner, domain=self._domain_name)
        if self.use_torch and _profiler_enabled():
            prefix = self._torch_prefix
            return (_record_enter(prefix + outer, None), _record_enter(prefix + inner, None))
        return None

    def pop2(self, tokens=None) -> None:
        """Close the two ranges :meth:`push2` opened; ``tokens`` is what it returned."""
        if tokens is not None:
            _record_exit(tokens[1])
            _record_exit(tokens[0])
        if self.use_nvtx:
            if _NVTX_FAST:
                _nvtx_pop(self._handle)
                _nvtx_pop(self._handle)
            else:
                _nvtx.pop_range(domain=self._domain_name)
                _nvtx.pop_range(domain=self._domain_name)


class CorrelatedEmitter(RangeEmitter):
    """A :class:`RangeEmitter` that also logs each range in the cupti source's
    :class:`~headcount.collector.cupti_logs.RangeLog`, which pushes the
    range's id as CUPTI external correlation id while it is open.

    Tokens carry both the record_function handle and the log id.
    """

    def __init__(self, log, domain: str = DOMAIN, nvtx: bool = True, torch_ranges: bool = True):
        super().__init__(domain=domain, nvtx=nvtx, torch_ranges=torch_ranges)
        self._log = log
        # the generic methods below replace the specialized closures
        self.push2 = self._push2
        self.pop2 = self._pop2

    def push(self, name: str, correlate: bool = True):
        token = RangeEmitter.push(self, name)
        return token, self._log.open(self._domain_name, name, correlate)

    def pop(self, token=None) -> None:
        inner, rid = token
        self._log.close(rid)
        RangeEmitter.pop(self, inner)

    def _push2(self, outer: str, inner: str):
        # nothing launches between the two: the inner range's id is the only one a launch can carry
        return self.push(outer, correlate=False), self.push(inner)

    def _pop2(self, tokens=None) -> None:
        self.pop(tokens[1])
        self.pop(tokens[0])
