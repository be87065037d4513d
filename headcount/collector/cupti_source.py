"""The ``cupti`` source: in-process CUPTI activity tracing with cupti-python.

Recording only (docs/architecture.md §1): enable activity kinds, receive buffers, copy each
record into a plain dict before CUPTI reuses the buffer, push an external
correlation id for every headcount range, optionally run PM sampling, and
write everything to one records file. Turning records into tables is
:mod:`headcount.parsers.cupti_records`'s job.

What is enabled and why:

- ``CONCURRENT_KERNEL`` (plain ``KERNEL`` serializes kernels), with latency
  timestamps (``queued``, ``submitted``) on;
- ``RUNTIME`` and ``DRIVER`` API records: the launch call of every kernel
  (``cudaLaunchKernel*``, ``cuLaunchKernel*`` from Triton and cuBLASLt,
  graph launches), for launch latency and CPU launch cost;
- ``EXTERNAL_CORRELATION``: headcount's ranges push an id (kind ``CUSTOM0``)
  while open, so every launch maps to its range exactly, on any thread,
  without comparing timestamps;
- ``MARKER`` (NVTX) when ``NVTX_INJECTION64_PATH`` points at libcupti: a
  cross-check, and the user's own NVTX ranges;
- the resource callbacks ``GRAPHNODE_CREATED`` and ``GRAPHNODE_CLONED``
  (:class:`GraphNodeLog`): which headcount range was open on the thread that
  captured each CUDA graph node (kernels replayed from a graph carry only their
  node's id): each replay's kernels are attributed through it
  (:mod:`headcount.attribute.graphs`, docs/cupti.md).

Thread ids are the system's (``gettid``) so that API records and headcount's
ranges name threads alike. Dropped records are counted (CUPTI's own count)
and reported in the run metadata.

Everything here that touches CUPTI goes through ``self.cupti`` (the
``cupti.cupti`` module), so tests can stand a recorded-records replay in for
the GPU (see ``tests/cupti_replay.py``).
"""

from __future__ import annotations

import ctypes
import gzip
import os
import threading
import time
from pathlib import Path

import msgspec

from headcount.collector import api_calls, cupti_home
from headcount.collector.cupti_errors import classify
from headcount.common.env import cuda_usable, package_version
from headcount.common.errors import HeadcountError
from headcount.common.naming import STEP_DOMAIN
from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

BUFFER_BYTES = 8 << 20
# PM sampling intervals tried, finest first (GPU ns), when none is asked for (DEFAULT_PM_INTERVAL_NS = 0, "auto"):
# the first CUPTI accepts is used. 5 µs is nsys's finest GPU-metrics rate (200 kHz); the 50-µs interval of the first
# H100 run resolved none of bert-base's 40–60-µs sdpa forward layer calls (headcount.derive.sampling.MIN_WHOLE_SAMPLES)
PM_INTERVALS_NS = (5_000, 10_000, 20_000, 50_000)
DEFAULT_PM_INTERVAL_NS = 0
PM_HARDWARE_BUFFER_BYTES = 256 << 20
# the most samples decoded from one recording (host memory: each becomes a record); at 5 µs, 20 s of GPU time.
# A longer recording keeps its first samples, says so, and its later ranges get no sampled figure (null)
PM_MAX_DECODED_SAMPLES = 4_000_000
# tried in order until PM sampling accepts one set in a single pass
# what PM sampling asks for, largest set first, from the tables the sampling derivation reads (they cannot drift apart)
PM_METRIC_SETS = ((*PM_COUNTERS, *PM_PERCENTS), tuple(PM_COUNTERS))
RECORDS_FILE = "cupti-records.jsonl.gz"

_KERNEL_FIELDS = (
    "name", "start", "end", "queued", "submitted", "correlation_id", "device_id", "context_id", "stream_id",
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "cluster_x", "cluster_y", "cluster_z",
    "registers_per_thread", "static_shared_memory", "dynamic_shared_memory", "shared_memory_executed",
    "local_memory_per_thread", "graph_id", "graph_node_id", "launch_type", "grid_id",
)
_API_FIELDS = ("cbid", "start", "end", "process_id", "thread_id", "correlation_id", "return_value")
_COPY_FIELDS = ("start", "end", "bytes", "correlation_id", "device_id", "context_id", "stream_id", "graph_id", "graph_node_id")


