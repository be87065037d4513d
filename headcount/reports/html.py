"""``headcount report``: one self-contained HTML page (no script, no network:
inline CSS and SVG) that shows where attention's time and bytes go.

Sections: the runs, the implementation comparison, then one section per run
(named by its model, shapes, mode and device): the bottlenecks in words,
layer × head heatmaps per implementation and phase (time per call, bandwidth,
DRAM bytes, occupancy where measured), and a roofline of the layers against
that run's device's ceilings. No figure adds two runs. Every figure names its unit and provenance; every text
that comes from a profile (names, paths) is escaped.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.derive import devices
from headcount.reports import findings
from headcount.reports.compare import comparison
from headcount.reports.figures import missing, number
from headcount.reports.query import connect, range_summary

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
    """An SVG heatmap: layers down (by name: T5's encoder and decoder layer 0
    are two rows), heads across, colour = ``value`` × ``scale``.

    ``frame`` holds one run, implementation and phase, so each cell is one
    row of the heads table; a frame with two rows for one cell is refused
    rather than summed.

    Raises:
        ValueError: two rows for one layer and head (runs or phases mixed).
    """
    frame = frame.dropna(subset=["layer_name", "head"])
    if not len(frame):
        return ""
    if frame.duplicated(["layer_name", "head"]).any():
        raise ValueError("heatmap: two rows for one layer and head (runs, implementations or phases mixed)")
    layers = frame.drop_duplicates("layer_name").sort_values(["layer", "layer_name"], na_position="last")["layer_name"].tolist()
    heads = sorted(frame["head"].unique().tolist())
    grid = frame.pivot(index="layer_name", columns="head", values=value).astype("float64") * scale
    finite = grid.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return ""
    lo, hi = float(finite.min()), float(finite.max())
    cell, top = 22, 30
    left = max(64, 7 * max(len(str(n)) for n in layers) + 12)
    width, height = max(left + cell * len(heads) + 90, 460), top + cell * len(layers) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
             f'<text x="0" y="16" font-size="13" font-weight="600">{_e(title)}</text>']
    for j, h in enumerate(heads):
        parts.append(f'<text x="{left + j * cell + cell / 2}" y="{top - 4}" font-size="10" text-anchor="middle">{int(h)}</text>')
    for i, layer in enumerate(layers):
        y = top + i * cell
        parts.append(f'<text x="{left - 6}" y="{y + cell * 0.7}" font-size="10" text-anchor="end">{_e(layer)}</text>')
        for j, h in enumerate(heads):
            v = grid.loc[layer, h] if (layer in grid.index and h in grid.columns) else float("nan")
            t = (v - lo) / (hi - lo) if hi > lo else 0.5
            parts.append(f'<rect x="{left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{_color(t)}">'
                         f'<title>{_e(layer)} head {int(h)}: {_e(number(v))} {_e(unit)}</title></rect>')
    bar_x = left + cell * len(heads) + 14
    for k in range(10):
        parts.append(f'<rect x="{bar_x}" y="{top + k * (cell * len(layers) / 10)}" width="12" height="{cell * len(layers) / 10 + 0.5}" '
                     f'fill="{_color(1 - k / 9)}"/>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + 10}" font-size="10">{_e(number(hi))}</text>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + cell * len(layers)}" font-size="10">{_e(number(lo))}</text>')
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
    """``layers``, ``heads`` and ``runs`` of report ``out`` (all runs; empty
    when absent), and ``ranges_summary`` (:func:`headcount.reports.query.range_summary`).

    Raises:
        HeadcountError: ``out`` is not a report.
    """
    con = connect(out)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    tables = {name: con.sql(f"SELECT * FROM {name}").df() if name in views else pd.DataFrame() for name in ("layers", "heads", "runs")}
    tables["ranges_summary"] = range_summary(con)
    return tables


def _run_section(run_id, layers: pd.DataFrame, heads: pd.DataFrame, info: dict, measured_gbps: float | None) -> list[str]:
    """Bottlenecks, heatmaps and roofline of one run (nothing here adds two runs)."""
    body = [f"<h2>{_e(findings.run_heading(run_id, info))}</h2>"]
    if len(layers):
        body.append("<h3>Bottlenecks</h3><ul>" + "".join(f"<li>{_e(line)}</li>" for line in findings.bottlenecks(layers, heads)) + "</ul>")
        body.append('<p class="cap">Per call: median (p10–p90) over the calls, rounded to that spread; totals: over every call of '
                    "the profiled steps. A layer or head is called hotter only when its p10–p90 interval lies wholly above the "
                    "median row's; otherwise the rows are within noise.</p>")
    if len(heads):
        for (impl, phase), g in heads.groupby(["implementation", "phase"], sort=True):
            prov = "/".join(sorted(set(g["provenance"].dropna()))) or "–"
            time_col = "duration_per_call_p50_ns" if g["duration_per_call_p50_ns"].notna().any() else "duration_per_call_ns"
            charts = [heatmap(g, time_col, "time per call (median)" if time_col.endswith("p50_ns") else "time per call (mean)",
                              "µs per call", f"time {prov}", 1e-3),
                      heatmap(g, "bandwidth_gbps", "bandwidth (total bytes ÷ total time)", "GB/s",
                              "bytes " + "/".join(sorted(set(g["bandwidth_provenance"].dropna()))) + ", time " + prov),
                      heatmap(g, "dram_bytes", "DRAM bytes, total over the profiled steps", "MB",
                              "bytes " + "/".join(sorted(set(g["dram_bytes_provenance"].dropna()))), 1e-6)]
            if "achieved_occupancy_pct" in g and g["achieved_occupancy_pct"].notna().any():
                charts.append(heatmap(g, "achieved_occupancy_pct", "achieved occupancy", "%", "/".join(sorted(set(g["achieved_occupancy_provenance"].dropna())))))
            body.append(f"<h3>Layer × head: {_e(impl)}, {_e(phase)}</h3><div class=\"grid\">" + "".join(c for c in charts if c) + "</div>")
    if len(layers):
        device = info.get("device_name") if info.get("device_kind") == "cuda" and not missing(info.get("device_name")) else None
        dtype = str(info["dtype"]) if not missing(info.get("dtype")) else None
        reported = info.get("device_memory_bandwidth_gbps")
        ceiling = measured_gbps or (float(reported) if not missing(reported) else None)
        peaks = devices.peaks_for(device)
        if peaks:
            basis = ("measured copy ceiling" if measured_gbps else
                     "the memory bandwidth the recording reports for this GPU" if ceiling else peaks.source)
            caption = (f"ceilings: {peaks.name}, {ceiling or peaks.dram_gbps:,.0f} GB/s ({basis}), "
                       f"{_num(peaks.tflops.get(dtype, float('nan')), ',.0f')} TFLOP/s {dtype or ''}")
        else:
            caption = f"no ceilings: the device ({device or info.get('device_name') or 'unknown'}) is not a GPU of the device table"
        measured_heads = heads[heads["provenance"] == "measured"] if len(heads) else heads
        points = pd.concat([layers, measured_heads], ignore_index=True) if len(measured_heads) else layers
        body.append("<h3>Roofline</h3>" + roofline(points, device, dtype, ceiling) +
                    f'<p class="cap">Filled: one point per layer row; rings: heads measured on their own (head mode); '
                    f"blue forward, orange backward; {_e(caption)}. FLOPs are analytic; bytes as in the tables' provenance.</p>")
    return body


def _ranges_section(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    body = []
    for run_id, g in summary.groupby("run_id", sort=True):
        body.append(f"<h2>{_e(findings.run_heading(run_id, findings.run_info(runs, run_id)))}</h2>")
        body.append('<p class="cap">No attention layers in this run (NVTX ranges that are not headcount\'s): the ranges are '
                    "summarised by name, never posed as layers. Nested ranges overlap: do not add rows.</p>")
        g = g.assign(total_ms=g["duration_ns"] / 1e6, p10_us=g["p10_ns"] / 1e3, p50_us=g["p50_ns"] / 1e3, p90_us=g["p90_ns"] / 1e3)
        body.append(_table(g, [("range", "path", "s"), ("instances", "instances", ",.0f"), ("total ms", "total_ms", ",.4g"),
                               ("p10 µs per instance", "p10_us", ",.4g"), ("median µs", "p50_us", ",.4g"),
                               ("p90 µs", "p90_us", ",.4g"), ("GPU ops", "gpu_op_count", ",.0f"), ("time basis", "duration_basis", "s")]))
    return body


def render(out: str | Path, measured_gbps: float | None = None, tables: dict[str, pd.DataFrame] | None = None,
           measured_device: str | None = None) -> str:
    """The HTML page of report ``out`` (its tables read unless given): the
    runs, the implementation comparison (speed-ups only within a run or
    between comparable runs, see :func:`headcount.reports.compare.comparison`),
    then one section per run. ``measured_gbps`` (a copy ceiling measured on
    ``measured_device``) is used only for runs on that device.

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
                "<b>analytic</b> (the model from shapes). Units are in every header. Every figure below is computed within one "
                "run; the comparison says where a speed-up compares two runs.</p>")
    if len(layers):
        table_cmp, notes = comparison(layers, runs)
        body.append("<h2>Attention implementations</h2>" + _table(table_cmp, [
            ("run", "run_id", "s"), ("model", "model", "s"), ("implementation", "implementation", "s"), ("source", "source", "s"),
            ("ms per step", "attention_ms_per_step", ",.3g"), ("kernels per call", "kernels_per_call", ",.3g"),
            ("launch cost µs per call", "cpu_launch_cost_us_per_call", ",.3g"), ("launch latency p50 µs", "launch_latency_p50_us", ",.3g"),
            ("DRAM MB per step", "dram_mb_per_step", ",.3g"), ("bytes provenance", "dram_bytes_provenance", "s"),
            ("GB/s", "bandwidth_gbps", ",.3g"), ("FLOP/byte", "flop_per_byte", ",.3g"), ("bound", "bound", "s"),
            ("speed-up", "speedup", ",.2f"), ("against", "baseline_run", "s")]))
        body += [f'<p class="note">{_e(n)}</p>' for n in notes]
    run_ids = list(dict.fromkeys(layers["run_id"])) if len(layers) else []
    for run_id in run_ids:
        info = findings.run_info(runs, run_id)
        ceiling = measured_gbps if measured_gbps and (measured_device is None or measured_device == info.get("device_name")) else None
        run_heads = heads[heads["run_id"] == run_id] if len(heads) else heads
        body += _run_section(run_id, layers[layers["run_id"] == run_id], run_heads, info, ceiling)
    summary = tables.get("ranges_summary")
    if summary is not None and len(summary):
        body += _ranges_section(summary, runs)
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>headcount report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")
