"""Bottlenecks in words, for one run at a time (the console and the HTML page):
the run's opening — how busy the GPU was and its ranked findings
(:func:`step_lines`, :func:`finding_lines`, from the ``steps`` and ``findings``
tables) — and the costliest and outlying layers and heads.

Every sentence names whether its figure is per call (median and p10–p90
over the calls) or a total over the profiled steps, and a layer or head is
called hotter than the others only where :func:`headcount.derive.spread.standout`
says the difference holds against the spread; otherwise the sentence says
the rows are within noise and how large the noise is.
"""

from __future__ import annotations

import math

import pandas as pd

from headcount.common import signals
from headcount.common.numbers import missing, number, with_spread
from headcount.derive import spread

_GROUP = ["implementation", "phase"]


def _steps(rows: pd.DataFrame) -> str:
    steps = rows["steps"].dropna() if "steps" in rows else pd.Series(dtype=float)
    return f"over {int(steps.max())} profiled step{'s' if steps.max() != 1 else ''}" if len(steps) else "over the profile"


def per_call_text(row) -> str:
    """``"2,300 (2,100–2,900) µs per call, median (p10–p90) of 3 calls"``, or the mean of one call."""
    calls = getattr(row, "calls", None)
    n = "" if calls is None or pd.isna(calls) else f" of {int(calls)} call{'s' if calls != 1 else ''}"
    p50 = getattr(row, "duration_per_call_p50_ns", None)
    if p50 is not None and not pd.isna(p50):
        text = with_spread(p50, row.duration_per_call_p10_ns, row.duration_per_call_p90_ns, 1e-3)
        return f"{text} µs per call, median (p10–p90){n}"
    mean = getattr(row, "duration_per_call_ns", None)
    if mean is not None and not pd.isna(mean):
        return f"{number(mean / 1e3)} µs per call{n} (no spread: one call)"
    return "time per call unknown"


def shares_text(r) -> str:
    """A layer row's shares, each named for what it is of: the phase's attention time, the step, GPU busy time."""
    said = [f"{number(getattr(r, 'share_of_phase_pct', float('nan')), 2)} % of the phase's attention time"]
    for column, what in (("share_of_step_pct", "of the step"), ("share_of_gpu_busy_pct", "of GPU busy time")):
        value = getattr(r, column, None)
        if value is not None and not pd.isna(value):
            said.append(f"{number(value, 2)} % {what}")
    return ", ".join(said)


def bound_evidence(r) -> str:
    """What a layer row's ``roofline_class`` rests on: its achieved fractions of the two ceilings, and its waves."""
    said = [f"{number(getattr(r, 'peak_bandwidth_pct', float('nan')), 2)} % of peak bandwidth",
            f"{number(getattr(r, 'peak_flop_pct', float('nan')), 2)} % of peak FLOP/s"]
    waves = getattr(r, "waves_per_sm", None)
    if waves is not None and not pd.isna(waves):
        said.append(f"{number(waves, 2)} waves of CTAs per SM")
    return ", ".join(said)


def layer_lines(layers: pd.DataFrame, top: int = 5) -> list[str]:
    """The costliest layer rows of one run (by total time)."""
    lines = []
    for r in layers.sort_values("duration_ns", ascending=False).head(top).itertuples(index=False):
        words = [f"{r.layer_name} ({r.phase}, {r.implementation}): {per_call_text(r)}; "
                 f"{number(r.duration_ns / 1e6)} ms total {_steps(layers)} "
                 f"({shares_text(r)})"]
        bound = getattr(r, "roofline_class", None)
        if isinstance(bound, str) and bound:
            words.append(f"{bound} ({bound_evidence(r)})")
        excess = getattr(r, "excess_traffic", None)
        if excess is not None and not pd.isna(excess):
            words.append(f"{number(excess, 2)}× the minimum DRAM traffic ({r.dram_bytes_provenance})")
        kpc = getattr(r, "kernels_per_call", None)
        if kpc is not None and not pd.isna(kpc):
            words.append(f"{number(kpc, 2)} kernels per call")
        lines.append(", ".join(words))
    return lines


