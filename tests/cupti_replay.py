"""A stand-in for the GPU side of ``cupti.cupti``, for CPU tests of the cupti source.

What it stands in for: the CUDA driver and a GPU under CUPTI. No GPU has
been lent to this project yet, so no CUPTI records captured from a real GPU
exist; the records this replay delivers are **real cupti-python record
objects** (``cupti.cupti.ActivityKernel<N>``, the newest the installed cupti-python has; ``ActivityAPI``,
``ActivityExternalCorrelation``), built here and filled the way CUPTI fills
them (same fields, same nanosecond clock semantics, per-thread external
correlation stacks, asynchronous kernels on one stream), and handed to the
recorder's buffer-completed callback exactly as cupti-python hands them.
Everything else (enums, record classes, error types) is the installed
cupti-python itself.

:meth:`ReplayCupti.run_recorded` replays a launching thread recorded on a
real GPU instead (:func:`schedule_from_trace`: the CPU gaps, launch call
durations and kernel durations of a real torch.profiler trace, e.g. the
H100 traces in ``tests/fixtures/kineto``), the replayed GPU running each
kernel once it is free, as the real one did.

Time is a virtual, deterministic clock (never the wall clock): every
timestamp read advances it by ``tick_ns`` and every launch by
``launch_cost_ns + op_gap_ns``, so launch latency, gaps and kernel order are
the same on an idle and on a loaded machine. Once a GPU run has produced records
(``tests/fixtures/gpu/``), tests should replay those instead.

:class:`LaunchOnEveryOp` makes every aten operator of a CPU model "launch a
kernel" through this replay, so a real model, really tagged, drives it.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import zlib

from headcount.collector import cupti_home

cupti_home.activate()  # the cupti-python the product loads (also in a child process that imports this first)
from cupti import cupti as real  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


def kernel_record_class(module=real):
    """The newest kernel activity record class the installed cupti-python has (``ActivityKernel13`` in 13.4,
    ``ActivityKernel10`` in 13.0.1): what CUPTI hands out for kernels is whichever its bindings provide."""
    numbered = [(int(m.group(1)), name) for name in dir(module) if (m := re.fullmatch(r"ActivityKernel(\d+)", name))]
    return getattr(module, max(numbered)[1])


class ReplayCupti:
    """Duck-types the ``cupti.cupti`` functions the recorder calls.

    Args:
        launch_cost_ns: CPU time of one launch call (API record duration).
        latency_ns: minimum time from launch call to kernel start.
        kernel_ns: kernel duration.
        dropped: what ``activity_get_num_dropped_records`` reports.
        fail_enable: an exception ``activity_enable`` raises (a failure mode).
        op_gap_ns: virtual CPU time from the end of one launch call to the
            next launch (the CPU work of an operator); larger than
            ``kernel_ns`` by default, so the replayed GPU never queues and
            every kernel starts exactly ``launch_cost_ns + latency_ns`` after
            its launch call.
        tick_ns: how far each timestamp read moves the clock.
    """

    def __init__(self, launch_cost_ns: int = 3_000, latency_ns: int = 5_000, kernel_ns: int = 20_000,
                 dropped: int = 0, fail_enable: BaseException | None = None, op_gap_ns: int | None = None,
                 tick_ns: int = 100):
        self.launch_cost_ns = launch_cost_ns
        self.latency_ns = latency_ns
        self.kernel_ns = kernel_ns
        self.dropped = dropped
        self.fail_enable = fail_enable
        self.op_gap_ns = op_gap_ns if op_gap_ns is not None else latency_ns + kernel_ns + 1_000
        self.tick_ns = tick_ns
        self._now = 1_000_000_000  # virtual ns; any origin will do
        self.enabled: set[int] = set()
        self.pushed: list[int] = []  # every external correlation id pushed, in order
        self.runtime_calls: set[int] = set()  # call ids enabled one by one (activity_enable_runtime_api)
        self.driver_calls: set[int] = set()
        self.thread_id_type = None
        self.latency_timestamps = False
        self._callbacks = None
        self._pending: list = []
        self._stacks: dict[int, list[int]] = {}
        self._lock = threading.Lock()
        self._correlation = 0
        self._gpu_free = 0
        self.launches = 0

    def __getattr__(self, name):  # enums, record classes, errors: the real cupti-python
        return getattr(real, name)

    # -- the functions the recorder calls --------------------------------
    def get_timestamp(self) -> int:
        """The virtual clock: each read moves it by ``tick_ns`` (so a range's
        open and close never share a timestamp)."""
        with self._lock:
            self._now += self.tick_ns
            return self._now

    def set_thread_id_type(self, kind) -> None:
        self.thread_id_type = kind

    def activity_register_callbacks(self, requested, completed) -> None:
        self._callbacks = (requested, completed)

    def activity_enable_latency_timestamps(self, enable: int) -> None:
        self.latency_timestamps = bool(enable)

    def activity_enable(self, kind) -> None:
        if self.fail_enable is not None:
            raise self.fail_enable
        self.enabled.add(int(kind))

    def activity_disable(self, kind) -> None:
        self.enabled.discard(int(kind))

    def activity_enable_runtime_api(self, cbid: int, enable: int) -> None:
        """One runtime call id recorded (or not) without the whole ``RUNTIME`` kind, as CUPTI does."""
        (self.runtime_calls.add if enable else self.runtime_calls.discard)(int(cbid))

    def activity_enable_driver_api(self, cbid: int, enable: int) -> None:
        (self.driver_calls.add if enable else self.driver_calls.discard)(int(cbid))

    def _recorded(self, record) -> bool:
        """Whether CUPTI would deliver ``record``: an API call only where its kind, or its own call id, is enabled."""
        if not isinstance(record, real.ActivityAPI):
            return True
        if int(record.kind) == int(real.ActivityKind.RUNTIME):
            return int(real.ActivityKind.RUNTIME) in self.enabled or int(record.cbid) in self.runtime_calls
        return int(real.ActivityKind.DRIVER) in self.enabled or int(record.cbid) in self.driver_calls

    def activity_push_external_correlation_id(self, kind, ext_id: int) -> None:
        assert int(kind) == int(real.ExternalCorrelationKind.CUSTOM0)
        self._stacks.setdefault(threading.get_native_id(), []).append(ext_id)
        self.pushed.append(ext_id)

    def activity_pop_external_correlation_id(self, kind) -> int:
        return self._stacks[threading.get_native_id()].pop()

    def activity_flush_all(self, flag: int) -> None:
        with self._lock:
            pending, self._pending = [r for r in self._pending if self._recorded(r)], []
        # an external correlation record precedes the API record it correlates: none where that call is not recorded
        calls = {r.correlation_id for r in pending if isinstance(r, real.ActivityAPI)}
        pending = [r for r in pending if not isinstance(r, real.ActivityExternalCorrelation) or r.correlation_id in calls]
        size, _ = self._callbacks[0]()
        assert size > 0
        for lo in range(0, len(pending), 500):  # several buffers, as CUPTI delivers them
            self._callbacks[1](pending[lo:lo + 500])

    def activity_get_num_dropped_records(self, context: int, stream_id: int, dropped_ptr: int) -> None:
        ctypes.c_size_t.from_address(dropped_ptr).value = self.dropped

    # -- the callback API (resource domain: CUDA graph nodes) ---------------
    def subscribe(self, callback, userdata) -> int:
        self._subscriber = (callback, userdata)
        self._resource_cbids: set[int] = set()
        return 1

    def enable_callback(self, enable: int, subscriber: int, domain: int, cbid: int) -> None:
        assert domain == int(real.CallbackDomain.RESOURCE)
        (self._resource_cbids.add if enable else self._resource_cbids.discard)(int(cbid))

    def unsubscribe(self, subscriber: int) -> None:
        self._subscriber = None

    def get_graph_node_id(self, node: int) -> int:
        """Node handles are ``0x10000 + id`` here."""
        return node - 0x10000

    def _resource_callback(self, cbid, node: int, original: int = 0) -> None:
        """CUPTI calls the subscriber on the calling thread with a ``CUpti_ResourceData``
        whose descriptor is a ``CUpti_GraphData`` (real cupti-python structs here)."""
        if getattr(self, "_subscriber", None) is None or int(cbid) not in self._resource_cbids:
            return
        graph = real.GraphData()
        graph.node, graph.original_node = node, original
        resource = real.ResourceData()
        resource.resource_descriptor = graph.ptr
        callback, userdata = self._subscriber
        callback(userdata, int(real.CallbackDomain.RESOURCE), int(cbid), resource.ptr)

    # -- CUDA graphs: stream capture, instantiation, replay ---------------------
    def begin_capture(self) -> None:
        """Launches on this thread become graph nodes (``GRAPHNODE_CREATED``) instead of running."""
        self._capturing, self._captured = True, []

    def end_capture(self) -> list[int]:
        """Instantiate the captured graph: one cloned node per captured node (``GRAPHNODE_CLONED``)."""
        self._capturing = False
        self._exec = []
        for node_id, name in self._captured:
            clone = node_id + 1_000
            self._resource_callback(real.CallbackIdResource.GRAPHNODE_CLONED, 0x10000 + clone, 0x10000 + node_id)
            self._exec.append((clone, name))
        return [c for c, _ in self._exec]

    def replay_graph(self) -> None:
        """A ``cudaGraphLaunch`` on this thread: one launch call (one API record,
        one correlation id) for every node's kernel, each carrying the id of the
        executable graph's node it ran from."""
        self.launch([(name, clone) for clone, name in self._exec], api="cudaGraphLaunch_v10000")

    # -- the GPU ----------------------------------------------------------
    def launch(self, name, api: str = "cudaLaunchKernel_v7000") -> None:
        """A launch call on this thread and the kernels it runs: ``name`` is a
        kernel's name (``cudaLaunchKernel``) or, for a graph launch, a list of
        ``(kernel name, graph node id)``."""
        tid = threading.get_native_id()
        kernels = name if isinstance(name, list) else [(name, 0)]
        if getattr(self, "_capturing", False):  # captured, not run: a graph node is made inside the launch call
            node_id = len(self._captured) + 1
            self._captured.append((node_id, name))
            self._resource_callback(real.CallbackIdResource.GRAPHNODE_CREATED, 0x10000 + node_id)
            kernels = []  # the call is recorded; no kernel runs
        with self._lock:
            t0 = self._now + self.tick_ns
            self._now = t0 + self.launch_cost_ns + self.op_gap_ns * len(kernels)
            self._correlation += 1
            corr = self._correlation
            call = self._call(api, t0, t0 + self.launch_cost_ns, tid, corr)
            records = [*self._external(tid, corr), call]
            for kernel_name, graph_node_id in kernels:
                records.append(self._kernel(call, corr, kernel_name, graph_node_id))
            self._pending += records
            self.launches += 1

    def run_recorded(self, schedule: list[dict], wake_ns: int = 2_000) -> None:
        """Replay a recorded launching thread on this thread (:func:`schedule_from_trace`):
        each entry waits ``cpu_gap_ns`` of CPU work, then makes its call —
        ``launch``: a launch call of ``launch_cost_ns`` whose kernel runs
        ``kernel_ns`` once the GPU is free; ``memcpy``: the same for a copy
        (a ``MEMCPY`` record); ``sync``: a ``cudaStreamSynchronize``
        that returns ``wake_ns`` after the GPU has finished everything launched."""
        tid = threading.get_native_id()
        for op in schedule:
            with self._lock:
                t0 = self._now + int(op["cpu_gap_ns"])
                self._correlation += 1
                corr = self._correlation
                if op["kind"] == "sync":
                    end = max(t0 + int(op.get("launch_cost_ns", 1_000)), self._gpu_free + wake_ns)
                    call = self._call("cudaStreamSynchronize_v3020", t0, end, tid, corr)
                    records = [call]
                elif op["kind"] == "memcpy":
                    call = self._call(op.get("api", "cudaMemcpyAsync_v3020"), t0, t0 + int(op["launch_cost_ns"]), tid, corr)
                    records = [*self._external(tid, corr), call, self._copy(call, corr, int(op["kernel_ns"]))]
                else:
                    call = self._call(op.get("api", "cudaLaunchKernel_v7000"), t0, t0 + int(op["launch_cost_ns"]), tid, corr)
                    records = [*self._external(tid, corr), call, self._kernel(call, corr, op["name"], 0, int(op["kernel_ns"]))]
                    self.launches += 1
                self._pending += records
                self._now = call.end

    def _call(self, api: str, start: int, end: int, tid: int, corr: int):
        """A runtime API record of this process's thread ``tid``."""
        call = real.ActivityAPI()
        call.kind = int(real.ActivityKind.RUNTIME)
        call.cbid = int(getattr(real.runtime_api_trace_cbid, api))
        call.start, call.end = start, end
        call.process_id, call.thread_id, call.correlation_id, call.return_value = os.getpid(), tid, corr, 0
        return call

    def _external(self, tid: int, corr: int) -> list:
        """The external correlation record of a launch: the innermost range id pushed on its thread (none outside ranges)."""
        stack = self._stacks.get(tid)
        if not stack or int(real.ActivityKind.EXTERNAL_CORRELATION) not in self.enabled:
            return []
        ext = real.ActivityExternalCorrelation()
        ext.kind = int(real.ActivityKind.EXTERNAL_CORRELATION)
        ext.external_kind = int(real.ExternalCorrelationKind.CUSTOM0)
        ext.external_id, ext.correlation_id = stack[-1], corr
        return [ext]

    def _copy(self, api, corr: int, duration_ns: int):
        """A device-to-host copy of launch call ``api`` (CUPTI's ``ActivityMemcpy6``), after the previous GPU work."""
        m = real.ActivityMemcpy6()
        m.kind = int(real.ActivityKind.MEMCPY)
        m.copy_kind = int(real.ActivityMemcpyKind.DTOH)
        m.bytes = 4096
        m.start = max(api.end + self.latency_ns, self._gpu_free + 1_000)
        m.end = m.start + duration_ns
        self._gpu_free = m.end
        m.correlation_id, m.device_id, m.context_id, m.stream_id = corr, 0, 1, 7
        return m

    def _kernel(self, api, corr: int, name: str, graph_node_id: int, kernel_ns: int | None = None):
        """The record of one kernel of launch call ``api``: runs on one stream, after the previous kernel."""
        h = zlib.crc32(name.encode())
        k = kernel_record_class()()
        k.kind = int(real.ActivityKind.CONCURRENT_KERNEL)
        k.name = name
        k.queued = api.start + self.launch_cost_ns // 2
        k.submitted = api.end + 500
        k.start = max(api.end + self.latency_ns, self._gpu_free + 1_000)
        k.end = k.start + (self.kernel_ns if kernel_ns is None else kernel_ns)
        self._gpu_free = k.end
        k.correlation_id, k.device_id, k.context_id, k.stream_id = corr, 0, 1, 7
        k.graph_node_id = graph_node_id
        k.grid_x, k.grid_y, k.grid_z = 64 + h % 64, 1, 1
        k.block_x, k.block_y, k.block_z = (128, 256, 512)[h % 3], 1, 1
        k.registers_per_thread = (32, 64, 96, 128)[h % 4]
        k.static_shared_memory, k.dynamic_shared_memory = 0, (0, 16384, 49152)[h % 3]
        k.shared_memory_executed = 233472
        return k


