"""``headcount diff``: before/after per call, against the spread, as a CI gate.

The reports are real (``headcount profile`` on this CPU, ``headcount parse`` of
the real 2×H100 nsys export); where a test needs a known change, it stretches
recorded durations of a copy by a stated factor, so that no assertion depends
on this machine's timing (benchmarks/diff_noise.py measures the real thing:
sdpa vs eager, false alarms over repeated profiles, a deliberately slowed layer).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headcount.cli.main import main
from headcount.derive import difference

NSYS = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
SMALL = ["--steps", "4", "--batch", "1", "--seq", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def sdpa_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("diff") / "sdpa"
    assert main(["profile", "--impl", "sdpa", *SMALL, "-o", str(out)]) == 0
    return out


def _slowed(src: Path, dst: Path, table: str, column: str, where, by: list[str]) -> Path:
    """A copy of report ``src`` in which the rows ``where(frame)`` selects are made slower by more than their own
    spread: each group of ``by`` gets ``(max − min) + median`` of the group added to every value — so the new
    p10–p90 interval lies above the base's whatever noise the recording holds, and the median more than doubles."""
    shutil.copytree(src, dst)
    for part in (dst / table).glob("run_id=*/*.parquet"):
        frame = pq.read_table(part).to_pandas()
        hit = where(frame).to_numpy(dtype=bool)
        values = frame[column].astype("float64")
        chosen = frame[hit]
        shift = chosen.groupby(by, dropna=False)[column].transform(lambda v: v.max() - v.min() + v.median())
        frame[column] = values.where(~hit, values + shift.reindex(frame.index).fillna(0))
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), part)
    return dst


def _diff_json(capsys, *args) -> tuple[int, dict]:
    rc = main(["diff", *map(str, args), "--json", "-"])
    captured = capsys.readouterr()
    _diff_json.err = captured.err  # what the gate said on stderr
    return rc, json.loads(captured.out)


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("base,new,calls,expected", [
    ((10.0, 11.0, 12.0), (10.5, 11.5, 12.5), (5, 5), "unchanged"),      # the spreads overlap
    ((10.0, 11.0, 12.0), (13.0, 14.0, 15.0), (5, 5), "regression"),     # new p10 above base p90, median +27 %
    ((10.0, 11.0, 12.0), (7.0, 8.0, 9.0), (5, 5), "improvement"),
    ((100.0, 100.1, 100.2), (100.3, 104.0, 104.5), (5, 5), "unchanged"),  # disjoint, but the median moved under 5 %
    ((10.0, 11.0, 12.0), (13.0, 14.0, 15.0), (2, 5), "inconclusive"),   # two calls: no spread
    ((10.0, 11.0, 12.0), (np.nan, np.nan, np.nan), (5, 0), "removed"),
    ((np.nan, np.nan, np.nan), (10.0, 11.0, 12.0), (0, 5), "added"),
])
def test_the_rule(base, new, calls, expected):
    assert difference.verdict(base, new, *calls)[0] == expected


# ---------------------------------------------------------------- reports of headcount profile
def test_a_report_against_itself_is_unchanged_and_passes_the_gate(sdpa_report, capsys):
    rc, doc = _diff_json(capsys, sdpa_report, sdpa_report, "--fail-on-regression", "10")
    assert rc == 0 and doc["verdict"] == "unchanged"
    assert doc["overall"][0]["basis"] == "time per step" and doc["overall"][0]["change_pct"] == 0
    assert {c["verdict"] for c in doc["changes"]} <= {"unchanged", "inconclusive"}
    layer = next(c for c in doc["changes"] if c["level"] == "layer")
    assert set(difference.CHANGE_COLUMNS) <= set(layer) and layer["base_calls"] == layer["new_calls"] == 4
    # one shape a layer (the recorded input dims): the layer's counters ride on its row
    assert layer["shape"].startswith("inputs 1×") and "dram_bytes_per_call" in layer["counters"]
    assert set(doc) == {"verdict", "headline", "base", "new", "overall", "rule", "notes", "changes"}
    assert doc["headline"].startswith("unchanged: time per step +0.0 %")