def layer_noise_lines(layers: pd.DataFrame) -> list[str]:
    """Per implementation and phase of one run: which layers stand out from
    the median layer beyond the spread, or that they are within noise."""
    lines = []
    # several models' layers (``CLIPTextModel_0.layer.3``: an untagged recording of a pipeline) are compared within their model
    model = layers["layer_name"].astype(str).str.extract(r"^(.+)\.layer\.\d+$", expand=False).fillna("")
    for (impl, phase, of), g in layers.assign(_model=model).groupby([*_GROUP, "_model"], sort=True):
        lines += _standout_lines(g, "layer_name", f"{phase}, {impl}" + (f", {of}" if of else ""), "layer", "layers")
    return lines


def head_lines(heads: pd.DataFrame, top: int = 5) -> list[str]:
    """For heads measured on their own (head mode) of one run: the heads that
    stand out from their layer's median head beyond the spread and beyond
    chance (at most ``top``, largest difference first), and per
    implementation and phase how many layers have their heads within noise,
    with the steps it takes to single a head out where the calls are too few."""
    measured = heads[heads["provenance"] == "measured"] if len(heads) else heads
    if not len(measured):
        return []
    tested = int(measured["hotter_p"].notna().sum()) * 2 if "hotter_p" in measured else 0  # the family the p-values were adjusted over
    found, quiet = [], {}
    for (impl, phase, layer), g in measured.groupby([*_GROUP, "layer_name"], sort=True):
        verdicts = spread.standout(g, "head")
        if not len(verdicts):
            continue
        hot = verdicts[verdicts["verdict"].isin(["hotter", "cooler"])]
        for v in hot.itertuples(index=False):
            why = (f"{'slower' if v.verdict == 'hotter' else 'faster'} than the other heads of its calls beyond chance "
                   f"(p = {v.p:.1g}, adjusted for {tested} tests; calls spread ±{number(v.noise_pct, 2)} %)") if pd.notna(v.p) else \
                f"beyond the spread over calls (±{number(v.noise_pct, 2)} %)"
            found.append((abs(v.vs_median_pct), f"{layer} head {int(v.head)} ({phase}, {impl}): {v.verdict}, "
                          f"{v.vs_median_pct:+.0f} % time per call against the layer's median head (head {int(v.reference)}), {why}"))
        key = (impl, phase)
        n_quiet, n_all, widest, unknown, why, short = quiet.get(key, (0, 0, 0.0, 0, set(), None))
        if (verdicts["verdict"] == "unknown").all():
            unknown += 1
            why |= set(verdicts["why"].dropna())
        elif not len(hot):
            n_quiet += 1
            widest = max(widest, float(verdicts["noise_pct"].iloc[0]) if pd.notna(verdicts["noise_pct"].iloc[0]) else 0.0)
            needed = _calls_to_single_out(len(g), tested)
            calls = int(g["calls"].min())
            if tested and needed and calls < needed:
                per_step = calls / g["steps"].max() if "steps" in g and pd.notna(g["steps"].max()) and g["steps"].max() > 0 else 1.0
                short = (calls, max(needed, short[1] if short else 0), max(math.ceil(needed / per_step), short[2] if short else 0))
        quiet[key] = (n_quiet, n_all + 1, widest, unknown, why, short)
    lines = [text for _, text in sorted(found, key=lambda t: -t[0])[:top]]
    for (impl, phase), (n_quiet, n_all, widest, unknown, why, short) in sorted(quiet.items()):
        if unknown == n_all and "order" in why:
            lines.append(f"{phase}, {impl}: heads not compared (every call computed them in the same order, so a head's time "
                         "cannot be told from its place's; profile in eager head mode, which draws each call's order)")
        elif unknown == n_all:
            lines.append(f"{phase}, {impl}: heads not compared (fewer than {spread.VERDICT_MIN_CALLS} calls per head; profile more steps)")
        elif n_quiet:
            lines.append(f"{phase}, {impl}: heads within noise in {n_quiet} of {n_all} layers "
                         f"(±{number(widest, 2)} % per call at most, the median head's p10–p90 half-width)"
                         + (f"; {short[0]} calls per head cannot single one out of {tested // 2} beyond chance, "
                            f"{short[1]} can: profile {short[2]} steps or more" if short else ""))
    return lines


