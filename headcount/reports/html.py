"""``headcount report``: one self-contained HTML page (no script, no network:
inline CSS and SVG) that shows where attention's time and bytes go.

Sections: the runs, the implementation comparison, the bottlenecks in words,
layer × head heatmaps per implementation and phase (time, bandwidth, DRAM
bytes, occupancy where measured), and a roofline of the layers against the
device's ceilings. Every figure names its unit and provenance; every text
that comes from a profile (names, paths) is escaped.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.derive import devices
from headcount.reports.compare import comparison
from headcount.reports.query import connect

# a perceptually ordered ramp (viridis, 9 stops)
_RAMP = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d1d1f;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f6}td.l,th.l{text-align:left}.note{color:#8a5300}.cap{color:#555;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:24px}svg text{font-family:system-ui,sans-serif}
"""


def _e(value) -> str:
    return html.escape("" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value), quote=True)


def _num(value, spec: str = ",.3g") -> str:
    if value is None or pd.isna(value):
        return "–"
    return format(float(value), spec)


def _color(t: float) -> str:
    if t is None or math.isnan(t):
        return "#e6e6e6"
    t = min(max(t, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in (_RAMP[i], _RAMP[i + 1]))
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def heatmap(frame: pd.DataFrame, value: str, title: str, unit: str, provenance: str, scale: float = 1.0) -> str:
    """An SVG heatmap: layers down, heads across, colour = ``value`` × ``scale``."""
    layers = sorted(frame["layer"].dropna().unique().tolist())
    heads = sorted(frame["head"].dropna().unique().tolist())
    if not layers or not heads:
        return ""
    grid = frame.pivot_table(index="layer", columns="head", values=value, aggfunc="sum") * scale
    finite = grid.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return ""
    lo, hi = float(finite.min()), float(finite.max())
    cell, left, top = 22, 64, 30
    width, height = max(left + cell * len(heads) + 90, 460), top + cell * len(layers) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
             f'<text x="0" y="16" font-size="13" font-weight="600">{_e(title)}</text>']
    for j, h in enumerate(heads):
        parts.append(f'<text x="{left + j * cell + cell / 2}" y="{top - 4}" font-size="10" text-anchor="middle">{int(h)}</text>')
    for i, layer in enumerate(layers):
        y = top + i * cell
        parts.append(f'<text x="{left - 6}" y="{y + cell * 0.7}" font-size="10" text-anchor="end">layer {int(layer)}</text>')
        for j, h in enumerate(heads):
            v = grid.loc[layer, h] if (layer in grid.index and h in grid.columns) else float("nan")
            t = (v - lo) / (hi - lo) if hi > lo else 0.5
            parts.append(f'<rect x="{left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{_color(t)}">'
                         f'<title>layer {int(layer)} head {int(h)}: {_num(v)} {_e(unit)}</title></rect>')
    bar_x = left + cell * len(heads) + 14
    for k in range(10):
        parts.append(f'<rect x="{bar_x}" y="{top + k * (cell * len(layers) / 10)}" width="12" height="{cell * len(layers) / 10 + 0.5}" '
                     f'fill="{_color(1 - k / 9)}"/>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + 10}" font-size="10">{_num(hi)}</text>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + cell * len(layers)}" font-size="10">{_num(lo)}</text>')
    parts.append(f'<text x="0" y="{height - 8}" font-size="11" fill="#555">{_e(unit)}; {_e(provenance)}; head across, layer down</text>')
    parts.append("</svg>")
    return "".join(parts)


