"""``headcount report``: the self-contained HTML page, checked as text and in
a real headless Chromium (Debian's ``chromium``; CI installs it and sets
HEADCOUNT_REQUIRE_CHROMIUM=1 so that its absence fails instead of skipping)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from headcount import AttentionProfiler
from headcount.cli.main import main as cli_main
from headcount.cli.models import load_model, make_inputs
from headcount.reports import html as html_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report"
    model, _ = load_model(None)
    inputs = make_inputs(model, 2, 32)
    for impl, append in (("eager", False), ("sdpa", True)):
        model.set_attn_implementation(impl)
        prof = AttentionProfiler(model, mode="head", metadata={"model": "<script>alert('x')</script> & co", "dtype": "float32"})
        with prof:
            model(**inputs).loss.backward()
        prof.save(out, append=append)
    return out


def test_the_page_is_self_contained_and_escaped(report, capsys):
    assert cli_main(["report", str(report)]) == 0
    page = (report / "report.html").read_text()
    assert "<script" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in page
    assert not re.search(r"(src|href)\s*=", page)  # nothing fetched: works offline
    assert page.count("<svg") >= 2 * 2 * 3 + 1  # 3 heatmaps per implementation × phase, and the roofline
    for text in ("Attention implementations", "Bottlenecks", "Layer × head", "Roofline", "µs per call", "GB/s", "analytic"):
        assert text in page
    assert "HTML:" in capsys.readouterr().out


def test_roofline_has_ceilings_for_a_known_device():
    import pandas as pd

    points = pd.DataFrame({"intensity_flop_per_byte": [10.0, 500.0], "flop": [1e12, 1e13], "duration_ns": [1e7, 2e7],
                           "phase": ["fwd", "bwd"], "implementation": ["sdpa", "sdpa"], "layer_name": ["layer.0", "layer.0"]})
    svg = html_report.roofline(points, "NVIDIA H100 80GB HBM3", "bfloat16")
    assert "DRAM ceiling 3,350 GB/s" in svg and "compute ceiling 989 TFLOP/s (bfloat16)" in svg
    plot = svg.split('<g class="legend">')[0]
    assert plot.count("FLOP/byte, ") == 2  # one point per row, each with its exact values in its tooltip
    assert "sdpa fwd layer.0: 10 FLOP/byte, 100 TFLOP/s (FLOPs analytic; bytes –; time –)" in plot
    heads = points.assign(head=[3, 5])
    assert plot.count('fill="none"') == 0
    assert html_report.roofline(heads, None, None).split('<g class="legend">')[0].count('fill="none"') == 2
    assert "ceiling" not in html_report.roofline(points, None, None).split('<g class="legend">')[0]


def test_roofline_ticks_are_human_units_and_a_legend_names_what_is_drawn():
    import re

    import pandas as pd

    points = pd.DataFrame({"intensity_flop_per_byte": [2.0, 40.0, 900.0], "flop": [1e9, 5e11, 2e13],
                           "duration_ns": [1e6, 1e6, 1e7], "phase": ["fwd", "bwd", "fwd"],
                           "implementation": ["eager", "sdpa", "flash_attention_2"], "layer_name": ["layer.0"] * 3})
    svg = html_report.roofline(points, "NVIDIA H100 80GB HBM3", "bfloat16")
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg)
    assert ticks and not [t for t in ticks if re.search(r"\de[+-]?\d", t)]  # never 1e12
    assert {"1", "10", "100", "1k"} <= set(ticks) and {"1 TFLOP/s", "100 TFLOP/s", "1 PFLOP/s"} <= set(ticks)
    legend = svg.split('<g class="legend">')[1]
    for text in ("fwd", "bwd", "eager", "sdpa", "flash_attention_2", "a layer", "ceilings"):
        assert f">{text}</text>" in legend
    plot = svg.split('<g class="legend">')[0]
    assert "<circle" in plot and "<rect x=" in plot and "<polygon" in plot  # one shape per implementation


def test_a_heatmap_of_values_equal_across_heads_is_one_column():
    import pandas as pd

    layers = ["layer.0", "layer.1"]
    rows = [{"layer_name": layer, "layer": i, "head": h, "duration_ns": 1000.0 * (i + 1), "dram_bytes": 5e6 + h}
            for i, layer in enumerate(layers) for h in range(4)]
    frame = pd.DataFrame(rows)
    apportioned = html_report.heatmap(frame, "duration_ns", "time", "ns", "apportioned")
    assert "the same for every head of a layer" in apportioned and apportioned.count("<title>") == 2
    assert "<title>layer.1, every head: 2,000 ns (apportioned)</title>" in apportioned
    measured = html_report.heatmap(frame, "dram_bytes", "bytes", "B", "measured")
    assert "the same for every head" not in measured and measured.count("<title>") == 8
    assert "<title>layer.0 head 3: 5e+06 B (measured)</title>" not in measured
    assert "<title>layer.0 head 3: 5,000,003 B (measured)</title>" in measured


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("HEADCOUNT_REQUIRE_CHROMIUM") == "1":
        pytest.fail("chromium is required here (HEADCOUNT_REQUIRE_CHROMIUM=1) but not installed")
    pytest.skip("no chromium: apt-get install chromium")


def test_the_charts_draw_in_a_real_browser(report, tmp_path):
    from PIL import Image

    browser = _chromium()
    page = report / "report.html"
    if not page.exists():
        assert cli_main(["report", str(report)]) == 0
    shot = tmp_path / "shot.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--window-size=1400,2400", f"--screenshot={shot}", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert shot.exists(), done.stderr[-2000:]
    console = [ln for ln in done.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console
    import numpy as np

    pixels = np.frombuffer(Image.open(shot).convert("RGB").tobytes(), dtype=np.uint8).reshape(-1, 3)
    non_white = (pixels != 255).any(axis=1).mean()
    assert non_white > 0.05  # not a blank page
    colours = {tuple(c) for c in np.unique(pixels, axis=0)}
    viridis = {(0x44, 0x01, 0x54), (0xfd, 0xe7, 0x25)}  # the heatmaps' end colours were painted
    assert len(colours) > 50 and viridis & colours


def test_an_ncu_report_shows_its_measured_kernel_counters(tmp_path):
    """An ncu file of untagged kernels (real H800 raw page): the page lists the top
    kernels with the counters ncu measured, not only the runs table."""
    from pathlib import Path

    import pandas as pd

    from headcount.common.shown_names import shown

    fixture = Path(__file__).parent / "fixtures" / "ncu" / "h800_flash_fwd_raw.C.csv"
    out = tmp_path / "r"
    assert cli_main(["parse", str(fixture), "-o", str(out)]) == 0
    assert cli_main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "Top kernels by time" in page
    kernels = pd.read_parquet(out / "kernels")
    top = kernels.groupby("name")["duration_ns"].sum().idxmax()
    assert html.escape(shown(top), quote=True) in page and len(str(top)) > 200  # shown folded; the table keeps it whole
    occupancy = kernels.loc[kernels["name"] == top, "achieved_occupancy_pct"].mean()
    dram = kernels.loc[kernels["name"] == top, "dram_throughput_pct"].mean()
    assert pd.notna(occupancy) and f"<td>{occupancy:,.3g}</td>" in page
    assert pd.notna(dram) and f"<td>{dram:,.3g}</td>" in page  # read under ncu's gpu__dram_throughput name


def _painted(browser: str, svg: str, tmp_path) -> tuple:
    """``svg`` alone on a white page, screenshotted by headless Chromium (800 × 420): the PNG's path and the DOM it read."""
    page = tmp_path / "roof.html"
    page.write_text(f'<!doctype html><html><body style="margin:0;background:#fff">{svg}</body></html>')
    shot = tmp_path / "roof.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars", "--force-device-scale-factor=1"]
    subprocess.run([browser, *flags, "--window-size=800,420", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, text=True, timeout=180)
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180).stdout
    return shot, dom