def _calls_to_single_out(heads: int, tests: int) -> int | None:
    """The fewest calls with which a head that is the slowest of its ``heads`` in every call
    passes the rank test after adjustment over ``tests`` tests (None when it cannot)."""
    if heads < 2 or not tests:
        return None
    return max(spread.VERDICT_MIN_CALLS, math.ceil(math.log(tests / spread.ALPHA) / math.log(heads)))


STANDOUT_LINES = 5
"""At most this many rows that stand out are named per group, largest difference first; the rest are counted."""

SAME_WORK_MAX_NOISE_PCT = 100.0
"""A row whose calls spread more than this (p10–p90 half-width over the median, %) holds more than one kind of
work (calls of several models or places under one layer name): its spread is no noise to compare against."""


def _standout_lines(rows: pd.DataFrame, key: str, where: str, what: str, whats: str) -> list[str]:
    least = spread.LAYER_MIN_CALLS if what == "layer" else spread.VERDICT_MIN_CALLS
    verdicts = spread.standout(rows, key, min_calls=least)
    if not len(verdicts):
        return []
    if (verdicts["verdict"] == "unknown").all():
        return [f"{where}: {whats} not compared (fewer than {least} calls each; profile more steps)"]
    hot = verdicts[verdicts["verdict"] == "hotter"]
    noise = float(verdicts["noise_pct"].iloc[0])
    if not len(hot) and noise > SAME_WORK_MAX_NOISE_PCT:  # the calls of one row are not one kind of work
        ordered = "provenance" in rows and (rows["provenance"] == "call order").any()
        return [f"{where}: {whats} not compared: the median {what}'s calls spread ±{number(noise, 2)} % per call, more than "
                f"the work itself" + ("; its calls were numbered by call order (no module ranges), so one row may hold "
                                      "different work (record with_modules=True)" if ordered else "")]
    if not len(hot):
        widest = float(verdicts["widest_pct"].iloc[0]) if "widest_pct" in verdicts else float("nan")
        seen = f", the widest ±{number(widest, 2)} %" if pd.notna(widest) and widest > noise else ""
        return [f"{where}: {whats} within noise (the median {what}'s calls spread ±{number(noise, 2)} % per call{seen})"]
    hot = hot.sort_values("vs_median_pct", ascending=False, key=abs)
    lines = [f"{where}: {v[key]} stands out, {v['vs_median_pct']:+.0f} % time per call against the median {what} "
             f"({v['reference']}), beyond the spread (±{number(v['noise_pct'], 2)} %)" for v in hot.head(STANDOUT_LINES).to_dict("records")]
    if len(hot) > STANDOUT_LINES:
        rest = hot.iloc[STANDOUT_LINES:]
        lines.append(f"{where}: {len(rest)} more {whats} beyond the spread, by {number(float(rest['vs_median_pct'].abs().max()), 2)} % "
                     "or less (the layers table has them all)")
    return lines


def module_lines(layers: pd.DataFrame) -> list[str]:
    """Per implementation and phase of one run whose recording names the attention modules: the whole
    modules' time per step beside the core's, the GPU operations per call, and their share of GPU busy time."""
    if "module_duration_ns" not in layers or not layers["module_duration_ns"].notna().any():
        return []
    lines = []
    for (impl, phase), g in layers[layers["module_duration_ns"].notna()].groupby(_GROUP, sort=True):
        steps = g["steps"].max() if g["steps"].notna().any() and g["steps"].max() > 0 else 1
        module, core = g["module_duration_ns"].sum() / steps, g["duration_ns"].sum() / steps
        busy = g["module_kernel_busy_ns"].sum(min_count=1) / steps
        gpu_busy = (g["duration_ns"] / (g["share_of_gpu_busy_pct"] / 100.0)).median() / steps if "share_of_gpu_busy_pct" in g else float("nan")
        busy_text = (f", {number(100.0 * busy / gpu_busy, 2)} % of GPU busy time"
                     if pd.notna(busy) and pd.notna(gpu_busy) and gpu_busy > 0 else "")
        per_call = g["module_kernel_count"].sum() / g["module_calls"].sum()
        span = g["module_gpu_span_ns"].sum(min_count=1) / steps if "module_gpu_span_ns" in g else float("nan")
        span_text = f", spanning {number(span / 1e6)} ms first start to last end" if pd.notna(span) else ""
        lines.append(f"{phase}, {impl}: the whole attention modules take {number(module / 1e6)} ms per step "
                     f"({number(per_call, 3)} GPU operations per call{busy_text}{span_text}); the attention core {number(core / 1e6)} ms "
                     f"of it ({number(100.0 * core / module, 2)} %), the rest is the modules' other work (projections and the like); "
                     f"measured, {len(g)} layers with their module recorded")
    return lines