def load_cupti():
    """Import ``cupti.cupti``.

    Raises:
        HeadcountError: cupti-python is missing or cannot be imported.
    """
    cupti_home.activate()  # headcount's own cupti-python and libcupti, where `headcount cupti install` put them
    try:
        from cupti import cupti
    except ImportError as exc:
        err = classify(exc, "importing cupti-python")
        if cupti_home.note():  # the folder is there but could not be used: that is the cause to name
            err = HeadcountError(f"{err.message}: {cupti_home.note()}", hint=err.hint, exit_code=err.exit_code)
        raise err from exc
    return cupti


def cupti_version() -> str | None:
    """Installed cupti-python version, or ``None``."""
    return package_version("cupti-python")


def api_name(cupti, kind_name: str, cbid: int) -> str:
    """``cudaLaunchKernel_v7000`` for a runtime cbid (read from cupti-python's
    enums: works without a driver, unlike ``get_callback_name``)."""
    key = (id(cupti), kind_name, int(cbid))
    name = _NAMES.get(key)
    if name is None:
        enum = cupti.runtime_api_trace_cbid if kind_name == "RUNTIME" else cupti.driver_api_trace_cbid
        try:
            name = enum(int(cbid)).name
        except ValueError:
            name = f"cbid {cbid}"
        _NAMES[key] = name
    return name


# Records are copied in CUPTI's buffer-completed callback, holding the GIL the training thread needs: kind and call
# names are looked up once per kind and call id, not built from the enums per record (2.1 → 1.7 µs an API record)
_NAMES: dict[tuple, str] = {}


def _kind_name(cupti, kind: int) -> str:
    key = (id(cupti), "kind", int(kind))
    name = _NAMES.get(key)
    if name is None:
        name = _NAMES[key] = cupti.ActivityKind(kind).name
    return name


def record_of(cupti, activity) -> dict | None:
    """Copy one activity record into a plain dict (``None`` for kinds not kept).

    ``kind`` becomes ``kernel``, ``memcpy``, ``memset``, ``runtime``, ``driver``,
    ``external_correlation`` or ``marker``; timestamps stay CUPTI's nanoseconds.
    """
    kind = _kind_name(cupti, activity.kind)
    if kind in ("CONCURRENT_KERNEL", "KERNEL"):
        rec = {f: getattr(activity, f, None) for f in _KERNEL_FIELDS}
        rec["kind"] = "kernel"
        return rec
    if kind in ("MEMCPY", "MEMSET"):  # GPU busy time that is not a kernel (the steps table's union needs it)
        rec = {f: getattr(activity, f, None) for f in _COPY_FIELDS}
        rec["kind"] = kind.lower()
        if kind == "MEMCPY":
            try:
                rec["name"] = f"Memcpy {cupti.ActivityMemcpyKind(getattr(activity, 'copy_kind', 0)).name}"
            except (ValueError, TypeError):
                rec["name"] = "Memcpy"
        else:
            rec["name"] = "Memset"
        return rec
    if kind in ("RUNTIME", "DRIVER"):
        rec = {f: getattr(activity, f) for f in _API_FIELDS}
        rec["kind"] = kind.lower()
        rec["name"] = api_name(cupti, kind, activity.cbid)
        return rec
    if kind == "EXTERNAL_CORRELATION":
        return {"kind": "external_correlation", "correlation_id": activity.correlation_id,
                "external_id": activity.external_id, "external_kind": activity.external_kind}
    if kind == "MARKER":
        rec = {"kind": "marker", "id": activity.id, "name": activity.name, "domain": activity.domain,
               "timestamp": activity.timestamp, "flags": int(activity.flags_)}
        try:  # the thread is in a union that depends on object_kind
            rec["thread_id"] = activity.object_id.pt.thread_id
            rec["process_id"] = activity.object_id.pt.process_id
        except Exception:  # noqa: BLE001 - markers on other objects have no thread
            pass
        return rec
    return None


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


