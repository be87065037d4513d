"""The Arrow schema of every table headcount writes (docs/architecture.md §4).

Fixed schemas keep runs appendable: every file of a table has the same
columns and types, so pandas, pyarrow.dataset, polars and DuckDB read all runs
of a directory at once. A column a source cannot fill is null, never 0.
Units are in the names: ``_ns``, ``_bytes``, ``_gbps`` (1e9 bytes/s),
``_pct``, ``flop``. ``run_id`` is the hive partition key (directory
``run_id=<id>``), so it is not stored inside the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

_ATTRIBUTION = [("range_id", I), ("nvtx_path", S), ("phase", S), ("layer_name", S), ("layer", I), ("head", I)]

_SHAPE = [
    ("batch", I), ("q_heads", I), ("kv_heads", I), ("q_len", I), ("kv_len", I), ("head_dim", I),
    ("v_head_dim", I), ("dtype", S), ("dtype_bytes", I), ("causal", B), ("mask_elements", I),
    ("mask_dtype_bytes", I), ("mask_per_head", B), ("sliding_window", I),
]

KERNELS = pa.schema([
    ("source", S), ("implementation", S), ("kind", S), ("runs_on", S), ("name", S), ("pid", I), ("tid", I),
    ("device", S), ("stream", I), ("correlation_id", I), ("step", I),
    ("start_ns", I), ("end_ns", I), ("duration_ns", I),
    ("api_start_ns", I), ("api_end_ns", I), ("launch_latency_ns", F), ("queue_delay_ns", F), ("cpu_launch_cost_ns", F),
    ("grid", S), ("block", S), ("registers_per_thread", I), ("shared_memory_bytes", I),
    ("theoretical_occupancy_pct", F), ("est_achieved_occupancy_pct", F), ("achieved_occupancy_pct", F),
    ("dram_bytes", F), ("dram_read_bytes", F), ("dram_write_bytes", F), ("dram_throughput_pct", F), ("l2_bytes", F),
    ("l1_bytes", F), ("sm_throughput_pct", F), ("memory_throughput_pct", F), ("waves_per_sm", F), ("bound", S),
    ("tensor_pipe_pct", F), ("ncu_id", I), ("incomplete", B), ("missing_metrics", S),
    ("dram_read_sampled_pct", F), ("dram_write_sampled_pct", F), ("sm_active_sampled_pct", F), ("sampling_interval_ns", F),
    ("dram_read_sampled_bytes", F), ("dram_write_sampled_bytes", F), ("sm_warps_active_sampled_pct", F), ("pm_whole_samples", F),
    ("external_id", I), ("queued_ns", I), ("submitted_ns", I), ("queue_ns", F), ("submit_to_start_ns", F),
    ("block_threads", I), ("shared_memory_static_bytes", F), ("shared_memory_dynamic_bytes", F),
    ("shared_memory_config_bytes", F), ("local_memory_per_thread_bytes", I), ("graph_id", I),
    ("graph_node_id", I), ("collective", S), ("msg_in_nelems", I), ("msg_out_nelems", I), ("group_size", I), ("comm_dtype", S),
    ("estimated_flop", F), ("estimated_min_bytes", F), ("estimate_provenance", S),
    *_ATTRIBUTION,
])

RANGES = pa.schema([
    ("implementation", S), ("step", I), ("range_id", I), ("parent_range_id", I), ("domain", S),
    ("name", S), ("path", S), ("depth", I), ("level", S), ("pid", I), ("tid", I), ("lane", S),
    ("start_ns", I), ("end_ns", I), ("duration_ns", F), ("duration_basis", S),
    ("op_count", I), ("cpu_ops_ns", F), ("cpu_op_start_ns", I), ("cpu_op_end_ns", I),
    ("gpu_start_ns", I), ("gpu_end_ns", I), ("gpu_op_count", I), ("external_id", I), ("replay_of", I), ("graph_capture", B),
    ("kernel_busy_ns", F), ("kernel_gap_ns", F), ("gpu_span_ns", F), ("gpu_annotation_ns", F), ("cpu_launch_cost_ns", F),
    ("dram_read_sampled_bytes", F), ("dram_write_sampled_bytes", F), ("sm_warps_active_sampled_pct", F), ("pm_whole_samples", F),
    ("phase", S), ("layer_name", S), ("layer", I), ("head", I), ("kv_head", I), ("model", S),
    *_SHAPE, ("flop", F), ("analytic_min_bytes", F), ("signal", S), ("found_as", S),
])

_AGG = [
    ("calls", I), ("steps", I), ("duration_ns", F), ("duration_per_call_ns", F),
    ("duration_per_call_p10_ns", F), ("duration_per_call_p50_ns", F), ("duration_per_call_p90_ns", F), ("duration_basis", S),
    ("duration_provenance", S), ("op_count", F), ("cpu_ops_ns", F),
    ("flop", F), ("flop_provenance", S), ("analytic_min_bytes", F), ("dram_bytes_measured", F),
    ("dram_bytes", F), ("dram_bytes_provenance", S), ("bandwidth_gbps", F), ("bandwidth_provenance", S),
    ("bandwidth_per_call_p10_gbps", F), ("bandwidth_per_call_p50_gbps", F), ("bandwidth_per_call_p90_gbps", F),
    ("intensity_flop_per_byte", F), ("intensity_provenance", S), ("excess_traffic", F),
    ("roofline_class", S), ("peak_bandwidth_pct", F), ("peak_flop_pct", F), ("waves_per_sm", F),
    ("launch_latency_p50_ns", F), ("launch_latency_p99_ns", F), ("queue_delay_p50_ns", F), ("queue_delay_p99_ns", F),
    ("queued_kernels_pct", F),
    ("achieved_occupancy_pct", F), ("achieved_occupancy_provenance", S), ("incomplete", B), ("provenance", S),
    ("kernel_count", F), ("kernels_per_call", F), ("cpu_launch_cost_ns", F), ("cpu_launch_cost_per_call_ns", F),
    ("kernel_gap_ns", F), ("kernel_gap_per_call_ns", F), ("kernel_busy_ns", F), ("gpu_span_ns", F), ("theoretical_occupancy_pct", F),
    ("dram_bytes_sampled", F), ("signal", S), ("found_as", S),
]

LAYERS = pa.schema([
    ("implementation", S), ("phase", S), ("layer_name", S), ("layer", I), *_AGG,
    ("heads_duration_ns", F), ("split_overhead_ns", F), ("heads_share_of_layer_pct", F), ("split_glue_ns", F),
    ("split_gaps_ns", F), ("heads_dram_bytes", F), ("heads_bytes_share_of_layer_pct", F),
    ("layer_mode_duration_per_call_ns", F), ("split_cost_x", F), ("share_of_phase_pct", F), ("share_of_step_pct", F),
    ("share_of_gpu_busy_pct", F), ("module_calls", I), ("module_duration_ns", F), ("module_duration_per_call_ns", F),
    ("module_kernel_count", F), ("module_kernels_per_call", F), ("module_kernel_busy_ns", F), ("module_gpu_span_ns", F), ("core_share_of_module_pct", F),
])

HEADS = pa.schema([
    ("implementation", S), ("phase", S), ("layer_name", S), ("layer", I), ("head", I), ("kv_head", I),
    *_AGG, ("share_of_layer_pct", F), ("positions_seen", I), ("hotter_p", F), ("cooler_p", F),
])

RUNS = pa.schema([
    ("implementation", S), ("source", S), ("source_version", S), ("mode", S),
    ("path", S), ("size_bytes", I), ("sha256", S), ("damaged", S), ("model", S), ("program", S),
    ("model_config", S), ("batch", I), ("seq", I), ("dtype", S), ("steps", I), ("backward", B),
    ("device_kind", S), ("device_name", S), ("device_compute_capability", S), ("device_sm_count", I),
    ("device_memory_bandwidth_gbps", F), ("torch", S), ("transformers", S),
    ("tool_version", S), ("schema_version", S), ("command_line", S), ("start_time", S),
    ("rank", I), ("world_size", I), ("pid", I), ("complete", B), ("program_exit_status", I),
    ("compile_mode", S),
])

ATTENTION_STATS = pa.schema([
    ("implementation", S), ("step", I), ("layer_name", S), ("layer", I), ("head", I), ("kv_head", I), ("model", S),
    ("calls", I), ("rows_per_call", I), ("entropy_nats", F), ("normalized_entropy", F), ("max_attention", F),
    ("top_k_mass", F), ("effective_tokens", F),
])

STEPS = pa.schema([
    ("implementation", S), ("pid", I), ("device", S), ("step", I), ("basis", S),
    ("window_start_ns", I), ("window_end_ns", I), ("window_ns", F), ("gpu_busy_ns", F), ("gpu_busy_pct", F),
    ("idle_ns", F), ("idle_launch_bound_ns", F), ("idle_sync_ns", F), ("idle_host_ns", F), ("idle_other_ns", F),
    ("idle_unknown_ns", F), ("idle_other_blocked_ns", F), ("idle_capture_ns", F),
    ("own_busy_ns", F), ("own_busy_pct", F), ("others_busy_ns", F), ("others_busy_pct", F), ("windows_overlap", pa.bool_()),
    ("kernels", I), ("kernel_ns", F), ("kernel_p50_ns", F), ("memcpy_ns", F), ("memset_ns", F),
    ("attention_gpu_ns", F), ("attention_cpu_ns", F), ("attention_share_pct", F), ("communication_ns", F),
    ("communication_overlapped_ns", F), ("communication_exposed_ns", F), ("graph_launches", I), ("graph_ops", I),
    ("graph_busy_ns", F),
    ("launches", I), ("cpu_launch_cost_p50_ns", F), ("sync_calls", I), ("queued_kernels_pct", F), ("launch_latency_p50_ns", F),
    ("launch_travel_ns", F), ("provenance", S), ("note", S),
])
"""One row per implementation × process × device × step: how busy the GPU was and why it was idle
(:mod:`headcount.derive.steps`)."""

COLLECTIVES = pa.schema([
    ("implementation", S), ("pid", I), ("device", S), ("step", I), ("kind", S), ("library", S), ("calls", I),
    ("time_ns", F), ("busy_ns", F), ("sized_calls", I), ("sized_time_ns", F), ("bytes", F), ("group_size", I),
    ("dtype", S), ("algbw_gbps", F), ("busbw_gbps", F), ("provenance", S),
])
"""One row per implementation × process × device × step × collective kind (:mod:`headcount.derive.collectives`)."""

FINDINGS = pa.schema([
    ("rank", I), ("kind", S), ("subject", S), ("implementation", S), ("value", F), ("unit", S),
    ("evidence", S), ("suggestion", S), ("expected_gain_pct", F), ("provenance", S),
])
"""What stands out in a run and what to try, ranked (:mod:`headcount.derive.triage`)."""

TABLES: dict[str, pa.Schema] = {
    "kernels": KERNELS,
    "ranges": RANGES,
    "layers": LAYERS,
    "heads": HEADS,
    "runs": RUNS,
    "attention_stats": ATTENTION_STATS,
    "steps": STEPS,
    "collectives": COLLECTIVES,
    "findings": FINDINGS,
}

WRITTEN = ("kernels", "ranges", "layers", "heads", "steps", "collectives", "findings")
"""The tables a recording's build gives and every writer writes (``runs`` is written from the run's metadata)."""


# ---------------------------------------------------------------- in-memory contracts (not saved)
@dataclass
class Timeline:
    """A recording's events as a parser hands them to :mod:`headcount.build`
    (nsys SQLite and parquetdir exports, ``.nsys-rep`` after export).

    Attributes:
        ranges: NVTX ranges (``range_id``, ``pid``, ``tid``, ``domain``, ``name``, ``style``, ``start_ns``, ``end_ns``, ``end_missing``).
        runtime: CUDA runtime/driver calls (``pid``, ``tid``, ``correlation_id``, ``start_ns``, ``end_ns``, ``name``).
        gpu: kernels, memcpys, memsets (``kind``, ``name``, ``pid``, ``device``, ``stream``, ``correlation_id``,
            ``start_ns``, ``end_ns``, launch configuration).
        gpu_metrics: device-wide samples (``device``, ``metric``, ``timestamp_ns``, ``value``); empty without them.
        meta: the export's metadata (name → value).
        devices: the recording's GPUs (one row per device id; empty when the export does not describe them).
        graph_nodes: CUDA graph nodes made or cloned (``node_id``, ``original_node_id`` (null: made, not
            cloned), ``pid``, ``tid``, ``start_ns``, ``end_ns`` of the call that made it); empty without any.
    """

    ranges: pd.DataFrame
    runtime: pd.DataFrame
    gpu: pd.DataFrame
    gpu_metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict = field(default_factory=dict)
    devices: pd.DataFrame = field(default_factory=pd.DataFrame)
    graph_nodes: pd.DataFrame = field(default_factory=lambda: Timeline.empty_graph_nodes())
    notices: list[str] = field(default_factory=list)

    @staticmethod
    def empty_graph_nodes() -> pd.DataFrame:
        return pd.DataFrame({"node_id": pd.Series(dtype="int64"), "original_node_id": pd.Series(dtype="Int64"),
                             "pid": pd.Series(dtype=object), "tid": pd.Series(dtype=object),
                             "start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64")})