SPLIT_TOLERANCE_PCT = 10.0  # heads that sum to their layer within this are said to add up


def split_lines(layers: pd.DataFrame) -> list[str]:
    """Head mode, per implementation and phase of one run: what the split costs and where a layer call's
    time went besides its heads (:func:`headcount.derive.aggregate._with_split`) — the heads' share of the
    layers' time (and of their measured or sampled bytes), the time per layer call that no head holds, as
    glue (work in the layer outside every head) and gaps (launch gaps, host time between heads), and the
    layer time against a paired layer-mode profile where one was made. Nothing is left unsaid: a row whose
    heads do not add up to their layer within :data:`SPLIT_TOLERANCE_PCT` says by how much."""
    if "heads_duration_ns" not in layers or not layers["heads_duration_ns"].notna().any():
        return []
    lines = []
    for (impl, phase), g in layers[layers["heads_duration_ns"].notna()].groupby(_GROUP, sort=True):
        layer_ns, heads_ns, calls = g["duration_ns"].sum(), g["heads_duration_ns"].sum(), g["calls"].sum()
        share = 100.0 * heads_ns / layer_ns if layer_ns > 0 else float("nan")
        adds_up = abs(share - 100.0) <= SPLIT_TOLERANCE_PCT
        text = f"head mode, {phase}, {impl}: the heads hold {number(share, 2)} % of their layers' time"
        apart = [f"{number(abs(100.0 - share), 2)} % of the time"]
        if "heads_bytes_share_of_layer_pct" in g and g["heads_bytes_share_of_layer_pct"].notna().any():
            known = g["heads_bytes_share_of_layer_pct"].notna()
            bytes_share = 100.0 * g["heads_dram_bytes"][known].sum() / g["dram_bytes"][known].sum()
            text += f" and {number(bytes_share, 2)} % of their {g['dram_bytes_provenance'].iloc[0]} DRAM bytes"
            adds_up = adds_up and abs(bytes_share - 100.0) <= SPLIT_TOLERANCE_PCT
            apart.append(f"{number(abs(100.0 - bytes_share), 2)} % of the bytes")
        text += (" (they add up, within 10 %)" if adds_up else f" (they do not add up within 10 %: {' and '.join(apart)} apart)")
        overhead = g["split_overhead_ns"].sum() / calls
        text += f"; {number(overhead / 1e3)} µs per layer call belongs to no head"
        if "split_glue_ns" in g and g["split_glue_ns"].notna().any():
            text += (f" ({number(g['split_glue_ns'].sum() / calls / 1e3)} µs glue: work in the layer outside every head; "
                     f"{number(g['split_gaps_ns'].sum() / calls / 1e3)} µs gaps between heads)")
        elif (g["duration_basis"] == "cpu_range").all():
            text += " (a CPU run: host time between the heads, operators and Python alike)"
        if "split_cost_x" in g and g["split_cost_x"].notna().any():
            ref = g["layer_mode_duration_per_call_ns"]
            cost = g["duration_per_call_p50_ns"].where(g["duration_per_call_p50_ns"].notna(), g["duration_per_call_ns"]).sum() / ref.sum()
            text += (f"; a layer call takes {number(cost, 2)}× its time in layer mode ({number(ref.median() / 1e3)} µs there "
                     "per call, paired layer-mode profile): the split's cost")
        else:
            text += "; the split's cost against layer mode is not measured here (headcount profile --mode head pairs a layer-mode profile)"
        lines.append(text)
    return lines


def bottlenecks(layers: pd.DataFrame, heads: pd.DataFrame, top: int = 5) -> list[str]:
    """The bottlenecks of one run in words: the costliest layers, the whole attention modules beside their core
    where recorded, whether any layer stands out, then heads measured on their own."""
    return layer_lines(layers, top) + module_lines(layers) + split_lines(layers) + layer_noise_lines(layers) + head_lines(heads, top)


