"""Spread over calls, figures rounded to it, and no noise called a bottleneck (issue 10 §3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount import AttentionProfiler
from headcount.derive import aggregate, spread
from headcount.reports import findings
from headcount.reports.figures import number, with_spread


def _ranges(durations: dict, level: str = "head") -> pd.DataFrame:
    """Range instances of one layer: ``durations`` maps head → per-call durations (ns)."""
    rows = []
    rid = 0
    for head, values in durations.items():
        for step, d in enumerate(values):
            rid += 1
            rows.append({"range_id": rid, "implementation": "sdpa", "phase": "fwd", "layer_name": "layer.0", "layer": 0,
                         "head": head, "kv_head": head, "step": step, "duration_ns": float(d), "duration_basis": "cpu_range",
                         "flop": 1e6, "analytic_min_bytes": 2e5, "op_count": 3, "level": level})
    return pd.DataFrame(rows)


def test_percentiles_are_those_of_the_calls():
    calls = {0: [100, 200, 300, 400, 500], 1: [1000]}
    table = aggregate.heads_table(_ranges(calls), pd.DataFrame())
    h0 = table[table["head"] == 0].iloc[0]
    assert [h0[c] for c in spread.DURATION] == pytest.approx(np.percentile([100, 200, 300, 400, 500], [10, 50, 90]))
    # bandwidth per call: that call's bytes over its own time (GB/s = bytes/ns)
    assert h0["bandwidth_per_call_p50_gbps"] == pytest.approx(np.percentile([2e5 / d for d in (100, 200, 300, 400, 500)], 50))
    h1 = table[table["head"] == 1].iloc[0]  # one call: no spread
    assert all(pd.isna(h1[c]) for c in (*spread.DURATION, *spread.BANDWIDTH))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(1, 1e9), min_size=1, max_size=12), min_size=1, max_size=6))
def test_p10_le_p50_le_p90(per_head):
    table = aggregate.heads_table(_ranges(dict(enumerate(per_head))), pd.DataFrame())
    for names in (spread.DURATION, spread.BANDWIDTH):
        known = table.dropna(subset=names)
        assert (known[names[0]] <= known[names[1]] + 1e-9).all() and (known[names[1]] <= known[names[2]] + 1e-9).all()


def _heads_rows(calls: dict) -> pd.DataFrame:
    return aggregate.heads_table(_ranges(calls), pd.DataFrame()).assign(provenance="measured")


def test_identical_heads_are_within_noise_and_a_slow_head_stands_out():
    rng = np.random.default_rng(0)
    same = {h: rng.normal(1000, 100, size=8) for h in range(8)}
    verdicts = spread.standout(_heads_rows(same), "head")
    assert set(verdicts["verdict"]) == {"within noise"}
    lines = findings.head_lines(_heads_rows(same))
    assert lines == [lines[0]] and "heads within noise in 1 of 1 layers" in lines[0]

    slow = {**same, 7: rng.normal(1400, 30, size=8)}  # +40 %, far beyond ±10 %
    verdicts = spread.standout(_heads_rows(slow), "head").set_index("head")
    assert verdicts.loc[7, "verdict"] == "hotter" and (verdicts.drop(index=7)["verdict"] == "within noise").all()
    assert 30 < verdicts.loc[7, "vs_median_pct"] < 50
    line = findings.head_lines(_heads_rows(slow))[0]
    assert line.startswith("layer.0 head 7 (fwd, sdpa): hotter, +") and "beyond the spread" in line


def test_too_few_calls_name_no_head():
    two = {0: [100, 101], 1: [900, 901]}  # 9× apart, but two calls each: no verdict
    assert set(spread.standout(_heads_rows(two), "head")["verdict"]) == {"unknown"}
    assert findings.head_lines(_heads_rows(two)) == ["fwd, sdpa: heads not compared (fewer than 3 calls per head; profile more steps)"]


def test_figures_are_rounded_to_their_spread():
    assert with_spread(2315.693, 2083.16, 2896.43) == "2,300 (2,100–2,900)"
    assert with_spread(123.456, 123.0, 124.0) == "123.5 (123.0–124.0)"
    assert with_spread(0.0123456, 0.012, 0.013) == "0.0123 (0.0120–0.0130)"
    assert with_spread(5.0) == "5.00" and number(123456.7) == "123,000" and number(None) == "–"
    assert with_spread(1e6, 1e6, 1e6, 1e-3) == "1,000 (1,000–1,000)"  # equal calls: three significant digits


def test_head_mode_statements_hold_against_the_spread(tiny_llama, llama_inputs):
    """A real head-mode run of identical heads (same shapes, same work): every
    head the findings single out satisfies the rule on the table's own
    figures, and the others are said to be within noise."""
    prof = AttentionProfiler(tiny_llama, mode="head", backend="torch")
    with prof:
        for i in range(4):
            with prof.step(i):
                tiny_llama(**llama_inputs).loss.backward()
    heads = prof.get_stats()["heads"]
    known = heads.dropna(subset=spread.DURATION)
    assert len(known) == len(heads)
    assert (known[spread.DURATION[0]] <= known[spread.DURATION[1]]).all() and (known[spread.DURATION[1]] <= known[spread.DURATION[2]]).all()
    lines = findings.head_lines(heads, top=100)
    for line in lines:
        if " hotter" in line or " cooler" in line:
            layer, _, rest = line.partition(" head ")
            head = int(rest.split()[0])
            phase = rest.split("(")[1].split(",")[0]
            group = heads[(heads["layer_name"] == layer) & (heads["phase"] == phase)]
            ref = group.sort_values(["duration_per_call_p50_ns", "head"]).iloc[(len(group) - 1) // 2]
            row = group[group["head"] == head].iloc[0]
            assert (row["duration_per_call_p10_ns"] > ref["duration_per_call_p90_ns"]
                    or row["duration_per_call_p90_ns"] < ref["duration_per_call_p10_ns"]), line
        else:
            assert "within noise" in line, line
    # the old wording ("N% of its layer's head time" for the top shares) is gone
    assert not any("of its layer's head time" in line for line in findings.bottlenecks(prof.get_stats()["layers"], heads))
