"""``headcount report``: the self-contained HTML page, checked as text and in
a real headless Chromium (Debian's ``chromium``; CI installs it and sets
HEADCOUNT_REQUIRE_CHROMIUM=1 so that its absence fails instead of skipping)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from headcount import AttentionProfiler
from headcount.cli.main import main as cli_main
from headcount.models import load_model, make_inputs
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
    assert "DRAM ceiling 3,350 GB/s" in svg and "compute ceiling 989 TFLOP/s (bfloat16)" in svg and svg.count("<circle") == 2
    heads = points.assign(head=[3, 5])
    assert svg.count("fill=\"none\"") == 0 and html_report.roofline(heads, None, None).count("fill=\"none\"") == 2
    assert "ceiling" not in html_report.roofline(points, None, None)


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
