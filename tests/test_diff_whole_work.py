"""``headcount diff`` judges the whole work first, on real before/after pairs, and refuses what cannot be compared.

The pairs are real recordings: a two-rank FSDP training on 2×H100 before and after a change (nsys 2026.2 exports,
GindaChen/nsys-ai; no ProfilerStep: the unit is the block, one ``FSDP::pre_forward (blocks.N…)`` start to the next),
and a CPU program with ``layers.N`` ranges recorded here with the real nsys 2023.4.4, with and without 25 % extra
work per layer (scripts/record_cpu_pair.py). Every expected figure is counted here from the SQLite files directly
(sqlite3, no headcount), or read from tests/fixtures/hand_counts/cpu_layers_hand_counts.json (scripts/hand_count_units.py).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hand_union import union_length

from headcount.cli.main import main
from headcount.derive import difference, work_units

FIXTURES = Path(__file__).parent / "fixtures"
BEFORE = FIXTURES / "nsys" / "h100x2_fsdp_before_nsys2026.2.sqlite"
AFTER = FIXTURES / "nsys" / "h100x2_fsdp_after_nsys2026.2.sqlite"
CPU = {k: FIXTURES / "nsys" / f"cpu_layers_{k}_nsys2023.4.sqlite" for k in ("base", "base2", "slower")}
HAND = json.loads((FIXTURES / "hand_counts" / "cpu_layers_hand_counts.json").read_text())


def _diff(capsys, *args) -> tuple[int, dict, str]:
    rc = main(["diff", *map(str, args), "--json", "-"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out.strip() else {}), out.err


def _block_periods(path: Path, indexed: bool = False) -> dict[int, np.ndarray]:
    """By hand: per process, one ``FSDP::pre_forward (blocks.N…)`` start to the next ``blocks.N+1`` start (ns);
    ``indexed``: as ``(N, span)`` pairs."""
    con = sqlite3.connect(path)
    rows = con.execute("SELECT n.start, coalesce(n.text, s.value), n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                       "ON s.id = n.textId WHERE coalesce(n.text, s.value) LIKE 'FSDP::pre_forward (blocks.%' ORDER BY n.start").fetchall()
    con.close()
    by: dict = {}
    for start, text, tid in rows:
        by.setdefault(tid >> 24 & 0xFFFFFF, []).append((start, int(re.search(r"blocks\.(\d+)", text).group(1))))
    if indexed:
        return {pid: [(a[1], b[0] - a[0]) for a, b in zip(xs, xs[1:]) if b[1] == a[1] + 1] for pid, xs in sorted(by.items())}
    return {pid: np.array([b[0] - a[0] for a, b in zip(xs, xs[1:]) if b[1] == a[1] + 1], dtype=float)
            for pid, xs in sorted(by.items())}


def _kernel_time_per_block(path: Path) -> dict[int, float]:
    """By hand: per process, the median over blocks of the summed durations of the kernels whose launch call (on the
    block's thread) started inside the block's span (ns)."""
    con = sqlite3.connect(path)
    hooks = con.execute("SELECT n.start, coalesce(n.text, s.value), n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                        "ON s.id = n.textId WHERE coalesce(n.text, s.value) LIKE 'FSDP::pre_forward (blocks.%' ORDER BY n.start").fetchall()
    launched = con.execute("SELECT r.globalTid, r.start, k.end - k.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN "
                           "CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
                           "AND k.globalPid >> 24 = r.globalTid >> 24").fetchall()
    con.close()
    by: dict = {}
    for start, text, tid in hooks:
        by.setdefault(tid, []).append((start, int(re.search(r"blocks\.(\d+)", text).group(1))))
    out = {}
    for tid, xs in by.items():
        mine = [(t, d) for g, t, d in launched if g == tid]
        sums = [sum(d for t, d in mine if a[0] <= t < b[0]) for a, b in zip(xs, xs[1:]) if b[1] == a[1] + 1]
        out[tid >> 24 & 0xFFFFFF] = float(np.median(sums))
    return out


def _device_of(path: Path) -> dict[int, int]:
    con = sqlite3.connect(path)
    rows = con.execute("SELECT DISTINCT globalPid >> 24 & 16777215, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    con.close()
    return dict(rows)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """The FSDP pair diffed once (its JSON, markdown and HTML), and the exit status under a 10 % gate."""
    out = tmp_path_factory.mktemp("fsdp")
    md, html, js = out / "d.md", out / "d.html", out / "d.json"
    rc = main(["diff", str(BEFORE), str(AFTER), "--fail-on-regression", "10", "--json", str(js), "--markdown", str(md),
               "--html", str(html)])
    return rc, json.loads(js.read_text()), md.read_text(), html.read_text()


def test_the_real_fsdp_pair_regressed_per_block_as_counted_by_hand(fsdp):
    rc, doc, _, _ = fsdp
    assert rc == 1 and doc["verdict"] == "regression"
    before, after = _block_periods(BEFORE), _block_periods(AFTER)
    dev_b, dev_a = _device_of(BEFORE), _device_of(AFTER)
    hand = {}
    for pb, pa in zip(before, after):
        assert dev_b[pb] == dev_a[pa]  # the processes pair rank by rank (device by device)
        hand[f"cuda:{dev_b[pb]}"] = 100 * (np.median(after[pa]) / np.median(before[pb]) - 1)
    assert hand["cuda:0"] == pytest.approx(16.05, abs=0.01) and hand["cuda:1"] == pytest.approx(17.41, abs=0.01)
    for o in doc["overall"]:
        assert o["basis"] == "span per unit FSDP::pre_forward (blocks.{N}._checkpoint_wrapped_module) (start to next start)"
        assert o["verdict"] == "regression" and o["change_pct"] == pytest.approx(hand[o["rank"]], abs=0.01)
        assert o["p_value"] < difference.ALPHA and (o["base_calls"], o["new_calls"]) == (16, 14)
    assert "+16.1 % (cuda:0), +17.4 % (cuda:1)" in doc["headline"]
    # the windows start at different blocks: said, per rank
    assert sum("cover different parts of the run" in n and "3–18" in n and "9–22" in n for n in doc["notes"]) == 2
    # and what the blocks both windows hold (9–18) say, by hand: 16.63 → 18.43 ms and 17.44 → 19.13 ms
    for o, (pb, pa) in zip(doc["overall"], zip(before, after)):
        common = o["common_units"]
        assert common["indices"] == "9–18" and common["base_spans"] == common["new_spans"] == 10
        idx_b = _block_periods(BEFORE, indexed=True)[pb]
        idx_a = _block_periods(AFTER, indexed=True)[pa]
        hb = np.median([v for i, v in idx_b if 9 <= i <= 18])
        ha = np.median([v for i, v in idx_a if 9 <= i <= 18])
        assert common["base_median_ns"] == pytest.approx(hb) and common["new_median_ns"] == pytest.approx(ha)
        assert f"({100 * (ha / hb - 1):+.1f} %, 10 vs 10 spans)" in next(n for n in doc["notes"] if n.startswith(o["rank"] + ": the windows"))


def test_the_evidence_is_the_reports_own_figures(fsdp):
    _, doc, _, _ = fsdp
    con = {p: sqlite3.connect(p) for p in (BEFORE, AFTER)}
    for o in doc["overall"]:
        ev = {e["figure"]: e for e in o["evidence"]}
        busy, launch = ev["GPU busy"], ev["launch-bound idle"]
        assert busy["per"] == "window" and busy["verdict"] is None  # one window a side: no spread, no verdict
        assert launch["ratio"] == pytest.approx(launch["new"] / launch["base"])
    by_rank = {o["rank"]: {e["figure"]: e for e in o["evidence"]} for o in doc["overall"]}
    # the triage of each report (headcount report) prints these: 91.3 → 80.2 % and 89.5 → 84.9 % busy,
    # launch-bound idle 10.5 → 42.6 ms and 13.8 → 31.7 ms
    assert round(by_rank["cuda:0"]["GPU busy"]["base"], 1) == 91.3 and round(by_rank["cuda:0"]["GPU busy"]["new"], 1) == 80.2
    assert round(by_rank["cuda:1"]["GPU busy"]["base"], 1) == 89.5 and round(by_rank["cuda:1"]["GPU busy"]["new"], 1) == 84.9
    assert round(by_rank["cuda:0"]["launch-bound idle"]["new_ms"], 1) == 42.6
    assert round(by_rank["cuda:1"]["launch-bound idle"]["base_ms"], 1) == 13.8
    assert "GPU busy 91.3 → 80.2 %, 89.5 → 84.9 %" in doc["headline"] and "launch-bound idle ×2.3–4.1" in doc["headline"]
    # the kernels the blocks asked for took as long as before: the GPU waited (by hand, launch calls in each block's span)
    kb, ka = _kernel_time_per_block(BEFORE), _kernel_time_per_block(AFTER)
    dev_b, dev_a = _device_of(BEFORE), _device_of(AFTER)
    for pid, ms in kb.items():
        row = by_rank[f"cuda:{dev_b[pid]}"]["kernel time per unit"]
        assert row["base"] == pytest.approx(ms / 1e6) and row["verdict"] == "unchanged"
    for pid, ms in ka.items():
        assert by_rank[f"cuda:{dev_a[pid]}"]["kernel time per unit"]["new"] == pytest.approx(ms / 1e6)
    assert "kernel time per unit 15.8 → 15.5 ms, 15.5 → 15.8 ms (unchanged)" in doc["headline"]
    # GPU busy by hand on rank 0, before: the union of every kernel, memcpy and memset of the device over the window
    rows = con[BEFORE].execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0 UNION ALL "
                               "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = 0 UNION ALL "
                               "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = 0").fetchall()
    busy = union_length(rows)
    assert by_rank["cuda:0"]["GPU busy"]["base_ms"] == pytest.approx(busy / 1e6, rel=1e-9)


def test_calls_of_different_shapes_are_never_mixed(fsdp):
    _, doc, _, _ = fsdp
    attention = [c for c in doc["changes"] if c["level"] == "layer"]
    assert attention and all(c["rank"] in ("cuda:0", "cuda:1") for c in attention)
    grids = {c["shape"] for c in attention}
    # flash_fwd_kernel runs with two grids in every block; each row holds one
    assert {"grid (122, 1, 12) block (128, 1, 1)", "grid (244, 1, 6) block (128, 1, 1)"} <= grids
    assert all(c["shape"].count("grid") == 1 for c in attention)
    flash = [c for c in doc["changes"] if c["level"] == "kernel" and c["name"] == "flash_fwd_kernel"]
    assert len(flash) == 4 and all(c["verdict"] == "unchanged" for c in flash)
    small = next(c for c in flash if c["shape"].startswith("grid (122") and c["rank"] == "cuda:0")
    assert small["base_p50_ns"] < 200_000 and small["new_p50_ns"] < 200_000  # ~154 µs, never the 4.01 ms of a mix
    # FSDP's per-block ranges are one row each, not one row per block added or removed
    ranges = [c for c in doc["changes"] if c["level"] == "range" and c["name"].startswith("FSDP::pre_forward (blocks.")]
    assert {c["name"] for c in ranges} == {"FSDP::pre_forward (blocks.{N}._checkpoint_wrapped_module)"}
    # the windows hold different blocks (3–19 and 9–23): a block's attention calls on one side only are unpaired,
    # never "added" or "removed"
    assert not [c for c in doc["changes"] if c["verdict"] in ("added", "removed")]
    unpaired = {c["name"].split(".call")[0] for c in doc["changes"] if c["verdict"] == "unpaired"}
    assert unpaired and all(c["level"] == "layer" for c in doc["changes"] if c["verdict"] == "unpaired")


def test_markdown_and_html_say_the_same_verdict_and_evidence(fsdp):
    _, doc, md, html = fsdp
    assert md.startswith("### headcount diff: **regression**") and doc["headline"] in md
    assert "headcount diff: <span class='verdict regression'>regression</span>" in html
    from html import escape
    assert escape(doc["headline"]) in html
    for line in ("launch-bound idle: 3.5 → 14.2 % of the windows (10.5 → 42.6 ms), ×4.1",):
        assert line in md and escape(line) in html


def test_an_identical_pair_is_unchanged_and_passes(capsys):
    rc, doc, _ = _diff(capsys, BEFORE, BEFORE, "--fail-on-regression", "1")
    assert rc == 0 and doc["verdict"] == "unchanged"
    assert all(o["change_pct"] == 0 and o["verdict"] == "unchanged" for o in doc["overall"])
    assert {c["verdict"] for c in doc["changes"]} <= {"unchanged", "inconclusive"}


# ---------------------------------------------------------------- a change made here, recorded with the real nsys
@pytest.mark.parametrize("base,new", [("base", "slower"), ("base2", "slower"), ("base", "base2")])
def test_cpu_pairs_recorded_here_give_the_hand_count(capsys, base, new):
    rc, doc, err = _diff(capsys, CPU[base], CPU[new], "--fail-on-regression", "10")
    hand = HAND["pairs"][f"cpu_layers_{base}_nsys2023.4.sqlite -> cpu_layers_{new}_nsys2023.4.sqlite"]["period_median_change_pct"]
    (o,) = doc["overall"]
    assert o["basis"] == "span per unit layers.{N} (start to next start)"
    assert o["change_pct"] == pytest.approx(hand, abs=0.01) and (o["base_calls"], o["new_calls"]) == (210, 210)
    # +41.9 % and +25.9 % (the 25 % extra work) and +12.6 %: two runs of one configuration on this loaded 2-core
    # machine differed that much (the hand count agrees); the gate at 10 % catches each, with its sign and size
    assert o["verdict"] == "regression" and rc == 1 and f"{o['change_pct']:+.1f} %" in err


def test_cpu_pair_against_itself_and_reversed(capsys):
    rc, doc, _ = _diff(capsys, CPU["base"], CPU["base"], "--fail-on-regression", "0")
    assert rc == 0 and doc["verdict"] == "unchanged"
    rc, doc, _ = _diff(capsys, CPU["slower"], CPU["base"], "--fail-on-regression", "10")
    assert rc == 0 and doc["verdict"] == "improvement" and doc["overall"][0]["change_pct"] < -25


# ---------------------------------------------------------------- refused
def _refused(capsys, a, b) -> str:
    assert main(["diff", str(a), str(b)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("headcount: error:")]
    assert len(err) == 1
    return err[0]


def test_a_timeline_against_an_ncu_report_is_refused(capsys):
    line = _refused(capsys, BEFORE, FIXTURES / "ncu" / "rtx2080ti_two_kernels.ncu-rep")
    assert "measure different things" in line and str(BEFORE) in line


def test_recordings_of_different_programs_are_refused(capsys):
    line = _refused(capsys, BEFORE, FIXTURES / "nsys" / "a100x4_cloverleaf_nsys2024.5.sqlite")
    assert "different programs" in line and "0 % and 0 %" in line


def test_nothing_in_common_is_refused(capsys):
    line = _refused(capsys, CPU["base"], FIXTURES / "nsys" / "h200_nvfuser_nsys2024.6.sqlite")
    assert "nothing in common" in line


# ---------------------------------------------------------------- the unit, on tables
def test_units_walk_their_index_and_the_coarsest_is_taken():
    import pandas as pd

    def ranges(names_starts):
        return pd.DataFrame([{"name": n, "depth": 0, "pid": 1, "tid": 1, "start_ns": s} for n, s in names_starts])
    blocks = [(f"Block {i}", 10 * i) for i in range(6)] + [(f"Block {i}", 100 + 12 * (5 - i)) for i in range(6)]
    sub = [(f"nn.Module: Linear_{i}", 10 * (i // 2) + 3 * (i % 2)) for i in range(12)]
    p = work_units.periods(ranges(blocks + sub))
    block = p[p["unit"] == "Block {N}"].sort_values("start_ns")
    # forward 0→5 (periods of 10) and backward 5→0 (periods of 12); the step from Block 5 (fwd) to Block 5 (bwd) is none
    assert block["period_ns"].tolist() == [10.0] * 5 + [12.0] * 5
    assert work_units.common_unit(p, p) == ("Block {N}", 0)
    assert work_units.indexless("FSDP::pre_forward (blocks.12._checkpoint_wrapped_module), op_id = 5") == \
        "FSDP::pre_forward (blocks.{N}._checkpoint_wrapped_module)"


def test_an_unindexed_outermost_range_is_a_unit_and_operators_are_not():
    import pandas as pd

    rows = [{"name": "micro_batch", "depth": 0, "pid": 1, "tid": 1, "start_ns": 100 * i} for i in range(5)]
    rows += [{"name": f"aten::mm, op_id = {i}", "depth": 0, "pid": 1, "tid": 1, "start_ns": 100 * i + 5} for i in range(5)]
    p = work_units.periods(pd.DataFrame(rows))
    assert set(p["unit"]) == {"micro_batch"} and p["period_ns"].tolist() == [100.0] * 4 and p["index"].isna().all()
    assert work_units.common_unit(p, p) == ("micro_batch", 0)


def test_a_real_ddp_trace_with_steps_is_judged_per_step(capsys):
    """torch.profiler on an A100, rank 0 of 2 (HTA's trace, 3 ProfilerSteps): the whole work is the time per step,
    the evidence per step with a verdict each, the rank the one the trace records."""
    trace = FIXTURES / "kineto" / "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"
    rc, doc, _ = _diff(capsys, trace, trace, "--fail-on-regression", "0")
    (o,) = doc["overall"]
    assert rc == 0 and o["basis"] == "time per step" and o["rank"] == "rank 0" and (o["base_calls"], o["new_calls"]) == (3, 3)
    ev = {e["figure"]: e for e in o["evidence"]}
    assert ev["kernel time per step"]["per"] == "step" and ev["GPU busy"]["per"] == "step"
    assert {e["verdict"] for e in o["evidence"]} == {"unchanged"}
    steps = json.loads(json.dumps(doc))  # the evidence is JSON-clean
    assert steps["overall"][0]["evidence"][0]["figure"] == "kernel time per step"
