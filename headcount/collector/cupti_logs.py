"""What the cupti source logs beside CUPTI's own records: headcount's ranges and the CUDA graph nodes they captured.

:class:`RangeLog` gives every headcount range CUPTI timestamps and pushes its id as an external correlation id while
it is open; :class:`GraphNodeLog` follows CUPTI's resource callbacks to note which range was open when each CUDA
graph node was made. :class:`~headcount.collector.cupti_source.CuptiRecorder` writes both into its records file.
"""

from __future__ import annotations

import os
import threading

from headcount.common.naming import STEP_DOMAIN


class RangeLog:
    """headcount's ranges as the cupti source sees them: each open range
    pushes its id as an external correlation id (kind ``CUSTOM0``) on its
    thread, and gets CUPTI timestamps, so the range table and the launch
    mapping come from the same clock without NVTX injection.

    Only where attribution reads the id: a step range pushes none (work finds its step by the time of its launch
    call, on any thread: :func:`headcount.attribute.labels.step_of`), nor does a range opened together with the
    one inside it (``correlate=False``: nothing can launch between the two, so every launch carries the inner id
    and nesting gives the outer its work). CUPTI writes an external correlation record for each recorded API
    call made while an id is pushed; a step pushed its id over every call of the step (44 % of the H100 step's
    20,898 such records, tests/fixtures/gpu/h100-2026-12-05).

    Thread-safe: ranges open on the main thread and on autograd's threads.
    """

    def __init__(self, cupti, correlate: bool = True):
        self._cupti = cupti
        self._correlate = correlate  # False: no id is ever pushed (ranges keep their timestamps; the GPU check's "+ ranges")
        self._kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
        self._ts = cupti.get_timestamp
        self._push = cupti.activity_push_external_correlation_id
        self._pop = cupti.activity_pop_external_correlation_id
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._open = threading.local()  # this thread's open range ids, innermost last
        self.ranges: list[list] = []  # [id, domain, name, pid, tid, start, end]
        self.before_open = None  # called before a range opens while set (the recorder's deferred PM sampling start)
        self.pushes = 0  # external correlation ids pushed (the run metadata's collector.correlation_pushes)

    def open(self, domain: str, name: str, correlate: bool = True) -> int:
        """Open a range on this thread; returns its id (≥ 1) for :meth:`close`.

        Args:
            correlate: push the id as external correlation id (never for a step range, see the class docstring);
                ``False`` for an outer range opened right before an inner one that pushes its own.
        """
        if self.before_open is not None:
            self.before_open()
        with self._lock:
            rid = len(self.ranges) + 1
            self.ranges.append([rid, domain, name, self._pid, threading.get_native_id(), self._ts(), None])
        pushed = correlate and self._correlate and domain != STEP_DOMAIN
        if pushed:
            self._push(self._kind, rid)
            self.pushes += 1
        stack = getattr(self._open, "ids", None)
        if stack is None:
            stack = self._open.ids = []
        stack.append((rid, domain, pushed))
        return rid

    def close(self, rid: int) -> None:
        """Close range ``rid`` (the innermost open one on this thread)."""
        stack = getattr(self._open, "ids", None)
        if not stack or stack[-1][2]:
            self._pop(self._kind)
        self.ranges[rid - 1][6] = self._ts()
        if stack:
            stack.pop()

    def current(self) -> int | None:
        """The innermost range open on this thread that can capture work (``None``
        outside every such range): step ranges never do (they are not replayed)."""
        stack = getattr(self._open, "ids", None) or ()
        return next((rid for rid, domain, _ in reversed(stack) if domain != STEP_DOMAIN), None)

    def records(self) -> list[dict]:
        return [{"kind": "range", "id": r[0], "domain": r[1], "name": r[2], "process_id": r[3], "thread_id": r[4],
                 "start": r[5], "end": r[6]} for r in self.ranges]


class GraphNodeLog:
    """The range open when each CUDA graph node was made, for the kernels a
    graph replays.

    A replayed kernel's launch is the ``cudaGraphLaunch`` of the whole graph,
    made wherever the program replays it (often outside every attention
    range); its record carries ``graph_node_id``. CUPTI calls the resource
    callback ``GRAPHNODE_CREATED`` on the thread that captures (or adds) a node,
    inside that call — while headcount's ranges of the layer being captured are
    open on that thread — and ``GRAPHNODE_CLONED`` for each node of an
    instantiated (executable) graph, naming its original. Both become records:
    ``{"kind": "graph_node", "node_id", "range_id"}`` and
    ``{"kind": "graph_node_clone", "node_id", "original_node_id"}``
    (:func:`headcount.attribute.graphs.follow_clones` resolves them).

    Never raises into CUPTI: a failure in the callback is counted.
    """

    def __init__(self, cupti, range_log: "RangeLog"):
        self._cupti = cupti
        self._ranges = range_log
        self._subscriber = None
        self._created = int(cupti.CallbackIdResource.GRAPHNODE_CREATED)
        self._cloned = int(cupti.CallbackIdResource.GRAPHNODE_CLONED)
        self.records: list[dict] = []
        self.failures = 0

    def start(self) -> str | None:
        """Subscribe; returns a notice instead of raising when CUPTI refuses."""
        cupti = self._cupti
        try:
            self._subscriber = cupti.subscribe(self._callback, 0)
            for cbid in (self._created, self._cloned):
                cupti.enable_callback(1, self._subscriber, int(cupti.CallbackDomain.RESOURCE), cbid)
        except Exception as exc:  # noqa: BLE001 - attribution of graph replays is lost, tracing goes on
            self.stop()
            return (f"CUDA graph nodes are not followed ({type(exc).__name__}: {exc}): the records will not say which "
                    "range captured each graph node")
        return None

    def stop(self) -> None:
        if self._subscriber is not None:
            try:
                self._cupti.unsubscribe(self._subscriber)
            except Exception:  # noqa: BLE001 - best effort at the end of a session
                pass
            self._subscriber = None

    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        cupti = self._cupti
        try:
            resource = cbdata if hasattr(cbdata, "resource_descriptor") else cupti.ResourceData.from_ptr(int(cbdata))
            graph = cupti.GraphData.from_ptr(int(resource.resource_descriptor))
            node = int(cupti.get_graph_node_id(graph.node))
            if int(cbid) == self._created:
                self.records.append({"kind": "graph_node", "node_id": node, "range_id": self._ranges.current()})
            elif int(cbid) == self._cloned:
                self.records.append({"kind": "graph_node_clone", "node_id": node,
                                     "original_node_id": int(cupti.get_graph_node_id(graph.original_node))})
        except Exception:  # noqa: BLE001 - never raise inside CUPTI's callback
            self.failures += 1
