"""``headcount diff BASE NEW``: what changed between two reports (or recordings), per call.

Each side is a report directory, or a recording that ``headcount diff`` has
parsed first into a temporary report, exactly as ``headcount parse`` would
(:mod:`headcount.cli.diff_cmd`). The sides' runs are
paired (:func:`pair_runs`), and within each pair every row is compared by
:mod:`headcount.derive.difference`'s rule on its per-call distribution:

- ``step``: the time of each step (the longest of its devices' windows,
  ``steps.window_ns``);
- ``layer`` / ``head``: attention range instances (``ranges``, levels
  ``layer`` and ``head``), matched on (phase, layer name, head); a report
  without range instances (ncu) is compared on its layers' stored percentiles;
- ``kernel``: GPU kernels, memcpys and memsets by name (CPU operators on a CPU run);
- ``range``: other NVTX ranges by name (the part before ``, `` in PyTorch's
  ``emit_nvtx`` names: ``aten::mm, op_id = 12`` counts as ``aten::mm``).

Per-call percentiles are computed in DuckDB over the report's files
(``quantile_cont``: linear interpolation), so a large report is never held
in pandas whole.

The **overall verdict** of a pair comes from the time per step where both
sides have at least three steps; else from the attention time per call (every
attention layer call of the pair, pooled); else from its rows (regression if
any row regressed, its change the largest row's). Runs that differ in model, batch, sequence length, dtype
or device are not comparable: ``inconclusive``, naming the fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.common import shown_names as names
from headcount.common.errors import HeadcountError
from headcount.common.numbers import number
from headcount.derive import difference

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
    parts = [f"SELECT DISTINCT run_id, implementation FROM {t}" for t in ("steps", "layers", "kernels") if _has(con, t)]
    if not parts:
        return pd.DataFrame()
    units = _query(con, " UNION ".join(parts) + " ORDER BY run_id, implementation")
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
            match = next((m for m in free if all(str(r.get(k)) == str(m.get(k)) for k in keys if k in r or k in m)), None)
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


# ---------------------------------------------------------------- per-call summaries (DuckDB)
_Q = ("count(*) AS calls, quantile_cont(v, 0.1) AS p10, quantile_cont(v, 0.5) AS p50, quantile_cont(v, 0.9) AS p90")


def _summaries(side: Side, run: dict, level: str) -> pd.DataFrame:
    """Per-call (p10, p50, p90, calls) of one unit's rows of ``level``, with their keys."""
    con, where = side.con, "run_id = ? AND implementation IS NOT DISTINCT FROM ?"
    params = [str(run["run_id"]), run.get("implementation")]
    if level in ATTENTION_LEVELS:
        if not _has(con, "ranges"):
            return pd.DataFrame()
        head = ", head" if level == "head" else ""
        capture = "AND NOT coalesce(graph_capture, false)" if "graph_capture" in _columns(con, "ranges") else ""
        return _query(con, f"SELECT phase, layer_name AS name, any_value(layer) AS layer{head}, {_Q} FROM "
                           f"(SELECT *, duration_ns AS v FROM ranges WHERE {where} AND level = '{level}' AND duration_ns IS NOT NULL {capture}) "
                           f"GROUP BY phase, layer_name{head}", params)
    if level == "kernel":
        if not _has(con, "kernels"):
            return pd.DataFrame()
        kinds = _query(con, f"SELECT DISTINCT kind FROM kernels WHERE {where}", params)["kind"].tolist()
        gpu = [k for k in kinds if k in ("kernel", "memcpy", "memset")]
        chosen = gpu or [k for k in kinds if k == "op"]
        if not chosen:
            return pd.DataFrame()
        listed = ", ".join(f"'{k}'" for k in chosen)
        return _query(con, f"SELECT name, {_Q} FROM (SELECT name, duration_ns AS v FROM kernels WHERE {where} AND kind IN ({listed}) "
                           "AND duration_ns IS NOT NULL) GROUP BY name", params)
    if level == "range":
        if not _has(con, "ranges"):
            return pd.DataFrame()
        # PyTorch's emit_nvtx ranges carry per-instance suffixes (", op_id = 12, sizes = …"): grouped by the name before them
        return _query(con, f"SELECT name, {_Q} FROM (SELECT split_part(name, ', ', 1) AS name, duration_ns AS v FROM ranges "
                           f"WHERE {where} AND level = 'other' AND duration_ns IS NOT NULL) GROUP BY name", params)
    if level == "step":
        if not _has(con, "steps"):
            return pd.DataFrame()
        return _query(con, f"SELECT 'time per step' AS name, {_Q} FROM (SELECT step, max(window_ns) AS v FROM steps WHERE {where} "
                           "AND step IS NOT NULL AND window_ns IS NOT NULL GROUP BY step) HAVING count(*) > 0", params)
    raise ValueError(level)