def test_the_roofline_legend_and_human_ticks_are_painted(report, tmp_path):
    """The report's roofline alone, screenshotted by headless Chromium: the
    legend's phase swatches are painted in their colours where the legend
    says, and the tick labels (human units, read back from Chromium's DOM)
    are painted beside the axes."""
    import re

    import numpy as np
    from PIL import Image

    browser = _chromium()
    tables = html_report.load_tables(report)
    layers = tables["layers"]
    svg = html_report.roofline(layers, None, None)
    shot, dom = _painted(browser, svg, tmp_path)
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', dom)
    assert any(t.endswith("FLOP/s") for t in ticks) and not [t for t in ticks if re.search(r"\de[+-]?\d", t)]
    legend = dom.split('<g class="legend">')[1]
    assert ">fwd</text>" in legend and ">bwd</text>" in legend and ">eager</text>" in legend and ">sdpa</text>" in legend
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    swatches = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="4.5" fill="(#[0-9a-f]{6})"', svg.split('<g class="legend">')[1])
    for phase_colour in ("#2c728e", "#e67e22"):
        x, y, _ = next(s for s in swatches if s[2] == phase_colour)
        want = np.array([int(phase_colour[k:k + 2], 16) for k in (1, 3, 5)])
        painted = image[round(float(y)), round(float(x))]
        assert np.abs(painted - (255 - 0.85 * (255 - want))).max() < 40, (phase_colour, painted)  # 85 % opaque on white
    tick_y = [float(v) for v in re.findall(r'<text class="tick" x="[\d.]+" y="([\d.]+)" font-size="10" text-anchor="end">', svg)]
    for y in tick_y:  # dark text pixels left of the plot at each FLOP/s tick
        band = image[int(y) - 8:int(y) + 2, 0:70]
        assert (band.sum(axis=2) < 300).any()


