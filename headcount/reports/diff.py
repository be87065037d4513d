"""``headcount diff BASE NEW``: what changed between two reports (or recordings).

Each side is a report directory, or a recording that ``headcount diff`` has
parsed first into a temporary report, exactly as ``headcount parse`` would
(:mod:`headcount.cli.diff_cmd`). The sides' runs are paired (:func:`pair_runs`:
by model, implementation and mode, then by rank or device, so that rank 0 meets
rank 0), and each pair is judged on its **whole work first** (:func:`whole_work`):

1. the time per step (``steps.window_ns``, the longest of the step's device
   windows) where both sides recorded at least three steps;
2. else the period of a repeated unit both recordings share
   (:mod:`headcount.derive.work_units`: a block, a layer, a micro-batch: one
   ``FSDP::pre_forward (blocks.N…)`` start to the next), per rank;

by :func:`headcount.derive.difference.shift` (a rank test and the least
change). Beside it, the **evidence** (:func:`evidence`): GPU busy % of the
windows (every stream), idle by cause (launch-bound, sync, host, capture,
other), exposed communication, attention's share of busy time — per step with
a verdict where steps exist, per window (one figure, no spread) otherwise.

Then every row, per call, by :func:`headcount.derive.difference.verdict` on
its per-call distribution, calls grouped **by shape** before any statistic:

- ``layer`` / ``head``: attention range instances (``ranges``, levels
  ``layer`` and ``head``) per (phase, layer name, head, shape); the shape is the
  recorded input shape, else the grid and block of the call's kernels, else
  its duration mode (:func:`headcount.derive.difference.modes`); a report
  without range instances (ncu) is compared on its layers' stored percentiles;
- ``kernel``: GPU kernels, memcpys and memsets per (name, grid, block) (CPU
  operators on a CPU run, per duration mode);
- ``range``: other ranges per name, indices read as ``{N}`` (``FSDP::pre_forward
  (blocks.{N}…)``: one row, not one per block) and PyTorch's ``emit_nvtx``
  suffixes dropped.

Per-call percentiles of kernels and ranges are computed in DuckDB over the
report's files (``quantile_cont``: linear interpolation), so a large report is
never held in pandas whole.

**Refused** (one line, exit 2): sources that measure different things (an
Nsight Compute report replays each kernel alone; a timeline does not), runs
that differ in model, batch, sequence length, dtype or device, two recordings
of different programs (less than half of either side's kernel time in kernels
the other ran), and pairs with nothing in common to compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.common.errors import HeadcountError
from headcount.derive import difference, work_units

COUNTERS = ("dram_bytes_per_call", "bandwidth_gbps", "achieved_occupancy_pct", "theoretical_occupancy_pct",
            "kernels_per_call", "cpu_launch_cost_per_call_ns")
"""Counters shown where both sides have them (layer and head rows), as ``base_<name>`` and ``new_<name>``; units in the names."""

FACTS = {"model": "model", "batch": "batch", "seq": "sequence length", "dtype": "dtype", "device_name": "device"}
"""What two runs must share to be compared (where both sides know it)."""

ATTENTION_LEVELS = ("layer", "head")


@dataclass
class Side:
    """One side of the diff: the path given, the report read, its runs."""

    path: str
    report: Path
    con: object
    runs: pd.DataFrame

    @property
    def measures(self) -> str:
        """What the side's times are: ``replay`` (Nsight Compute: each kernel alone, serialized) or ``timeline``."""
        sources = set(self.runs["source"].dropna().astype(str)) if "source" in self.runs else set()
        return "replay" if sources and sources <= {"ncu"} else "timeline"


@dataclass
class Pair:
    """A base run paired with a new run (one implementation each)."""

    base: dict
    new: dict
    differs: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading
def open_report(path: str, report: Path) -> Side:
    """The report at ``report`` (``path``: what the user gave, a report or the recording parsed into ``report``) as a side.

    Raises:
        HeadcountError: the report holds no run.
    """
    from headcount.store.query import connect

    con = connect(report)
    runs = _units(con)
    if not len(runs):
        raise HeadcountError(f"{path}: the report holds no run", hint="profile or parse something into it first")
    return Side(path, report, con, runs)


def _units(con) -> pd.DataFrame:
    """The (run, implementation) units of a report, as its tables hold them (a parsed recording's
    ``runs`` row may not know the implementation its calls name), with the facts of their ``runs`` row."""
    parts = [f"SELECT DISTINCT run_id, implementation FROM {t}" for t in ("steps", "layers", "kernels", "ranges") if _has(con, t)]
    if not parts:
        return pd.DataFrame()
    units = _query(con, " UNION ".join(parts) + " ORDER BY run_id, implementation")
    if _has(con, "steps"):  # the device a unit ran on: how ranks pair when the recording names none
        devices = _query(con, "SELECT run_id, implementation, min(device) AS unit_device FROM steps GROUP BY ALL")
        units = units.merge(devices.astype({"run_id": str}), on=["run_id", "implementation"], how="left")
    runs = _table(con, "runs")
    if not len(runs):
        return units
    runs = runs.astype({"run_id": str})
    units = units.astype({"run_id": str})
    exact = units.merge(runs, on=["run_id", "implementation"], how="left", indicator=True)
    found = exact[exact["_merge"] == "both"].drop(columns="_merge")
    rest = units.merge(exact.loc[exact["_merge"] != "both", ["run_id", "implementation"]], on=["run_id", "implementation"])
    by_run = rest.merge(runs.drop(columns="implementation").drop_duplicates("run_id"), on="run_id", how="left")
    return pd.concat([found, by_run], ignore_index=True).sort_values(["run_id", "implementation"]).reset_index(drop=True)


