"""``headcount report``: one self-contained HTML page (no script, no network:
inline CSS and SVG) that shows where attention's time and bytes go.

Sections: the runs, the implementation comparison, then one section per run
(named by its model, shapes, mode and device): how busy the GPU was and where
its idle time went (a strip per device and step), the ranked findings, the bottlenecks in words,
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

from headcount.common import shown_names as names
from headcount.common.numbers import missing, number
from headcount.derive import peaks as device_peaks
from headcount.reports import findings
from headcount.reports.compare import comparison
from headcount.store.query import connect, range_summary

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


_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"))


def human(value: float, unit: str = "") -> str:
    """``value`` with an SI prefix: ``human(2.5e12, "FLOP/s")`` → ``"2.5 TFLOP/s"``,
    ``human(1000)`` → ``"1k"`` (axis ticks and tooltips: never ``1e12``)."""
    if missing(value) or not math.isfinite(value):
        return "–"
    for factor, prefix in _PREFIXES:
        if abs(value) >= factor * 0.9995 or factor == _PREFIXES[-1][0]:
            scaled = value / factor
            text = f"{scaled:.3g}"
            break
    return f"{text} {prefix}{unit}" if unit else f"{text}{prefix}"


def exact(value: float) -> str:
    """A value in full for a tooltip: whole numbers with every digit, others to 6 significant digits."""
    if missing(value) or not math.isfinite(value):
        return "–"
    return f"{value:,.0f}" if value == int(value) and abs(value) < 1e15 else f"{value:,.6g}"


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
    same_across_heads = bool(np.all(np.isclose(grid.min(axis=1), grid.max(axis=1), rtol=1e-9, atol=0) | grid.isna().all(axis=1)))
    collapsed = same_across_heads and len(heads) > 1
    if collapsed:
        # apportioned time, analytic bytes: every head of a layer has the layer's share, so one column says it all
        grid = grid.iloc[:, :1]
        heads = heads[:1]
        title = f"{title} — the same for every head of a layer"
    cell, top = 22, 30
    left = max(64, 7 * max(len(str(n)) for n in layers) + 12)
    width, height = max(left + cell * len(heads) + 90, 460), top + cell * len(layers) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
             f'<text x="0" y="16" font-size="13" font-weight="600">{_e(title)}</text>']
    for j, h in enumerate(heads):
        label = "all" if collapsed else str(int(h))
        parts.append(f'<text x="{left + j * cell + cell / 2}" y="{top - 4}" font-size="10" text-anchor="middle">{label}</text>')
    for i, layer in enumerate(layers):
        y = top + i * cell
        parts.append(f'<text x="{left - 6}" y="{y + cell * 0.7}" font-size="10" text-anchor="end">{_e(layer)}</text>')
        for j, h in enumerate(heads):
            v = grid.loc[layer, h] if (layer in grid.index and h in grid.columns) else float("nan")
            t = (v - lo) / (hi - lo) if hi > lo else 0.5
            who = f"{layer}, every head" if collapsed else f"{layer} head {int(h)}"
            parts.append(f'<rect x="{left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{_color(t)}">'
                         f'<title>{_e(who)}: {_e(exact(v))} {_e(unit)} ({_e(provenance)})</title></rect>')
    bar_x = left + cell * len(heads) + 14
    for k in range(10):
        parts.append(f'<rect x="{bar_x}" y="{top + k * (cell * len(layers) / 10)}" width="12" height="{cell * len(layers) / 10 + 0.5}" '
                     f'fill="{_color(1 - k / 9)}"/>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + 10}" font-size="10">{_e(number(hi))}</text>')
    parts.append(f'<text x="{bar_x + 16}" y="{top + cell * len(layers)}" font-size="10">{_e(number(lo))}</text>')
    parts.append(f'<text x="0" y="{height - 8}" font-size="11" fill="#555">{_e(unit)}; {_e(provenance)}; head across, layer down</text>')
    parts.append("</svg>")
    return "".join(parts)


def roofline(points: pd.DataFrame, device_name: str | None, dtype: str | None, measured_gbps: float | None = None,
             estimated: pd.DataFrame | None = None) -> str:
    """An SVG roofline (log–log): FLOP/byte across, achieved FLOP/s up, one
    point per layer row, with the device's bandwidth and compute ceilings; ``estimated``: kernels whose FLOPs
    and minimum bytes are Inductor's estimates (``name``, ``estimated_flop``, ``estimated_min_bytes``, ``time_ns``,
    ``kernels``), grey crosses."""
    pts = points.dropna(subset=["intensity_flop_per_byte", "flop", "duration_ns"]) if len(points) else pd.DataFrame(
        columns=["intensity_flop_per_byte", "flop", "duration_ns", "implementation", "phase", "layer_name"])
    pts = pts[(pts["intensity_flop_per_byte"] > 0) & (pts["duration_ns"] > 0) & (pts["flop"] > 0)]
    est = _estimated_points(estimated)
    peaks = device_peaks.peaks_for(device_name)
    bw = (measured_gbps or (peaks.dram_gbps if peaks else None))
    peak = peaks.tflops.get(dtype) * 1e12 if peaks and dtype in peaks.tflops else None
    xs = pts["intensity_flop_per_byte"].to_numpy(float)
    ys = (pts["flop"] / (pts["duration_ns"] * 1e-9)).to_numpy(float)
    all_x = np.concatenate([xs, est["x"].to_numpy(float)])
    x_lo, x_hi = (all_x.min() / 4, all_x.max() * 4) if len(all_x) else (0.1, 1000.0)
    y_vals = list(ys) + list(est["y"]) + ([peak] if peak else [])
    y_lo, y_hi = (min(y_vals) / 4, max(y_vals) * 4) if y_vals else (1e6, 1e15)
    if peak and bw:
        x_hi = max(x_hi, peak / (bw * 1e9) * 4)
    w, h, m = 760, 400, 76
    legend_w = 150

    def px(x):
        return m + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (w - 2 * m)

    def py(y):
        return h - m + -(math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * (h - 2 * m)

    w -= legend_w  # the plot; the legend sits to its right
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + legend_w}" height="{h}" role="img" aria-label="roofline">',
             f'<rect x="{m}" y="{m}" width="{w - 2 * m}" height="{h - 2 * m}" fill="#fafafa" stroke="#ccc"/>']
    for e in range(math.ceil(math.log10(x_lo)), math.floor(math.log10(x_hi)) + 1):
        parts.append(f'<text class="tick" x="{px(10 ** e)}" y="{h - m + 16}" font-size="10" text-anchor="middle">{human(10.0 ** e)}</text>')
    for e in range(math.ceil(math.log10(y_lo)), math.floor(math.log10(y_hi)) + 1):
        parts.append(f'<text class="tick" x="{m - 6}" y="{py(10 ** e) + 3}" font-size="10" text-anchor="end">{human(10.0 ** e, "FLOP/s")}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 14}" font-size="11" text-anchor="middle">intensity, FLOP/byte (analytic FLOPs ÷ DRAM bytes)</text>')
    parts.append(f'<text x="14" y="{h / 2}" font-size="11" text-anchor="middle" transform="rotate(-90 14 {h / 2})">FLOP/s achieved</text>')
    if bw:
        x_knee = device_peaks.ridge(peaks, dtype, bw) if peak else x_hi  # FLOP/byte where the two ceilings meet
        x0, x1 = x_lo, min(x_knee, x_hi)
        parts.append(f'<line x1="{px(x0)}" y1="{py(max(bw * 1e9 * x0, y_lo))}" x2="{px(x1)}" y2="{py(min(bw * 1e9 * x1, y_hi))}" '
                     f'stroke="#c0392b" stroke-width="2"><title>DRAM ceiling {bw:,.0f} GB/s</title></line>')
        if peak:
            parts.append(f'<line x1="{px(x_knee)}" y1="{py(peak)}" x2="{px(x_hi)}" y2="{py(peak)}" stroke="#c0392b" stroke-width="2">'
                         f'<title>compute ceiling {peak / 1e12:,.0f} TFLOP/s ({_e(dtype)})</title></line>')
    head_rows = "head" in pts.columns
    impls = list(dict.fromkeys(pts["implementation"].astype(str))) if len(pts) else []
    shapes = {impl: _SHAPES[i % len(_SHAPES)] for i, impl in enumerate(impls)}
    any_head = False
    for row, x, y in zip(pts.itertuples(index=False), xs, ys):
        head = getattr(row, "head", None) if head_rows else None
        is_head = head is not None and not pd.isna(head)
        any_head |= is_head
        label = f"{row.layer_name} head {int(head)}" if is_head else row.layer_name
        colour = _PHASE_COLOURS.get(row.phase, "#555")
        time_prov = getattr(row, "duration_provenance", None)
        bytes_prov = getattr(row, "dram_bytes_provenance", None)
        tip = (f"{row.implementation} {row.phase} {label}: {exact(x) if x >= 1000 else f'{x:,.4g}'} FLOP/byte, {human(y, 'FLOP/s')} "
               f"(FLOPs analytic; bytes {bytes_prov if not missing(bytes_prov) else '–'}; time {time_prov if not missing(time_prov) else '–'})")
        parts.append(_marker(shapes[str(row.implementation)], px(x), py(y), colour, hollow=is_head, size=2.8 if is_head else 4.5, tip=tip))
    for row in est.itertuples(index=False):
        tip = (f"{names.shown(row.name)} ({int(row.kernels)} launches): {row.x:,.4g} FLOP/byte, {human(row.y, 'FLOP/s')} "
               "(FLOPs and minimum bytes: inductor estimate; time measured)")
        parts.append(_cross(px(row.x), py(row.y), tip))
    parts.append(_legend(w + 8, m, [p for p in _PHASE_COLOURS if p in set(pts["phase"])], shapes, any_head, len(est) > 0))
    parts.append("</svg>")
    return "".join(parts)


_PHASE_COLOURS = {"fwd": "#2c728e", "bwd": "#e67e22", "recompute": "#7f8c8d"}
_SHAPES = ("circle", "square", "triangle", "diamond")


def _marker(shape: str, x: float, y: float, colour: str, hollow: bool = False, size: float = 4.5, tip: str = "") -> str:
    paint = f'fill="none" stroke="{colour}" stroke-width="1.5"' if hollow else f'fill="{colour}" fill-opacity="0.85"'
    title = f"<title>{_e(tip)}</title>" if tip else ""
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size}" {paint}>{title}</circle>'
    if shape == "square":
        return f'<rect x="{x - size:.1f}" y="{y - size:.1f}" width="{2 * size}" height="{2 * size}" {paint}>{title}</rect>'
    if shape == "triangle":
        pts = f"{x:.1f},{y - size * 1.2:.1f} {x - size * 1.1:.1f},{y + size * 0.8:.1f} {x + size * 1.1:.1f},{y + size * 0.8:.1f}"
    else:
        pts = f"{x:.1f},{y - size * 1.3:.1f} {x + size * 1.3:.1f},{y:.1f} {x:.1f},{y + size * 1.3:.1f} {x - size * 1.3:.1f},{y:.1f}"
    return f'<polygon points="{pts}" {paint}>{title}</polygon>'


def _estimated_points(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Kernels with both Inductor estimates, as roofline points: ``x`` FLOP/byte, ``y`` FLOP/s over their measured time."""
    columns = ["name", "kernels", "x", "y"]
    if kernels is None or not len(kernels) or "estimated_flop" not in kernels:
        return pd.DataFrame(columns=columns)
    k = kernels.dropna(subset=["estimated_flop", "estimated_min_bytes", "time_ns"])
    k = k[(k["estimated_flop"] > 0) & (k["estimated_min_bytes"] > 0) & (k["time_ns"] > 0)]
    return pd.DataFrame({"name": k["name"], "kernels": k["kernels"], "x": k["estimated_flop"] / k["estimated_min_bytes"],
                         "y": k["estimated_flop"] / (k["time_ns"] * 1e-9)}, columns=columns)


