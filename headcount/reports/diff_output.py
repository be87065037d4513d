"""How ``headcount diff`` says what it found: the headline, the JSON document, the console's lines, markdown, HTML.

Presentation only: :mod:`headcount.reports.diff` computes the :class:`~headcount.reports.diff.Diff`; this module
writes it, the same verdict and evidence in every form.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common import shown_names as names
from headcount.common.numbers import number
from headcount.derive import difference
from headcount.reports.diff import COUNTERS, Diff

MOVED_PT = 2.0
"""The least move of a figure's share (points of the windows) that the headline names as evidence."""


def headline(result: Diff) -> str:
    """``regression: span per unit … +16.1 % (cuda:0), +17.4 % (cuda:1); GPU busy 91.3 → 80.2 %, 89.5 → 84.9 %; …``"""
    parts = []
    by_basis: dict = {}
    for o in result.overall:
        by_basis.setdefault(o["basis"], []).append(o)
    for basis, group in by_basis.items():
        moves = ", ".join(f"{percent(o['change_pct'])} ({o['rank']})" if len(result.overall) > 1 else percent(o["change_pct"])
                          for o in group)
        parts.append(f"{basis} {moves}")
    figures: dict = {}
    for o in result.overall:
        for e in o.get("evidence", []):
            figures.setdefault(e["figure"], []).append(e)
    shown = []
    busy = figures.get("GPU busy", [])
    if busy:
        shown.append("GPU busy " + ", ".join(f"{e['base']:.1f} → {e['new']:.1f} %" for e in busy))
    for label, rows in figures.items():
        if label.startswith("kernel time"):  # did the kernels get slower, or did the GPU wait: always said
            verdicts = sorted({e["verdict"] for e in rows})
            shown.append(f"{label} " + ", ".join(f"{number(e['base'])} → {number(e['new'])} ms" for e in rows)
                         + f" ({'/'.join(verdicts)})")
            continue
        if label in ("GPU busy", "attention"):
            continue
        # evidence is what moved: by half or more of its share, and by at least MOVED_PT points of the windows
        moved = [e for e in rows if e["ratio"] is not None and np.isfinite(e["ratio"]) and abs(e["new"] - e["base"]) >= MOVED_PT
                 and (e["ratio"] >= 1.5 or e["ratio"] <= 1 / 1.5)]
        if not moved:
            continue
        up = {e["ratio"] > 1 for e in moved}
        if len(up) == 1:
            lo, hi = min(e["ratio"] for e in moved), max(e["ratio"] for e in moved)
            shown.append(f"{label} ×{lo:.2g}" + (f"–{hi:.2g}" if f"{hi:.2g}" != f"{lo:.2g}" else ""))
        else:
            shown.append(f"{label} " + ", ".join(f"×{e['ratio']:.2g} ({e['rank']})" for e in moved))
    return f"{result.verdict}: " + "; ".join(parts) + ("; " + ", ".join(shown) if shown else "")




# ---------------------------------------------------------------- ordering and writing
ORDER = {"regression": 0, "improvement": 1, "added": 2, "removed": 3, "unpaired": 4, "inconclusive": 5, "unchanged": 6}


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


RULE = ("whole work (time per step, else span per repeated unit): regression when a one-sided Mann–Whitney U test finds the "
        "new samples larger at p < {alpha} (or every new sample lies above every base one) and the median grew by more than "
        "{min_change:g} %; rows, per call and per shape: "
        "regression when the new p10 lies above the base p90 and the median grew by more than {min_change:g} % "
        "(at least {min_calls} calls a side); improvement: the mirror image")