def _has(con, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal AND view_name = ?", [table]).fetchall()[0][0])


def _table(con, name: str) -> pd.DataFrame:
    return con.sql(f"SELECT * FROM {name}").df() if _has(con, name) else pd.DataFrame()


def _query(con, sql: str, params: list | None = None) -> pd.DataFrame:
    return con.execute(sql, params or []).df()


# ---------------------------------------------------------------- pairing
def _known(v) -> bool:
    return v is not None and not (isinstance(v, float) and np.isnan(v)) and not pd.isna(v) and str(v) != ""


def _unit(run: dict) -> str:
    return f"{run.get('run_id')} ({run.get('implementation')})"


def pair_runs(base: Side, new: Side, run_ids: list[str] | None = None) -> tuple[list[Pair], list[str]]:
    """Pairs of (run, implementation) units, and notes on what stayed unpaired.

    Each side alone (after ``--run``): the two are paired whatever their
    implementations (the change under test may be the implementation);
    otherwise units are paired on equal model, model config, implementation
    and mode.

    Raises:
        HeadcountError: a ``--run`` id on neither side; nothing to pair; every pair incomparable.
    """
    if base.measures != new.measures:
        kinds = {"replay": "an Nsight Compute report (each kernel replayed alone)", "timeline": "a timeline"}
        raise HeadcountError(f"{base.path} is {kinds[base.measures]} and {new.path} {kinds[new.measures]}: their times measure "
                             "different things and cannot be compared",
                             hint="diff two recordings of one kind (two nsys exports, two torch.profiler traces, two ncu reports)")
    b, n = base.runs.to_dict("records"), new.runs.to_dict("records")
    if run_ids:
        known = {str(r["run_id"]) for r in b + n}
        missing = [i for i in run_ids if i not in known]
        if missing:
            raise HeadcountError(f"--run {missing[0]}: no such run in {base.path} or {new.path}",
                                 hint="run ids: " + ", ".join(sorted(known)))
        b = [r for r in b if str(r["run_id"]) in run_ids] or b
        n = [r for r in n if str(r["run_id"]) in run_ids] or n
    notes, pairs = [], []
    if len(b) == 1 and len(n) == 1:
        pairs = [Pair(b[0], n[0])]
    else:
        keys = ("model", "model_config", "implementation", "mode")
        free = list(n)
        for r in b:
            candidates = [m for m in free if all(str(r.get(k)) == str(m.get(k)) for k in keys if k in r or k in m)]
            # rank 0 meets rank 0: the recorded rank, else the device, where both sides know it
            match = next((m for m in candidates if _same_rank(r, m)), candidates[0] if candidates else None)
            if match is None:
                notes.append(f"base run {_unit(r)} has no counterpart in {new.path} (model, implementation, mode)")
                continue
            free.remove(match)
            pairs.append(Pair(r, match))
        notes += [f"new run {_unit(m)} has no counterpart in {base.path}" for m in free]
    if not pairs:
        raise HeadcountError(f"no run of {base.path} matches a run of {new.path} (model, implementation, mode)",
                             hint="name the two runs with --run BASE_ID NEW_ID")
    for p in pairs:
        for key, label in FACTS.items():
            x, y = p.base.get(key), p.new.get(key)
            if _known(x) and _known(y) and str(x) != str(y):
                p.differs.append(f"{label} {x} vs {y}")
    comparable = [p for p in pairs if not p.differs]
    if not comparable:
        p = pairs[0]
        raise HeadcountError(f"base run {_unit(p.base)} and new run {_unit(p.new)} are not comparable: "
                             + "; ".join(p.differs) + " (inconclusive)",
                             hint="diff runs of the same model, batch, sequence length, dtype and device")
    for p in pairs:
        if p.differs:
            notes.append(f"base run {_unit(p.base)} and new run {_unit(p.new)} are not comparable ({'; '.join(p.differs)}): "
                         "inconclusive")
    return pairs, notes


def _same_rank(a: dict, b: dict) -> bool:
    for key in ("rank", "unit_device"):
        if _known(a.get(key)) and _known(b.get(key)):
            return str(a.get(key)) == str(b.get(key))
    return True


def rank_label(run: dict) -> str:
    """The rank a unit stands for: ``rank 3`` where recorded, else its device (``cuda:0``), else its process, else ``run``."""
    if _known(run.get("rank")):
        return f"rank {int(run['rank'])}"
    if _known(run.get("unit_device")):
        return str(run["unit_device"])
    return f"pid {run['pid']}" if _known(run.get("pid")) else "run"  # one process, nothing to tell it by


def _pair_rank(pair: "Pair") -> str:
    b, n = rank_label(pair.base), rank_label(pair.new)
    return b if b == n else f"{b} → {n}"


# ---------------------------------------------------------------- per-call summaries (DuckDB)
_Q = ("count(*) AS calls, quantile_cont(v, 0.1) AS p10, quantile_cont(v, 0.5) AS p50, quantile_cont(v, 0.9) AS p90")
_WHERE = "run_id = ? AND implementation IS NOT DISTINCT FROM ?"


def _params(run: dict) -> list:
    return [str(run["run_id"]), run.get("implementation")]


def _summaries(side: Side, run: dict, level: str) -> pd.DataFrame:
    """Per-call (p10, p50, p90, calls) of one unit's rows of ``level``, with their keys (``shape`` among them)."""
    if level in ATTENTION_LEVELS:
        return _attention_summaries(side, run, level)
    con, params = side.con, _params(run)
    if level == "kernel":
        if not _has(con, "kernels"):
            return pd.DataFrame()
        kinds = _query(con, f"SELECT DISTINCT kind FROM kernels WHERE {_WHERE}", params)["kind"].tolist()
        gpu = [k for k in kinds if k in ("kernel", "memcpy", "memset")]
        chosen = gpu or [k for k in kinds if k == "op"]
        if not chosen:
            return pd.DataFrame()
        listed = ", ".join(f"'{k}'" for k in chosen)
        cols = _columns(con, "kernels")
        shape = ("CASE WHEN grid IS NOT NULL THEN 'grid ' || grid || ' block ' || coalesce(block, '?') END"
                 if {"grid", "block"} <= cols else "NULL")
        rows = f"SELECT name, {shape} AS shape, duration_ns AS v FROM kernels WHERE {_WHERE} AND kind IN ({listed}) AND duration_ns IS NOT NULL"
        known = _query(con, f"SELECT name, shape, {_Q} FROM ({rows}) WHERE shape IS NOT NULL GROUP BY name, shape", params)
        # nothing tells these calls' shapes apart (CPU operators, kernels without a grid): their duration modes do
        unknown = _query(con, f"SELECT name, v FROM ({rows}) WHERE shape IS NULL", params)
        return pd.concat([f for f in (known, _by_modes(unknown, ["name"])) if len(f)] or [known], ignore_index=True)
    if level == "range":
        if not _has(con, "ranges"):
            return pd.DataFrame()
        names = _query(con, f"SELECT DISTINCT split_part(name, ', ', 1) AS base FROM ranges WHERE {_WHERE} AND level = 'other'", params)
        if not len(names):
            return pd.DataFrame()
        keys = names.assign(key=[work_units.indexless(n) for n in names["base"]])
        con.register("_diff_range_keys", keys)
        try:
            return _query(con, f"SELECT key AS name, NULL AS shape, {_Q} FROM (SELECT k.key, r.duration_ns AS v FROM ranges r JOIN "
                               f"_diff_range_keys k ON k.base = split_part(r.name, ', ', 1) WHERE r.{_WHERE.replace(' AND ', ' AND r.')} "
                               "AND r.level = 'other' AND r.duration_ns IS NOT NULL) GROUP BY key", params)
        finally:
            con.unregister("_diff_range_keys")
    raise ValueError(level)


_SHAPE_COLUMNS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim")


def _attention_summaries(side: Side, run: dict, level: str) -> pd.DataFrame:
    """Attention calls of one unit, per (phase, layer name[, head], shape): the recorded input shape, else the grid
    and block of the call's kernels, else the call's duration mode. Calls without GPU time count in ``untimed``."""
    con, params = side.con, _params(run)
    if not _has(con, "ranges"):
        return pd.DataFrame()
    cols = _columns(con, "ranges")
    capture = "AND NOT coalesce(graph_capture, false)" if "graph_capture" in cols else ""
    dims = [c for c in _SHAPE_COLUMNS if c in cols]
    calls = _query(con, f"SELECT range_id, phase, layer_name AS name, layer, head, duration_ns AS v{''.join(', ' + d for d in dims)} "
                        f"FROM ranges WHERE {_WHERE} AND level = '{level}' {capture}", params)
    if not len(calls):
        return pd.DataFrame()
    shape = pd.Series([None] * len(calls), dtype=object)
    if dims:
        values = calls[dims].to_numpy(dtype=object)
        text = ["inputs " + "×".join("?" if pd.isna(x) else str(int(x)) for x in row) if any(pd.notna(x) for x in row) else None
                for row in values]  # batch×q_heads×kv_heads×q_len×kv_len×head_dim
        shape = pd.Series(text, dtype=object)
    if _has(con, "kernels") and {"range_id", "grid"} <= _columns(con, "kernels"):
        grids = _query(con, f"SELECT range_id, string_agg(DISTINCT 'grid ' || grid || ' block ' || coalesce(block, '?'), ' + ' "
                            f"ORDER BY 'grid ' || grid || ' block ' || coalesce(block, '?')) AS g FROM kernels WHERE {_WHERE} "
                            "AND range_id IS NOT NULL AND grid IS NOT NULL GROUP BY range_id", params)
        by_range = dict(zip(grids["range_id"].tolist(), grids["g"].tolist()))
        missing = shape.isna().to_numpy()
        shape[missing] = calls.loc[missing, "range_id"].map(by_range).to_numpy()
    calls["shape"] = shape.to_numpy()
    keys = ["phase", "name", *(["head"] if level == "head" else [])]
    timed = calls[calls["v"].notna()]
    untimed = calls[calls["v"].isna()].groupby(keys, dropna=False).size().rename("untimed").reset_index()
    known = timed[timed["shape"].notna()]
    rows = [_percentiles(known, [*keys, "shape"]) if len(known) else pd.DataFrame(),
            _by_modes(timed[timed["shape"].isna()].drop(columns="shape"), keys)]
    out = pd.concat([f for f in rows if len(f)], ignore_index=True) if any(len(f) for f in rows) else pd.DataFrame()
    if not len(out):
        return out
    layers = calls.groupby(keys, dropna=False)["layer"].first().reset_index()
    out = out.merge(layers, on=keys, how="left")
    return out.merge(untimed, on=keys, how="left") if len(untimed) else out.assign(untimed=0)


def _percentiles(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    g = frame.groupby(keys, dropna=False)["v"]
    return pd.DataFrame({"calls": g.size(), "p10": g.quantile(0.1), "p50": g.quantile(0.5), "p90": g.quantile(0.9)}).reset_index()


def _by_modes(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows of calls whose shape nothing recorded, per duration mode (:func:`headcount.derive.difference.modes`): a
    single mode keeps no shape; several are ``mode 1 of 2`` … (1: the fastest)."""
    if not len(frame):
        return pd.DataFrame()
    parts = []
    for key, group in frame.groupby(keys, dropna=False, sort=False):
        labels = difference.modes(group["v"].to_numpy(dtype="float64"))
        count = int(labels.max())
        shape = [None if count <= 1 else f"mode {k} of {count}" for k in labels]
        parts.append(group.assign(shape=shape))
    both = pd.concat(parts, ignore_index=True)
    both["shape"] = both["shape"].astype(object)
    return _percentiles(both, [*keys, "shape"])


def _columns(con, table: str) -> set[str]:
    return set(con.sql(f"SELECT * FROM {table} LIMIT 0").columns)


def _counters(side: Side, run: dict, level: str) -> pd.DataFrame:
    """The counters of :data:`COUNTERS` per attention row of a unit (from ``layers`` / ``heads``)."""
    table = "layers" if level == "layer" else "heads"
    if not _has(side.con, table):
        return pd.DataFrame()
    cols = _columns(side.con, table)
    picks = ["phase", "layer_name AS name", *(["head"] if level == "head" else [])]
    if "dram_bytes" in cols:
        picks.append("dram_bytes / calls AS dram_bytes_per_call")
    picks += [c for c in COUNTERS if c != "dram_bytes_per_call" and c in cols]
    extra = ["duration_per_call_p10_ns", "duration_per_call_p50_ns", "duration_per_call_p90_ns", "calls", "layer"]
    picks += [c for c in extra if c in cols]
    return _query(side.con, f"SELECT {', '.join(picks)} FROM {table} WHERE run_id = ? AND implementation IS NOT DISTINCT FROM ?",
                  [str(run["run_id"]), run.get("implementation")])


# ---------------------------------------------------------------- comparing
def _compare(base: pd.DataFrame, new: pd.DataFrame, keys: list[str], level: str, min_change: float) -> pd.DataFrame:
    """Change rows from two sides' summaries (:func:`_summaries`) matched on ``keys``."""
    if not len(base) and not len(new):
        return pd.DataFrame(columns=difference.CHANGE_COLUMNS)
    empty = pd.DataFrame(columns=[*keys, "calls", "p10", "p50", "p90"])
    base, new = (base if len(base) else empty), (new if len(new) else empty)
    merged = base.merge(new, on=keys, how="outer", suffixes=("_b", "_n"))
    rows = []
    for r in merged.to_dict("records"):
        def side(s):
            calls = r.get(f"calls_{s}")
            return tuple(float(r[f"p{q}_{s}"]) if pd.notna(r.get(f"p{q}_{s}")) else np.nan for q in (10, 50, 90)), \
                int(calls) if pd.notna(calls) else 0
        (bp, bc), (np_, nc) = side("b"), side("n")
        row = {k: r[k] for k in keys}
        if "layer_b" in r:  # attention rows: the layer index, from whichever side has the row
            row["layer"] = r["layer_b"] if pd.notna(r["layer_b"]) else r.get("layer_n")
        rows.append({**row, **difference.summary_row(bp, np_, bc, nc, level, min_change)})
    return pd.DataFrame(rows).reindex(columns=list(dict.fromkeys([*difference.CHANGE_COLUMNS, *keys])))


def _with_counters(changes: pd.DataFrame, base: pd.DataFrame, new: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The layers' (heads') counters beside their change rows, where the layer holds calls of one shape only: a
    layer's counters are per call over all its calls, and never ride on one shape's row of a mix."""
    if not len(changes) or not len(base) or not len(new):
        return changes
    names = [c for c in COUNTERS if c in base.columns and c in new.columns]
    if not names:
        return changes
    both = base[keys + names].merge(new[keys + names], on=keys, how="inner", suffixes=("_base", "_new"))
    both = both.rename(columns={f"{c}_base": f"base_{c}" for c in names} | {f"{c}_new": f"new_{c}" for c in names})
    shapes = changes.groupby(keys, dropna=False)["shape"].transform(lambda s: s.nunique(dropna=False))
    single = changes[keys].assign(_one=(shapes <= 1).to_numpy())
    both = both.merge(single[single["_one"]].drop(columns="_one").drop_duplicates(), on=keys, how="inner")
    return changes.merge(both, on=keys, how="left")


def diff_pair(base: Side, new: Side, pair: Pair, min_change: float = difference.MIN_CHANGE_PCT,
              prefer: tuple | None = None) -> tuple[pd.DataFrame, dict]:
    """Every change row of one pair, and its overall verdict.

    Returns:
        ``(changes, overall)``: :data:`headcount.derive.difference.CHANGE_COLUMNS` plus ``base_run``,
        ``new_run`` and counter columns; ``overall`` as :func:`_overall`.
    """
    frames, untimed = [], {}
    for level, keys in (("layer", ["phase", "name"]), ("head", ["phase", "name", "head"]), ("kernel", ["name"]), ("range", ["name"])):
        b, n = _summaries(base, pair.base, level), _summaries(new, pair.new, level)
        if level == "layer" and not len(b) and not len(n):  # no range instances (ncu): the stored percentiles
            b, n = _stored(base, pair.base), _stored(new, pair.new)
        if not len(b) and not len(n):
            continue
        if level in ATTENTION_LEVELS:
            untimed[level] = tuple(int(f["untimed"].fillna(0).sum()) if "untimed" in f else 0 for f in (b, n))
        changes = _compare(b, n, [*keys, "shape"], level, min_change)
        if level in ATTENTION_LEVELS:
            changes = _with_counters(changes, _counters(base, pair.base, level), _counters(new, pair.new, level), keys)
        frames.append(changes)
    work = whole_work(base, new, pair, min_change, prefer)
    if work is not None:
        frames.insert(0, pd.DataFrame([{**work["row"], "name": work["name"], "shape": None}]))
    changes = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=difference.CHANGE_COLUMNS)
    changes["rank"] = _pair_rank(pair)
    changes["base_run"], changes["new_run"] = _unit(pair.base), _unit(pair.new)
    if pair.differs:  # not comparable: no row says more than that
        changes["verdict"] = np.where(changes["verdict"].isin(["added", "removed"]), changes["verdict"], "inconclusive")
    if work is not None and work["note"]:  # the windows hold different blocks: a row on one side only was not in the other window
        changes["verdict"] = changes["verdict"].replace({"added": "unpaired", "removed": "unpaired"})
    overall = _overall(pair, changes, work)
    overall["evidence"] = _kernel_time_row(work, pair) + evidence(base, new, pair)
    overall["untimed"] = untimed.get("layer", (0, 0))
    overall["unit"] = work["unit"] if work else None
    return changes, overall


def _stored(side: Side, run: dict) -> pd.DataFrame:
    table = _counters(side, run, "layer")
    if not len(table) or "duration_per_call_p50_ns" not in table:
        return pd.DataFrame()
    return table.rename(columns={"duration_per_call_p10_ns": "p10", "duration_per_call_p50_ns": "p50",
                                 "duration_per_call_p90_ns": "p90"})[["phase", "name", "layer", "calls", "p10", "p50", "p90"]].assign(shape=None)


# ---------------------------------------------------------------- the whole work
def _step_times(side: Side, run: dict) -> np.ndarray:
    if not _has(side.con, "steps"):
        return np.array([])
    t = _query(side.con, f"SELECT step, max(window_ns) AS v FROM steps WHERE {_WHERE} AND step IS NOT NULL "
                         "AND window_ns IS NOT NULL GROUP BY step ORDER BY step", _params(run))
    return t["v"].to_numpy(dtype="float64")


def _step_kernel_time(side: Side, run: dict) -> np.ndarray:
    """Per step, the summed kernel durations of its devices (``steps.kernel_ns``, ns)."""
    if "kernel_ns" not in _columns(side.con, "steps"):
        return np.array([])
    t = _query(side.con, f"SELECT step, sum(kernel_ns) AS v FROM steps WHERE {_WHERE} AND step IS NOT NULL GROUP BY step "
                         "ORDER BY step", _params(run))
    return t["v"].to_numpy(dtype="float64")


def _unit_periods(side: Side, run: dict) -> pd.DataFrame:
    if not _has(side.con, "ranges"):
        return pd.DataFrame(columns=work_units.PERIOD_COLUMNS)
    # emit_nvtx's per-instance suffixes dropped in SQL: a big export's millions of distinct names become a few hundred
    own = _query(side.con, f"SELECT split_part(name, ', ', 1) AS name, strpos(name, ', ') > 0 AS suffixed, depth, pid, tid, "
                           f"start_ns FROM ranges WHERE {_WHERE} AND level = 'other' AND start_ns IS NOT NULL", _params(run))
    return work_units.periods(own)


def whole_work(base: Side, new: Side, pair: Pair, min_change: float, prefer: tuple | None = None) -> dict | None:
    """What the user waits for, both sides: the time per step (at least :data:`~headcount.derive.difference.MIN_CALLS`
    steps a side), else the period of the repeated unit both share (:func:`headcount.derive.work_units.common_unit`),
    judged by :func:`headcount.derive.difference.shift`; ``prefer``: the unit another rank was judged on.

    Returns:
        ``{"basis", "name", "row", "note"}`` (``row``: the change columns, level ``work``); ``None``: neither.
    """
    b, n = _step_times(base, pair.base), _step_times(new, pair.new)
    if len(b) >= difference.MIN_CALLS and len(n) >= difference.MIN_CALLS:
        return {"basis": "time per step", "name": "time per step", "row": difference.shift_row(b, n, "work", min_change),
                "note": None, "unit": None, "kernel_time": (_step_kernel_time(base, pair.base), _step_kernel_time(new, pair.new))}
    pb, pn = _unit_periods(base, pair.base), _unit_periods(new, pair.new)
    unit = work_units.common_unit(pb, pn, prefer)
    if unit is None:
        return None
    pick = lambda p: p[(p["unit"] == unit[0]) & (p["depth"] == unit[1])]  # noqa: E731
    sb, sn = pick(pb), pick(pn)
    cb, cn = work_units.coverage(sb), work_units.coverage(sn)
    note, common = None, None
    if cb != cn:
        note = (f"the windows cover different parts of the run: {unit[0]} at {cb} in {base.path}, at {cn} in {new.path}; "
                "compared per unit over each side's units")
        common = work_units.common_instances(sb, sn)
        if common is not None:
            note += (f"; over the units both windows hold ({common['indices']}): {_ms(common['base_median_ns'])} → "
                     f"{_ms(common['new_median_ns'])} median ({common['change_pct']:+.1f} %, {common['base_spans']} vs "
                     f"{common['new_spans']} spans)")
    kernels = (_launched_kernels(base, pair.base), _launched_kernels(new, pair.new))
    return {"basis": f"span per unit {unit[0]} (start to next start)", "name": unit[0],
            "row": difference.shift_row(sb["period_ns"].to_numpy(), sn["period_ns"].to_numpy(), "work", min_change),
            "note": note, "unit": unit, "common": common,
            "kernel_time": (work_units.kernel_time(sb, kernels[0]), work_units.kernel_time(sn, kernels[1]))}


def _launched_kernels(side: Side, run: dict) -> pd.DataFrame:
    if not _has(side.con, "kernels") or "api_start_ns" not in _columns(side.con, "kernels"):
        return pd.DataFrame(columns=["pid", "tid", "api_start_ns", "duration_ns"])
    return _query(side.con, f"SELECT pid, tid, api_start_ns, duration_ns FROM kernels WHERE {_WHERE} AND kind = 'kernel' "
                            "AND api_start_ns IS NOT NULL AND duration_ns IS NOT NULL", _params(run))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


IDLE_CAUSES = (("idle_launch_bound_ns", "launch-bound idle"), ("idle_sync_ns", "sync idle"), ("idle_host_ns", "host idle"),
               ("idle_capture_ns", "capture idle"), ("idle_other_ns", "other idle"))


def _windows(side: Side, run: dict) -> pd.DataFrame:
    """The unit's device windows (``steps`` rows: per step and device, or one per device where no steps were recorded)."""
    if not _has(side.con, "steps"):
        return pd.DataFrame()
    cols = _columns(side.con, "steps")
    wanted = ["step", "window_ns", "gpu_busy_ns", "communication_ns", "communication_exposed_ns", "attention_gpu_ns",
              *(c for c, _ in IDLE_CAUSES)]
    picks = [c for c in wanted if c in cols]
    return _query(side.con, f"SELECT {', '.join(picks)} FROM steps WHERE {_WHERE} AND window_ns > 0 AND gpu_busy_ns IS NOT NULL",
                  _params(run))


def evidence(base: Side, new: Side, pair: Pair) -> list[dict]:
    """The figures behind the whole work, both sides, from their ``steps`` rows: GPU busy % of the windows (every
    stream), each idle cause and the exposed communication as % of the windows, attention's share of busy time.

    Each figure: ``{"figure", "unit", "base", "new", "base_ms", "new_ms", "ratio", "verdict", "per"}``; ``per`` is
    ``step`` (a verdict by :func:`headcount.derive.difference.shift` over per-step shares, as the way the figure
    moved: ``higher``, ``lower``, ``unchanged``, ``inconclusive``) or ``window`` (one figure a
    side: no spread, no verdict); the shares are sums over the windows (measured), ``ratio`` new ÷ base of the shares.
    """
    wb, wn = _windows(base, pair.base), _windows(new, pair.new)
    if not len(wb) or not len(wn):
        return []
    stepped = wb["step"].notna().sum() >= difference.MIN_CALLS and wn["step"].notna().sum() >= difference.MIN_CALLS
    figures = [("gpu_busy_ns", "GPU busy", "window_ns"), *((c, label, "window_ns") for c, label in IDLE_CAUSES),
               ("communication_exposed_ns", "exposed communication", "window_ns"), ("attention_gpu_ns", "attention", "gpu_busy_ns")]
    out = []
    for column, label, of in figures:
        if column not in wb or column not in wn or (wb[column].isna().all() and wn[column].isna().all()):
            continue
        share = lambda w: 100.0 * w[column].sum() / w[of].sum() if w[of].sum() else np.nan  # noqa: E731
        sb, sn = share(wb), share(wn)
        row = {"figure": label, "unit": f"% of {'the windows' if of == 'window_ns' else 'GPU busy time'}", "base": sb, "new": sn,
               "base_ms": wb[column].sum() / 1e6, "new_ms": wn[column].sum() / 1e6,
               "ratio": sn / sb if sb and np.isfinite(sb) and np.isfinite(sn) else np.nan,
               "per": "step" if stepped else "window", "verdict": None}
        if stepped:
            per = lambda w: (100.0 * w[column] / w[of]).to_numpy(dtype="float64")  # noqa: E731
            row["verdict"] = _direction(difference.shift(per(wb[wb["step"].notna()]), per(wn[wn["step"].notna()]), 0.0)[0])
        out.append({**row, "rank": _pair_rank(pair)})
    return out


def _kernel_time_row(work: dict | None, pair: Pair) -> list[dict]:
    """The evidence row of the GPU work each unit (step) asked for: its kernels' summed durations, median per unit (ms),
    judged by :func:`headcount.derive.difference.shift` (did the kernels get slower, or did the GPU wait?)."""
    if work is None:
        return []
    b, n = (np.asarray(x, dtype="float64") for x in work["kernel_time"])
    b, n = b[np.isfinite(b)], n[np.isfinite(n)]
    if not len(b) or not len(n):
        return []
    per = "step" if work["unit"] is None else "unit"
    mb, mn = float(np.median(b)) / 1e6, float(np.median(n)) / 1e6
    return [{"figure": f"kernel time per {per}", "unit": f"ms (median, summed kernel durations per {per})", "base": mb,
             "new": mn, "base_ms": None, "new_ms": None, "ratio": mn / mb if mb else np.nan, "per": per,
             "verdict": _direction(difference.shift(b, n)[0]), "rank": _pair_rank(pair)}]


def _direction(verdict: str) -> str:
    """An evidence figure's verdict as the way it moved (``higher``, ``lower``): more GPU busy time is no regression."""
    return {"regression": "higher", "improvement": "lower"}.get(verdict, verdict)


def _overall(pair: Pair, changes: pd.DataFrame, work: dict | None) -> dict:
    keep = ["verdict", "change_pct", "p_value", "base_calls", "new_calls", "base_p10_ns", "base_p50_ns", "base_p90_ns",
            "new_p10_ns", "new_p50_ns", "new_p90_ns"]
    if work is not None:
        row, basis = dict(work["row"]), work["basis"]
    else:
        rows = changes[changes["level"] != "work"]
        verdict = difference.overall(rows)
        moved = rows.loc[rows["verdict"] == verdict, "change_pct"].dropna()
        # the overall change is the row that decided it: the largest regression (or improvement)
        change = (moved.max() if verdict == "regression" else moved.min()) if len(moved) else np.nan
        row, basis = {"verdict": verdict, "change_pct": change}, "rows (no steps and no repeated unit in common)"
    if pair.differs:
        row["verdict"] = "inconclusive"
    return {"basis": basis, "rank": _pair_rank(pair), "base_run": _unit(pair.base), "new_run": _unit(pair.new),
            "whole_work": work is not None, "note": work["note"] if work else None,
            "common_units": work.get("common") if work else None, **{k: row.get(k) for k in keep}}


@dataclass
class Diff:
    """The whole diff: its verdict, each pair's overall, every change row, and notes (its headline:
    :func:`headcount.reports.diff_output.headline`)."""

    verdict: str
    overall: list[dict]
    changes: pd.DataFrame
    notes: list[str]
    base: Side
    new: Side
    min_change: float = difference.MIN_CHANGE_PCT


def _shared_time(side: Side, other: Side) -> float | None:
    """The share (0–1) of ``side``'s kernel time in kernel names ``other`` ran too; ``None``: no kernels to tell.

    The names are the short names the report keeps (nsys ``shortName``, Kineto's kernel name): two programs built on
    the same libraries share some (``elementwise_kernel``), which is why the bar is half the time, not any name.
    """
    if not _has(side.con, "kernels") or not _has(other.con, "kernels"):
        return None
    # kernels (operators on a CPU run) only: memcpy and memset rows carry generic names every program shares
    mine = _query(side.con, "SELECT name, sum(duration_ns) AS t FROM kernels WHERE duration_ns IS NOT NULL "
                            "AND kind IN ('kernel', 'op') GROUP BY name")
    theirs = set(_query(other.con, "SELECT DISTINCT name FROM kernels WHERE kind IN ('kernel', 'op')")["name"].tolist())
    total = mine["t"].sum()
    return float(mine.loc[mine["name"].isin(theirs), "t"].sum() / total) if total else None


SAME_PROGRAM = 0.5
"""The least share of one side's kernel time in kernels both sides ran for two recordings to be one program's."""


def diff(base: Side, new: Side, run_ids: list[str] | None = None, min_change: float = difference.MIN_CHANGE_PCT) -> Diff:
    """Pair the runs, compare the whole work and every row, and give the verdict (regression if any pair regressed, …).

    Args:
        min_change: the least change of a median (%) that can be a regression or improvement.

    Raises:
        HeadcountError: what :func:`pair_runs` refuses; recordings of different programs; nothing in common to compare.
    """
    pairs, notes = pair_runs(base, new, run_ids)
    shared = [x for x in (_shared_time(base, new), _shared_time(new, base)) if x is not None]
    if len(shared) == 2 and max(shared) < SAME_PROGRAM:
        raise HeadcountError(f"{base.path} and {new.path} look like recordings of different programs: "
                             f"{100 * shared[0]:.0f} % and {100 * shared[1]:.0f} % of their kernel time is in kernels the other ran",
                             hint="diff two recordings of the same program, before and after one change")
    frames, overalls, unit = [], [], None
    for p in pairs:
        changes, overall = diff_pair(base, new, p, min_change, unit)
        unit = unit or overall["unit"]
        frames.append(changes)
        overalls.append(overall)
        moved = changes[changes["calls_changed"].astype(bool) & changes["level"].isin(ATTENTION_LEVELS)
                        & (changes["base_calls"] > 0) & (changes["new_calls"] > 0)]
        if len(moved):
            notes.append(f"{overall['rank']}: {len(moved)} attention rows ran a different number of calls: compared per call, "
                         "the counts are in base_calls/new_calls")
        if overall["note"]:
            notes.append(f"{overall['rank']}: {overall['note']}")
        if any(overall["untimed"]):
            notes.append(f"{overall['rank']}: {overall['untimed'][0]} → {overall['untimed'][1]} attention calls have no GPU time "
                         "(their kernels fell outside the recording): counted in the layers table, not compared")
    changes = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=difference.CHANGE_COLUMNS)
    compared = changes[changes["verdict"].isin(["regression", "improvement", "unchanged"])]
    if not any(o["whole_work"] for o in overalls) and not len(compared) and not any(p.differs for p in pairs):
        raise HeadcountError(f"{base.path} and {new.path} have nothing in common to compare: no steps, no repeated unit, "
                             "no row with calls on both sides", hint="diff two recordings of the same program and part of its run")
    verdict = difference.overall(pd.DataFrame({"verdict": [o["verdict"] for o in overalls]}))
    if all(o["verdict"] == "inconclusive" for o in overalls):
        verdict = "inconclusive"
    return Diff(verdict, overalls, changes, notes, base, new, min_change)


def gate(result: Diff, pct: float) -> list[str]:
    """What fails ``--fail-on-regression PCT``: a pair's whole work (its overall verdict) regressed by more than ``pct`` %."""
    def change(v):
        return "(change unknown)" if v is None or pd.isna(v) else f"{v:+.1f} %"
    return [f"{o['rank']}: {o['basis']} {change(o['change_pct'])}" for o in result.overall
            if o["verdict"] == "regression" and (o["change_pct"] is None or pd.isna(o["change_pct"]) or o["change_pct"] > pct)]


def row_regressions(result: Diff, pct: float) -> pd.DataFrame:
    """Attention rows regressed by more than ``pct`` % (reported beside the gate, never gating: the whole work does)."""
    c = result.changes
    return c[(c["verdict"] == "regression") & c["level"].isin(ATTENTION_LEVELS) & (c["change_pct"] > pct)]