def _cross(x: float, y: float, tip: str) -> str:
    return (f'<path d="M{x - 3:.1f},{y - 3:.1f}L{x + 3:.1f},{y + 3:.1f}M{x - 3:.1f},{y + 3:.1f}L{x + 3:.1f},{y - 3:.1f}" '
            f'stroke="#777" stroke-width="1.5"><title>{_e(tip)}</title></path>')


def _legend(x: float, y: float, phases: list[str], shapes: dict[str, str], heads: bool, estimated: bool = False) -> str:
    """What the colours (phases), shapes (implementations), rings (heads) and crosses (estimated kernels) mean."""
    rows = [f'<text x="{x}" y="{y + 4}" font-size="11" font-weight="600">legend</text>']
    at = y + 22
    for phase in phases:
        rows.append(_marker("circle", x + 6, at - 4, _PHASE_COLOURS[phase]) + f'<text x="{x + 18}" y="{at}" font-size="11">{_e(phase)}</text>')
        at += 18
    for impl, shape in shapes.items():
        rows.append(_marker(shape, x + 6, at - 4, "#444") + f'<text x="{x + 18}" y="{at}" font-size="11">{_e(impl)}</text>')
        at += 18
    rows.append(_marker("circle", x + 6, at - 4, "#444") + f'<text x="{x + 18}" y="{at}" font-size="11">a layer</text>')
    at += 18
    if heads:
        rows.append(_marker("circle", x + 6, at - 4, "#444", hollow=True, size=2.8)
                    + f'<text x="{x + 18}" y="{at}" font-size="11">a head (head mode)</text>')
        at += 18
    if estimated:
        rows.append(_cross(x + 6, at - 4, "") + f'<text x="{x + 18}" y="{at}" font-size="11">a kernel (Inductor est.)</text>')
        at += 18
    rows.append(f'<line x1="{x}" y1="{at - 4}" x2="{x + 12}" y2="{at - 4}" stroke="#c0392b" stroke-width="2"/>'
                f'<text x="{x + 18}" y="{at}" font-size="11">ceilings</text>')
    return '<g class="legend">' + "".join(rows) + "</g>"


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
    """``layers``, ``heads``, ``runs``, ``steps``, ``findings`` and ``collectives`` of report ``out`` (all runs; empty
    when absent), and ``ranges_summary`` (:func:`headcount.store.query.range_summary`).

    Raises:
        HeadcountError: ``out`` is not a report.
    """
    con = connect(out)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    tables = {name: con.sql(f"SELECT * FROM {name}").df() if name in views else pd.DataFrame()
              for name in ("layers", "heads", "runs", "steps", "findings", "collectives")}
    tables["ranges_summary"] = range_summary(con)
    tables["kernel_summary"] = kernel_summary(con) if "kernels" in views else pd.DataFrame()
    return tables