def run_info(runs: pd.DataFrame | None, run_id) -> dict:
    """The ``runs`` row of ``run_id`` as a dict (its first implementation's; empty when absent)."""
    if runs is None or not len(runs) or "run_id" not in runs:
        return {}
    rows = runs[runs["run_id"] == run_id]
    return rows.iloc[0].to_dict() if len(rows) else {}


def run_named(info: dict) -> str | None:
    """What a run came from, in a few words: its file's name and its rank (``rank0.json.gz, rank 0 of 2``;
    a process of a recording of several: ``run.sqlite, process 144``); ``None`` where the run says neither."""
    import os

    path = info.get("path")
    facts = [os.path.basename(str(path).rstrip("/")) or str(path)] if not missing(path) else []
    rank, world = info.get("rank"), info.get("world_size")
    if not missing(rank):
        facts.append(f"rank {int(rank)}" + (f" of {int(world)}" if not missing(world) else ""))
    elif facts and not missing(info.get("pid")) and str(info.get("run_id", "")).endswith(f"-pid{info['pid']}"):
        facts.append(f"process {info['pid']}")
    return ", ".join(facts) or None


def run_heading(run_id, info: dict) -> str:
    """``Run <id> (<file>, rank R of W): <model>, batch B, seq S, <dtype>, <mode> mode[, torch.compile <mode>], on <device>``
    (what the run says of itself: :func:`run_named`, then what ran)."""
    named = run_named({**info, "run_id": run_id})
    facts = [str(info["model"])] if not missing(info.get("model")) else [f"{info['source']} recording"] if not missing(info.get("source")) else []
    shape = ", ".join(f"{label} {info[k]:.0f}" if isinstance(info.get(k), (int, float)) else f"{label} {info[k]}"
                      for k, label in (("batch", "batch"), ("seq", "seq")) if not missing(info.get(k)))
    if shape:
        facts.append(shape)
    for k, fmt in (("dtype", "{}"), ("mode", "{} mode"), ("compile_mode", "torch.compile {}"), ("device_name", "on {}")):
        if not missing(info.get(k)):
            facts.append(fmt.format(info[k]))
    return f"Run {run_id}" + (f" ({named})" if named else "") + (": " + ", ".join(facts) if facts else "")


# ---------------------------------------------------------------- triage: the opening lines of a run
def _ms(ns) -> str:
    return f"{number(ns / 1e6)} ms"


def step_lines(steps: pd.DataFrame | None) -> list[str]:
    """How busy the GPU was and where its idle time went, one line per
    implementation × process × device of one run (medians over its steps;
    rows outside every step range only where there are no steps)."""
    if steps is None or not len(steps):
        return []
    lines = []
    for (impl, pid, device, basis), g in steps.groupby(["implementation", "pid", "device", "basis"], dropna=False, sort=True):
        stepped = g[g["step"].notna()]
        g = stepped if len(stepped) else g
        n = len(g)
        over = f"median of {n} steps" if n > 1 else ("one step" if len(stepped) else "no steps recorded")
        of = "the step" if len(stepped) else "the recording"
        who = ", ".join(str(x) for x in (device, None if missing(pid) else f"process {pid}",
                                         None if missing(impl) or impl == "unknown" else impl) if x is not None and not missing(x))
        attention = g["attention_share_pct"].median()
        if basis == "gpu_window":
            causes = ("launch_bound", "sync", "host", "other", "unknown", "capture")
            idle = {c: g[f"idle_{c}_ns"].median() for c in causes if f"idle_{c}_ns" in g}
            split = ", ".join(f"{_ms(v)} {c.replace('_', '-')}" for c, v in idle.items() if v > 0 or c in ("launch_bound", "sync", "host"))
            text = (f"{who}: GPU busy {number(g['gpu_busy_pct'].median())} % of {of} ({_ms(g['window_ns'].median())} GPU window, {over}; "
                    f"every stream's work); idle {_ms(g['idle_ns'].median())}: {split}")
            text += ("; attention: none found" if missing(attention) else f"; attention {number(attention)} % of the step's own GPU busy time")
            text += _overlap_words(g) + _communication_words(g, bool(len(stepped))) + _graph_words(g, bool(len(stepped)))
        elif basis == "cpu_step":
            text = (f"{who}: CPU run, no GPU (no busy or idle figures); step {_ms(g['window_ns'].median())} ({over})"
                    + ("; attention: none found" if missing(attention) else f"; attention {number(attention)} % of the step's wall time"))
        else:
            text = (f"{who or 'ncu'}: {int(g['kernels'].sum()):,} kernels, {_ms(g['kernel_ns'].sum())} of replayed kernel time "
                    f"(ncu replays kernels one at a time: no busy or idle figures)"
                    + ("; attention: none found" if missing(attention) else f"; attention {number(attention)} % of it"))
        lines.append(text)
    return lines


