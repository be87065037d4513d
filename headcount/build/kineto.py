"""The torch.profiler route: a trace's step groups (:class:`~headcount.parsers.kineto_steps.Pieces`)
→ tables, one group at a time (:func:`kineto_pieces`), and the whole trace's layers, heads, findings
and unstepped work at the end (:func:`kineto_aggregates`); :func:`tables_from_kineto` for a trace read
whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headcount.attribute import graph_annotations, labels, untagged
from headcount.build.in_process import pm_ceiling, pm_resolution, trace_samples
from headcount.build.shared import (
    NO_ATTENTION,
    Built,
    _concat,
    add_roofline,
    attention_tables,
    collected,
    finished,
    implementation_of,
    run_findings,
    tables_from_events,
    typed_like,
    untagged_provenance,
)
from headcount.common.device import Device
from headcount.common.errors import HeadcountError
from headcount.common.naming import DOMAIN, STEP_DOMAIN
from headcount.derive import aggregate, collectives, inductor, sampling
from headcount.derive import steps as step_view
from headcount.parsers.plausible import drop_implausible


def tables_from_kineto(trace: dict, run_id: str) -> Built:
    """Build headcount's tables from a torch.profiler trace held in memory
    (:func:`headcount.parsers.kineto_json.read_trace`): :func:`kineto_pieces` of its
    events as one group, gathered into whole tables. ``trace["events"]`` is
    taken out of ``trace`` (freed as soon as the build is done with it)."""
    from headcount.parsers import kineto_json as kineto

    notices: list[str] = []
    events = trace.pop("events")
    if not len(events):
        raise HeadcountError("the trace holds no complete event (ph \"X\")", hint="record with torch.profiler.profile() around some work")
    events = drop_implausible(events, "events", notices)  # a negative duration: no such event happened
    found: dict = {}
    pm, said = trace_samples(trace.get("counters") or [], kineto.run_device(trace.get("devices") or []))
    notices += said
    whole = collected(kineto_pieces([(0, events)], trace.get("devices") or [], notices, found=found, pm=pm))
    steps = whole["steps"]  # the work outside every step first, as gpu_steps orders it
    whole["steps"] = steps.iloc[np.argsort(steps["step"].notna().to_numpy(dtype=bool), kind="stable")].reset_index(drop=True)
    whole.setdefault("attention_breakdown", found["attention_breakdown"])
    return finished(whole, run_id, kineto.run_device(trace.get("devices") or []), found["calls"], notices)


@dataclass
class GroupFigures:
    """What the whole trace's tables need of one group of its steps (:func:`kineto_group_pieces`),
    kept while the other groups are built (or sent back by the worker that built it)."""

    group: int
    figures: pd.DataFrame  # its layer and head ranges whose figures count, labels categorical
    attention_kernels: pd.DataFrame | None  # its attention kernels: names, times, launch latency, waves
    steps: pd.DataFrame  # its steps rows, less the work outside every step
    outside: tuple[pd.DataFrame, pd.DataFrame] | None  # its GPU work and synchronizing calls outside every step
    launching: set  # (device, process) of its GPU work with a launch call
    calls: list
    notices: list[str]
    tagged: bool  # it has headcount's ranges
    pm_counts: dict | None = None  # what the trace's PM samples resolve in it (build.in_process.pm_resolution)


def kineto_pieces(groups, devices: list[dict], notices: list[str], launched: bool | None = None, found: dict | None = None,
                  pm: pd.DataFrame | None = None):
    """Headcount's tables from a torch.profiler trace, a group of whole steps at a time
    (:class:`headcount.parsers.kineto_steps.Pieces`): one trace headcount kept with
    ``--trace-dir``, one a user recorded with ``torch.profiler`` around a tagged model,
    or one recorded with no tags at all.

    With headcount's ranges in the trace, they are used as recorded (no call
    log: analytic FLOPs and bytes are null). Without them, attention calls
    are found by operator, module and kernel names
    (:func:`headcount.attribute.untagged.find_calls`), each row saying which
    ``signal`` found it, and the layers' ``provenance`` says how they were
    numbered (``module ranges`` or ``call order``). GPU kernels whose launch is not in
    the trace (launched before the window opened) are counted in a notice and
    attributed to nothing. A group in which no call is found has ``implementation``
    ``unknown``.

    A trace with neither gives kernels, steps and findings, and a notice
    (:data:`NO_ATTENTION`). torch.profiler's ``ProfilerStep#N`` annotations
    are its steps (where headcount's own step ranges are absent).

    Args:
        groups: ``(group number, events table)`` of each group, in order (each let go once built).
        devices: the trace's ``deviceProperties``.
        notices: where the notices go, once the last group is built (each group's counts summed).
        launched: whether the trace has GPU work whose launch it holds (``None``: each group says).
        found: filled with ``calls`` (the calls found, in order) and ``attention_breakdown``.
        pm: the trace's PM samples (:func:`headcount.parsers.kineto_counters.pm_samples`): sampled DRAM bytes and
            warps active for its kernels and ranges, as the cupti source's samples give them.

    Yields:
        ``ranges``, ``kernels`` and ``steps`` of each group (:func:`kineto_group_pieces`), then
        ``layers``, ``heads`` and ``findings`` of the whole trace (:func:`kineto_aggregates`).
    """
    from headcount.parsers import kineto_json as kineto

    device = kineto.run_device(devices)
    parts: list[GroupFigures] = []
    for group, events in groups:
        yield from kineto_group_pieces(events, group, device, launched, parts, pm)
        del events
    whole = kineto_aggregates(parts, device, notices, pm)
    if found is not None:
        found.update(calls=whole.pop("calls"), attention_breakdown=whole.pop("attention_breakdown"))
    yield from ((name, whole[name]) for name in ("steps", "layers", "heads", "findings"))


def kineto_group_pieces(events: pd.DataFrame, group: int, device: Device | None, launched: bool | None,
                        parts: list[GroupFigures], pm: pd.DataFrame | None = None):
    """``ranges``, ``kernels`` and ``steps`` of one group of a trace's steps (range ids from
    ``group`` · 2³², unique across the groups); what the whole trace's tables need of it goes to ``parts``;
    ``pm``: the trace's PM samples (:func:`kineto_pieces`)."""
    tables, calls, notices, tagged = _kineto_group(events, device, launched, pm)
    del events
    ranges, kernels, figures = tables["ranges"], tables["kernels"], tables.pop("figures")
    facts: dict = {}
    if pm is not None:  # the counts only: the groups' are summed into one notice (kineto_aggregates)
        pm_resolution(tables, pm, facts)
    offset = group << 32
    if offset:  # each group numbers its ranges from 0
        for frame in (ranges, kernels, figures):
            for column in ("range_id", "parent_range_id"):
                if column in frame:
                    frame[column] = frame[column] + offset
    attention_kernels = None
    if "launch_latency_ns" in kernels:
        attention_kernels = kernels.loc[kernels["layer_name"].notna().to_numpy(dtype=bool),
                              [*aggregate.GROUP_LAYER, "head", "name", "duration_ns", "launch_latency_ns", "waves_per_sm"]]
    steps, outside, syncs, launching = tables["steps"], None, tables.pop("syncs"), set()
    gpu = kernels["kind"].isin(step_view.GPU_KINDS).to_numpy(dtype=bool)
    if gpu.any():
        known = gpu & kernels["pid"].notna().to_numpy(dtype=bool) & kernels["device"].notna().to_numpy(dtype=bool)
        pairs = kernels.loc[known, ["device", "pid"]].drop_duplicates()  # a few pairs among many kernels
        launching = set(zip(pairs["device"], pairs["pid"]))
        # the work outside every step is one row of the trace's, whichever groups it fell in: built at the end
        unstepped = kernels["step"].isna().to_numpy(dtype=bool)
        outside = (kernels.loc[gpu & unstepped, [c for c in step_view.WORK_COLUMNS if c in kernels]],
                   syncs[syncs["step"].isna().to_numpy(dtype=bool)])
        steps = steps[steps["step"].notna().to_numpy(dtype=bool)].reset_index(drop=True)
    parts.append(GroupFigures(group, figures, attention_kernels, steps, outside, launching, calls, notices, tagged,
                              facts.get("resolution")))
    yield "ranges", ranges
    yield "kernels", kernels
    yield "collectives", collectives.collectives(kernels)
    yield "steps", steps


def kineto_aggregates(parts: list[GroupFigures], device: Device | None, notices: list[str], pm: pd.DataFrame | None = None) -> dict:
    """``layers``, ``heads``, ``findings`` and ``attention_breakdown`` of a whole trace from its groups
    (in order), with ``calls``: every call found; the groups' notices, counts summed, go to ``notices``, with
    (``pm``, the trace's PM samples) the count of single samples above the DRAM ceiling."""
    from headcount.parsers.kineto_steps import merged

    calls = [c for part in parts for c in part.calls]
    ranges = parts[0].figures if len(parts) == 1 else _concat_categories([part.figures for part in parts])
    kernels = [part.attention_kernels for part in parts if part.attention_kernels is not None]
    attention = attention_tables(ranges, _concat(kernels) if kernels else pd.DataFrame())
    for table in attention.values():
        labels.plain(table)
    untagged_provenance(attention, ranges)
    add_roofline(attention, device, calls)
    notices += merged([n for part in parts for n in part.notices])
    if pm is not None:
        notices += _pm_notices(parts, pm, device)
    captured = any(untagged.CAPTURED in n for part in parts for n in part.notices)
    if not calls and not any(part.tagged for part in parts) and not captured:
        notices.append(NO_ATTENTION + " (neither headcount's ranges nor an attention operator, module or kernel that "
                       "docs/cli.md § Untagged recordings lists; record with torch.profiler.profile(with_modules=True, "
                       "with_stack=True, record_shapes=True), or tag the model with headcount)")
    unstepped = _unstepped(parts, attention_found=bool(calls) or any(part.tagged for part in parts))
    findings = run_findings([*(part.steps for part in parts), unstepped], attention["layers"], attention["heads"], notices)
    return {**attention, "steps": unstepped, "findings": findings, "calls": calls}


def _pm_notices(parts: list[GroupFigures], pm: pd.DataFrame, device: Device | None) -> list[str]:
    """What the trace's PM samples do not resolve, over all its groups, and the single samples above the DRAM ceiling."""
    counts = [part.pm_counts for part in parts if part.pm_counts]
    total = {key: sum(c[key] for c in counts) for key in ("kernels", "kernels_unresolved", "attention_ranges", "attention_ranges_unresolved")}
    said = sampling.unresolved_notice(total["kernels"], total["kernels_unresolved"], total["attention_ranges"],
                                      total["attention_ranges_unresolved"], counts[0]["median_window_ns"] if counts else None,
                                      finer=sampling.FINER_TORCH)
    return ([said] if said else []) + pm_ceiling(pm, device, {})


def _unstepped(parts: list[GroupFigures], attention_found: bool) -> pd.DataFrame:
    """The ``steps`` rows of the GPU work outside every step (:func:`headcount.derive.steps.gpu_steps`),
    from every group's: what a whole trace attributed at once gives (empty: no such work)."""
    outside = [part.outside for part in parts if part.outside is not None]
    work = _concat([w for w, _ in outside]) if outside else pd.DataFrame()
    if not len(work):
        return pd.DataFrame()
    # work without a launch call: its device's process where the device served one only (as gpu_steps does in one group)
    served: dict = {}
    for device_id, pid in set().union(*(part.launching for part in parts)):
        served.setdefault(device_id, set()).add(pid)
    sole = {device_id: next(iter(pids)) for device_id, pids in served.items() if len(pids) == 1}
    missing = work["pid"].isna().to_numpy(dtype=bool)
    if missing.any() and sole:
        work = work.assign(pid=work["pid"].astype(object).where(~missing, work["device"].map(sole)))
    return step_view.gpu_steps(work, _concat([s for _, s in outside]), attention_found=attention_found)


def _concat_categories(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` concatenated, their categorical columns kept categorical: categories in the order
    they first come (the order the attention tables' rows follow)."""
    frames = [f.copy(deep=False) for f in frames]
    for column in [c for c, t in frames[0].dtypes.items() if isinstance(t, pd.CategoricalDtype)]:
        order = pd.unique(np.concatenate([np.asarray(f[column].cat.categories, dtype=object) for f in frames
                                          if isinstance(f[column].dtype, pd.CategoricalDtype)]))
        kind = pd.CategoricalDtype(pd.Index(order, dtype=object))
        for f in frames:
            f[column] = f[column].astype(object).astype(kind)
    return pd.concat(frames, ignore_index=True)


def _kineto_group(events: pd.DataFrame, device: Device | None, launched: bool | None, pm: pd.DataFrame | None = None):
    """One group of a trace's events (:func:`kineto_pieces`) → ``(tables, calls, notices, tagged)``:
    its tables (:func:`tables_from_events`, with ``figures``), the calls found in it, the notices
    of what it holds, and whether it has headcount's ranges."""
    notices: list[str] = []
    events = _profiler_steps(events)
    events, said = graph_annotations.with_annotated_ranges(events)  # a replay's kernels labelled at capture
    notices += said
    tagged = bool(((events["kind"] == "range") & events["name"].astype(str).str.startswith(DOMAIN + "@")).any())
    calls = []
    if not tagged:
        found = untagged.find_calls(events)
        notices += found.notices
        calls = found.calls
        if len(found.ranges):
            keys = untagged.assigned_keys(found, len(events))
            keyed = untagged.CALL_KEY in events
            if keys is not None:  # a replay's attention kernels: given to their call by name, not by the graph launch
                if keyed:  # beside the kernels an annotation gave its region
                    keys = np.where(keys >= 0, keys, graph_annotations.call_keys(events))
                events = events.assign(**{untagged.CALL_KEY: keys})
            elif not keyed:
                found.ranges = found.ranges.drop(columns=untagged.CALL_KEY)
            events = pd.concat([events, typed_like(found.ranges, events)], ignore_index=True)
    events, said = inductor.with_kernel_estimates(events)
    if said:
        notices.append(said)
    gpu = events["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy(dtype=bool)
    orphan = gpu & ~launched_in(events)
    if orphan.any():
        kernels = int((orphan & (events["kind"] == "kernel").to_numpy(dtype=bool)).sum())
        notices.append(f"{int(orphan.sum())} GPU operations ({kernels} kernels) have no launch call in the trace (launched "
                       "before it started): counted, attributed to no range")
    replayed = gpu & events["graph_node_id"].notna().to_numpy(dtype=bool)
    replayed &= graph_annotations.call_keys(events) < graph_annotations.KEY_BASE  # those an annotation gave a region are theirs
    if replayed.any():
        notices.append(f"{int(replayed.sum())} GPU operations were replayed from CUDA graphs: a torch.profiler trace does not "
                       "record which range captured them, so (attention kernels found by name aside) they count for the range "
                       "around the graph launch (often none); capture with torch.cuda.graph(g, enable_annotations=True) and "
                       "export with cuda_graph_annotations=get_kernel_annotations() (torch 2.15+, CUDA 13.1+: headcount marks its "
                       "calls), or record with `--backend cupti` or `nsys --cuda-graph-trace=node`, to attribute them to their layers")
    tables = tables_from_events(events, calls, implementation_of(calls), source="torch", limits=device.limits() if device else None,
                                launched=launched, with_figures=True, sm_count=device.sm_count if device else None, pm_samples=pm)
    untagged_provenance(tables, tables["ranges"])
    return tables, calls, notices, tagged


def launched_in(events: pd.DataFrame) -> np.ndarray:
    """Which events' correlation id is that of a runtime call in ``events`` (a GPU operation whose launch is there)."""
    ids = pd.array(events["correlation_id"], dtype="Int64").to_numpy(np.int64, na_value=-1)  # ids are never negative
    calls = ids[(events["kind"] == "runtime").to_numpy(dtype=bool) & (ids >= 0)]
    return np.isin(ids, calls) & (ids >= 0)


def _profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """torch.profiler's ``ProfilerStep#N`` annotations as headcount's step ranges
    (``headcount.step@step#N``), where the trace has no step range of headcount's."""
    names = events.loc[events["kind"] == "range", "name"].astype(str)  # annotations only: a few among the operators
    if names.str.startswith(STEP_DOMAIN + "@").any():
        return events
    number = names.str.extract(r"^ProfilerStep#(\d+)$", expand=False).dropna()
    if not len(number):
        return events
    events = events.copy(deep=False)  # copy-on-write: only the renamed column is copied, not the whole table
    events.loc[number.index, "name"] = STEP_DOMAIN + "@step#" + number
    return events