def kernel_summary(con, top: int = 15) -> pd.DataFrame:
    """Per run, the ``top`` GPU kernels by total time, per process (a parsed export of several
    processes counts each process's kernels apart), layer and phase where attributed: count,
    total time, DRAM bytes, and the measured counters' means (achieved/theoretical occupancy,
    DRAM throughput %) where the source has them (ncu, cupti, nsys). CPU operators are not kernels."""
    have = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE kernels)").fetchall()}

    def col(name, expr):
        return expr if name in have else "NULL"

    return con.sql(f"""
        WITH k AS (
            SELECT run_id, {col('pid', "coalesce(CAST(pid AS VARCHAR), '')")} AS pid, coalesce(phase, '') AS phase,
                   coalesce(layer_name, '') AS layer_name, name,
                   count(*) AS kernels, sum(duration_ns) AS time_ns,
                   {col('dram_bytes', 'sum(dram_bytes)')} AS dram_bytes,
                   {col('achieved_occupancy_pct', 'avg(achieved_occupancy_pct)')} AS achieved_occupancy_pct,
                   {col('theoretical_occupancy_pct', 'avg(theoretical_occupancy_pct)')} AS theoretical_occupancy_pct,
                   {col('dram_throughput_pct', 'avg(dram_throughput_pct)')} AS dram_throughput_pct,
                   {col('sm_throughput_pct', 'avg(sm_throughput_pct)')} AS sm_throughput_pct,
                   {col('memory_throughput_pct', 'avg(memory_throughput_pct)')} AS memory_throughput_pct,
                   {col('bound', 'mode(bound)')} AS bound,
                   -- Inductor's estimates: a total only where every launch of the row has one
                   {col('estimated_flop', 'CASE WHEN count(estimated_flop) = count(*) THEN sum(estimated_flop) END')} AS estimated_flop,
                   {col('estimated_min_bytes', 'CASE WHEN count(estimated_min_bytes) = count(*) THEN sum(estimated_min_bytes) END')}
                       AS estimated_min_bytes
            FROM kernels WHERE kind = 'kernel' GROUP BY ALL)
        SELECT * EXCLUDE (n) FROM (
            SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY time_ns DESC NULLS LAST, dram_bytes DESC NULLS LAST) AS n FROM k)
        WHERE n <= {int(top)} ORDER BY run_id, time_ns DESC NULLS LAST""").df()