def _overlap_words(g: pd.DataFrame) -> str:
    """``"; steps overlap: …"`` where the rows' windows overlap their neighbours' (pipelined work), else ``""``."""
    if "windows_overlap" not in g or not g["windows_overlap"].fillna(False).astype(bool).any():
        return ""
    n = int(g["windows_overlap"].fillna(False).astype(bool).sum())
    return (f"; {n} of {len(g)} step windows overlap a neighbour's (pipelined): the step's own work kept the GPU busy "
            f"{number(g['own_busy_pct'].median())} %, the neighbours' work {number(g['others_busy_pct'].median())} % more")


def _communication_words(g: pd.DataFrame, stepped: bool) -> str:
    """``"; communication 12.3 ms per step, 4.5 ms (36.6 %) exposed"`` (medians), or ``""`` without any."""
    if "communication_exposed_ns" not in g or not (g["communication_ns"].fillna(0) > 0).any():
        return ""
    total, exposed = float(g["communication_ns"].median()), float(g["communication_exposed_ns"].median())
    share = f" ({number(100.0 * exposed / total)} %)" if total > 0 else ""
    return (f"; communication {_ms(total)}{' per step' if stepped else ''}, {_ms(exposed)}{share} exposed "
            "(no compute kernel ran beside it)")


def _graph_words(g: pd.DataFrame, stepped: bool) -> str:
    """``"; graph replays: 2 launches ran 841 of 2,503 GPU operations (…% of its own busy time)"`` (medians), or ``""``."""
    if "graph_launches" not in g or not (g["graph_launches"].fillna(0) > 0).any():
        return ""
    own = g["own_busy_ns"] if "own_busy_ns" in g else g["gpu_busy_ns"]
    share = 100.0 * float((g["graph_busy_ns"] / own).median()) if "graph_busy_ns" in g else float("nan")
    return (f"; CUDA/HIP graph replays: {int(g['graph_launches'].median())} launches{' per step' if stepped else ''} ran "
            f"{int(g['graph_ops'].median()):,} GPU operations ({number(share)} % of the own busy time; {int(g['kernels'].median()):,} kernels in all)")


def gain_text(finding) -> str:
    """``"; expected gain 23.1 % of the step's time"`` (of the recording's, for a recording without steps), or ``""``."""
    if missing(finding.expected_gain_pct):
        return ""
    of = "the recording's" if str(finding.subject).startswith("recording") else "the step's"
    return f"; expected gain {number(finding.expected_gain_pct)} % of {of} time"


def finding_lines(findings: pd.DataFrame | None) -> list[str]:
    """The findings of one run in rank order: what, the figure, the evidence and what to try
    (``Nothing stands out`` when there is none)."""
    if findings is None:
        return []
    if not len(findings):
        return ["Nothing stands out: no finding passed its threshold against the spread (docs/reading-a-report.md § Triage)."]
    lines = []
    for f in findings.sort_values("rank").itertuples(index=False):
        gain = gain_text(f)
        lines.append(f"{int(f.rank)}. {f.kind}: {f.subject}: {number(f.value)} {f.unit}{gain}")
        lines.append(f"   evidence: {f.evidence}")
        lines.append(f"   try: {f.suggestion}")
    return lines


def found_line(layers: pd.DataFrame) -> str | None:
    """How the attention calls of an untagged recording were found (``signal`` and
    ``provenance`` of the layer rows), e.g. ``found without tags by operator names
    (layers numbered by call order)``; ``None`` for tagged calls."""
    if "signal" not in layers or not layers["signal"].notna().any():
        return None
    found = signals.kinds_in(layers["signal"])
    numbered = sorted(set(layers["provenance"].dropna()) - {"apportioned", "measured"})
    return (f"found without tags by {'/'.join(found)} names"
            + (f" (layers numbered by {'/'.join(numbered)})" if numbered else ""))
