"""PM samples torch 2.15 writes into a trace (counter events) give per-layer sampled DRAM bytes (issue 59, route 1).

The trace: a real H100 run's events and PM samples in torch's trace format (:mod:`torch_pm_trace` says how it is
made). The figures are checked against a hand sum of the raw counter events over each call's GPU window, and
against headcount's own cupti route over the same run's records.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch_pm_trace

from headcount.parsers import kineto_counters

ROOT = Path(__file__).resolve().parents[1]
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"


def _parse(trace: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(trace), "-o", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def kineto_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch-pm")
    trace = torch_pm_trace.write(tmp / "trace.json.gz", torch_pm_trace.kineto_counter_events())
    done = _parse(trace, tmp / "out")
    return trace, tmp / "out", done.stderr


def _hand_windows(trace: Path, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start ns, end ns, value) of each sample of ``metric``, straight from the trace's counter events: a sample
    runs from its stamp to the next (the last: one median spacing)."""
    with gzip.open(trace, "rt") as fh:
        doc = json.load(fh)
    events = sorted((ev["ts"], ev["args"][""]) for ev in doc["traceEvents"] if ev.get("ph") == "C" and ev["name"] == metric)
    start = np.array([round(ts * 1000) for ts, _ in events], dtype=np.int64)
    value = np.array([v for _, v in events], dtype=np.float64)
    end = np.append(start[1:], start[-1] + np.median(np.diff(start)))
    return start, end, value


def _hand_sum(start, end, value, lo: float, hi: float) -> float:
    """Bytes of the samples over [lo, hi], each sample's share the part of its window inside."""
    total = 0.0
    for s, e, v in zip(start, end, value):
        overlap = min(e, hi) - max(s, lo)
        if overlap > 0:
            total += v * overlap / (e - s)
    return total


def test_a_layers_sampled_bytes_are_the_hand_sum_of_the_samples_over_its_calls(kineto_report):
    trace, out, _ = kineto_report
    layers = pd.read_parquet(out / "layers")
    ranges = pd.read_parquet(out / "ranges")
    calls = ranges[ranges["level"] == "layer"]
    resolved = layers[layers["dram_bytes_provenance"] == "sampled"]
    assert len(resolved) == 12 and set(resolved["phase"]) == {"bwd"}  # 50 µs samples resolve the backward layers only
    windows = {metric: _hand_windows(trace, metric) for metric in (READ, WRITE)}
    for row in resolved.itertuples():
        mine = calls[(calls["layer_name"] == row.layer_name) & (calls["phase"] == row.phase)]
        assert len(mine) == row.calls == 3
        by_hand = sum(_hand_sum(*windows[m], float(c.gpu_start_ns), float(c.gpu_end_ns)) for m in (READ, WRITE) for c in mine.itertuples())
        assert row.dram_bytes == pytest.approx(by_hand, rel=1e-9)
        assert row.dram_bytes > 5e8  # a backward layer of this model moves about 1 GB over its 3 calls


def test_layers_the_samples_do_not_resolve_are_null_with_a_notice_naming_torchs_finer_interval(kineto_report):
    _, out, stderr = kineto_report
    layers = pd.read_parquet(out / "layers")
    forward = layers[layers["phase"] == "fwd"]
    assert len(forward) == 12 and forward["dram_bytes_sampled"].isna().all()
    assert forward["dram_bytes_provenance"].isna().all()  # no analytic fallback without a call log: null, not 0
    assert "does not resolve 36 of 72 attention ranges" in stderr
    assert "sampling_interval_ms in torch's PerformanceMetricsConfig" in stderr


def test_the_torch_trace_gives_the_cupti_routes_figures_for_the_same_run(kineto_report, tmp_path):
    _, out, _ = kineto_report
    _parse(torch_pm_trace.records(), tmp_path / "cupti")
    key = ["phase", "layer_name"]
    torch_layers = pd.read_parquet(out / "layers").set_index(key).sort_index()
    cupti_layers = pd.read_parquet(tmp_path / "cupti" / "layers").set_index(key).sort_index()
    both = torch_layers["dram_bytes_sampled"].notna()
    assert both.sum() == 12 and (cupti_layers["dram_bytes_sampled"].notna() == both).all()
    # the same samples over the same calls' windows (the trace's times are the records' to the nanosecond): the same
    # figures; before issue 59 the cupti route's float64 absolute times (256 ns steps) put them up to 0.09 % apart
    for column in ("dram_bytes_sampled", "achieved_occupancy_pct"):
        assert np.allclose(torch_layers.loc[both, column], cupti_layers.loc[both, column], rtol=1e-9, atol=0)