def _kernels_section(kernels: pd.DataFrame) -> list[str]:
    """The measured kernel counters of one run (nothing when it ran no GPU kernel)."""
    if not len(kernels):
        return []
    g = kernels.assign(total_us=kernels["time_ns"] / 1e3, dram_mb=kernels["dram_bytes"] / 1e6,
                       us_per_kernel=kernels["time_ns"] / kernels["kernels"] / 1e3, shown=kernels["name"].map(names.shown))
    processes = [("process", "pid", "s")] if g["pid"].astype(str).nunique() > 1 else []  # a parsed export of several ranks
    return ["<h3>Top kernels by time</h3>" + _table(g, [
        *processes, ("phase", "phase", "s"), ("layer", "layer_name", "s"), ("kernel", "shown", "s"), ("count", "kernels", ",.0f"),
        ("total µs", "total_us", ",.4g"), ("µs per kernel", "us_per_kernel", ",.4g"), ("DRAM MB", "dram_mb", ",.4g"),
        ("achieved occupancy %", "achieved_occupancy_pct", ",.3g"), ("theoretical occupancy %", "theoretical_occupancy_pct", ",.3g"),
        ("DRAM throughput %", "dram_throughput_pct", ",.3g"), ("SM throughput %", "sm_throughput_pct", ",.3g"),
        ("memory throughput %", "memory_throughput_pct", ",.3g"), ("bound (ncu's rule)", "bound", "s")]) +
        '<p class="cap">Per kernel name (templates and arguments folded to &lt;…&gt; and (…); the kernels table has every name whole), layer and phase (blank: outside every attention range): total time and DRAM bytes '
        "over the run; occupancy and throughputs are means of the kernels' measured counters, in percent of each unit's "
        "sustained peak (– where the source records none: torch.profiler and nsys have no such counters per kernel). "
        "bound: Nsight Compute's own Speed of Light rule on the SM and memory throughputs (either ≥ 80 %: that unit; "
        "both < 60 %: latency-bound, or under-filled below one wave of CTAs per SM; in between: the busier unit, or "
        "balanced), the most frequent verdict among the kernels (docs/reading-a-report.md).</p>"]