def schedule_from_trace(path, sync_after_every_launch: bool = False) -> list[dict]:
    """The kernel launches and copies of a real torch.profiler trace's launching
    thread, as :meth:`ReplayCupti.run_recorded` replays them: for each launch
    call that started a kernel or a memcpy (in time order), the CPU time since
    the thread's previous such call ended (its other calls, memset launches
    and Python included), the call's own duration and the operation's
    recorded duration. ``sync_after_every_launch``: a synchronize after each launch, as
    ``CUDA_LAUNCH_BLOCKING=1`` makes every launch wait for its kernel."""
    from headcount.parsers.kineto_json import load_trace

    events = load_trace(path)
    kernels = events[events["kind"].isin(["kernel", "memcpy"])].dropna(subset=["correlation_id"])
    calls = events[(events["kind"] == "runtime") & events["correlation_id"].isin(kernels["correlation_id"])]
    thread = calls["tid"].mode().iloc[0]  # the thread that launched the most kernels
    calls = calls[calls["tid"] == thread].sort_values("start_ns")
    duration = dict(zip(kernels["correlation_id"], kernels["end_ns"] - kernels["start_ns"]))
    names = dict(zip(kernels["correlation_id"], kernels["name"]))
    kinds = dict(zip(kernels["correlation_id"], kernels["kind"]))
    schedule, last_end = [], None
    for call in calls.itertuples(index=False):
        gap = 0 if last_end is None else max(int(call.start_ns) - last_end, 0)
        kind = "memcpy" if kinds[call.correlation_id] == "memcpy" else "launch"
        schedule.append({"kind": kind, "name": str(names[call.correlation_id])[:200], "cpu_gap_ns": gap,
                         "launch_cost_ns": int(call.end_ns - call.start_ns), "kernel_ns": int(duration[call.correlation_id])})
        last_end = int(call.end_ns)
        if sync_after_every_launch:
            schedule.append({"kind": "sync", "cpu_gap_ns": 0, "launch_cost_ns": 1_000})
    return schedule