def test_a_trace_read_in_spans_and_built_in_groups_gives_the_same_layers_and_one_summed_notice(kineto_report, tmp_path,
                                                                                                  monkeypatch, capsys):
    from headcount.cli.main import main
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers import kineto_steps

    trace = torch_pm_trace.write(tmp_path / "trace.json", torch_pm_trace.kineto_counter_events())
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 0)  # as if the file were large: two workers read a span each
    monkeypatch.setattr(kineto_steps, "GROUP_ROWS", 20_000)  # and the steps are built in several groups
    capsys.readouterr()
    assert main(["parse", str(trace), "-o", str(tmp_path / "out"), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert "(2 workers)" in err and "groups of steps" in err
    assert err.count("does not resolve") == 1 and "does not resolve 36 of 72 attention ranges and 1731 of 1746 kernels" in err
    key = ["phase", "layer_name"]
    split = pd.read_parquet(tmp_path / "out" / "layers").set_index(key).sort_index()
    whole = pd.read_parquet(kineto_report[1] / "layers").set_index(key).sort_index()
    pd.testing.assert_series_equal(split["dram_bytes_sampled"], whole["dram_bytes_sampled"], rtol=1e-12)


def test_percent_of_peak_metrics_are_converted_with_the_devices_peak_and_said_so(tmp_path):
    pm, base = torch_pm_trace.samples(), torch_pm_trace.base_ns()
    window = (pm["end_ns"] - pm["start_ns"]).to_numpy(np.float64)
    peak = 3350.0  # GB/s: the H100 80GB HBM3's datasheet figure (headcount.derive.peaks)
    counters = []
    for (metric, column) in (("dram__bytes_read.sum.pct_of_peak_sustained_elapsed", READ),
                             ("dram__bytes_write.sum.pct_of_peak_sustained_elapsed", WRITE)):
        pct = pm[column].to_numpy(np.float64) / (peak * window) * 100.0
        counters += [{"ph": "C", "cat": "hardware_counters", "name": metric, "pid": "GPU 0 Counters", "tid": 0,
                      "ts": round((int(s) - base) / 1e3, 3), "args": {"": float(v)}} for s, v in zip(pm["start_ns"], pct)]
    trace = torch_pm_trace.write(tmp_path / "pct.json.gz", counters)
    done = _parse(trace, tmp_path / "out")
    assert "are % of peak: converted to bytes with the device's peak DRAM bandwidth (3,350 GB/s, datasheet of NVIDIA H100 80GB HBM3)" in done.stderr
    _parse(torch_pm_trace.write(tmp_path / "bytes.json.gz", torch_pm_trace.kineto_counter_events()), tmp_path / "bytes")
    converted = pd.read_parquet(tmp_path / "out" / "layers")["dram_bytes_sampled"]
    counted = pd.read_parquet(tmp_path / "bytes" / "layers")["dram_bytes_sampled"]
    assert converted.notna().sum() == 12
    assert np.allclose(converted.dropna(), counted.dropna(), rtol=2e-3)


def test_counters_headcount_does_not_read_are_named_and_left_out():
    rows = [(0, "Power (W)", 10.0, 300.0), (0, "Power (W)", 11.0, 301.0), (0, READ, 10.0, 5.0), (0, READ, 11.0, 7.0),
            (1, READ, 10.0, 1.0)]
    pm, notices = kineto_counters.pm_samples(rows, None)
    assert list(pm["start_ns"]) == [10_000, 11_000] and list(pm["end_ns"]) == [11_000, 12_000]
    assert list(pm[READ]) == [5.0, 7.0]
    assert any("Power (W)" in n and "left out" in n for n in notices)
    assert any("PM samples of 2 GPUs" in n and "GPU 1 left out" in n for n in notices)


def test_a_gap_in_sampling_is_not_given_to_the_sample_before_it():
    rows = [(0, READ, ts, 1.0) for ts in (0.0, 1.0, 2.0, 10.0, 11.0)]
    pm, _ = kineto_counters.pm_samples(rows, None)
    assert list(pm["end_ns"] - pm["start_ns"]) == [1000, 1000, 1000, 1000, 1000]


def test_one_sample_has_no_known_window():
    pm, notices = kineto_counters.pm_samples([(0, READ, 1.0, 5.0)], None)
    assert pm is None and any("one PM sample" in n for n in notices)


def test_a_trace_without_counter_events_is_read_as_before(tmp_path):
    trace = torch_pm_trace.write(tmp_path / "plain.json.gz", [])
    done = _parse(trace, tmp_path / "out")
    assert "PM sampling" not in done.stderr
    assert pd.read_parquet(tmp_path / "out" / "layers")["dram_bytes_sampled"].isna().all()


def test_the_samples_written_by_torch_215s_own_chrome_writer_give_the_same_layers(kineto_report, tmp_path):
    try:
        counters = torch_pm_trace.cuspy_counter_events()
    except ImportError as exc:
        if os.environ.get("HEADCOUNT_REQUIRE_TORCH215"):
            raise
        pytest.skip(f"torch 2.15's Cuspy writer is not importable here ({exc}): scripts/torch_215.sh runs this test")
    assert all(ev["pid"] == "GPU 0 Counters" for ev in counters if ev["ph"] == "C")
    trace = torch_pm_trace.write(tmp_path / "cuspy.json.gz", counters)
    _parse(trace, tmp_path / "out")
    key = ["phase", "layer_name"]
    mine = pd.read_parquet(tmp_path / "out" / "layers").set_index(key).sort_index()
    kineto = pd.read_parquet(kineto_report[1] / "layers").set_index(key).sort_index()
    pd.testing.assert_series_equal(mine["dram_bytes_sampled"], kineto["dram_bytes_sampled"], rtol=1e-9)


def test_the_in_process_torch_source_reads_the_samples_torch_wrote_into_its_trace(kineto_report, tmp_path):
    """What ``AttentionProfiler(backend="torch")`` builds of the trace its recorder wrote (here, the same trace)."""
    from headcount.build.in_process import tables_from_torch
    from headcount.parsers.kineto_json import run_device

    trace = torch_pm_trace.write(tmp_path / "trace.json", torch_pm_trace.kineto_counter_events())
    built = tables_from_torch(trace, [], "h100", "sdpa", device=run_device([torch_pm_trace.H100_PROPERTIES]))
    key = ["phase", "layer_name"]
    mine = built.tables["layers"].set_index(key).sort_index()
    parsed = pd.read_parquet(kineto_report[1] / "layers").set_index(key).sort_index()
    assert np.allclose(mine["dram_bytes_sampled"], parsed["dram_bytes_sampled"], rtol=1e-12, equal_nan=True)
    assert mine["dram_bytes_sampled"].notna().sum() == 12
    assert any("does not resolve 36 of 72" in n and "PerformanceMetricsConfig" in n for n in built.notices)


def test_a_heads_sampled_bytes_are_the_hand_sum_of_the_samples_over_its_calls(tmp_path):
    """Per head, where the samples resolve it: a head-mode run's trace (:func:`torch_pm_trace.head_mode_trace`: the
    replayed GPU's timeline, the H100's sample values) gives each head the hand sum of the raw counter events over its
    calls' GPU windows; the heads of a layer are told apart (their figures differ as the samples under them do)."""
    from conftest import llama_model
    from cupti_replay import ReplayPm, profile_replayed

    from headcount.cli.models import make_inputs

    model = llama_model("eager")
    prof, _ = profile_replayed(model, make_inputs(model, 2, 32), mode="head", pm=ReplayPm(), tmp_path=tmp_path / "rec",
                               steps=2, pm_interval_ns=5_000)
    trace = torch_pm_trace.head_mode_trace(tmp_path / "trace.json.gz", Path(prof.trace_path))
    _parse(trace, tmp_path / "out")
    heads = pd.read_parquet(tmp_path / "out" / "heads")
    calls = pd.read_parquet(tmp_path / "out" / "ranges").query("level == 'head'")
    assert len(heads) == 2 * 2 * 4 and (heads["dram_bytes_provenance"] == "sampled").all()  # 2 phases × 2 layers × 4 heads
    windows = {metric: _hand_windows(trace, metric) for metric in (READ, WRITE)}
    for row in heads.itertuples():
        mine = calls[(calls["layer_name"] == row.layer_name) & (calls["phase"] == row.phase) & (calls["head"] == row.head)]
        assert len(mine) == row.calls == 2
        by_hand = sum(_hand_sum(*windows[m], float(c.gpu_start_ns), float(c.gpu_end_ns)) for m in (READ, WRITE) for c in mine.itertuples())
        assert row.dram_bytes == pytest.approx(by_hand, rel=1e-9)
    assert heads.groupby(["phase", "layer_name"])["dram_bytes"].nunique().eq(4).all()