def roofline(points: pd.DataFrame, device_name: str | None, dtype: str | None, measured_gbps: float | None = None) -> str:
    """An SVG roofline (log–log): FLOP/byte across, achieved FLOP/s up, one
    point per layer row, with the device's bandwidth and compute ceilings."""
    pts = points.dropna(subset=["intensity_flop_per_byte", "flop", "duration_ns"])
    pts = pts[(pts["intensity_flop_per_byte"] > 0) & (pts["duration_ns"] > 0) & (pts["flop"] > 0)]
    peaks = devices.peaks_for(device_name)
    bw = (measured_gbps or (peaks.dram_gbps if peaks else None))
    peak = peaks.tflops.get(dtype) * 1e12 if peaks and dtype in peaks.tflops else None
    xs = pts["intensity_flop_per_byte"].to_numpy(float)
    ys = (pts["flop"] / (pts["duration_ns"] * 1e-9)).to_numpy(float)
    x_lo, x_hi = (xs.min() / 4, xs.max() * 4) if len(xs) else (0.1, 1000.0)
    y_vals = list(ys) + ([peak] if peak else [])
    y_lo, y_hi = (min(y_vals) / 4, max(y_vals) * 4) if y_vals else (1e6, 1e15)
    if peak and bw:
        x_hi = max(x_hi, peak / (bw * 1e9) * 4)
    w, h, m = 620, 380, 56

    def px(x):
        return m + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (w - 2 * m)

    def py(y):
        return h - m + -(math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * (h - 2 * m)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" aria-label="roofline">',
             f'<rect x="{m}" y="{m}" width="{w - 2 * m}" height="{h - 2 * m}" fill="#fafafa" stroke="#ccc"/>']
    for e in range(math.ceil(math.log10(x_lo)), math.floor(math.log10(x_hi)) + 1):
        parts.append(f'<text x="{px(10 ** e)}" y="{h - m + 16}" font-size="10" text-anchor="middle">1e{e}</text>')
    for e in range(math.ceil(math.log10(y_lo)), math.floor(math.log10(y_hi)) + 1):
        parts.append(f'<text x="{m - 6}" y="{py(10 ** e) + 3}" font-size="10" text-anchor="end">1e{e}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 14}" font-size="11" text-anchor="middle">intensity, FLOP/byte (analytic FLOPs ÷ DRAM bytes)</text>')
    parts.append(f'<text x="14" y="{h / 2}" font-size="11" text-anchor="middle" transform="rotate(-90 14 {h / 2})">FLOP/s achieved</text>')
    if bw:
        x_knee = peak / (bw * 1e9) if peak else x_hi
        x0, x1 = x_lo, min(x_knee, x_hi)
        parts.append(f'<line x1="{px(x0)}" y1="{py(max(bw * 1e9 * x0, y_lo))}" x2="{px(x1)}" y2="{py(min(bw * 1e9 * x1, y_hi))}" '
                     f'stroke="#c0392b" stroke-width="2"><title>DRAM ceiling {bw:,.0f} GB/s</title></line>')
        if peak:
            parts.append(f'<line x1="{px(x_knee)}" y1="{py(peak)}" x2="{px(x_hi)}" y2="{py(peak)}" stroke="#c0392b" stroke-width="2">'
                         f'<title>compute ceiling {peak / 1e12:,.0f} TFLOP/s ({_e(dtype)})</title></line>')
    colors = {"fwd": "#2c728e", "bwd": "#e67e22", "recompute": "#7f8c8d"}
    head_rows = "head" in pts.columns
    for row, x, y in zip(pts.itertuples(index=False), xs, ys):
        head = getattr(row, "head", None) if head_rows else None
        label = f"{row.layer_name} head {int(head)}" if head is not None and not pd.isna(head) else row.layer_name
        is_head = head is not None and not pd.isna(head)
        shape = (f'r="2.5" fill="none" stroke="{colors.get(row.phase, "#555")}"' if is_head
                 else f'r="4" fill="{colors.get(row.phase, "#555")}" fill-opacity="0.8"')
        parts.append(f'<circle cx="{px(x)}" cy="{py(y)}" {shape}>'
                     f'<title>{_e(row.implementation)} {_e(row.phase)} {_e(label)}: {x:,.1f} FLOP/B, {y / 1e12:,.3f} TFLOP/s</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def bottlenecks(layers: pd.DataFrame, heads: pd.DataFrame, top: int = 5) -> list[str]:
    """The costliest rows, in words."""
    lines = []
    for r in layers.sort_values("duration_ns", ascending=False).head(top).itertuples(index=False):
        words = [f"{r.layer_name} ({r.phase}, {r.implementation}): {_num(r.duration_ns / 1e3, ',.1f')} µs "
                 f"({_num(getattr(r, 'share_of_phase_pct', float('nan')), '.1f')}% of the phase)"]
        bound = getattr(r, "roofline_class", None)
        if bound:
            words.append(bound)
        excess = getattr(r, "excess_traffic", None)
        if excess is not None and not pd.isna(excess):
            words.append(f"{excess:.1f}× the minimum DRAM traffic ({r.dram_bytes_provenance})")
        if not pd.isna(getattr(r, "kernels_per_call", float("nan"))):
            words.append(f"{r.kernels_per_call:.1f} kernels per call")
        lines.append(", ".join(words))
    measured = heads[heads.get("provenance", pd.Series(dtype=object)) == "measured"] if len(heads) else heads
    if len(measured):
        share = measured.sort_values("share_of_layer_pct", ascending=False).head(top)
        for r in share.itertuples(index=False):
            lines.append(f"{r.layer_name} head {int(r.head)} ({r.phase}, {r.implementation}): "
                         f"{_num(r.share_of_layer_pct, '.1f')}% of its layer's head time")
    return lines


def _table(frame: pd.DataFrame, columns: list[tuple[str, str, str]]) -> str:
    head = "".join(f'<th class="{"l" if spec == "s" else ""}">{_e(label)}</th>' for label, _, spec in columns)
    rows = []
    for rec in frame.to_dict("records"):
        cells = []
        for _, col, spec in columns:
            v = rec.get(col)
            cells.append(f'<td class="l">{_e(v)}</td>' if spec == "s" else f"<td>{_num(v, spec)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def load_tables(out: str | Path) -> dict[str, pd.DataFrame]:
    """``layers``, ``heads`` and ``runs`` of report ``out`` (all runs; empty when absent).

    Raises:
        HeadcountError: ``out`` is not a report.
    """
    con = connect(out)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    return {name: con.sql(f"SELECT * FROM {name}").df() if name in views else pd.DataFrame() for name in ("layers", "heads", "runs")}


def render(out: str | Path, measured_gbps: float | None = None, tables: dict[str, pd.DataFrame] | None = None) -> str:
    """The HTML page of report ``out`` (its tables read unless given).

    Raises:
        HeadcountError: ``out`` is not a report.
    """
    tables = tables if tables is not None else load_tables(out)
    layers, heads, runs = tables["layers"], tables["heads"], tables["runs"]
    body = [f"<h1>headcount report: {_e(Path(out).name)}</h1>"]
    body.append("<h2>Runs</h2>" + _table(runs, [("run", "run_id", "s"), ("implementation", "implementation", "s"), ("source", "source", "s"),
                                                  ("mode", "mode", "s"), ("device", "device_name", "s"), ("model", "model", "s"),
                                                  ("dtype", "dtype", "s"), ("batch", "batch", ",.0f"), ("seq", "seq", ",.0f")]))
    body.append('<p class="cap">Provenance: <b>measured</b> (a counter or timestamp of that very range or kernel), <b>sampled</b> '
                "(device-wide samples over its window), <b>apportioned</b> (a layer's figure split over its heads), "
                "<b>analytic</b> (the model from shapes). Units are in every header.</p>")
    if len(layers):
        table_cmp, notes = comparison(layers, runs)
        body.append("<h2>Attention implementations</h2>" + _table(table_cmp, [
            ("run", "run_id", "s"), ("implementation", "implementation", "s"), ("source", "source", "s"),
            ("ms per step", "attention_ms_per_step", ",.3f"), ("kernels per call", "kernels_per_call", ",.1f"),
            ("launch cost µs per call", "cpu_launch_cost_us_per_call", ",.1f"), ("launch latency p50 µs", "launch_latency_p50_us", ",.1f"),
            ("DRAM MB per step", "dram_mb_per_step", ",.2f"), ("bytes provenance", "dram_bytes_provenance", "s"),
            ("GB/s", "bandwidth_gbps", ",.1f"), ("FLOP/byte", "flop_per_byte", ",.1f"), ("bound", "bound", "s"), ("speed-up", "speedup", ",.2f")]))
        body += [f'<p class="note">{_e(n)}</p>' for n in notes]
        body.append("<h2>Bottlenecks</h2><ul>" + "".join(f"<li>{_e(line)}</li>" for line in bottlenecks(layers, heads)) + "</ul>")
    if len(heads):
        body.append("<h2>Layer × head</h2>")
        for (impl, phase), g in heads.groupby(["implementation", "phase"], sort=True):
            prov = "/".join(sorted(set(g["provenance"].dropna()))) or "–"
            charts = [heatmap(g, "duration_per_call_ns", "time per call", "µs per call", f"time {prov}", 1e-3),
                      heatmap(g, "bandwidth_gbps", "bandwidth", "GB/s", "bytes " + "/".join(sorted(set(g["bandwidth_provenance"].dropna()))) + ", time " + prov),
                      heatmap(g, "dram_bytes", "DRAM bytes per profile", "MB", "bytes " + "/".join(sorted(set(g["dram_bytes_provenance"].dropna()))), 1e-6)]
            if "achieved_occupancy_pct" in g and g["achieved_occupancy_pct"].notna().any():
                charts.append(heatmap(g, "achieved_occupancy_pct", "achieved occupancy", "%", "/".join(sorted(set(g["achieved_occupancy_provenance"].dropna())))))
            body.append(f"<h3>{_e(impl)}, {_e(phase)}</h3><div class=\"grid\">" + "".join(c for c in charts if c) + "</div>")
    if len(layers):
        device = runs["device_name"].dropna().iloc[0] if "device_name" in runs and runs["device_name"].notna().any() else None
        dtypes = runs["dtype"].dropna().unique() if "dtype" in runs else []
        dtype = str(dtypes[0]) if len(dtypes) == 1 else None
        peaks = devices.peaks_for(device)
        caption = (f"ceilings: {peaks.name}, {measured_gbps or peaks.dram_gbps:,.0f} GB/s "
                   f"({'measured copy ceiling' if measured_gbps else peaks.source}), "
                   f"{_num(peaks.tflops.get(dtype, float('nan')), ',.0f')} TFLOP/s {dtype or ''}" if peaks else
                   f"no ceilings: the device ({device or 'unknown'}) is not in the device table (a CPU run has none)")
        measured_heads = heads[heads["provenance"] == "measured"] if len(heads) else heads
        points = pd.concat([layers, measured_heads], ignore_index=True) if len(measured_heads) else layers
        body.append("<h2>Roofline</h2>" + roofline(points, device, dtype, measured_gbps) +
                    f'<p class="cap">Filled: one point per layer row; rings: heads measured on their own (head mode); '
                    f"blue forward, orange backward; {_e(caption)}. FLOPs are analytic; bytes as in the tables' provenance.</p>")
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>headcount report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")