def _columns(con, table: str) -> set[str]:
    return set(con.sql(f"SELECT * FROM {table} LIMIT 0").columns)


def _attention_pooled(side: Side, run: dict) -> tuple[tuple, int]:
    """(p10, p50, p90) and calls of every attention layer call of a unit, pooled (the overall basis without steps)."""
    if not _has(side.con, "ranges"):
        return (np.nan, np.nan, np.nan), 0
    r = _query(side.con, f"SELECT {_Q} FROM (SELECT duration_ns AS v FROM ranges WHERE run_id = ? AND implementation IS NOT DISTINCT "
                         "FROM ? AND level = 'layer' AND duration_ns IS NOT NULL)", [str(run["run_id"]), run.get("implementation")])
    row = r.iloc[0]
    return (row["p10"], row["p50"], row["p90"]), int(row["calls"])


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
    if not len(changes) or not len(base) or not len(new):
        return changes
    names = [c for c in COUNTERS if c in base.columns and c in new.columns]
    if not names:
        return changes
    both = base[keys + names].merge(new[keys + names], on=keys, how="inner", suffixes=("_base", "_new"))
    both = both.rename(columns={f"{c}_base": f"base_{c}" for c in names} | {f"{c}_new": f"new_{c}" for c in names})
    return changes.merge(both, on=keys, how="left")


def diff_pair(base: Side, new: Side, pair: Pair, min_change: float = difference.MIN_CHANGE_PCT) -> tuple[pd.DataFrame, dict]:
    """Every change row of one pair, and its overall verdict.

    Returns:
        ``(changes, overall)``: :data:`headcount.derive.difference.CHANGE_COLUMNS` plus ``base_run``,
        ``new_run`` and counter columns; ``overall`` with ``basis``, ``verdict`` and the change columns.
    """
    frames = []
    for level, keys in (("step", ["name"]), ("layer", ["phase", "name"]), ("head", ["phase", "name", "head"]),
                        ("kernel", ["name"]), ("range", ["name"])):
        b, n = _summaries(base, pair.base, level), _summaries(new, pair.new, level)
        if level == "layer" and not len(b) and not len(n):  # no range instances (ncu): the stored percentiles
            b, n = _stored(base, pair.base), _stored(new, pair.new)
        if not len(b) and not len(n):
            continue
        changes = _compare(b, n, keys, level, min_change)
        if level in ATTENTION_LEVELS:
            changes = _with_counters(changes, _counters(base, pair.base, level), _counters(new, pair.new, level), keys)
        frames.append(changes)
    changes = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=difference.CHANGE_COLUMNS)
    changes["base_run"], changes["new_run"] = _unit(pair.base), _unit(pair.new)
    if pair.differs:  # not comparable: no row says more than that
        changes["verdict"] = np.where(changes["verdict"].isin(["added", "removed"]), changes["verdict"], "inconclusive")
    return changes, _overall(base, new, pair, changes, min_change)


def _stored(side: Side, run: dict) -> pd.DataFrame:
    table = _counters(side, run, "layer")
    if not len(table) or "duration_per_call_p50_ns" not in table:
        return pd.DataFrame()
    return table.rename(columns={"duration_per_call_p10_ns": "p10", "duration_per_call_p50_ns": "p50",
                                 "duration_per_call_p90_ns": "p90"})[["phase", "name", "layer", "calls", "p10", "p50", "p90"]]


