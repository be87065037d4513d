"""The console summary printed at the end of ``headcount profile``.

Reads the tables; prints with rich. Units are in the headers.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

from headcount.common import shown_names
from headcount.common.numbers import number, with_spread
from headcount.reports import findings, terminal


def _fmt(value, spec: str = ",.0f") -> str:
    if value is None or pd.isna(value):
        return "–"
    return format(value, spec)


def implementation_summary(layers: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and phase (of one run): attention time per step (ns), calls per step,
    analytic FLOPs and bytes per step, operators/kernels per call."""
    steps = layers["steps"].fillna(1).clip(lower=1)
    if _has_kernels(layers):  # GPU sources: kernels per call, not CPU operators
        layers = layers.assign(op_count=layers["kernel_count"])
    per_step = layers.assign(
        duration_step=layers["duration_ns"] / steps,
        calls_step=layers["calls"] / steps,
        flop_step=layers["flop"] / steps,
        bytes_step=layers["dram_bytes"] / steps,
    )
    out = per_step.groupby(["implementation", "phase"], sort=True).agg(
        attention_ns_per_step=("duration_step", "sum"),
        calls_per_step=("calls_step", "sum"),
        flop_per_step=("flop_step", _known_sum),
        dram_bytes_per_step=("bytes_step", _known_sum),
        ops=("op_count", "sum"),
        calls=("calls", "sum"),
        basis=("duration_basis", "first"),
        bytes_provenance=("dram_bytes_provenance", "first"),
    ).reset_index()
    out["ops_per_call"] = out["ops"] / out["calls"]
    return out.drop(columns=["ops", "calls"])


def _known_sum(values: pd.Series) -> float:
    """A sum that is null when no value is known (unrecorded shapes: no FLOPs, not 0)."""
    return values.sum(min_count=1)


def _has_kernels(layers: pd.DataFrame) -> bool:
    return "kernel_count" in layers and layers["kernel_count"].notna().any()


def _launch_table(layers: pd.DataFrame, kernels: pd.DataFrame) -> Table:
    from headcount.derive.launch import summary

    t = Table(title="Launching attention (per layer call)",
              caption="latency: kernel start − launch call start, kernels launched onto an idle stream; queued: kernels that "
                      "waited behind earlier work, and how long after their launch returned; gaps: GPU idle between a call's "
                      "kernels; occupancy: theoretical")
    for col in ("impl", "phase", "kernels", "launch cost µs", "gaps µs", "GPU µs", "latency p50 µs", "p99 µs", "queued %",
                "queue p50 µs", "occupancy %"):
        t.add_column(col, justify="left" if col in ("impl", "phase") else "right")
    occ = layers.groupby(["implementation", "phase"])["theoretical_occupancy_pct"].mean() if "theoretical_occupancy_pct" in layers else {}
    for r in summary(layers, kernels).itertuples(index=False):
        t.add_row(r.implementation, r.phase, _fmt(r.kernels_per_call, ",.1f"), _fmt(r.cpu_launch_cost_per_call_ns / 1e3, ",.1f"),
                  _fmt(r.kernel_gap_per_call_ns / 1e3, ",.1f"), _fmt(r.gpu_time_per_call_ns / 1e3, ",.1f"),
                  _fmt(r.launch_latency_p50_ns / 1e3, ",.1f"), _fmt(r.launch_latency_p99_ns / 1e3, ",.1f"),
                  _fmt(r.queued_kernels_pct, ",.0f"), _fmt(r.queue_delay_p50_ns / 1e3, ",.1f"),
                  _fmt(occ.get((r.implementation, r.phase)) if len(occ) else None, ",.1f"))
    return t


def _provenance_caption(frame: pd.DataFrame) -> str:
    basis = ", ".join(sorted(frame["duration_basis"].dropna().unique())) or "–"
    found = findings.found_line(frame)
    found = f"; {found}" if found else ""
    return (f"time: {basis} ({'/'.join(sorted(frame['duration_provenance'].dropna().unique())) or '–'}); "
            f"bytes: {'/'.join(sorted(frame['dram_bytes_provenance'].dropna().unique())) or '–'}; "
            f"FLOP: {'analytic' if 'flop' in frame and frame['flop'].notna().any() else 'not known (no shapes recorded)'}{found}")