def test_every_fwd_layer_slower_is_a_regression_and_fails_the_gate(sdpa_report, tmp_path, capsys):
    fwd = lambda f: (f["level"] == "layer") & (f["phase"] == "fwd")  # noqa: E731
    slow = _slowed(sdpa_report, tmp_path / "slow", "ranges", "duration_ns", fwd, ["layer_name"])
    _slowed(slow, tmp_path / "slower", "steps", "window_ns", lambda f: f["step"].notna(), ["implementation"])
    rc, doc = _diff_json(capsys, sdpa_report, tmp_path / "slower", "--fail-on-regression", "10")
    assert rc == 1 and doc["verdict"] == "regression"
    assert doc["overall"][0]["basis"] == "time per step" and doc["overall"][0]["verdict"] == "regression"
    layers = [c for c in doc["changes"] if c["level"] == "layer"]
    assert {(c["phase"], c["verdict"]) for c in layers} == {("fwd", "regression"), ("bwd", "unchanged")}
    # by hand, from the recorded calls: the new median is the base median plus the shift
    ranges = pd.read_parquet(sdpa_report / "ranges")
    calls = ranges[fwd(ranges) & (ranges["layer_name"] == "layer.0")]["duration_ns"].to_numpy(dtype=float)
    shift = calls.max() - calls.min() + np.median(calls)
    row = next(c for c in layers if c["phase"] == "fwd" and c["name"] == "layer.0")
    assert row["base_p10_ns"] == pytest.approx(np.percentile(calls, 10)) and row["new_p50_ns"] == pytest.approx(np.median(calls) + shift)
    assert row["change_pct"] == pytest.approx(100 * shift / np.median(calls))


def test_one_slowed_layer_is_the_only_attention_row_flagged(sdpa_report, tmp_path, capsys):
    new = _slowed(sdpa_report, tmp_path / "one", "ranges", "duration_ns",
                  lambda f: (f["level"] == "layer") & (f["phase"] == "fwd") & (f["layer_name"] == "layer.1"), ["layer_name"])
    rc, doc = _diff_json(capsys, sdpa_report, new, "--fail-on-regression", "10")
    flagged = [(c["phase"], c["name"]) for c in doc["changes"] if c["level"] in ("layer", "head") and c["verdict"] != "unchanged"]
    assert flagged == [("fwd", "layer.1")]
    # the steps were not touched: the whole work says unchanged and the gate holds; the row is named, not gated
    assert doc["verdict"] == "unchanged" and rc == 0
    assert "1 attention rows regressed by more than 10 % (listed above; not gated)" in _diff_json.err


def test_a_change_in_the_number_of_calls_is_not_folded_into_time(sdpa_report, tmp_path, capsys):
    """nsys-ai's failure: fewer calls in the window look like a faster kernel. Per call, nothing moved."""
    new = tmp_path / "fewer"
    shutil.copytree(sdpa_report, new)
    for part in (new / "ranges").glob("run_id=*/*.parquet"):
        frame = pq.read_table(part).to_pandas()
        frame = frame[~((frame["level"] == "layer") & (frame["layer_name"] == "layer.0") & (frame["step"] == 3))]
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), part)
    rc, doc = _diff_json(capsys, sdpa_report, new)
    row = next(c for c in doc["changes"] if c["level"] == "layer" and c["name"] == "layer.0" and c["phase"] == "fwd")
    assert (row["base_calls"], row["new_calls"], row["calls_changed"]) == (4, 3, True)
    assert row["verdict"] == "unchanged"
    assert any("different number of calls" in n for n in doc["notes"])


def test_two_implementations_pair_and_the_markdown(sdpa_report, tmp_path, capsys):
    eager = tmp_path / "eager"
    assert main(["profile", "--impl", "eager", *SMALL, "-o", str(eager)]) == 0
    capsys.readouterr()
    md = tmp_path / "comment.md"
    rc, doc = _diff_json(capsys, sdpa_report, eager, "--markdown", str(md))
    assert rc == 0  # no gate asked for
    assert doc["overall"][0]["base_run"].endswith("(sdpa)") and doc["overall"][0]["new_run"].endswith("(eager)")
    layers = {(c["phase"], c["name"]) for c in doc["changes"] if c["level"] == "layer"}
    assert layers == {(p, f"layer.{i}") for p in ("fwd", "bwd") for i in range(4)}
    text = md.read_text()
    assert text.startswith(f"### headcount diff: **{doc['verdict']}**") and "| rank | change | verdict |" in text
    assert doc["headline"] in text