def _overall(base: Side, new: Side, pair: Pair, changes: pd.DataFrame, min_change: float) -> dict:
    steps = changes[changes["level"] == "step"]
    if len(steps) and (steps["base_calls"] >= difference.MIN_CALLS).all() and (steps["new_calls"] >= difference.MIN_CALLS).all():
        row = steps.iloc[0].to_dict()
        basis = "time per step"
    else:
        (bp, bc), (np_, nc) = _attention_pooled(base, pair.base), _attention_pooled(new, pair.new)
        if bc >= difference.MIN_CALLS and nc >= difference.MIN_CALLS:
            row = difference.summary_row(bp, np_, bc, nc, "attention", min_change)
            basis = "attention time per call"
        else:
            verdict = difference.overall(changes)
            moved = changes.loc[changes["verdict"] == verdict, "change_pct"].dropna()
            # the overall change is the row that decided it: the largest regression (or improvement)
            change = (moved.max() if verdict == "regression" else moved.min()) if len(moved) else np.nan
            row = {"verdict": verdict, "change_pct": change}
            basis = "rows (no steps and too few attention calls to compare)"
    if pair.differs:
        row["verdict"] = "inconclusive"
    keep = ["verdict", "change_pct", "base_calls", "new_calls", "base_p10_ns", "base_p50_ns", "base_p90_ns",
            "new_p10_ns", "new_p50_ns", "new_p90_ns"]
    return {"basis": basis, "base_run": _unit(pair.base), "new_run": _unit(pair.new), **{k: row.get(k) for k in keep}}


@dataclass
class Diff:
    """The whole diff: its verdict, each pair's overall, every change row, and notes."""

    verdict: str
    overall: list[dict]
    changes: pd.DataFrame
    notes: list[str]
    base: Side
    new: Side
    min_change: float = difference.MIN_CHANGE_PCT


def diff(base: Side, new: Side, run_ids: list[str] | None = None, min_change: float = difference.MIN_CHANGE_PCT) -> Diff:
    """Pair the runs, compare every row, and give the verdict (regression if any pair regressed, …).

    Args:
        min_change: the least change of a median (%) that can be a regression or improvement.
    """
    pairs, notes = pair_runs(base, new, run_ids)
    frames, overalls = [], []
    for p in pairs:
        changes, overall = diff_pair(base, new, p, min_change)
        frames.append(changes)
        overalls.append(overall)
        moved = changes[changes["calls_changed"].astype(bool) & changes["level"].isin(ATTENTION_LEVELS)]
        if len(moved):
            notes.append(f"{len(moved)} attention rows ran a different number of calls ({_unit(p.base)} → {_unit(p.new)}): "
                         "compared per call, the counts are in base_calls/new_calls")
    changes = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=difference.CHANGE_COLUMNS)
    verdict = difference.overall(pd.DataFrame({"verdict": [o["verdict"] for o in overalls]}))
    if all(o["verdict"] == "inconclusive" for o in overalls):
        verdict = "inconclusive"
    return Diff(verdict, overalls, changes, notes, base, new, min_change)


def gate(result: Diff, pct: float) -> list[str]:
    """What fails ``--fail-on-regression PCT``: the overall verdict or any attention row, regressed by more than ``pct`` %."""
    failed = [f"overall ({o['basis']}, {o['new_run']}): {percent(o['change_pct'])}" for o in result.overall
              if o["verdict"] == "regression" and (o["change_pct"] is None or pd.isna(o["change_pct"]) or o["change_pct"] > pct)]
    rows = result.changes[(result.changes["verdict"] == "regression") & result.changes["level"].isin(ATTENTION_LEVELS)
                          & (result.changes["change_pct"] > pct)]
    failed += [f"{r.level} {r.phase} {r.name}{'' if pd.isna(r.head) else f' head {int(r.head)}'}: {percent(r.change_pct)}"
               for r in rows.itertuples()]
    return failed


# ---------------------------------------------------------------- ordering and writing
ORDER = {"regression": 0, "improvement": 1, "added": 2, "removed": 3, "inconclusive": 4, "unchanged": 5}


def notable(changes: pd.DataFrame) -> pd.DataFrame:
    """The rows worth showing, :func:`ranked`: regressions, improvements, rows added or removed (not
    ``unchanged``, nor ``inconclusive``: those are counted, not listed)."""
    shown = ranked(changes)
    return shown[shown["verdict"].isin(["regression", "improvement", "added", "removed"])]


def ranked(changes: pd.DataFrame) -> pd.DataFrame:
    """Regressions first (largest change first), then improvements, added, removed, inconclusive, unchanged."""
    key = changes["verdict"].map(ORDER).fillna(9)
    magnitude = -changes["change_pct"].abs().fillna(0)
    return changes.assign(_k=key, _m=magnitude).sort_values(["_k", "_m"], kind="stable").drop(columns=["_k", "_m"])