def rule_text(min_change: float) -> str:
    return RULE.format(alpha=difference.ALPHA, min_change=min_change, min_calls=difference.MIN_CALLS)


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
    def overall(o):
        out = {k: _clean(v) for k, v in o.items() if k not in ("evidence", "untimed", "unit")}
        out["evidence"] = [{k: _clean(v) for k, v in e.items()} for e in o.get("evidence", [])]
        out["untimed_calls"] = {"base": int(o.get("untimed", (0, 0))[0]), "new": int(o.get("untimed", (0, 0))[1])}
        return out
    return {
        "verdict": result.verdict,
        "headline": headline(result),
        "base": {"path": result.base.path, "runs": sorted({str(o["base_run"]) for o in result.overall})},
        "new": {"path": result.new.path, "runs": sorted({str(o["new_run"]) for o in result.overall})},
        "overall": [overall(o) for o in result.overall],
        "rule": {"min_calls": difference.MIN_CALLS, "min_change_pct": result.min_change, "alpha": difference.ALPHA,
                 "text": rule_text(result.min_change)},
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
    """``layer fwd layer.3 head 2 [grid (122, 1, 12) block (128, 1, 1)]``, ``kernel flash_fwd…``, ``work time per step``."""
    name = names.shown(r["name"], 70) if r["level"] == "kernel" else str(r["name"])
    phase = f" {r['phase']}" if "phase" in r and isinstance(r.get("phase"), str) else ""
    head = "" if r.get("head") is None or pd.isna(r.get("head")) else f" head {int(r['head'])}"
    shape = f" [{r['shape']}]" if isinstance(r.get("shape"), str) and r.get("shape") else ""
    return f"{r['level']}{phase} {name}{head}{shape}"


def evidence_lines(o: dict) -> list[str]:
    """One pair's evidence as lines: ``GPU busy: 91.3 → 80.2 % of the windows (one window a side, no spread)``."""
    out = []
    for e in o.get("evidence", []):
        if e["base"] is None or (isinstance(e["base"], float) and not np.isfinite(e["base"])) or (not e["base"] and not e["new"]):
            continue
        ms = f" ({number(e['base_ms'])} → {number(e['new_ms'])} ms)" if e.get("base_ms") is not None else ""
        ratio = f", ×{e['ratio']:.2g}" if e["figure"] not in ("GPU busy", "attention") and not e["figure"].startswith("kernel time") \
            and e["ratio"] is not None \
            and np.isfinite(e["ratio"]) else ""
        judged = f": {e['verdict']}" if e["verdict"] else " (one window a side: no spread, no verdict)"
        fmt = (lambda v: number(v)) if e["figure"].startswith("kernel time") else (lambda v: f"{v:.1f}")  # noqa: E731
        out.append(f"{e['figure']}: {fmt(e['base'])} → {fmt(e['new'])} {e['unit']}{ms}{ratio}{judged}")
    return out


def overall_line(o: dict) -> str:
    tail = ""
    if o.get("base_p50_ns") is not None and not pd.isna(o.get("base_p50_ns")):
        tail = (f", median {duration(o['base_p50_ns'])} → {duration(o['new_p50_ns'])} ({percent(o['change_pct'])}; "
                f"{o['base_calls']} vs {o['new_calls']}" + (f", p = {o['p_value']:.2g}" if o.get("p_value") is not None
                                                              and not pd.isna(o.get("p_value")) else "") + ")")
    return f"{o['rank']} ({o['base_run']} → {o['new_run']}): {o['verdict']} on {o['basis']}{tail}"


def as_markdown(result: Diff, top: int = 20) -> str:
    """A pull-request comment: the verdict and its headline, each pair's whole work and evidence, the top changes, the notes, the rule."""
    lines = [f"### headcount diff: **{result.verdict}**", "", headline(result), ""]
    for o in result.overall:
        lines.append(f"- {overall_line(o)}")
        lines += [f"  - {e}" for e in evidence_lines(o)]
    shown = notable(result.changes[result.changes["level"] != "work"]).head(top)
    counts = result.changes.groupby(["level", "verdict"]).size()
    lines += ["", "| rank | change | verdict | base calls | new calls | base p50 (p10–p90) | new p50 (p10–p90) | median |",
              "|---|---|---|---:|---:|---|---|---:|"]
    for r in shown.to_dict("records"):
        lines.append(f"| {r['rank']} | {row_label(r)} | {r['verdict']} | {r['base_calls']} | {r['new_calls']} | "
                     f"{spread(r, 'base')} | {spread(r, 'new')} | {percent(r['change_pct'])} |")
    if not len(shown):
        lines.append("| | (no row changed beyond its spread) | | | | | | |")
    lines += ["", "Rows: " + "; ".join(f"{level} {verdict} {n}" for (level, verdict), n in counts.items()), ""]
    lines += [f"- note: {n}" for n in result.notes]
    lines += ["", f"_{rule_text(result.min_change)} (docs/cli.md § headcount diff)._"]
    return "\n".join(lines) + "\n"


def as_html(result: Diff, top: int = 20) -> str:
    """The same verdict, headline, evidence, rows and notes as :func:`as_markdown`, as one self-contained HTML page."""
    from html import escape

    def table(head: list[str], rows: list[list[str]]) -> str:
        th = "".join(f"<th>{escape(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    parts = [f"<h1>headcount diff: <span class='verdict {escape(result.verdict)}'>{escape(result.verdict)}</span></h1>",
             f"<p class='headline'>{escape(headline(result))}</p>",
             f"<p>{escape(result.base.path)} → {escape(result.new.path)}</p>", "<h2>Whole work, per rank</h2>"]
    for o in result.overall:
        parts.append(f"<h3>{escape(overall_line(o))}</h3>")
        ev = evidence_lines(o)
        if ev:
            parts.append("<ul>" + "".join(f"<li>{escape(e)}</li>" for e in ev) + "</ul>")
    shown = notable(result.changes[result.changes["level"] != "work"]).head(top)
    parts.append("<h2>Top changes</h2>")
    parts.append(table(["rank", "change", "verdict", "base calls", "new calls", "base p50 (p10–p90)", "new p50 (p10–p90)", "median"],
                       [[r["rank"], row_label(r), r["verdict"], r["base_calls"], r["new_calls"], spread(r, "base"),
                         spread(r, "new"), percent(r["change_pct"])] for r in shown.to_dict("records")]
                       or [["", "(no row changed beyond its spread)", "", "", "", "", "", ""]]))
    if result.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>")
    parts.append(f"<p class='rule'>{escape(rule_text(result.min_change))} (docs/cli.md § headcount diff).</p>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}.regression{color:#b00}.improvement{color:#070}")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>headcount diff: {escape(result.verdict)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