class PmSampler:
    """PM sampling (cupti-python ≥ 13.3): device-wide counters at a fixed GPU
    time interval. Any failure turns into a notice; activity tracing goes on.

    Args:
        pm_sampling: the ``cupti.pm_sampling`` module.
        device_index: CUDA device.
        interval_ns: sampling interval in GPU nanoseconds; 0 (auto): the finest of :data:`PM_INTERVALS_NS`
            that CUPTI accepts (``interval_ns`` afterwards, the ones refused in ``refused_intervals``).
    """

    def __init__(self, pm_sampling, device_index: int = 0, interval_ns: int = DEFAULT_PM_INTERVAL_NS):
        self._pm = pm_sampling
        self.device_index = device_index
        self.intervals = tuple(PM_INTERVALS_NS) if not interval_ns else (int(interval_ns),)
        self.interval_ns = self.intervals[0]
        self.refused_intervals: list[int] = []
        self.metrics: list[str] = []
        self.notice: str | None = None
        self._collector = None
        self._t0 = 0.0

    def start(self) -> bool:
        try:
            collector = self._pm.Collector(device_index=self.device_index)
            collector.enable()
        except Exception as exc:  # noqa: BLE001 - PM sampling is optional by design
            self.notice = f"PM sampling unavailable: {classify(exc, 'enabling PM sampling').one_line()}"
            return False
        errors = []
        for metrics in PM_METRIC_SETS:
            refused = []  # the intervals refused for the set finally used: what refused_intervals_ns reports
            for interval in self.intervals:  # finest first: the largest metric set at the finest interval it takes
                try:
                    collector.configure(metrics=list(metrics), sampling_interval=interval,
                                        hardware_buffer_size=PM_HARDWARE_BUFFER_BYTES)
                    self.metrics, self.interval_ns, self.refused_intervals = list(metrics), interval, refused
                    break
                except Exception as exc:  # noqa: BLE001 - try a coarser interval, then the next, smaller set
                    errors.append(f"{','.join(metrics)} every {interval} ns: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                    refused.append(interval)
            if self.metrics:
                break
        if not self.metrics:
            collector.disable()
            self.notice = "PM sampling unavailable: no metric set accepted (" + "; ".join(errors) + ")"
            return False
        try:
            collector.start()
        except Exception as exc:  # noqa: BLE001
            collector.disable()
            self.notice = f"PM sampling unavailable: {classify(exc, 'starting PM sampling').one_line()}"
            return False
        self._collector = collector
        self._t0 = time.perf_counter()
        return True

    def stop(self) -> tuple[list[dict], dict]:
        """Stop, decode and evaluate; returns (samples, info)."""
        if self._collector is None:
            return [], {"enabled": False, "notice": self.notice or (
                "PM sampling never started: CUDA was not initialized while headcount's ranges opened (DRAM is not "
                f"sampled; {DRAM_ELSEWHERE})")}
        collector, self._collector = self._collector, None
        elapsed_ns = (time.perf_counter() - self._t0) * 1e9
        info = {"enabled": True, "metrics": self.metrics, "interval_ns": self.interval_ns,
                "interval_choice": "auto" if len(self.intervals) > 1 else "asked", "refused_intervals_ns": self.refused_intervals}
        samples = []
        try:
            collector.stop()
            wanted = int(elapsed_ns / self.interval_ns * 1.5) + 1000
            budget = min(wanted, PM_MAX_DECODED_SAMPLES)
            data = collector.decode(max_samples=budget)
            info.update(total_samples=data.num_total_samples, populated_samples=data.num_populated_samples,
                        completed_samples=data.num_completed_samples, decode_budget=budget)
            if budget < wanted and data.num_populated_samples >= budget:
                info["notice"] = self.notice = (
                    f"PM sampling: the recording outlasted {budget:,} samples at {self.interval_ns / 1e3:g} µs (the decode "
                    "budget): the samples cover its first part only, later ranges get no sampled figure; a coarser "
                    "--pm-interval-us covers longer, or profile fewer steps")
            for sample in data:
                samples.append({"kind": "pm_sample", "start": sample.start_timestamp, "end": sample.end_timestamp,
                                "values": dict(zip(data.metrics, (float(v) for v in sample.metric_values)))})
        except Exception as exc:  # noqa: BLE001 - keep the activity records whatever happens here
            info["notice"] = self.notice = f"PM sampling failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        finally:
            collector.disable()
        return samples, info


class CuptiRecorder:
    """Records CUDA kernels, launch calls, external correlations and (when
    available) PM samples of this process.

    Args:
        pm_sampling: try PM sampling (a notice, not an error, where unavailable).
        pm_interval_ns: PM sampling interval.
        record_dir: where to write the records file (a temporary directory by default).
        cupti: the ``cupti.cupti`` module (imported when omitted).
        pm_module: the ``cupti.pm_sampling`` module (imported when omitted).
        cuda_ready: whether the program has initialized CUDA (default :func:`cuda_initialized`): PM sampling starts
            once it has.
        correlate: push each attention range's id as CUPTI external correlation id, so every launch maps to its
            range exactly (the default). ``False``: no id pushed and no ``EXTERNAL_CORRELATION`` records; the
            records say so (``stats["correlation"]``) and the reader attributes launches by time on their thread,
            as for the other sources: what the GPU check's overhead breakdown uses to price correlation apart.

    Raises:
        HeadcountError: cupti-python cannot be imported (at construction).
    """

    name = "cupti"
    writes = "cupti-records"
    correlates_ranges = True

    def __init__(self, pm_sampling: bool = True, pm_interval_ns: int = DEFAULT_PM_INTERVAL_NS,
                 record_dir: str | Path | None = None, cupti=None, pm_module=None, device_index: int = 0, cuda_ready=None,
                 correlate: bool = True):
        self.cupti = cupti if cupti is not None else load_cupti()
        self.correlate = correlate
        self._pm_module = pm_module
        self._cuda_ready = cuda_ready or cuda_initialized
        self.pm_sampling = pm_sampling
        self.pm_interval_ns = pm_interval_ns
        self.device_index = device_index
        self._tmp = None
        if record_dir is None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="headcount-cupti-")
            record_dir = self._tmp.name
        self.records_path = Path(record_dir) / RECORDS_FILE
        self.records: list[dict] = []
        self.range_log: RangeLog | None = None
        self.stats = {"buffers": 0, "records": 0, "dropped_records": 0, "pm_sampling": {"enabled": False},
                      "correlation": correlate, "timings_ms": {}}
        self.notices: list[str] = []
        self._kinds: list = []
        self._api_calls: dict | None = None  # call ids enabled one by one (headcount.collector.api_calls)
        self._lock = threading.Lock()
        self._sampler: PmSampler | None = None
        self._graph_nodes: GraphNodeLog | None = None
        self.device_limits = None  # SmLimits; read from the device torch sees when None

    @property
    def version(self) -> str | None:
        return cupti_version()

    # -------------------------------------------------------------- CUPTI side
    def _buffer_requested(self):
        return BUFFER_BYTES, 0

    def _disable_api_calls(self) -> None:
        """Stop recording the call ids :func:`headcount.collector.api_calls.switch` chose (best effort)."""
        if self._api_calls:
            self._api_calls = None
            try:
                api_calls.switch(self.cupti, False)
            except Exception:  # noqa: BLE001 - best effort at the end of a session
                pass

    def _buffer_completed(self, activities) -> None:
        cupti = self.cupti
        kept = []
        for activity in activities:
            rec = record_of(cupti, activity)
            if rec is not None:
                kept.append(rec)
        with self._lock:
            self.records.extend(kept)
            self.stats["buffers"] += 1
            self.stats["records"] += len(kept)

    def start(self) -> None:
        """Enable tracing (and PM sampling when asked and possible).

        Raises:
            HeadcountError: no GPU or driver, driver too old, CUPTI held by
                another profiler, counters not permitted, libcupti mismatch.
        """
        cupti = self.cupti
        began = time.perf_counter()
        kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET,
                 *([cupti.ActivityKind.EXTERNAL_CORRELATION] if self.correlate else [])]
        if os.environ.get("NVTX_INJECTION64_PATH"):
            kinds.append(cupti.ActivityKind.MARKER)
            self.stats["nvtx_markers_enabled"] = True
        else:
            self.notices.append("NVTX marker records off: NVTX_INJECTION64_PATH is not set before Python started "
                                "(headcount's own ranges do not need it; `headcount doctor` shows how to set it)")
        enabled = []
        try:
            cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            try:
                cupti.activity_enable_latency_timestamps(1)
            except AttributeError:  # an older cupti-python: queued/submitted stay unknown
                self.notices.append(f"cupti-python {self.version} cannot enable latency timestamps: queued/submitted are null")
            for kind in kinds:
                cupti.activity_enable(kind)
                enabled.append(kind)
            # only the runtime and driver calls a table reads (before any whole kind, which would override them)
            self._api_calls = api_calls.switch(cupti, True)
            self.stats["api_calls"] = self._api_calls or "all (this cupti-python cannot choose call ids)"
            if self._api_calls is None:
                for kind in (cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER):
                    cupti.activity_enable(kind)
                    enabled.append(kind)
        except Exception as exc:
            for kind in enabled:
                try:
                    cupti.activity_disable(kind)
                except Exception:  # noqa: BLE001 - best effort unwinding
                    pass
            self._disable_api_calls()
            raise classify(exc) from exc
        self._kinds = enabled
        self._took("enable", began)
        self.range_log = RangeLog(cupti, correlate=self.correlate)
        self._graph_nodes = GraphNodeLog(cupti, self.range_log)
        refused = self._graph_nodes.start()
        if refused:
            self.notices.append(refused)
        if self.pm_sampling:
            pm = self._pm_module
            if pm is None:
                try:
                    from cupti import pm_sampling as pm
                except ImportError:
                    pm = None
            library = libcupti_path()
            self.stats["libcupti"] = library
            self.stats["libcupti_release"] = cupti_home.library_release(library)
            folder = cupti_home.activate()
            self.stats["cupti_home"] = str(folder) if folder else cupti_home.note()
            gap = pm_sampling_gap(library) if self._pm_module is None else None  # a stand-in module needs no library
            if pm is None:
                self.stats["pm_sampling"] = {"enabled": False, "notice": (
                    f"PM sampling needs cupti-python ≥ 13.3 (installed: {self.version}): `headcount cupti install` adds it "
                    f"beside your torch; {DRAM_ELSEWHERE}")}
            elif gap:
                self.stats["pm_sampling"] = {"enabled": False, "notice": gap}
            else:
                self._sampler = PmSampler(pm, self.device_index, self.pm_interval_ns)
                if self._cuda_ready():
                    began = time.perf_counter()
                    self._sampler.start()
                    self._took("pm_sampling_start", began)
                else:
                    # CUPTI's profiler knows no device before the driver is initialized ("Invalid device_index: 0" under
                    # `headcount run`, which starts recording before the program touches CUDA): start at the first
                    # range that opens once it is, without initializing CUDA ourselves (a fork after that breaks CUDA)
                    self.range_log.before_open = self._start_sampler_once_cuda_is_up
                    self._sampler_lock = threading.Lock()
        if self.stats["pm_sampling"].get("notice"):
            self.notices.append(self.stats["pm_sampling"]["notice"])
        self.stats["started_ns"] = cupti.get_timestamp()

    def _start_sampler_once_cuda_is_up(self) -> None:
        if not self._cuda_ready():
            return
        with self._sampler_lock:
            if self.range_log.before_open is None:
                return  # another thread started it
            self.range_log.before_open = None
            self.stats["pm_sampling_started_ns"] = self.cupti.get_timestamp()
            began = time.perf_counter()
            self._sampler.start()
            self._took("pm_sampling_start", began)

    def _took(self, what: str, began: float) -> None:
        """Note the wall time (ms) since ``began`` (``time.perf_counter``) under ``stats["timings_ms"][what]``: what
        starting and stopping cost, part by part, for the GPU check's overhead breakdown."""
        self.stats["timings_ms"][what] = round((time.perf_counter() - began) * 1e3, 3)

    def stop(self) -> Path:
        """Wait for the GPU, flush and disable; write the records file; returns its path."""
        cupti = self.cupti
        began = time.perf_counter()
        try:  # kernels still running would be flushed without an end time
            import torch

            if cuda_usable() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failed sync is said, the records are still flushed
            self.notices.append(f"could not wait for the GPU before flushing CUPTI ({exc})")
        self._took("synchronize", began)
        if self.range_log is not None:
            self.range_log.before_open = None
            self.stats["correlation_pushes"] = self.range_log.pushes
        if self._sampler is not None:
            began = time.perf_counter()
            samples, info = self._sampler.stop()
            self._took("pm_sampling_stop_decode", began)
            self.records.extend(samples)
            self.stats["pm_sampling"] = info
            if info.get("notice"):
                self.notices.append(info["notice"])
        began = time.perf_counter()
        try:
            cupti.activity_flush_all(1)  # the buffers still open complete here: _buffer_completed copies them
        finally:
            for kind in self._kinds:
                try:
                    cupti.activity_disable(kind)
                except Exception:  # noqa: BLE001
                    pass
            self._kinds = []
            self._disable_api_calls()
            self._took("flush_disable", began)
        if self._graph_nodes is not None:
            self._graph_nodes.stop()
            self.records.extend(self._graph_nodes.records)
            self.stats["graph_nodes"] = {"created": sum(r["kind"] == "graph_node" for r in self._graph_nodes.records),
                                         "cloned": sum(r["kind"] == "graph_node_clone" for r in self._graph_nodes.records),
                                         "callback_failures": self._graph_nodes.failures}
        self.stats["dropped_records"] = self._dropped()
        if self.stats["dropped_records"]:
            self.notices.append(f"CUPTI dropped {self.stats['dropped_records']} activity records (buffers full): "
                                "figures of the affected kernels are missing, not zero")
        self.stats["stopped_ns"] = cupti.get_timestamp()
        kinds: dict[str, int] = {}
        for rec in self.records:
            kinds[rec["kind"]] = kinds.get(rec["kind"], 0) + 1
        self.stats["records_by_kind"] = kinds
        began = time.perf_counter()
        path = self.write()
        self._took("write", began)  # not in the file's header (written before it is known): in the run metadata
        return path

    def _dropped(self) -> int:
        dropped = ctypes.c_size_t(0)
        try:
            self.cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        except Exception as exc:  # noqa: BLE001 - unknown is said, not hidden
            self.notices.append(f"could not read CUPTI's dropped-record count ({exc})")
            return -1
        return int(dropped.value)

    def write(self) -> Path:
        """Write ``cupti-records.jsonl.gz``: a header line, headcount's ranges, then the records."""
        header = {"kind": "header", "format": "headcount-cupti-records", "version": 1, "cupti_python": self.version,
                  "pid": os.getpid(), "stats": self.stats, "notices": self.notices}
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.records_path.with_name(self.records_path.name + ".tmp")
        # msgspec: 5× faster than the json module, the same JSON lines; level 1: the file is written while the
        # user waits (a training loop's profiled step: stop() runs in the loop); it still shrinks ~7×
        lines = msgspec.json.Encoder().encode_lines
        with gzip.open(tmp, "wb", compresslevel=1) as fh:
            fh.write(lines([header]))
            for rows in (self.range_log.records() if self.range_log else [], self.records):
                for lo in range(0, len(rows), 50_000):
                    fh.write(lines(rows[lo:lo + 50_000]))
        os.replace(tmp, self.records_path)
        return self.records_path

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def injection_library() -> str | None:
    """The libcupti that NVTX can inject: headcount's own (:mod:`~headcount.collector.cupti_home`), else
    ``nvidia/cu13/lib/libcupti.so*`` on ``sys.path`` (as the nvidia-cuda-cupti wheel installs it), else ``None``."""
    import glob
    import sys

    own = cupti_home.library()
    if own is not None:
        return str(own)  # the library headcount's cupti-python records with: markers must reach that one
    for base in sys.path:
        for pattern in ("nvidia/cu13/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*"):
            hits = sorted(glob.glob(os.path.join(base or ".", pattern)))
            if hits:
                return hits[0]
    return None