# ---------------------------------------------------------------- recordings parsed on the fly (real nsys export)
def test_nsys_export_against_itself_and_one_kernel_stretched(tmp_path, capsys):
    rc, doc = _diff_json(capsys, NSYS, NSYS)
    assert rc == 0 and doc["verdict"] == "unchanged"
    # the kernel stretched: the most frequent one whose own spread is narrower than the stretch
    con = sqlite3.connect(NSYS)
    rows = con.execute("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName").fetchall()
    durations = pd.DataFrame(rows, columns=["name", "d"])
    spread = durations.groupby("name")["d"].agg(lambda d: np.percentile(d, 90) / np.percentile(d, 10) if len(d) >= 3 else np.inf)
    counts = durations.groupby("name").size()
    name = counts[spread < 1.4].sort_values(ascending=False).index[0]
    name_id = con.execute("SELECT id FROM StringIds WHERE value = ?", [name]).fetchone()[0]
    con.close()
    new = tmp_path / "stretched.sqlite"
    shutil.copy(NSYS, new)
    with sqlite3.connect(new) as c:
        c.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start + CAST((end - start) * 1.5 AS INTEGER) WHERE shortName = ?", [name_id])
    rc, doc = _diff_json(capsys, NSYS, new, "--fail-on-regression", "10")
    stretched = [c for c in doc["changes"] if c["level"] == "kernel" and c["name"] == name and c["verdict"] != "inconclusive"]
    assert stretched and all(c["verdict"] == "regression" and c["change_pct"] == pytest.approx(50.0, abs=0.1) for c in stretched)
    others = {(c["name"], c["shape"]): c["verdict"] for c in doc["changes"] if c["level"] == "kernel" and c["name"] != name}
    assert set(others.values()) <= {"unchanged", "inconclusive"} and "unchanged" in others.values()
    # the kernels' recorded ends moved, their starts did not: the blocks (FSDP::pre_forward (encoder.block.N…) start to
    # next start) took as long as before; the whole work is unchanged and the gate holds, the kernel row says regression
    assert all(o["basis"].startswith("span per unit FSDP::post_forward (encoder.block.{N}.layer.") for o in doc["overall"])
    assert doc["verdict"] == "unchanged" and rc == 0


# ---------------------------------------------------------------- bad input
def test_a_directory_that_is_not_a_report(sdpa_report, tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    assert main(["diff", str(tmp_path / "junk"), str(sdpa_report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headcount: error:") and "junk" in err[0]


def test_two_incomparable_runs(sdpa_report, tmp_path, capsys):
    other = tmp_path / "batch2"
    assert main(["profile", "--impl", "sdpa", "--steps", "2", "--batch", "2", "--seq", "32", "--device", "cpu", "-o", str(other)]) == 0
    capsys.readouterr()
    assert main(["diff", str(sdpa_report), str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not comparable" in err[0] and "batch 1 vs 2" in err[0] and "inconclusive" in err[0]


def test_a_torch_profiler_trace_against_itself(capsys):
    """A parsed recording's runs row does not name the implementation its calls do: units come from the tables."""
    trace = Path(__file__).parent / "fixtures" / "kineto" / "h100_qwen1.5-0.5b_kineto.json.gz"
    rc, doc = _diff_json(capsys, trace, trace, "--fail-on-regression", "5")
    assert rc == 0 and doc["verdict"] == "unchanged"
    overall = doc["overall"][0]
    # one step and no module ranges in the ranges table: no whole-work figure, the rows decide; attention per shape
    assert overall["basis"].startswith("rows") and overall["base_run"].endswith("(sdpa)")
    layers = [c for c in doc["changes"] if c["level"] == "layer"]
    assert len(layers) == 24 and all(c["shape"] == "inputs 16×16×16×559×559×64" for c in layers)