_IDLE = (("gpu_busy_ns", "busy", "#2c728e"), ("idle_launch_bound_ns", "launch-bound", "#e6550d"),
         ("idle_sync_ns", "sync", "#c2185b"), ("idle_host_ns", "host", "#fdae6b"), ("idle_other_ns", "other", "#9e9ac8"),
         ("idle_unknown_ns", "unknown", "#cccccc"), ("idle_capture_ns", "capture", "#74c476"))


def strip(steps: pd.DataFrame) -> str:
    """One bar per device and step: its GPU window split into busy time and idle
    time by cause (lengths are shares of the window, not positions in it)."""
    rows = steps[steps["basis"] == "gpu_window"] if len(steps) else steps
    if not len(rows):
        return ""
    rows = rows.sort_values(["implementation", "device", "pid", "step"], na_position="last")
    w, label_w, bar_h, gap = 760, 230, 16, 6
    h = len(rows) * (bar_h + gap) + 34
    out = [f'<svg width="{w}" height="{h}" role="img" aria-label="GPU busy and idle by cause, per device and step">']
    y = 4
    for r in rows.itertuples(index=False):
        window = float(r.window_ns) if not missing(r.window_ns) else 0.0
        step = "outside steps" if missing(r.step) else f"step {int(r.step)}"
        who = f"{r.device} {'' if missing(r.pid) else 'pid ' + str(r.pid)} {step}"
        out.append(f'<text x="0" y="{y + bar_h - 4}" font-size="11">{_e(who)}</text>')
        x = float(label_w)
        for col, name, colour in _IDLE:
            value = getattr(r, col)
            if missing(value) or window <= 0 or value <= 0:
                continue
            width = (w - label_w - 10) * float(value) / window
            tip = f"{name}: {exact(float(value))} ns ({100 * float(value) / window:.1f} % of the {exact(window)} ns window; measured)"
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{max(width, 0.5):.2f}" height="{bar_h}" fill="{colour}"><title>{_e(tip)}</title></rect>')
            x += width
        y += bar_h + gap
    x = 0.0
    for _, name, colour in _IDLE:
        out.append(f'<rect x="{x}" y="{y + 4}" width="10" height="10" fill="{colour}"/><text x="{x + 14}" y="{y + 13}" font-size="11">{name}</text>')
        x += 14 + 8 * len(name) + 16
    out.append("</svg>")
    return "".join(out)