def _by_run(frame: pd.DataFrame | None, run_id) -> pd.DataFrame | None:
    if frame is None or not len(frame) or "run_id" not in frame:
        return frame
    return frame[frame["run_id"] == run_id]


def _title(run_id, runs: pd.DataFrame | None) -> str:
    return findings.run_heading(run_id, findings.run_info(runs, run_id))


def _damaged(run_id, runs: pd.DataFrame | None) -> str | None:
    """What ``--salvage`` lost of the run's recording (its ``runs.damaged``), or ``None``."""
    damaged = findings.run_info(runs, run_id).get("damaged")
    return None if findings.missing(damaged) else str(damaged)


def print_summary(layers: pd.DataFrame, heads: pd.DataFrame, out_dir, console: Console | None = None, top: int = 5,
                  kernels: pd.DataFrame | None = None, runs: pd.DataFrame | None = None,
                  ranges: pd.DataFrame | None = None, steps: pd.DataFrame | None = None,
                  findings: pd.DataFrame | None = None, collectives: pd.DataFrame | None = None) -> None:
    """Print, for each run on its own (no figure adds two runs): how busy the
    GPU was and where its idle time went (``steps``), the ranked findings
    (``findings``), the per-implementation comparison, what launching costs
    (GPU sources, given ``kernels``), the costliest layers (or heads, when
    they were measured) with their spread over calls, and which rows stand
    out beyond it; then NVTX ranges that are not headcount's (``ranges``:
    :func:`headcount.store.query.range_summary`), and where the report is."""
    console = console or terminal.console()
    run_ids = []
    for frame in (steps, layers, ranges):
        if frame is not None and len(frame):
            run_ids += list(frame["run_id"]) if "run_id" in frame else [None]
    run_ids = list(dict.fromkeys(run_ids))
    for run_id in run_ids:
        run_layers = _by_run(layers, run_id) if run_id is not None else layers
        run_heads = _by_run(heads, run_id) if run_id is not None else heads
        if len(run_ids) > 1 or runs is not None:
            terminal.heading(console, _title(run_id, runs))
            if damaged := _damaged(run_id, runs):
                console.print(f"salvaged from a damaged recording: {damaged}", style="yellow", highlight=False)
        _print_triage(console, _by_run(steps, run_id) if run_id is not None else steps,
                      _by_run(findings, run_id) if run_id is not None else findings)
        run_collectives = _by_run(collectives, run_id) if run_id is not None else collectives
        if run_collectives is not None and len(run_collectives):
            console.print(_collectives_table(run_collectives))
        if len(run_layers):
            _print_run(console, run_layers, run_heads, _by_run(kernels, run_id) if run_id is not None else kernels, top)
        else:
            console.print("no attention found in this run: kernels, steps and findings only", highlight=False)
        run_ranges = _by_run(ranges, run_id) if run_id is not None else ranges
        if run_ranges is not None and len(run_ranges):
            console.print(_ranges_table(run_ranges, top * 2))
    for line in rank_lines(steps, runs):
        console.print(line, soft_wrap=True, highlight=False)
    if out_dir is not None:
        console.print(f"Report: {out_dir}/ (Parquet datasets kernels, ranges, layers, heads, steps, collectives, findings, runs)")


def _print_triage(console: Console, steps: pd.DataFrame | None, found: pd.DataFrame | None) -> None:
    """The run's opening: busy and idle per device (medians over steps), then its findings in rank order."""
    for line in findings.step_lines(steps):
        console.print(line, soft_wrap=True, highlight=False)
    for line in findings.finding_lines(found):
        console.print(f"  {line}", soft_wrap=True, highlight=False)