def test_kernel_names_are_shown_folded_and_cut_but_kept_whole_in_the_tables():
    from headcount.common.shown_names import shown

    flash = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::half_t>, true>(Flash_fwd_params)"
    assert shown(flash) == "flash_fwd_kernel<…>(…)"
    assert shown("void at::native::<unnamed>::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2)") == \
        "at::native::{anonymous}::vectorized_elementwise_kernel<…>(…)"
    long = "Cijk_Alik_Bljk_" + "X" * 200
    assert len(shown(long)) == 80 and shown(long).endswith("…") and shown("aten::mm") == "aten::mm"


def test_a_parsed_traces_roofline_draws_the_compute_ceiling_of_its_calls_dtype(tmp_path):
    """A torch.profiler trace parsed (no headcount tags): its run says the dtype its calls ran in, so the
    page's roofline draws the compute ceiling (989 TFLOP/s bf16 on the H100) beside the DRAM one,
    painted where the SVG says (headless Chromium)."""
    import re
    from pathlib import Path

    import numpy as np
    import pandas as pd
    from PIL import Image

    browser = _chromium()
    trace = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"
    out = tmp_path / "r"
    assert cli_main(["parse", str(trace), "-o", str(out)]) == 0
    run = pd.read_parquet(out / "runs").iloc[0]
    assert (run["implementation"], run["dtype"], run["batch"], run["seq"]) == ("sdpa", "bfloat16", 1, 141)
    assert cli_main(["report", str(out)]) == 0
    svg = re.search(r'<svg[^>]*aria-label="roofline">.*?</svg>', (out / "report.html").read_text(), re.S).group(0)
    ceiling = re.search(r'<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)" stroke="#c0392b" stroke-width="2">'
                        r'<title>compute ceiling 989 TFLOP/s \(bfloat16\)</title>', svg)
    assert ceiling is not None and "DRAM ceiling" in svg
    shot, _ = _painted(browser, svg, tmp_path)
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    x1, y, x2 = float(ceiling.group(1)), float(ceiling.group(2)), float(ceiling.group(3))
    band = image[int(y) - 1:int(y) + 2, round(x1) + 2:round(x2) - 2]  # the 2-pixel line, wherever it falls on the grid
    red = (np.abs(band - np.array([0xc0, 0x39, 0x2b])).max(axis=2) < 60).any(axis=0)
    assert red.mean() > 0.9  # the ceiling is painted along its length


def test_top_kernels_of_an_export_of_two_processes_are_counted_per_process(tmp_path):
    """The H100×2 nsys export holds two processes (ranks): parse makes one run of each, and each run's top
    kernels on the page count its own process's kernels (124 of the largest GEMM, not 248 merged)."""
    import re
    from pathlib import Path

    export = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
    out = tmp_path / "r"
    assert cli_main(["parse", str(export), "-o", str(out)]) == 0
    assert cli_main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    tables = [t[:t.index("</table>")] for t in page.split("Top kernels by time")[1:]]
    assert len(tables) == 2  # one per run, i.e. per process
    for table in tables:
        rows = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r) for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
        assert rows[0][0] != "process"  # one process in the run: no process column
        name, count = rows[1][2], rows[1][3]
        assert name.startswith("sm80_xmma_gemm") and count == "124", rows[:2]  # not 248 = 2 × 124
    assert "pid111" in page and "pid112" in page


README_PICTURE = Path(__file__).resolve().parents[1] / "docs" / "images" / "report.png"
README_CROP = (0, 0, 1400, 2060)  # the page down to the roofline's caption, before the kernel tables


def test_the_readme_picture_is_this_report_in_a_real_browser(tmp_path):
    """The README's picture (docs/images/report.png) is the report of the BERT-small H100 trace as headless
    Chromium paints it. ``make readme-picture`` (HEADCOUNT_README_PICTURE=1) writes it anew from this test;
    otherwise the committed one must match the page painted now (same size, nearly the same pixels)."""
    import numpy as np
    from PIL import Image

    browser = _chromium()
    trace = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"
    out = tmp_path / "r"
    assert cli_main(["parse", str(trace), "-o", str(out)]) == 0
    assert cli_main(["report", str(out)]) == 0
    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                    "--window-size=1400,2400", f"--screenshot={shot}", (out / "report.html").as_uri()],
                   capture_output=True, text=True, timeout=180)
    page = Image.open(shot).convert("RGB").crop(README_CROP)
    picture = page.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    if os.environ.get("HEADCOUNT_README_PICTURE") == "1":
        picture.save(README_PICTURE, optimize=True)
    committed = Image.open(README_PICTURE).convert("RGB")
    assert committed.size == page.size
    fresh = np.asarray(picture.convert("RGB")).astype(int)
    assert (fresh != 255).any(axis=2).mean() > 0.05  # a painted page, not a blank one
    assert np.abs(fresh - np.asarray(committed).astype(int)).mean() < 8  # the same page (fonts may hint differently)
