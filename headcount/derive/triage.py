"""What stands out in one run, and what to try: the ``findings`` table
(docs/reading-a-report.md § Triage, which lists every rule and threshold).

Tables in (``steps``, ``layers``, ``heads`` of one run), the findings out;
no I/O. A finding is made only where its evidence holds against the spread:

- over steps: with :data:`MIN_STEPS` steps or more, a step figure must pass
  its threshold at the 10th percentile over the steps (most steps, not one
  lucky step); with fewer, every step must pass it (and the evidence says
  there is no spread to test against);
- over calls: a layer or head is an outlier only by
  :func:`headcount.derive.spread.standout`;
- an implementation is slower only where, over :data:`MIN_STEPS` steps or
  more of each, its attention time per step at the 10th percentile lies
  above the faster one's 90th (the spread's rule on per-step totals, which
  a preempted call on a loaded machine does not overturn).

"Nothing stands out" is a valid answer: no row. Rows are ordered by
``expected_gain_pct`` (largest first; null last), then by how much of the
step the finding concerns. ``expected_gain_pct`` is filled only where a
measurement of the same run gives it, as a share of the step's time (its
GPU window, or its wall time on a CPU run): the idle time of a cause (all
of it, the most that removing the cause can give back), the attention time
a faster implementation measured in the same run saves, the time a layer
or head spends beyond the median one. Never a guessed figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common import shown_names
from headcount.common.numbers import number
from headcount.derive import spread
from headcount.derive.aggregate import attention_per_step, work_signature
from headcount.derive.steps import CPU_PACE_NS, LAUNCH_TRAVEL_NS

IDLE_MIN_PCT = 10.0  # the GPU idle at least this share of the window before idle causes are named
CAUSE_MIN_PCT = 5.0  # a cause of idle time is named from this share of the window
ATTENTION_DOMINANT_PCT = 50.0  # attention's share of GPU busy time (CPU: of the step) from which it is the thing to work on
SLOWER_MIN = 1.2  # an implementation is "slow" when another one of the run is at least this much faster per step
OUTLIER_MIN_PCT = 20.0  # a layer/head beyond the spread must also be this much slower than the median one to be a finding
EXCESS_MIN = 2.0  # measured DRAM bytes over the analytic minimum
LOW_OCCUPANCY_PCT = 25.0  # time-weighted occupancy of attention's kernels
MANY_KERNELS = 100  # kernels per step from which "many small kernels" is considered
QUEUED_MAX_PCT = 50.0  # "many small kernels" only where at most this share of the work waited behind earlier work:
# where most of it queued, the CPU stayed ahead of the GPU and its launches cost the GPU nothing
MIN_STEPS = 3
DOMINANT_KERNEL_PCT = 50.0  # an ncu report's kernel from this share of the replayed time is the one to look at

KINDS = ("gpu_idle_launch_bound", "gpu_idle_sync", "gpu_idle_host", "gpu_idle_other", "exposed_communication",
         "gpu_idle_capture", "attention_dominant", "slow_implementation",
         "layer_outlier", "head_outlier", "dominant_kernel", "attention_memory_bound", "excess_traffic", "low_occupancy", "many_small_kernels")
COLUMNS = ["rank", "kind", "subject", "implementation", "value", "unit", "evidence", "suggestion", "expected_gain_pct", "provenance"]

_SUGGEST = {
    "gpu_idle_launch_bound": "capture the step in CUDA graphs (torch.compile(model, mode='reduce-overhead'), or "
                             "torch.cuda.CUDAGraph) so that one launch replays all its kernels; fuse small operators "
                             "(torch.compile); a larger batch gives each kernel more work per launch",
    "gpu_idle_sync": "remove synchronizations inside the step: .item(), .cpu(), .tolist(), printing or logging a GPU tensor, "
                     "torch.cuda.synchronize(), a blocking copy; keep values on the GPU and read them every N steps, or "
                     "copy with non_blocking=True into pinned memory",
    "gpu_idle_host": "the CPU did other work while the GPU waited: prepare data ahead (DataLoader num_workers, "
                     "pin_memory=True, prefetch), move per-step Python work (logging, metrics, checkpoint logic) out of "
                     "the step; the CPU side of the trace shows what ran",
    "gpu_idle_other": "the GPU had the work but waited for something else: look at what the work after the gaps waits "
                      "for (an event recorded on another stream or device, a collective, another process on the GPU); "
                      "overlap independent work on other streams",
    "exposed_communication": "overlap communication with compute: DDP/FSDP bucketing overlaps gradient all-reduce "
                             "with the backward pass (bucket_cap_mb, gradient_as_bucket_view), FSDP prefetching "
                             "(forward_prefetch, backward_prefetch) overlaps all-gathers; issue independent compute "
                             "on another stream while the collective runs; fewer, larger collectives",
    "gpu_idle_capture": "graph capture is set-up work, not step time: capture once (warm-up) and replay; if the recording "
                        "was meant to show the steps, start it after the capture (torch.profiler schedule wait/warmup)",
    "attention_dominant": "attention is where the time goes: compare implementations (headcount profile --impl "
                          "eager,sdpa,flash_attention_2) and look at the traffic and occupancy findings",
    "layer_outlier": "look at what differs in that layer (sliding window, sequence length, dtype, a different kernel); "
                     "headcount query OUT \"SELECT * FROM kernels WHERE layer_name = '…'\" lists its kernels",
    "head_outlier": "look at what differs in that head's work (mask, sink, window); heads measured one at a time "
                    "show their own kernels in the kernels table",
    "attention_memory_bound": "reduce the bytes attention moves: a fused implementation (sdpa, flash_attention_2) "
                              "keeps the score matrix on chip; lower precision (bf16/fp8) halves the traffic",
    "excess_traffic": "attention moves more DRAM bytes than its inputs and outputs need: a fused implementation "
                      "(sdpa, flash_attention_2) does not write the score matrix to memory",
    "low_occupancy": "few warps per SM can be resident for attention's kernels (registers, shared memory or block "
                     "size limit them): try another implementation, or more work per launch (batch × heads)",
    "many_small_kernels": "kernels shorter than their launch: fuse operators (torch.compile) or capture the step "
                          "in CUDA graphs so the CPU stops paying a launch per kernel",
}


_DOMINANT_SUGGEST = {
    "latency-bound": "neither the SMs nor memory are busy: too few warps hide latency; give the kernel more parallel "
                     "work (larger grid, batch × heads), or look at its stall reasons (ncu --section WarpStateStats)",
    "under-filled": "the grid fills less than one wave of the SMs: more blocks (split the work: split-K, smaller tiles, "
                    "more batch × heads per launch)",
    "memory-bound": "memory is the ceiling: move fewer bytes (fusion, lower precision, a fused attention kernel that keeps "
                    "the score matrix on chip)",
    "compute-bound": "the SMs are the ceiling: lower precision on tensor cores (bf16/fp8), or less work (a cheaper algorithm)",
    "balanced": "both units are about equally busy: the kernel is near its mix's limits; look at its sections for the detail",
}


def _pct(x) -> str:
    return f"{number(x, 3)} %"


def _ms(ns) -> str:
    return f"{number(ns / 1e6, 3)} ms"


def _us(ns) -> str:
    return f"{number(ns / 1e3, 3)} µs"


def _over_steps(values: pd.Series, stepped: bool = True) -> tuple[float, float, str]:
    """(lower bound, median, words): the 10th percentile over ≥ MIN_STEPS steps, else the minimum.
    ``stepped``: the rows are steps (else whole recordings, one per process and device)."""
    v = values.dropna().astype("float64")
    if not len(v):
        return np.nan, np.nan, ""
    if not stepped:
        return float(v.min()), float(v.median()), "no steps recorded: the whole recording, no spread over steps to test against"
    if len(v) >= MIN_STEPS:
        return float(v.quantile(0.1)), float(v.median()), f"median of {len(v)} steps, p10 {number(v.quantile(0.1), 3)}"
    words = "one step: no spread over steps to test against" if len(v) == 1 else f"{len(v)} steps, both pass"
    return float(v.min()), float(v.median()), words


def _step_groups(steps: pd.DataFrame):
    """(implementation, pid, device) groups of GPU-window rows; a group's rows outside
    every step range are left out when it has stepped rows."""
    gpu = steps[steps["basis"] == "gpu_window"]
    for key, g in gpu.groupby(["implementation", "pid", "device"], dropna=False, sort=True):
        stepped = g[g["step"].notna()]
        yield key, (stepped if len(stepped) else g)


def _where(key) -> str:
    impl, pid, device = key
    parts = [str(device)] if not pd.isna(device) else []
    if not pd.isna(pid):
        parts.append(f"process {pid}")
    if not pd.isna(impl) and impl not in ("unknown", None):
        parts.append(str(impl))
    return ", ".join(parts)


def _idle_findings(steps: pd.DataFrame) -> list[dict]:
    out = []
    for key, g in _step_groups(steps):
        window = g["window_ns"].astype("float64")
        stepped = bool(g["step"].notna().all())
        what = f"{'step' if stepped else 'recording'} ({_where(key)})"
        idle_lo, idle_mid, idle_words = _over_steps(100.0 * g["idle_ns"] / window, stepped)
        if not idle_lo >= IDLE_MIN_PCT:
            continue
        busy = number(float(g["gpu_busy_pct"].median()), 3)
        for cause, kind in (("launch_bound", "gpu_idle_launch_bound"), ("sync", "gpu_idle_sync"), ("host", "gpu_idle_host"),
                            ("other", "gpu_idle_other")):
            lo, mid, words = _over_steps(100.0 * g[f"idle_{cause}_ns"] / window, stepped)
            if not lo >= CAUSE_MIN_PCT:
                continue
            evidence = (f"GPU busy {busy} % of its window ({_ms(float(window.median()))}); idle {_pct(idle_mid)} of it, "
                        f"{_pct(mid)} {cause.replace('_', '-')} ({words}); measured from the kernel and launch timeline "
                        f"(the expected gain is all of that time: the most that removing the cause gives back)")
            if cause == "launch_bound":
                evidence += (f"; {int(g['kernels'].median())} kernels per step, median {_us(float(g['kernel_p50_ns'].median()))} "
                             f"each, CPU launch call median {_us(float(g['cpu_launch_cost_p50_ns'].median()))}")
            elif cause == "sync":
                calls = g["sync_calls"].dropna()
                if len(calls):
                    evidence += f"; {int(calls.median())} synchronizing calls per step"
            elif cause == "host":
                evidence += f"; the launching thread launched nothing for more than {_us(CPU_PACE_NS)} before the GPU's next work"
            else:
                travel = float(g["launch_travel_ns"].median()) if "launch_travel_ns" in g and g["launch_travel_ns"].notna().any() \
                    else float(LAUNCH_TRAVEL_NS)
                evidence += (f"; the work after these gaps had been launched and waited more than {_us(travel)} to start "
                             + ("(launch_travel_ns: each step's p90 from launch call end to start onto an idle stream, "
                                "median over steps)" if travel < LAUNCH_TRAVEL_NS else "(the ceiling: too few launches onto "
                                "an idle stream to measure it)"))
            gain = mid
            if cause == "other" and "idle_other_blocked_ns" in g and g["idle_other_blocked_ns"].fillna(0).gt(0).any():
                _, blocked, _ = _over_steps(100.0 * g["idle_other_blocked_ns"].fillna(0) / window, stepped)
                gain = max(mid - blocked, 0.0)
                evidence = evidence.replace("(the expected gain is all of that time: the most that removing the cause gives back)",
                                            "(the expected gain: that time, less what the program could not have used)")
                evidence += (f"; {_pct(blocked)} of the window the launching thread was itself blocked in a synchronizing "
                             "call while the GPU waited: both waited on something outside the recording (requests, another "
                             f"process, a peer), so no gain is claimed for it: expected gain {_pct(gain)}")
            out.append({"kind": kind, "subject": what, "implementation": key[0], "value": mid,
                        "unit": "% of the GPU window", "evidence": evidence, "suggestion": _SUGGEST[kind],
                        "expected_gain_pct": gain, "provenance": "measured", "_impact": gain})
        out += _capture_findings(g, key, what, window, stepped) + _communication_findings(g, key, what, window, stepped)
        # most kernels run from graph launches (a replay is one launch for many kernels): already captured, no such advice
        launches = g["launches"] if "launches" in g else pd.Series(0, index=g.index)
        replayed = (launches > 0) & (2 * launches < g["kernels"])
        # work that waited behind earlier work was launched ahead of the GPU: its launch cost the GPU nothing
        queued = pd.to_numeric(g["queued_kernels_pct"], errors="coerce") if "queued_kernels_pct" in g else pd.Series(np.nan, index=g.index)
        ahead = queued > QUEUED_MAX_PCT
        small = g[(g["kernels"] >= MANY_KERNELS) & (g["kernel_p50_ns"] < g["cpu_launch_cost_p50_ns"]) & ~replayed & ~ahead]
        if len(small) == len(g) and len(g):
            launched = "; whether the work queued behind earlier work is not known"
            if queued.notna().any():
                latency = float(pd.to_numeric(g["launch_latency_p50_ns"], errors="coerce").median())
                launched = (f"; {_pct(float(queued.median()))} of the work waited behind earlier work, the rest started "
                            f"{_us(latency)} (p50) after its launch call began")
            out.append({"kind": "many_small_kernels", "subject": what, "implementation": key[0],
                        "value": float(g["kernel_p50_ns"].median()), "unit": "ns median kernel duration",
                        "evidence": f"{int(g['kernels'].median())} kernels per step, median {_us(float(g['kernel_p50_ns'].median()))}: "
                                    f"shorter than the CPU's median launch call ({_us(float(g['cpu_launch_cost_p50_ns'].median()))})"
                                    f"{launched}; GPU idle {_pct(idle_mid)} of the window ({idle_words}); measured",
                        "suggestion": _SUGGEST["many_small_kernels"], "expected_gain_pct": np.nan, "provenance": "measured",
                        "_impact": idle_mid})
    return out


def _capture_findings(g: pd.DataFrame, key, what: str, window: pd.Series, stepped: bool) -> list[dict]:
    """Idle time while the process captured a CUDA/HIP graph: named, with no gain claimed (the GPU had nothing to run)."""
    if "idle_capture_ns" not in g:
        return []
    lo, mid, words = _over_steps(100.0 * g["idle_capture_ns"].fillna(0) / window, stepped)
    if not lo >= CAUSE_MIN_PCT:
        return []
    return [{"kind": "gpu_idle_capture", "subject": what, "implementation": key[0], "value": mid,
             "unit": "% of the GPU window", "suggestion": _SUGGEST["gpu_idle_capture"], "expected_gain_pct": np.nan,
             "evidence": (f"the GPU idle {_pct(mid)} of the window ({words}) while the process captured a graph "
                          "(…StreamBeginCapture … …StreamEndCapture, …GraphInstantiate): the captured work was recorded, "
                          "not run, so this is no idle time to win back in a step; measured from the runtime calls"),
             "provenance": "measured", "_impact": 0.0}]


def _communication_findings(g: pd.DataFrame, key, what: str, window: pd.Series, stepped: bool) -> list[dict]:
    """Communication that no compute kernel of the device overlapped, from :data:`CAUSE_MIN_PCT` of the window: the
    expected gain is all of it (the most that overlapping it with compute can give back)."""
    if "communication_exposed_ns" not in g or not g["communication_exposed_ns"].fillna(0).gt(0).any():
        return []
    lo, mid, words = _over_steps(100.0 * g["communication_exposed_ns"].fillna(0) / window, stepped)
    if not lo >= CAUSE_MIN_PCT:
        return []
    total, exposed = float(g["communication_ns"].median()), float(g["communication_exposed_ns"].median())
    return [{"kind": "exposed_communication", "subject": what, "implementation": key[0], "value": mid,
             "unit": "% of the GPU window", "suggestion": _SUGGEST["exposed_communication"], "expected_gain_pct": mid,
             "evidence": (f"communication kernels {_ms(total)} per step, {_ms(exposed)} of it with no compute kernel of the "
                          f"device running beside it: {_pct(mid)} of the window ({words}); measured from the kernel timeline "
                          "(communication by kernel name: docs/report-format.md § Communication; the expected gain is all "
                          "of the exposed time, the most that overlapping gives back)"),
             "provenance": "measured", "_impact": mid}]


def _step_time(steps: pd.DataFrame) -> dict:
    """Median step time (ns) per implementation: the GPU window, else the CPU step."""
    times = {}
    for impl, g in steps.groupby("implementation", dropna=False):
        for basis in ("gpu_window", "cpu_step"):
            rows = g[(g["basis"] == basis) & g["step"].notna()]
            rows = rows if len(rows) else g[g["basis"] == basis]
            if len(rows) and rows["window_ns"].notna().any():
                # several devices or processes: the step lasts as long as its longest window
                times[impl] = float(rows.groupby("step", dropna=False)["window_ns"].max().median())
                break
    return times


def _attention_findings(steps: pd.DataFrame) -> list[dict]:
    out = []
    for (impl, basis), g in steps.groupby(["implementation", "basis"], dropna=False, sort=True):
        if basis == "kernel_sum":
            rows = g
        else:
            rows = g[g["step"].notna()] if g["step"].notna().any() else g
        lo, mid, words = _over_steps(rows["attention_share_pct"])
        if not lo >= ATTENTION_DOMINANT_PCT:
            continue
        of = {"gpu_window": "GPU busy time", "cpu_step": "the step's wall time (CPU run)", "kernel_sum": "replayed kernel time (ncu)"}[basis]
        out.append({"kind": "attention_dominant", "subject": f"attention ({impl})", "implementation": impl, "value": mid,
                    "unit": f"% of {of}", "evidence": f"attention {_pct(mid)} of {of} ({words}); measured",
                    "suggestion": _dominant_suggestion(impl), "expected_gain_pct": np.nan, "provenance": "measured",
                    "_impact": mid})
    return out


def _dominant_suggestion(running) -> str:
    """What to try where attention dominates: the other implementations than the one that ran (never that one)."""
    others = [i for i in ("eager", "sdpa", "flash_attention_2", "flex") if i != running]
    if running in ("flash_attention_2", "flash_attention_3", "flashinfer", "tensorrt_llm"):
        others = [i for i in others if i not in ("eager",)]  # a fused kernel already ran: eager is no step forward
    return (f"attention is where the time goes and {running or 'an unknown implementation'} ran: compare it with "
            f"{', '.join(others)} (headcount profile --impl {','.join(others)}) and look at the traffic and occupancy findings")


def _per_step_attention(steps: pd.DataFrame, implementation) -> pd.Series:
    """Attention time of each step of one implementation (ns; summed over its processes and devices): GPU busy time,
    or on a CPU run its CPU time (``attention_cpu_ns``; only ever compared with other runs of the same kind)."""
    time = steps["attention_gpu_ns"]
    if "attention_cpu_ns" in steps:
        time = time.fillna(steps["attention_cpu_ns"])
    rows = (steps["implementation"] == implementation) & steps["step"].notna() & time.notna()
    return time[rows].groupby(steps.loc[rows, "step"]).sum()


def _implementation_findings(layers: pd.DataFrame, steps: pd.DataFrame, step_time: dict) -> list[dict]:
    if not len(layers) or layers["implementation"].nunique() < 2:
        return []
    per_step = attention_per_step(layers.assign(run_id=0)).dropna(subset=["attention_ns_per_step"])
    per_step = per_step[per_step["attention_ns_per_step"] > 0]
    if len(per_step) < 2:
        return []
    fastest = per_step.loc[per_step["attention_ns_per_step"].idxmin()]
    fast_steps = _per_step_attention(steps, fastest["implementation"])
    work = {impl: work_signature(g) for impl, g in layers.groupby("implementation", sort=False)}
    out = []
    for row in per_step.itertuples(index=False):
        if row.implementation == fastest["implementation"] or work.get(row.implementation) != work.get(fastest["implementation"]):
            continue  # like with like: the same layers and shapes, else no speed-up
        speedup = row.attention_ns_per_step / fastest["attention_ns_per_step"]
        slow_steps = _per_step_attention(steps, row.implementation)
        # the difference holds against the spread over steps: the slower one's p10 above the faster one's p90
        if speedup < SLOWER_MIN or min(len(slow_steps), len(fast_steps)) < MIN_STEPS:
            continue
        slow_p10, fast_p90 = float(slow_steps.quantile(0.1)), float(fast_steps.quantile(0.9))
        if not slow_p10 > fast_p90:
            continue
        saved = row.attention_ns_per_step - fastest["attention_ns_per_step"]
        step = step_time.get(row.implementation)
        gain = 100.0 * saved / step if step else np.nan
        basis = layers.loc[layers["implementation"] == row.implementation, "duration_basis"].dropna()
        out.append({
            "kind": "slow_implementation", "subject": f"{row.implementation} attention", "implementation": row.implementation,
            "value": speedup, "unit": f"× ({fastest['implementation']} faster per step)",
            "evidence": (f"{row.implementation} attention {_ms(row.attention_ns_per_step)} per step, {fastest['implementation']} "
                         f"{_ms(fastest['attention_ns_per_step'])} ({row.calls_per_step:g} calls per step each): "
                         f"{number(speedup, 3)}× (compare's speed-up); over the steps, {row.implementation}'s p10 "
                         f"({_ms(slow_p10)}) is above {fastest['implementation']}'s p90 ({_ms(fast_p90)}), {len(slow_steps)} and "
                         f"{len(fast_steps)} steps; measured ({basis.iloc[0] if len(basis) else 'time'})"
                         + (f"; the step takes {_ms(step)}" if step else "")),
            "suggestion": (f"use {fastest['implementation']}: {number(speedup, 3)}× faster per step in this report "
                           f"(from_pretrained(..., attn_implementation='{fastest['implementation']}'), or "
                           f"headcount profile --impl {fastest['implementation']} to check it on your model)"),
            "expected_gain_pct": gain, "provenance": "measured", "_impact": gain if not np.isnan(gain) else 0.0,
        })
    return out


def _outlier_findings(layers: pd.DataFrame, heads: pd.DataFrame, step_time: dict) -> list[dict]:
    out = []
    for (impl, phase), g in layers.groupby(["implementation", "phase"], sort=True, dropna=False):
        out += _outliers(g, "layer_name", "layer_outlier", f"{phase}, {impl}", impl, step_time, "layer")
    if not len(heads) or "provenance" not in heads:
        return out
    measured = heads[heads["provenance"] == "measured"]
    for (impl, phase, layer), g in measured.groupby(["implementation", "phase", "layer_name"], sort=True, dropna=False):
        out += _outliers(g, "head", "head_outlier", f"{layer}, {phase}, {impl}", impl, step_time, "head")
    return out


def _outliers(rows: pd.DataFrame, key: str, kind: str, where: str, impl, step_time: dict, what: str) -> list[dict]:
    verdicts = spread.standout(rows, key, min_calls=spread.LAYER_MIN_CALLS if what == "layer" else spread.VERDICT_MIN_CALLS)
    hot = verdicts[(verdicts["verdict"] == "hotter") & (verdicts["vs_median_pct"] >= OUTLIER_MIN_PCT)] if len(verdicts) else verdicts
    out = []
    for v in hot.to_dict("records"):
        row = rows[rows[key] == v[key]].iloc[0]
        ref = rows[rows[key] == v["reference"]].iloc[0]
        extra = row["duration_per_call_p50_ns"] - ref["duration_per_call_p50_ns"]
        steps = row["steps"] if not pd.isna(row.get("steps")) else 1
        step = step_time.get(impl)
        gain = 100.0 * extra * row["calls"] / steps / step if step else np.nan
        name = f"head {int(v[key])}" if what == "head" else str(v[key])
        ref_name = f"head {int(v['reference'])}" if what == "head" else str(v["reference"])
        out.append({
            "kind": kind, "subject": f"{name} ({where})", "implementation": impl, "value": v["vs_median_pct"],
            "unit": f"% time per call over the median {what}",
            "evidence": (f"{name}: {_us(row['duration_per_call_p50_ns'])} per call (p10–p90 {_us(row['duration_per_call_p10_ns'])}"
                         f"–{_us(row['duration_per_call_p90_ns'])}, {int(row['calls'])} calls) against the median {what} "
                         f"{ref_name}'s {_us(ref['duration_per_call_p50_ns'])} (p90 {_us(ref['duration_per_call_p90_ns'])}): "
                         + (f"slower than the other heads of its calls beyond chance (rank test, adjusted p = {v['p']:.1g}; calls "
                            f"spread ±{number(v['noise_pct'], 2)} %)" if pd.notna(v.get("p")) else
                            f"beyond the spread (±{number(v['noise_pct'], 2)} %)")
                         + f"; {row.get('duration_provenance') or 'measured'}"),
            "suggestion": _SUGGEST[kind], "expected_gain_pct": gain, "provenance": row.get("duration_provenance") or "measured",
            "_impact": gain if not np.isnan(gain) else 0.0,
        })
    return out


def _counter_findings(layers: pd.DataFrame) -> list[dict]:
    """Hardware-counter findings of attention's layers, one per implementation and
    phase (naming the layers concerned): only from measured or sampled figures."""
    out = []
    for (impl, phase), g in layers.groupby(["implementation", "phase"], sort=True, dropna=False):
        where = f"attention ({phase}, {impl})"
        n = len(g)
        prov = g["dram_bytes_provenance"] if "dram_bytes_provenance" in g else pd.Series(None, index=g.index)
        if "excess_traffic" in g:
            hit = g[(g["excess_traffic"] >= EXCESS_MIN) & prov.isin(["measured", "sampled"])]
            if len(hit):
                out.append({"kind": "excess_traffic", "subject": where, "implementation": impl, "value": float(hit["excess_traffic"].median()),
                            "unit": "× the analytic minimum DRAM bytes (median of the layers concerned)",
                            "evidence": f"{len(hit)} of {n} layers ({_names(hit)}) move {number(hit['excess_traffic'].min(), 3)}–"
                                        f"{number(hit['excess_traffic'].max(), 3)}× the DRAM bytes their inputs and outputs need "
                                        f"(bytes {'/'.join(sorted(set(prov[hit.index])))}, minimum analytic)",
                            "suggestion": _SUGGEST["excess_traffic"], "expected_gain_pct": np.nan,
                            "provenance": "/".join(sorted(set(prov[hit.index]))), "_impact": 0.0})
        if "roofline_class" in g and "bandwidth_provenance" in g:
            hit = g[(g["roofline_class"] == "memory-bound") & g["bandwidth_provenance"].isin(["measured", "sampled"])]
            if len(hit):
                out.append({"kind": "attention_memory_bound", "subject": where, "implementation": impl,
                            "value": float(hit["bandwidth_gbps"].median()), "unit": "GB/s (median of the layers concerned)",
                            "evidence": f"{len(hit)} of {n} layers ({_names(hit)}) at {number(hit['bandwidth_gbps'].median(), 3)} GB/s "
                                        f"({'/'.join(sorted(set(hit['bandwidth_provenance'])))}), "
                                        f"{number(_median(hit, 'peak_bandwidth_pct'), 2)} % of the device's peak bandwidth "
                                        f"(its FLOP/s {number(_median(hit, 'peak_flop_pct'), 2)} % of peak, analytic FLOPs)",
                            "suggestion": _SUGGEST["attention_memory_bound"], "expected_gain_pct": np.nan,
                            "provenance": "/".join(sorted(set(hit["bandwidth_provenance"]))), "_impact": 0.0})
        if "achieved_occupancy_pct" in g and "achieved_occupancy_provenance" in g:
            # theoretical occupancy alone is no finding: fused attention kernels keep few, large blocks by design
            hit = g[(g["achieved_occupancy_pct"] < LOW_OCCUPANCY_PCT) & g["achieved_occupancy_provenance"].isin(["measured", "sampled"])]
            if len(hit):
                out.append({"kind": "low_occupancy", "subject": where, "implementation": impl,
                            "value": float(hit["achieved_occupancy_pct"].median()), "unit": "% of the warps an SM holds (achieved)",
                            "evidence": f"{len(hit)} of {n} layers ({_names(hit)}): achieved occupancy "
                                        f"{number(hit['achieved_occupancy_pct'].min(), 3)}–{number(hit['achieved_occupancy_pct'].max(), 3)} % "
                                        f"({'/'.join(sorted(set(hit['achieved_occupancy_provenance'])))}), time-weighted over the layers' kernels",
                            "suggestion": _SUGGEST["low_occupancy"], "expected_gain_pct": np.nan,
                            "provenance": "/".join(sorted(set(hit["achieved_occupancy_provenance"]))), "_impact": 0.0})
    return out


def _median(rows: pd.DataFrame, column: str) -> float:
    """The median of ``column`` over ``rows`` (NaN where the table has no such column)."""
    return float(rows[column].median()) if column in rows else float("nan")


def _names(rows: pd.DataFrame, most: int = 4) -> str:
    names = [str(n) for n in rows["layer_name"]]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _dominant_kernel_findings(steps: pd.DataFrame, kernels: pd.DataFrame | None) -> list[dict]:
    """ncu reports (``kernel_sum`` steps): the kernel that takes :data:`DOMINANT_KERNEL_PCT` or more of the replayed
    time, with its limiter (ncu's Speed of Light rule, :mod:`headcount.derive.bound`) and the figures it rests on."""
    if kernels is None or not len(kernels) or not (steps.get("basis", pd.Series(dtype=object)) == "kernel_sum").any():
        return []
    from headcount.derive import bound

    d = pd.to_numeric(kernels["duration_ns"], errors="coerce")
    total = float(d.sum(min_count=1)) if d.notna().any() else np.nan
    if not total > 0:
        return []
    per = d.groupby(kernels["name"].astype(object)).sum().sort_values(ascending=False)  # a kernel without a name: none
    if not len(per):
        return []
    name, share = str(per.index[0]), 100.0 * float(per.iloc[0]) / total
    if share < DOMINANT_KERNEL_PCT:
        return []
    mine = kernels[(kernels["name"].astype(object) == per.index[0]).to_numpy(dtype=bool)]

    def med(col):
        return float(pd.to_numeric(mine[col], errors="coerce").astype("float64").median()) if col in mine else float("nan")

    verdicts = mine["bound"].dropna() if "bound" in mine else pd.Series(dtype=object)
    limiter = verdicts.mode().iloc[0] if len(verdicts) else None
    figures = (bound.evidence(med("sm_throughput_pct"), med("memory_throughput_pct"), med("dram_throughput_pct"), med("waves_per_sm"))
               if limiter else "no Speed of Light counters in the report (sm__throughput, gpu__compute_memory_throughput): "
                               "record with ncu --section SpeedOfLight")
    shown = shown_names.shown(name)
    return [{"kind": "dominant_kernel", "subject": f"kernel {shown}", "implementation": None, "value": share,
             "unit": "% of replayed kernel time", "expected_gain_pct": np.nan, "provenance": "measured", "_impact": share,
             "evidence": (f"{shown}: {len(mine)} of {len(kernels)} kernels, {_ms(float(per.iloc[0]))} of {_ms(total)} replayed "
                          f"({_pct(share)}); " + (f"{limiter} by ncu's Speed of Light rule: " if limiter else "") + figures),
             "suggestion": _DOMINANT_SUGGEST.get(limiter, "look at this kernel first: ncu --set full -k regex:<name> shows "
                                                          "its sections and ncu's own rule results")}]


def findings(steps: pd.DataFrame, layers: pd.DataFrame, heads: pd.DataFrame,
             kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """The findings of one run (see the module docstring), ranked.

    Args:
        steps: the run's ``steps`` table (:mod:`headcount.derive.steps`).
        layers, heads: the run's ``layers`` and ``heads`` tables.
        kernels: its kernels table (read for ncu reports: the kernel that dominates).

    Returns:
        :data:`COLUMNS` (no ``run_id``); no row when nothing stands out.
    """
    steps = steps if steps is not None and len(steps) else pd.DataFrame(columns=["implementation", "pid", "device", "step", "basis"])
    layers = layers if layers is not None else pd.DataFrame()
    heads = heads if heads is not None else pd.DataFrame()
    step_time = _step_time(steps) if len(steps) else {}
    rows = _idle_findings(steps) + _attention_findings(steps) + _dominant_kernel_findings(steps, kernels)
    if len(layers) and "duration_per_call_p50_ns" in layers:
        rows += _implementation_findings(layers, steps, step_time) + _outlier_findings(layers, heads, step_time) + _counter_findings(layers)
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    table = pd.DataFrame(rows)
    table["_order"] = table["kind"].map({k: i for i, k in enumerate(KINDS)})
    table = table.sort_values(["expected_gain_pct", "_impact", "_order"], ascending=[False, False, True], na_position="last")
    table["rank"] = np.arange(1, len(table) + 1)
    return table.reindex(columns=COLUMNS).reset_index(drop=True)