def _print_run(console: Console, layers: pd.DataFrame, heads: pd.DataFrame, kernels: pd.DataFrame | None, top: int) -> None:
    summary = implementation_summary(layers)
    table = Table(title="Attention per step (totals over the profiled steps ÷ steps)", caption=_provenance_caption(layers))
    for col in ("impl", "phase", "ms", "calls", "GPU ops/call" if _has_kernels(layers) else "ops/call", "GFLOP", "MB", "GB/s"):
        table.add_column(col, justify="left" if col in ("impl", "phase") else "right")
    for row in summary.itertuples(index=False):
        gbps = row.dram_bytes_per_step / row.attention_ns_per_step if row.attention_ns_per_step else None
        # no operator or kernel seen in any call (e.g. nsys on a CPU: ranges only) is "not measured", not 0
        table.add_row(
            row.implementation, row.phase, number(row.attention_ns_per_step / 1e6), _fmt(row.calls_per_step, ",.0f"),
            number(row.ops_per_call or None), number(row.flop_per_step / 1e9), number(row.dram_bytes_per_step / 1e6), number(gbps),
        )
    console.print(table)
    for line in findings.module_lines(layers) + findings.split_lines(layers):
        console.print(f"  {line}", soft_wrap=True)
    if kernels is not None and _has_kernels(layers):
        console.print(_launch_table(layers, kernels))

    measured_heads = heads[heads["provenance"] == "measured"] if len(heads) else heads
    rows, what = (measured_heads, "heads") if len(measured_heads) else (layers, "layers")
    t = Table(title=f"Top {top} {what} by median time per call",
              caption=_provenance_caption(rows) + "; per call: median (p10–p90) over the calls, rounded to that spread")
    for col in ("impl", "phase", "layer", *(("head", "kv") if what == "heads" else ()), "µs per call", "calls",
                "GB/s per call", "FLOP/B"):
        t.add_column(col, justify="left" if col in ("impl", "phase", "layer") else "right")
    order = rows.assign(_key=rows["duration_per_call_p50_ns"].fillna(rows["duration_per_call_ns"]))
    for r in order.sort_values("_key", ascending=False).head(top).itertuples(index=False):
        cells = [r.implementation, r.phase, str(r.layer_name)]
        if what == "heads":
            cells += [_fmt(r.head, "d"), _fmt(r.kv_head, "d")]
        per_call = (with_spread(r.duration_per_call_p50_ns, r.duration_per_call_p10_ns, r.duration_per_call_p90_ns, 1e-3)
                    if pd.notna(r.duration_per_call_p50_ns) else number(r.duration_per_call_ns / 1e3))
        gbps = (with_spread(r.bandwidth_per_call_p50_gbps, r.bandwidth_per_call_p10_gbps, r.bandwidth_per_call_p90_gbps)
                if pd.notna(r.bandwidth_per_call_p50_gbps) else number(r.bandwidth_gbps))
        cells += [per_call, _fmt(r.calls, ",.0f"), gbps, number(r.intensity_flop_per_byte)]
        t.add_row(*cells)
    console.print(t)
    for line in findings.layer_noise_lines(layers) + findings.head_lines(heads):
        console.print(f"  {line}", soft_wrap=True)


def rank_lines(steps: pd.DataFrame | None, runs: pd.DataFrame | None) -> list[str]:
    """The ranks of the report side by side (:mod:`headcount.derive.ranks`): per rank its median step time, busy and
    communication time per step, then the skew and the straggler with its evidence; nothing with fewer than two ranks."""
    from headcount.derive import ranks

    per_rank = ranks.rank_steps(steps, runs)
    if not len(per_rank):
        return []
    verdict = ranks.skew_and_straggler(per_rank)
    world = pd.to_numeric(runs["world_size"], errors="coerce").max() if "world_size" in runs else float("nan")
    of = f" of the job's {int(world)}" if pd.notna(world) and world > per_rank["rank"].nunique() else ""
    lines = [f"Ranks: {per_rank['rank'].nunique()}{of} in this report, {verdict['steps']} steps on every rank"]
    for rank, g in per_rank.groupby("rank"):
        lines.append(f"  rank {rank}: step {number(g['step_ns'].median() / 1e6)} ms (median of {len(g)}), GPU busy "
                     f"{number(g['gpu_busy_ns'].median() / 1e6)} ms, communication {number(g['communication_ns'].median() / 1e6)} ms, "
                     f"{number(g['communication_exposed_ns'].median() / 1e6)} ms exposed")
    if verdict["steps"]:
        lines.append(f"  skew between ranks: {number(verdict['skew_p50_ns'] / 1e6)} ms per step (median), "
                     f"{number(verdict['skew_max_ns'] / 1e6)} ms (largest)")
    lines.append(f"  straggler: rank {verdict['straggler']}: {verdict['evidence']}" if verdict["straggler"] is not None
                 else f"  straggler: none named: {verdict['evidence']}")
    return lines