def enable_nvtx_injection() -> str | None:
    """Point ``NVTX_INJECTION64_PATH`` at libcupti so that NVTX ranges become
    CUPTI marker records. Works only before the process's first NVTX call
    (a launcher such as ``headcount profile`` calls it first thing); a no-op
    when the variable is set already or ``HEADCOUNT_NVTX_INJECTION=0``.

    Returns:
        The library now injected, or ``None``.
    """
    if os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("HEADCOUNT_NVTX_INJECTION") == "0":
        return None
    lib = injection_library()
    if lib:
        os.environ["NVTX_INJECTION64_PATH"] = lib
    return lib


PM_SAMPLING_FUNCTIONS = (
    "cuptiProfilerInitialize", "cuptiProfilerDeInitialize", "cuptiDeviceGetChipName",
    "cuptiProfilerHostGetSupportedChips", "cuptiProfilerHostInitialize", "cuptiProfilerHostDeinitialize",
    "cuptiProfilerHostConfigAddMetrics", "cuptiProfilerHostGetConfigImageSize", "cuptiProfilerHostGetConfigImage",
    "cuptiProfilerHostEvaluateToGpuValues",
    "cuptiPmSamplingSetConfig", "cuptiPmSamplingEnable", "cuptiPmSamplingDisable", "cuptiPmSamplingStart", "cuptiPmSamplingStop",
    "cuptiPmSamplingDecodeData", "cuptiPmSamplingGetCounterDataInfo", "cuptiPmSamplingGetCounterDataSize",
    "cuptiPmSamplingCounterDataImageInitialize", "cuptiPmSamplingCounterDataGetSampleInfo",
)
"""The libcupti functions cupti-python's PM sampling calls on headcount's path (a collector given a metric list, no
single-pass set name): all exported by libcupti 13.0.85 (torch 2.14's) and 13.4, read from cupti-python 13.4's
``pm_sampling`` and ``profiler_host`` modules."""