def _triage_section(steps: pd.DataFrame, found: pd.DataFrame) -> list[str]:
    """How busy the GPU was, where its idle time went, attention's share, then the findings in rank order."""
    body = []
    lines = findings.step_lines(steps)
    if lines:
        body.append("<h3>How busy the GPU was</h3><ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>")
        chart = strip(steps)
        if chart:
            body.append(chart + '<p class="cap">Each bar is one step\'s GPU window on one device (first start to last end of the '
                        "GPU operations launched in the step), split into busy time (the union of every kernel, memcpy and memset "
                        "of the device inside the window, whatever stream or step it came from) and idle time by cause "
                        "(docs/reading-a-report.md § Triage); hover a segment for its exact nanoseconds. All measured from the "
                        "recording's timestamps.</p>")
    if found is not None:
        items = []
        for f in found.sort_values("rank").itertuples(index=False):
            gain = findings.gain_text(f)
            items.append(f"<li><b>{_e(f.kind)}</b>: {_e(f.subject)}: {_e(number(f.value))} {_e(f.unit)}{_e(gain)}"
                         f"<br><span class=\"cap\">evidence ({_e(f.provenance)}): {_e(f.evidence)}</span>"
                         f"<br>try: {_e(f.suggestion)}</li>")
        body.append("<h3>Findings</h3>" + (f"<ol>{''.join(items)}</ol>" if items else
                                           "<p>Nothing stands out: no finding passed its threshold against the spread.</p>"))
    return body


def _collectives_section(collectives: pd.DataFrame | None) -> list[str]:
    """Communication by collective kind of one run, per step (docs/report-format.md § Communication)."""
    if collectives is None or not len(collectives):
        return []
    from headcount.reports.console import collective_summary

    g = collective_summary(collectives)
    return ["<h3>Communication by collective (per step: totals over the steps ÷ steps)</h3>" + _table(g, [
        ("device", "device", "s"), ("process", "pid", "s"), ("kind", "kind", "s"), ("library", "library", "s"),
        ("calls", "calls_per_step", ",.3g"), ("ms", "ms_per_step", ",.4g"), ("MB", "mb_per_step", ",.4g"), ("ranks", "group_size", ",.0f"),
        ("algbw GB/s", "algbw_gbps", ",.3g"), ("busbw GB/s", "busbw_gbps", ",.3g")]),
        '<p class="cap">Kind: what torch.distributed named the collective (its message or nccl:… annotation), else the '
        "kernel's name. Time: the communication kernels' durations summed (measured); size: the larger message × its "
        "element size where the trace records it; algbw = size ÷ time; busbw = algbw × nccl-tests' factor for the group size (NVIDIA/nccl-tests "
        "doc/PERFORMANCE.md); empty where the recording carries no message size.</p>"]


