"""From attributed range instances to the ``layers`` and ``heads`` tables.

Tables in, tables out; no I/O. Units are in the column names (``_ns``,
``_bytes``, ``_gbps`` = 1e9 bytes/s = bytes/ns, ``_pct``, ``flop``); each
measured-or-not quantity has a ``<quantity>_provenance`` column:

- ``measured``: read from the profiler for that very range (its duration);
- ``analytic``: the analytic model (:mod:`headcount.derive.analytic`);
- ``apportioned``: a layer's figure split across its heads by the analytic
  FLOP share (layer mode; heads of one call have equal shares unless their
  work differs);
- a ratio is as strong as its weakest input: analytic bytes over measured
  time is ``analytic``.

``duration_basis`` says what the duration is: ``cpu_range`` (wall time of the
range on the CPU thread — the CPU torch source), ``gpu_busy`` (the union of the
GPU work launched inside the range: busy time, idle between its kernels left out;
``gpu_span_ns`` keeps the first kernel start to last kernel end, a span) or
``gpu_kernel_sum`` (sum of kernel durations — ncu, which serializes kernels).

Totals (``duration_ns``, ``dram_bytes``, ``flop``) are over every call of the
profiled steps; ``*_per_call*`` columns are per call: the mean
(``duration_per_call_ns``) and the 10th/50th/90th percentiles over the calls
(:mod:`headcount.derive.spread`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.derive import spread

GROUP_LAYER = ["implementation", "phase", "layer_name", "layer"]
GROUP_HEAD = GROUP_LAYER + ["head", "kv_head"]

_SUMMED = (  # summed over a group's ranges
    "duration_ns",
    "op_count",
    "cpu_ops_ns",
    "flop",
    "analytic_min_bytes",
    "dram_bytes_measured",
    "kernel_count",
    "kernel_busy_ns",
    "kernel_gap_ns",
    "gpu_span_ns",
    "cpu_launch_cost_ns",
    "theoretical_occupancy_x_busy",
    "dram_read_sampled_bytes",
    "dram_write_sampled_bytes",
    "sm_warps_active_x_duration",
)


# PM-sampled figures, null for a call the samples do not resolve (headcount.derive.sampling.MIN_WHOLE_SAMPLES)
_SAMPLED_EVERY_CALL = ("dram_read_sampled_bytes", "dram_write_sampled_bytes", "sm_warps_active_x_duration")

_NAMES = ("signal", "found_as")


def _distinct(values: pd.Series) -> str | None:
    """The distinct non-null values, in order of first appearance, joined by ``, ``; ``None`` for none."""
    seen = list(dict.fromkeys(v for v in values if isinstance(v, str)))
    return ", ".join(seen) if seen else None


def _aggregate(ranges: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    present = [c for c in _SUMMED if c in ranges.columns]
    ranges = ranges.assign(**{spread.CALL_BANDWIDTH: spread.call_bandwidth_gbps(ranges)})
    grouped = ranges.groupby(keys, dropna=False, sort=True)
    out = pd.DataFrame({"calls": grouped.size(), "steps": grouped["step"].nunique()})
    if present:  # one grouped sum of every column (a named aggregation per column cost 5× more on a small run)
        # a sum over rows that are all null is null, not 0 (min_count)
        out = out.join(grouped[present].sum(min_count=1).astype("float64"))
        sampled = [c for c in _SAMPLED_EVERY_CALL if c in present]
        if sampled:  # a row's sampled total needs every call resolved: a sum over some of them is no total
            complete = grouped[sampled].count().eq(out["calls"], axis=0)
            out[sampled] = out[sampled].where(complete)
    out["steps"] = out["steps"].where(out["steps"] > 0)  # no step ranges: unknown, not 0
    out["duration_basis"] = grouped["duration_basis"].first()
    for col in _NAMES:  # a call found in an untagged recording: what found it, as the recording names it
        if col in ranges.columns and ranges[col].notna().any():
            out[col] = grouped[col].agg(_distinct)
    for col, values in spread.per_call(grouped).items():
        out[col] = values
    return out.reset_index()


def _derive(table: pd.DataFrame, duration_provenance: str) -> pd.DataFrame:
    t = table
    nan = pd.Series(np.nan, index=t.index)
    measured = t["dram_bytes_measured"] if "dram_bytes_measured" in t else nan
    if "dram_read_sampled_bytes" in t:
        t["dram_bytes_sampled"] = t["dram_read_sampled_bytes"] + t["dram_write_sampled_bytes"]
    sampled = t["dram_bytes_sampled"] if "dram_bytes_sampled" in t else nan
    # the strongest figure wins: a counter of the range, then device-wide samples, then the model
    t["dram_bytes"] = measured.where(measured.notna(), sampled.where(sampled.notna(), t["analytic_min_bytes"]))
    t["dram_bytes_provenance"] = np.where(measured.notna(), "measured", np.where(sampled.notna(), "sampled",
                                          np.where(t["analytic_min_bytes"].notna(), "analytic", None)))
    # device-wide samples are taken over a range's GPU window, first start to last end: their rates are over that span
    window = t["gpu_span_ns"].where(t["gpu_span_ns"].notna(), t["duration_ns"]) if "gpu_span_ns" in t else t["duration_ns"]
    if "sm_warps_active_x_duration" in t:
        # PM sampling: device-wide warps active over the range's GPU window (an achieved occupancy, sampled)
        with np.errstate(divide="ignore", invalid="ignore"):
            t["achieved_occupancy_pct"] = (t["sm_warps_active_x_duration"] / window).where(window > 0)
        t["achieved_occupancy_provenance"] = np.where(t["achieved_occupancy_pct"].notna(), "sampled", None)
    if "kernel_count" in t:
        t["kernels_per_call"] = t["kernel_count"] / t["calls"]
        t["cpu_launch_cost_per_call_ns"] = t["cpu_launch_cost_ns"] / t["calls"]
        t["kernel_gap_per_call_ns"] = t["kernel_gap_ns"] / t["calls"]
        with np.errstate(divide="ignore", invalid="ignore"):
            t["theoretical_occupancy_pct"] = (t["theoretical_occupancy_x_busy"] / t["kernel_busy_ns"]).where(t["kernel_busy_ns"] > 0)
    t["duration_provenance"] = np.where(t["duration_ns"].notna(), duration_provenance, None)
    t["duration_per_call_ns"] = t["duration_ns"] / t["calls"]
    with np.errstate(divide="ignore", invalid="ignore"):
        over = window.where(pd.Series(t["dram_bytes_provenance"], index=t.index) == "sampled", t["duration_ns"])
        t["bandwidth_gbps"] = (t["dram_bytes"] / over).where(over > 0)
        t["intensity_flop_per_byte"] = (t["flop"] / t["dram_bytes"]).where(t["dram_bytes"] > 0)
    t["flop_provenance"] = np.where(t["flop"].notna(), "analytic", None)
    t["bandwidth_provenance"] = np.where(
        t["bandwidth_gbps"].isna(), None,
        np.where((t["dram_bytes_provenance"] == "measured") & (t["duration_provenance"] == "measured"), "measured", t["dram_bytes_provenance"]),
    )
    # measured (or sampled) bytes over the minimum the analytic model allows; never the model over itself
    with np.errstate(divide="ignore", invalid="ignore"):
        t["excess_traffic"] = (t["dram_bytes"] / t["analytic_min_bytes"]).where(
            (t["analytic_min_bytes"] > 0) & pd.Series(t["dram_bytes_provenance"], index=t.index).isin(["measured", "sampled"]))
    t["intensity_provenance"] = np.where(t["intensity_flop_per_byte"].isna(), None, "analytic")
    return t


def layers_table(ranges: pd.DataFrame) -> pd.DataFrame:
    """One row per implementation × phase × layer, from the layer range instances.

    Args:
        ranges: attributed ranges with ``level`` (``layer``/``head``/…), shapes,
            ``flop``, ``analytic_min_bytes``, ``duration_ns``, ``duration_basis``, ``step``.

    Returns:
        The layers table; in head mode it also has ``heads_duration_ns`` (sum of
        the head ranges inside) and ``split_overhead_ns`` (layer − heads).
    """
    layer_ranges = ranges[ranges["level"] == "layer"]
    table = _aggregate(layer_ranges, GROUP_LAYER)
    head_ranges = ranges[ranges["level"] == "head"]
    if len(head_ranges):
        table = _with_split(table, layer_ranges, head_ranges)
    table = _derive(table, "measured")
    if len(head_ranges):
        with np.errstate(divide="ignore", invalid="ignore"):
            table["heads_bytes_share_of_layer_pct"] = (100.0 * table["heads_dram_bytes"] / table["dram_bytes"]).where(
                table["dram_bytes_provenance"].isin(["measured", "sampled"]) & (table["dram_bytes"] > 0))
    table = _with_module(table, ranges[ranges["level"] == "module"])
    total = table.groupby(["implementation", "phase"], dropna=False)["duration_ns"].transform("sum")
    table["share_of_phase_pct"] = 100.0 * table["duration_ns"] / total
    table["provenance"] = "measured"
    return table


SPLIT_COLUMNS = ["heads_duration_ns", "split_overhead_ns", "heads_share_of_layer_pct", "split_glue_ns", "split_gaps_ns",
                 "heads_dram_bytes", "heads_bytes_share_of_layer_pct"]
SPLIT_COST_COLUMNS = ["layer_mode_duration_per_call_ns", "split_cost_x"]


def _with_split(table: pd.DataFrame, layer_ranges: pd.DataFrame, head_ranges: pd.DataFrame) -> pd.DataFrame:
    """Head mode: where each layer's time went, besides its heads (docs/reading-a-report.md § Head mode).

    Adds, summed over the row's calls: ``heads_duration_ns`` (the head ranges inside the layer's),
    ``split_overhead_ns`` (layer − heads: time of a layer call that no head holds),
    ``heads_share_of_layer_pct``, ``split_glue_ns`` (GPU work inside the layer but in no head: the
    union of its kernels' busy time less the heads' — the split's and join's own kernels, the heads'
    gradient concatenation), ``split_gaps_ns`` (the rest of the overhead: launch gaps and host time
    between heads; both null on a CPU run, where the time outside the heads is host work, operators and
    Python alike) and ``heads_dram_bytes`` (the heads' measured or sampled bytes; their share of the
    layer's is added by :func:`layers_table` once the layer's bytes are known). Nothing of a layer call is
    dropped: heads + glue + gaps = the layer's time."""
    keys = ["range_id", *GROUP_LAYER]
    if "pid" in layer_ranges and "pid" in head_ranges:
        keys.append("pid")  # range ids are per process (and per implementation in one run)
    inner = head_ranges.merge(layer_ranges[keys].rename(columns={"range_id": "parent_range_id"}),
                              on=[k if k != "range_id" else "parent_range_id" for k in keys])
    # GPU work only: a CPU operator may straddle a head range's edge (autograd opens a head's backward range
    # inside one node and closes it inside another), so the operators' time cannot be cut at the heads
    busy = "kernel_busy_ns"
    summed = {"heads_duration_ns": inner["duration_ns"]}
    if busy in inner and inner[busy].notna().any():
        summed["heads_busy_ns"] = inner[busy]
    sampled = [c for c in ("dram_bytes_measured", "dram_read_sampled_bytes", "dram_write_sampled_bytes") if c in inner]
    for col in sampled:
        summed[f"heads_{col}"] = inner[col]
    sums = pd.DataFrame(summed).assign(**{k: inner[k] for k in GROUP_LAYER}).groupby(GROUP_LAYER, dropna=False).sum(min_count=1)
    table = table.merge(sums.reset_index(), on=GROUP_LAYER, how="left")
    table["split_overhead_ns"] = table["duration_ns"] - table["heads_duration_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["heads_share_of_layer_pct"] = (100.0 * table["heads_duration_ns"] / table["duration_ns"]).where(table["duration_ns"] > 0)
    if "heads_busy_ns" in table and busy in table:
        table["split_glue_ns"] = (table[busy] - table["heads_busy_ns"]).clip(lower=0)
        table["split_gaps_ns"] = table["split_overhead_ns"] - table["split_glue_ns"]
    else:
        table["split_glue_ns"] = table["split_gaps_ns"] = np.nan
    measured = table.get("heads_dram_bytes_measured")
    if measured is not None and measured.notna().any():
        table["heads_dram_bytes"] = measured
    elif "heads_dram_read_sampled_bytes" in table:
        table["heads_dram_bytes"] = table["heads_dram_read_sampled_bytes"] + table["heads_dram_write_sampled_bytes"]
    else:
        table["heads_dram_bytes"] = np.nan
    return table.drop(columns=[c for c in table.columns if c.startswith("heads_") and c not in SPLIT_COLUMNS])


def with_split_cost(head_layers: pd.DataFrame, layer_layers: pd.DataFrame) -> pd.DataFrame:
    """The split's cost of a head-mode run against a paired layer-mode profile of the same model, inputs and
    implementation (``headcount profile --mode head`` makes one): ``layer_mode_duration_per_call_ns`` (the
    paired row's median per call, else its mean) and ``split_cost_x`` (the head-mode row's over it, same
    statistic). A row without a pair keeps nulls. Returns a copy of ``head_layers``."""
    out = head_layers.copy()

    def per_call(t):
        p50 = t["duration_per_call_p50_ns"] if "duration_per_call_p50_ns" in t else pd.Series(np.nan, index=t.index)
        return p50.where(p50.notna(), t["duration_per_call_ns"])

    ref = layer_layers.assign(layer_mode_duration_per_call_ns=per_call(layer_layers))[[*GROUP_LAYER, "layer_mode_duration_per_call_ns"]]
    out = out.drop(columns=SPLIT_COST_COLUMNS, errors="ignore").merge(ref, on=GROUP_LAYER, how="left")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["split_cost_x"] = (per_call(out) / out["layer_mode_duration_per_call_ns"]).where(out["layer_mode_duration_per_call_ns"] > 0)
    return out


MODULE_COLUMNS = ["module_calls", "module_duration_ns", "module_duration_per_call_ns", "module_kernel_count",
                  "module_kernels_per_call", "module_kernel_busy_ns", "module_gpu_span_ns", "core_share_of_module_pct"]


def _with_module(table: pd.DataFrame, modules: pd.DataFrame) -> pd.DataFrame:
    """Add the whole attention module of each layer row, where the recording names it (``module`` ranges:
    :func:`headcount.attribute.untagged.find_calls`): ``module_calls``, ``module_duration_ns`` (its time, on
    the same basis as ``duration_ns``, summed over calls) and per call, ``module_kernel_count`` (GPU
    operations launched inside it, the core's included) and per call, ``module_kernel_busy_ns``, ``module_gpu_span_ns``
    (first start to last end of its GPU work, summed over calls: a span), and
    ``core_share_of_module_pct`` (the core's ``duration_ns`` over the module's, in %, where every call of
    the row has its module). All null where no module range was recorded."""
    for column in MODULE_COLUMNS:
        table[column] = np.nan
    if not len(modules) or not len(table):
        return table
    grouped = modules.groupby(GROUP_LAYER, dropna=False, sort=True)
    counted = "kernel_count" if "kernel_count" in modules else "gpu_op_count"
    per = pd.DataFrame({
        "module_calls": grouped.size(),
        "module_duration_ns": grouped["duration_ns"].sum(min_count=1).astype("float64"),
        "module_kernel_count": grouped[counted].sum(min_count=1).astype("float64") if counted in modules else np.nan,
        "module_kernel_busy_ns": grouped["kernel_busy_ns"].sum(min_count=1).astype("float64") if "kernel_busy_ns" in modules else np.nan,
        "module_gpu_span_ns": grouped["gpu_span_ns"].sum(min_count=1).astype("float64") if "gpu_span_ns" in modules else np.nan,
    }).reset_index()
    out = table.drop(columns=MODULE_COLUMNS).merge(per, on=GROUP_LAYER, how="left")
    out["module_duration_per_call_ns"] = out["module_duration_ns"] / out["module_calls"]
    out["module_kernels_per_call"] = out["module_kernel_count"] / out["module_calls"]
    whole = out["module_calls"] == out["calls"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["core_share_of_module_pct"] = (100.0 * out["duration_ns"] / out["module_duration_ns"]).where(
            whole & (out["module_duration_ns"] > 0))
    return out


def heads_table(ranges: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """One row per implementation × phase × layer × head.

    Head mode: aggregated from the head range instances (durations measured),
    with how each head ranked among the heads of its calls
    (:func:`headcount.derive.spread.rank_tests`: ``positions_seen``,
    ``hotter_p``, ``cooler_p``).
    Layer mode (no head ranges): each layer row split across its query heads
    by analytic FLOP share, with ``provenance`` ``apportioned``.
    """
    head_ranges = ranges[ranges["level"] == "head"]
    if len(head_ranges):
        table = _aggregate(head_ranges, GROUP_HEAD)
        if "parent_range_id" in head_ranges and "start_ns" in head_ranges:
            table = table.merge(spread.rank_tests(head_ranges, GROUP_HEAD, GROUP_LAYER), on=GROUP_HEAD, how="left")
        table = _derive(table, "measured")
        table["provenance"] = "measured"
    else:
        table = _apportion(ranges[ranges["level"] == "layer"], layers)
    layer_time = table.groupby(GROUP_LAYER, dropna=False)["duration_ns"].transform("sum")
    table["share_of_layer_pct"] = 100.0 * table["duration_ns"] / layer_time
    return table


def _apportion(layer_ranges: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    if "q_heads" not in layer_ranges or layer_ranges["q_heads"].isna().all():
        # no call shapes (e.g. a parsed nsys capture): nothing to split by
        return pd.DataFrame(columns=[*GROUP_HEAD, *layers.columns.difference([*GROUP_HEAD, "provenance"]), "provenance"])
    heads = layer_ranges.groupby(GROUP_LAYER, dropna=False)[["q_heads", "kv_heads"]].max().reset_index()
    heads = heads.dropna(subset=["q_heads"])
    rows = []
    for rec in heads.itertuples(index=False):
        n, n_kv = int(rec.q_heads), int(rec.kv_heads)
        groups = max(n // max(n_kv, 1), 1)
        for h in range(n):
            rows.append((*[getattr(rec, k) for k in GROUP_LAYER], h, h // groups, 1.0 / n))
    split = pd.DataFrame(rows, columns=[*GROUP_LAYER, "head", "kv_head", "_share"])
    table = split.merge(layers, on=GROUP_LAYER, how="left")
    # a head's share of every call (bandwidth per call is unchanged: bytes and time scale alike)
    for col in ("duration_ns", "op_count", "cpu_ops_ns", "flop", "analytic_min_bytes", "dram_bytes", "dram_bytes_measured",
                "dram_bytes_sampled", "kernel_busy_ns", "kernel_gap_ns", "cpu_launch_cost_ns", *spread.DURATION):
        if col in table:
            table[col] = table[col] * table["_share"]
    table["duration_per_call_ns"] = table["duration_ns"] / table["calls"]
    table = table.drop(columns=["_share", "share_of_phase_pct", *SPLIT_COLUMNS, *SPLIT_COST_COLUMNS], errors="ignore")
    for col in ("duration_provenance", "dram_bytes_provenance", "bandwidth_provenance"):
        table[col] = np.where(table[col].isna(), None, "apportioned")
    table["provenance"] = "apportioned"
    return table


def from_kernels(kernels: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Aggregate per-kernel hardware counters (ncu) by ``keys``.

    ncu replays kernels one at a time, so a group's time is the sum of its
    kernels' durations (``duration_basis`` ``gpu_kernel_sum``), its DRAM bytes
    the sum of their measured bytes, its occupancy the duration-weighted mean.
    ``calls`` is unknown here (ncu records kernels, not range instances).
    """
    k = kernels[kernels["layer_name"].notna()].copy()
    k["duration_ns"] = k["duration_ns"].astype("float64")
    k["_occ_x_t"] = k["achieved_occupancy_pct"].astype("float64") * k["duration_ns"]
    grouped = k.groupby(keys, dropna=False, sort=True)
    out = grouped.agg(
        op_count=("name", "size"),
        duration_ns=("duration_ns", lambda s: s.sum(min_count=1)),
        dram_bytes_measured=("dram_bytes", lambda s: s.astype("float64").sum(min_count=1)),
        _occ=("_occ_x_t", lambda s: s.sum(min_count=1)),
        incomplete=("incomplete", "any"),
    ).reset_index()
    out["achieved_occupancy_pct"] = out.pop("_occ") / out["duration_ns"]
    out["achieved_occupancy_provenance"] = np.where(out["achieved_occupancy_pct"].notna(), "measured", None)
    out["calls"] = pd.NA
    out["steps"] = pd.NA
    out["duration_basis"] = "gpu_kernel_sum"
    out["flop"] = np.nan
    out["analytic_min_bytes"] = np.nan
    out = _derive(out, "measured")
    out["duration_per_call_ns"] = np.nan
    out["provenance"] = "measured"
    return out


def with_launch_latency(layers: pd.DataFrame, heads: pd.DataFrame, kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add ``launch_latency_p50_ns``/``_p99_ns``, ``queue_delay_p50_ns``/``_p99_ns`` and ``queued_kernels_pct``
    (of the kernels of each row, :func:`headcount.derive.launch.latency_quantiles`) to the layers and heads
    tables; unchanged where kernels have no latency."""
    from headcount.derive.launch import latency_quantiles

    none_queued = kernels["queue_delay_ns"].isna().all() if "queue_delay_ns" in kernels else True
    if "launch_latency_ns" not in kernels or (kernels["launch_latency_ns"].isna().all() and none_queued):
        return layers, heads
    out = []
    for table, keys in ((layers, GROUP_LAYER), (heads, GROUP_LAYER + ["head"])):
        table = table.drop(columns=["launch_latency_p50_ns", "launch_latency_p99_ns", "queue_delay_p50_ns", "queue_delay_p99_ns",
                                    "queued_kernels_pct"], errors="ignore")
        out.append(_joined(table, latency_quantiles(kernels, keys), keys))
    return out[0], out[1]


def _joined(table: pd.DataFrame, per_key: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``table`` with ``per_key``'s columns joined on ``keys`` (left; keys of one type on both sides, nullable)."""
    if not len(table) or not len(per_key):
        return table
    per_key = per_key.copy()
    for k in keys:
        numeric = k in ("layer", "head")
        per_key[k] = pd.array(per_key[k], dtype="Int64") if numeric else per_key[k].astype(object)
        table[k] = pd.array(table[k], dtype="Int64") if numeric else table[k].astype(object)
    return table.merge(per_key, on=keys, how="left")


def with_waves(layers: pd.DataFrame, heads: pd.DataFrame, kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add ``waves_per_sm`` to the layers and heads tables: of each row's main kernel (the kernel name that
    took the most of its time), the median over its launches; under 1 its grid leaves SMs idle. Unchanged
    where the kernels have no waves (:func:`headcount.derive.occupancy.kernel_waves`)."""
    if "waves_per_sm" not in kernels or kernels["waves_per_sm"].isna().all():
        return layers, heads
    k = kernels[kernels["layer_name"].notna().to_numpy(dtype=bool) & kernels["waves_per_sm"].notna().to_numpy(dtype=bool)]
    out = []
    for table, keys in ((layers, GROUP_LAYER), (heads, GROUP_LAYER + ["head"])):  # among the kernels with a grid: not copies
        table = table.drop(columns=["waves_per_sm"], errors="ignore")
        by_name = k.groupby([*keys, "name"], dropna=False, observed=True).agg(
            time=("duration_ns", "sum"), waves_per_sm=("waves_per_sm", "median")).reset_index()
        main = by_name.sort_values("time", kind="stable").groupby(keys, dropna=False, observed=True).tail(1)
        out.append(_joined(table, main[[*keys, "waves_per_sm"]], keys))
    return out[0], out[1]


def with_call_totals(table: pd.DataFrame, calls, implementation: str, heads: bool) -> pd.DataFrame:
    """Calls, analytic FLOPs and minimum bytes of a kernel-aggregated table
    (ncu: no range instances) from the tagger's call log, then the derived
    columns again.

    Args:
        table: :func:`from_kernels` output (``layers`` or, with ``heads``, ``heads``).
        calls: the call log of the profiled steps as a table (:func:`headcount.attribute.calls.calls_frame`).
        implementation: the attention implementation the calls ran.
    """
    if not len(table) or calls is None or not len(calls):
        return table
    from headcount.derive import analytic

    frame = calls
    frame = frame[frame["q_heads"].notna()] if "q_heads" in frame else frame.iloc[0:0]
    if not len(frame):
        return table
    frame = frame.assign(flop=analytic.flop(frame, frame["phase"]), analytic_min_bytes=analytic.min_bytes(frame, frame["phase"]))
    keys = ["phase", "layer_name", *(["head"] if heads else [])]
    if not heads:
        frame = frame[frame["head"].isna()] if frame["head"].isna().any() else frame
    sums = frame.groupby(keys, dropna=False).agg(calls_log=("phase", "size"), flop_log=("flop", "sum"), min_log=("analytic_min_bytes", "sum")).reset_index()
    t = table.copy()
    for k in keys:
        if k == "head":
            t[k] = pd.array(t[k], dtype="Int64")
            sums[k] = pd.array(sums[k], dtype="Int64")
    t = t.merge(sums, on=keys, how="left")
    t["calls"] = t["calls_log"]
    t["flop"] = t["flop_log"]
    t["analytic_min_bytes"] = t["min_log"]
    t = t.drop(columns=["calls_log", "flop_log", "min_log"])
    t["implementation"] = implementation
    t = _derive(t, "measured")
    t["duration_per_call_ns"] = t["duration_ns"] / t["calls"]
    return t


def attention_per_step(layers: pd.DataFrame, keys: list[str] | None = None) -> pd.DataFrame:
    """Attention time and calls per step of each ``keys`` group (default: run
    and implementation) — the figures ``compare``'s speed-ups and the
    ``slow_implementation`` finding divide.

    A group's time is the sum of its layer rows' ``duration_ns`` over its
    steps (the most steps any of its rows ran; 1 where steps are unknown).

    Returns:
        ``keys``, ``steps``, ``attention_ns_per_step``, ``calls_per_step``.
    """
    keys = keys or ["run_id", "implementation"]
    rows = []
    for key, g in layers.groupby(keys, sort=True, dropna=False):
        steps = g["steps"].max() if g["steps"].notna().any() else 1
        duration = float(g["duration_ns"].sum(min_count=1)) if "duration_ns" in g else np.nan
        calls = float(g["calls"].sum(min_count=1)) if "calls" in g else np.nan
        rows.append((*(key if isinstance(key, tuple) else (key,)), steps, duration / steps, calls / steps))
    return pd.DataFrame(rows, columns=[*keys, "steps", "attention_ns_per_step", "calls_per_step"])


def work_signature(layers: pd.DataFrame) -> tuple:
    """What one implementation's attention ran in a run: its layers and their shapes. Speed-ups compare two
    implementations only where these are equal (a pipeline's text encoder and its transformer are different work)."""
    shape = [c for c in ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype") if c in layers]
    names = tuple(sorted({str(v) for v in layers["layer_name"].dropna()})) if "layer_name" in layers else ()
    shapes = tuple(sorted({tuple(str(v) for v in r) for r in layers[shape].itertuples(index=False)})) if shape else ()
    return names, shapes


def with_step_shares(layers: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Add (in place) each layer row's ``share_of_step_pct`` — its time over the profiled steps' windows
    (``window_ns`` summed over the steps of its implementation) — and ``share_of_gpu_busy_pct`` — over
    their GPU busy time (the steps' own work, ``own_busy_ns``; null without GPU figures), in percent. The rows of work outside every step
    count only where the recording has no step at all (their window is then the whole recording)."""
    for column in ("share_of_step_pct", "share_of_gpu_busy_pct"):
        layers[column] = np.nan
    if not len(layers) or steps is None or not len(steps) or "window_ns" not in steps:
        return layers
    stepped = steps[steps["step"].notna().to_numpy(dtype=bool)] if steps["step"].notna().any() else steps
    # each step's own work: steps' windows may overlap (pipelined work), their own work does not
    own = "own_busy_ns" if "own_busy_ns" in stepped and stepped["own_busy_ns"].notna().any() else "gpu_busy_ns"
    totals = stepped.groupby(stepped["implementation"].astype(object), dropna=False).agg(
        window=("window_ns", "sum"), busy=(own, lambda v: v.sum(min_count=1)))
    implementation = layers["implementation"].astype(object)
    window = implementation.map(totals["window"]).astype("float64")
    busy = implementation.map(totals["busy"]).astype("float64")
    if len(totals) == 1:  # one implementation recorded (a parsed file's rows may say "unknown" where the layers do not)
        window, busy = window.fillna(float(totals["window"].iloc[0])), busy.fillna(float(totals["busy"].iloc[0]))
    duration = pd.to_numeric(layers["duration_ns"], errors="coerce").astype("float64")
    layers["share_of_step_pct"] = 100.0 * duration / window.where(window > 0)
    layers["share_of_gpu_busy_pct"] = 100.0 * duration / busy.where(busy > 0)
    return layers