def cuda_initialized() -> bool:
    """Whether torch has initialized CUDA in this process (False before torch is imported; never initializes it)."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch half imported, or without CUDA
        return False


def libcupti_path() -> str | None:
    """The libcupti this process has loaded (``/proc/self/maps``), else the one cupti-python would load
    (headcount's folder, then the nvidia-cuda-cupti wheel), else None."""
    loaded = cupti_home.loaded_libraries()
    return loaded[0] if loaded else injection_library()


def missing_functions(library: str, names: tuple[str, ...] = PM_SAMPLING_FUNCTIONS) -> list[str]:
    """Those of ``names`` that ``library`` does not export, read from its dynamic symbol table (pyelftools, which
    cupti-python needs too): nothing is loaded into the process, where a second libcupti would split CUPTI in two.
    All of them where the file cannot be read as a shared library."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return list(names)
    try:
        with open(library, "rb") as fh:
            table = ELFFile(fh).get_section_by_name(".dynsym")
            exported = {sym.name for sym in table.iter_symbols() if sym["st_shndx"] != "SHN_UNDEF"} if table else set()
    except (OSError, ELFError):
        return list(names)
    return [name for name in names if name not in exported]


DRAM_ELSEWHERE = "DRAM meanwhile from --backend nsys --gpu-metrics on, or --backend ncu"


def pm_sampling_gap(library: str | None) -> str | None:
    """Why PM sampling cannot run on ``library``: the functions it lacks, named, or a release older than the
    cupti-python in use declares (CUPTI then refuses every configuration); None when nothing is known against it."""
    if library is None:
        return None
    missing = missing_functions(library)
    if missing:
        return (f"PM sampling needs {', '.join(missing)}, which {library} does not export: DRAM is not sampled here "
                f"(`headcount cupti install` brings a libcupti that has them; {DRAM_ELSEWHERE})")
    release = cupti_home.library_release(library)
    version, declared = cupti_home.bindings_need()
    if cupti_home.older_than_declared(release, declared) and cupti_home.note():
        # the folder holds the right library, but another was loaded first: say that, not "install"
        return f"PM sampling cannot run on libcupti {release} ({library}): {cupti_home.note()} ({DRAM_ELSEWHERE})"
    if cupti_home.older_than_declared(release, declared):
        return (f"libcupti {release} ({library}) is older than cupti-python {version} declares ({declared}): CUPTI refuses "
                "its PM sampling there (ERROR_INVALID_PARAMETER on an H100), so DRAM is not sampled "
                f"(`headcount cupti install` puts libcupti {declared} beside your torch; {DRAM_ELSEWHERE})")
    return None


def require() -> None:
    """Check that the cupti source can run here: cupti-python imports, a CUPTI
    call succeeds (driver present and recent enough), torch sees a GPU.
    Cheap; enables nothing.

    Raises:
        HeadcountError: the first thing missing, in one line.
    """
    cupti = load_cupti()
    try:
        cupti.get_timestamp()  # raises the precise reason (no driver, too old) when there is one
    except Exception as exc:  # noqa: BLE001
        raise classify(exc, "probing CUPTI") from exc
    if not cuda_usable():
        raise HeadcountError("torch sees no CUDA GPU although the driver answers",
                             hint="install a CUDA build of torch, or use --backend torch", exit_code=3)


def probe() -> tuple[bool, str]:
    """Whether the cupti source can run here, and why not (see :func:`require`)."""
    try:
        require()
    except HeadcountError as exc:
        return False, exc.message
    return True, "cupti-python " + str(cupti_version())