class ReplayPm:
    """Stands in for ``cupti.pm_sampling`` (no GPU: no PM sampler). Samples are
    synthetic: a constant DRAM rate over consecutive windows covering the run,
    so apportioning can be checked against exact arithmetic.

    Args:
        bytes_per_ns: DRAM read rate; writes are half of it.
        fail: an exception ``Collector.enable`` raises (PM sampling unavailable).
    """

    def __init__(self, bytes_per_ns: float = 2.0, warps_pct: float = 40.0, fail: BaseException | None = None,
                 offset_ns: int = 0, accepts: int = 3, clock=None, finest_ns: int = 0):
        self.clock = clock  # the replayed GPU's clock (ReplayCupti.get_timestamp); set by whoever pairs them
        self.offset_ns = offset_ns  # samples on another clock than the activity records (a failure mode)
        self.accepts = accepts  # how many metrics the stand-in chip accepts in a single configuration
        self.finest_ns = finest_ns  # the finest sampling interval the stand-in chip accepts (0: any)
        self.bytes_per_ns = bytes_per_ns
        self.warps_pct = warps_pct
        self.fail = fail
        outer = self

        class Sample:
            def __init__(self, start, end, values):
                self.start_timestamp, self.end_timestamp, self.metric_values = start, end, values

        class Data(list):
            pass

        class Collector:
            def __init__(self, device_index: int = 0):
                self.interval = None

            def enable(self):
                if outer.fail is not None:
                    raise outer.fail

            def configure(self, *, metrics, sampling_interval, hardware_buffer_size, **kw):
                if len(metrics) > outer.accepts or sampling_interval < outer.finest_ns:  # cupti-python's ERROR_NOT_SUPPORTED
                    raise ValueError("Requested PM sampling configuration is not supported.")
                self.metrics, self.interval = metrics, sampling_interval

            def start(self):
                self.t0 = outer.clock()

            def stop(self):
                self.t1 = outer.clock() + 10_000_000  # kernels run after their (CPU) launch

            def decode(self, max_samples):
                data = Data()
                data.metrics = list(self.metrics)
                t = self.t0
                while t < self.t1 and len(data) < max_samples:  # as CUPTI: at most max_samples decoded
                    e = t + self.interval
                    values = []
                    for m in self.metrics:
                        if m == "dram__bytes_read.sum":
                            values.append(outer.bytes_per_ns * self.interval)
                        elif m == "dram__bytes_write.sum":
                            values.append(outer.bytes_per_ns * self.interval / 2)
                        else:
                            values.append(outer.warps_pct)
                    data.append(Sample(t + outer.offset_ns, e + outer.offset_ns, values))
                    t = e
                data.num_total_samples = data.num_populated_samples = data.num_completed_samples = len(data)
                return data

            def disable(self):
                pass

        self.Collector = Collector