def collective_summary(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per process, device and collective kind of one run: calls, time and bytes per step (over the stepped rows; the
    whole recording where it has no steps), and the algorithm and bus bandwidths of the calls with a size."""
    rows = collectives[collectives["step"].notna()] if collectives["step"].notna().any() else collectives
    steps = max(int(rows["step"].nunique()), 1) if rows["step"].notna().any() else 1
    g = rows.groupby(["pid", "device", "kind"], dropna=False, sort=True)
    out = g.agg(library=("library", "first"), calls=("calls", "sum"), time_ns=("time_ns", "sum"), sized_time_ns=("sized_time_ns", "sum"),
                bytes=("bytes", lambda v: v.sum(min_count=1)), group_size=("group_size", "max"), dtype=("dtype", "first")).reset_index()
    out["calls_per_step"], out["ms_per_step"] = out["calls"] / steps, out["time_ns"] / steps / 1e6
    out["mb_per_step"] = out["bytes"] / steps / 1e6
    out["algbw_gbps"] = (out["bytes"] / out["sized_time_ns"]).where(out["sized_time_ns"] > 0)
    from headcount.derive.collectives import bus_factor

    out["busbw_gbps"] = out["algbw_gbps"] * [bus_factor(k, n) for k, n in zip(out["kind"], out["group_size"])]
    return out


def _collectives_table(collectives: pd.DataFrame) -> Table:
    t = Table(title="Communication by collective (per step: totals over the steps ÷ steps)",
              caption="kind: what torch.distributed named the collective (its message or nccl:… annotation), else the kernel's "
                      "name; time: the kernels' durations summed (measured); size: the larger message × its element size where the trace "
                      "records it; algbw = size ÷ time, busbw = algbw × nccl-tests' factor for the group size "
                      "(NVIDIA/nccl-tests doc/PERFORMANCE.md)")
    for col in ("device", "process", "kind", "library", "calls", "ms", "MB", "ranks", "algbw GB/s", "busbw GB/s"):
        t.add_column(col, justify="left" if col in ("device", "process", "kind", "library") else "right")
    for r in collective_summary(collectives).itertuples(index=False):
        t.add_row(str(r.device), str(r.pid), str(r.kind), str(r.library), _fmt(r.calls_per_step, ",.3g"), number(r.ms_per_step),
                  number(r.mb_per_step), _fmt(r.group_size, ".0f"), number(r.algbw_gbps), number(r.busbw_gbps))
    return t


RANGE_NAME_CHARS = 100  # a range name longer than this is cut in the console (shown_names.cut)


def _ranges_table(ranges: pd.DataFrame, top: int) -> Table:
    t = Table(title="Ranges by name (NVTX ranges and torch.profiler annotations, not headcount's), by GPU time",
              caption="time: GPU busy time of each range instance (the union of the GPU work launched inside it), or its CPU "
                      "time without GPU work; per instance: median (p10–p90); nested ranges overlap: do not add rows; names over "
                      f"{RANGE_NAME_CHARS} characters cut (in full: the ranges table)")
    for col in ("range", "instances", "total ms", "µs per instance", "GPU ops"):
        t.add_column(col, justify="left" if col == "range" else "right")
    for r in ranges.head(top).itertuples(index=False):
        t.add_row(shown_names.cut(str(r.path), RANGE_NAME_CHARS), _fmt(r.instances, ",.0f"), number(r.duration_ns / 1e6),
                  with_spread(r.p50_ns, r.p10_ns, r.p90_ns, 1e-3), _fmt(r.gpu_op_count, ",.0f"))
    return t