def _ranks_section(steps: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The ranks of the report side by side: step time, skew, straggler (docs/reading-a-report.md § Ranks)."""
    from headcount.reports.console import rank_lines

    lines = rank_lines(steps, runs)
    return ["<h2>Ranks</h2><ul>" + "".join(f"<li>{_e(line.strip())}</li>" for line in lines) + "</ul>"] if lines else []


def _run_section(run_id, layers: pd.DataFrame, heads: pd.DataFrame, info: dict, measured_gbps: float | None,
                 kernels: pd.DataFrame | None = None, steps: pd.DataFrame | None = None,
                 found: pd.DataFrame | None = None, collectives: pd.DataFrame | None = None) -> list[str]:
    """Busy and idle time, findings, communication, bottlenecks, heatmaps, roofline and top kernels of one run (nothing
    here adds two runs)."""
    body = [f"<h2>{_e(findings.run_heading(run_id, info))}</h2>"]
    if not findings.missing(info.get("damaged")):
        body.append(f'<p class="cap"><b>Salvaged from a damaged recording:</b> {_e(info["damaged"])}</p>')
    body += _triage_section(steps if steps is not None else pd.DataFrame(), found)
    body += _collectives_section(collectives)
    if len(layers):
        body.append("<h3>Bottlenecks</h3><ul>" + "".join(f"<li>{_e(line)}</li>" for line in findings.bottlenecks(layers, heads)) + "</ul>")
        if found := findings.found_line(layers):
            body.append(f'<p class="cap">Attention {_e(found)}: see the layers table\'s <code>signal</code> and <code>found_as</code>.</p>')
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
    estimated = _estimated_points(kernels)
    if len(layers) or len(estimated):
        device = info.get("device_name") if info.get("device_kind") == "cuda" and not missing(info.get("device_name")) else None
        dtype = str(info["dtype"]) if not missing(info.get("dtype")) else None
        reported = info.get("device_memory_bandwidth_gbps")
        ceiling = measured_gbps or (float(reported) if not missing(reported) else None)
        peaks = device_peaks.peaks_for(device)
        if peaks:
            basis = ("measured copy ceiling" if measured_gbps else
                     "the memory bandwidth the recording reports for this GPU" if ceiling else peaks.source)
            caption = (f"ceilings: {peaks.name}, {ceiling or peaks.dram_gbps:,.0f} GB/s ({basis}), "
                       f"{_num(peaks.tflops.get(dtype, float('nan')), ',.0f')} TFLOP/s {dtype or ''}")
        else:
            caption = f"no ceilings: the device ({device or info.get('device_name') or 'unknown'}) is not a GPU of the device table"
        measured_heads = heads[heads["provenance"] == "measured"] if len(heads) else heads
        points = pd.concat([layers, measured_heads], ignore_index=True) if len(measured_heads) else layers
        crosses = (" Grey crosses: the top kernels whose FLOPs and minimum bytes are Inductor's own estimates (kernels table "
                   "<code>estimate_provenance</code>), over their measured time." if len(estimated) else "")
        body.append("<h3>Roofline</h3>" + roofline(points, device, dtype, ceiling, kernels) +
                    f'<p class="cap">Filled: one point per layer row; rings: heads measured on their own (head mode); colour: '
                    f"phase; shape: implementation (legend); {_e(caption)}. FLOPs are analytic; bytes as in the tables' "
                    f"provenance; hover a point for its exact values.{crosses}</p>")
    if kernels is not None:
        body += _kernels_section(kernels)
    return body


def _ranges_section(summary: pd.DataFrame) -> list[str]:
    """The NVTX ranges (not headcount's) of one run without attention layers."""
    body = []
    for _, g in summary.groupby("run_id", sort=True):
        body.append('<p class="cap">Ranges by name: NVTX ranges that are not headcount\'s (runs without attention layers) and '
                    "torch.profiler's own annotations (record_function, user_annotation; every run), summarised by name, never "
                    "posed as layers. Time: the busy union of the GPU work launched inside each instance (its CPU time where it "
                    "launched none). Nested ranges overlap: do not add rows.</p>")
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
    named = runs.assign(file=[findings.run_named({"path": p}) for p in runs["path"]]) if "path" in runs else runs
    body.append("<h2>Runs</h2>" + _table(named, [("run", "run_id", "s"), ("file", "file", "s"), ("rank", "rank", ",.0f"),
                                                   ("implementation", "implementation", "s"), ("source", "source", "s"),
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
    kernel_summary_ = tables.get("kernel_summary", pd.DataFrame())
    steps, found = tables.get("steps", pd.DataFrame()), tables.get("findings", pd.DataFrame())
    summary = tables.get("ranges_summary", pd.DataFrame())
    run_ids = []  # every run once: with attention layers, or only kernels, steps or NVTX ranges of untagged work
    for frame in (layers, steps, kernel_summary_, summary):
        if frame is not None and len(frame):
            run_ids += [r for r in dict.fromkeys(frame["run_id"]) if r not in run_ids]

    def of_run(frame, run_id):
        return frame[frame["run_id"] == run_id] if frame is not None and len(frame) else (frame if frame is not None else pd.DataFrame())

    for run_id in run_ids:
        info = findings.run_info(runs, run_id)
        ceiling = measured_gbps if measured_gbps and (measured_device is None or measured_device == info.get("device_name")) else None
        run_kernels = of_run(kernel_summary_, run_id) if len(kernel_summary_) else None
        body += _run_section(run_id, of_run(layers, run_id), of_run(heads, run_id), info, ceiling, run_kernels,
                             of_run(steps, run_id), of_run(found, run_id) if len(steps) or len(found) else None,
                             of_run(tables.get("collectives"), run_id))
        if summary is not None and len(summary) and (summary["run_id"] == run_id).any():
            body += _ranges_section(summary[summary["run_id"] == run_id])
    body += _ranks_section(steps, runs)
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>headcount report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")