class LaunchOnEveryOp(TorchDispatchMode):
    """Every aten operator that runs launches one replayed kernel named after it."""

    def __init__(self, replay: ReplayCupti):
        super().__init__()
        self.replay = replay

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.replay.launch(f"replay::{func.__name__}")
        return func(*args, **(kwargs or {}))


SHARED: ReplayCupti | None = None


def factory():
    """``HEADCOUNT_CUPTI_FACTORY=cupti_replay:factory``: the replay a child
    process of ``headcount run --backend cupti`` records with (one per process)."""
    global SHARED
    if SHARED is None:
        SHARED = ReplayCupti()
    # CUDA is up once the program launched something (model.to("cuda") before its first forward, here the operators
    # before the first attention range): PM sampling starts there, as on a GPU
    return SHARED, ReplayPm(clock=SHARED.get_timestamp), lambda: SHARED.launches > 0


def profile_replayed(model, inputs, mode="layer", steps=2, replay=None, pm=None, tmp_path=None, backward=True,
                     cuda_ready=lambda: True, pm_interval_ns: int = 0, correlate: bool = True):
    """``AttentionProfiler`` on a :class:`CuptiRecorder` fed by this replay (H100 limits), ``steps``
    numbered steps of ``model(**inputs)`` with every operator launching: ``(profiler, replay)``."""
    from headcount import AttentionProfiler
    from headcount.collector.cupti_source import CuptiRecorder
    from headcount.common.device import LIMITS

    replay = replay or ReplayCupti()
    if pm is not None:
        pm.clock = replay.get_timestamp  # one clock for the replayed GPU and its PM sampler
    # the model is on the GPU before profiling (cuda_ready), unless a test says otherwise
    rec = CuptiRecorder(cupti=replay, pm_module=pm, pm_sampling=pm is not None, record_dir=tmp_path, cuda_ready=cuda_ready,
                        pm_interval_ns=pm_interval_ns, correlate=correlate)
    rec.device_limits = LIMITS["9.0"]
    prof = AttentionProfiler(model, mode=mode, recorder=rec)
    with prof:
        for i in range(steps):
            with prof.step(i), LaunchOnEveryOp(replay):
                out = model(**inputs)
                if backward:
                    out.loss.backward()
    return prof, replay