def _clean(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def as_json(result: Diff) -> dict:
    """The diff as the documented JSON document (docs/cli.md § headcount diff)."""
    changes = []
    for r in ranked(result.changes).to_dict("records"):
        row = {k: _clean(r.get(k)) for k in difference.CHANGE_COLUMNS}
        row["base_run"], row["new_run"] = r.get("base_run"), r.get("new_run")
        counters = {c: {"base": _clean(r.get(f"base_{c}")), "new": _clean(r.get(f"new_{c}"))} for c in COUNTERS
                    if f"base_{c}" in r and (_clean(r.get(f"base_{c}")) is not None or _clean(r.get(f"new_{c}")) is not None)}
        if counters:
            row["counters"] = counters
        changes.append(row)
    return {
        "verdict": result.verdict,
        "base": {"path": result.base.path, "runs": sorted({str(o["base_run"]) for o in result.overall})},
        "new": {"path": result.new.path, "runs": sorted({str(o["new_run"]) for o in result.overall})},
        "overall": [{k: _clean(v) for k, v in o.items()} for o in result.overall],
        "rule": {"min_calls": difference.MIN_CALLS, "min_change_pct": result.min_change,
                 "text": "regression: new p10 > base p90 and the median grew by more than min_change_pct; improvement: the mirror image; "
                         "per call (per step for steps), at least min_calls on each side"},
        "notes": list(result.notes),
        "changes": changes,
    }


def duration(ns) -> str:
    """A time in ns as ``0.761 ms`` or ``5.0 µs`` (three significant digits; ``–`` when unknown)."""
    if ns is None or pd.isna(ns):
        return "–"
    return f"{number(ns / 1e6)} ms" if ns >= 1e5 else f"{number(ns / 1e3)} µs"


def spread(r: dict, side: str) -> str:
    """``p50 (p10–p90)`` of one side of a change row; ``–`` where the side has no calls."""
    if r.get(f"{side}_p50_ns") is None or pd.isna(r.get(f"{side}_p50_ns")):
        return "–"
    if pd.isna(r.get(f"{side}_p10_ns")) or r.get(f"{side}_calls", 0) < 2:
        return duration(r[f"{side}_p50_ns"])
    return f"{duration(r[f'{side}_p50_ns'])} ({duration(r[f'{side}_p10_ns'])}–{duration(r[f'{side}_p90_ns'])})"


def percent(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:+.1f} %"


def row_label(r) -> str:
    """``layer fwd layer.3 head 2``, ``kernel flash_fwd…``, ``step time per step``."""
    name = names.shown(r["name"], 70) if r["level"] == "kernel" else str(r["name"])
    phase = f" {r['phase']}" if "phase" in r and isinstance(r.get("phase"), str) else ""
    head = "" if r.get("head") is None or pd.isna(r.get("head")) else f" head {int(r['head'])}"
    return f"{r['level']}{phase} {name}{head}"


def as_markdown(result: Diff, top: int = 20) -> str:
    """A pull-request comment: the verdict, each pair's overall line, the top changes, the notes, the rule."""
    lines = [f"### headcount diff: **{result.verdict}**", ""]
    for o in result.overall:
        lines.append(f"- {o['base_run']} → {o['new_run']}: **{o['verdict']}** on {o['basis']}"
                     + (f", median {duration(o.get('base_p50_ns'))} → {duration(o.get('new_p50_ns'))} ({percent(o.get('change_pct'))})"
                        if o.get("base_p50_ns") is not None and not pd.isna(o.get("base_p50_ns")) else ""))
    shown = notable(result.changes).head(top)
    counts = result.changes.groupby(["level", "verdict"]).size()
    lines += ["", "| change | verdict | base calls | new calls | base p50 (p10–p90) | new p50 (p10–p90) | median |",
              "|---|---|---:|---:|---|---|---:|"]
    for r in shown.to_dict("records"):
        lines.append(f"| {row_label(r)} | {r['verdict']} | {r['base_calls']} | {r['new_calls']} | "
                     f"{spread(r, 'base')} | {spread(r, 'new')} | {percent(r['change_pct'])} |")
    if not len(shown):
        lines.append("| (no row changed beyond its spread) | | | | | | |")
    lines += ["", "Rows: " + "; ".join(f"{level} {verdict} {n}" for (level, verdict), n in counts.items()), ""]
    lines += [f"- note: {n}" for n in result.notes]
    lines += ["", f"_Per call, against the spread: a row regressed only when the new p10–p90 interval lies wholly above the "
                  f"base's and its median grew by more than {result.min_change:g} % (at least {difference.MIN_CALLS} "
                  "calls a side)._"]
    return "\n".join(lines) + "\n"
