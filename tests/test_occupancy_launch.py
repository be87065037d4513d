"""Theoretical occupancy, launch statistics and PM-sample apportioning:
pure functions checked against hand-computed values and brute force."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.attribute import attribution
from headcount.attribute.nesting import ancestor_rows
from headcount.derive import launch, sampling
from headcount.derive.occupancy import LIMITS, blocks_per_sm, kernel_occupancy, theoretical_occupancy_pct


@pytest.mark.parametrize("cc,threads,regs,smem,expect", [
    ("8.0", 256, 32, 0, 100.0),          # 8 blocks × 8 warps = 64 of 64
    ("8.6", 256, 64, 0, 100 * 32 / 48),  # registers: 8 warps per sub-partition → 4 blocks
    ("9.0", 128, 128, 0, 25.0),          # 4096 registers a warp → 16 warps
    ("9.0", 128, 255, 0, 12.5),          # rounded to 8192 a warp → 8 warps
    ("9.0", 128, 32, 100 * 1024, 12.5),  # (100 KiB + 1 KiB reserved) → 2 blocks of 228 KiB
    ("9.0", 32, 16, 0, 50.0),            # 32 blocks at most → 32 warps
    ("9.0", 1024, 255, 0, 0.0),          # 262,144 registers do not fit a block
    ("7.5", 1024, 32, 0, 100.0),         # T4: 32 warps an SM
    ("8.9", 32, 40, 0, 50.0),            # L4: 24 blocks at most → 24 of 48 warps
    ("8.9", 96, 40, 0, 100.0),           # 16 blocks of 3 warps fill 48
])
def test_theoretical_occupancy(cc, threads, regs, smem, expect):
    assert theoretical_occupancy_pct([threads], [regs], [smem], LIMITS[cc])[0] == pytest.approx(expect)


def test_the_configured_shared_memory_carveout_counts():
    h100 = LIMITS["9.0"]
    assert blocks_per_sm([128], [32], [48 * 1024], h100)[0] == 4  # 228 KiB / 49 KiB
    assert blocks_per_sm([128], [32], [48 * 1024], h100, shared_memory_config=[100 * 1024])[0] == 2


def test_kernel_rows_without_launch_details_stay_null():
    k = pd.DataFrame({"block": ["(128, 1, 1)", None, "(256, 2, 1)"], "registers_per_thread": pd.array([64, 32, None], dtype="Int64"),
                      "shared_memory_bytes": pd.array([0, 0, 0], dtype="Int64")})
    occ = kernel_occupancy(k, LIMITS["9.0"])
    assert occ[0] == pytest.approx(100 * 32 / 64 * 1.0) and occ[1:].isna().all()
    assert kernel_occupancy(k, None).isna().all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(1, 15)), min_size=1, max_size=25))
def test_busy_time_is_the_union_of_kernel_intervals(kernels):
    """Range 0 contains ranges 1 and 2; kernels of a child count for the parent too."""
    ranges = pd.DataFrame({"range_id": [0, 1, 2], "parent_range_id": [-1, 0, 0], "gpu_start_ns": [0, 0, 0], "gpu_end_ns": [100, 100, 100]})
    work = pd.DataFrame({"start_ns": [s for _, s, _ in kernels], "end_ns": [s + d for _, s, d in kernels],
                         "api_start_ns": 0, "api_end_ns": 7})
    inner = np.array([r for r, _, _ in kernels])
    got = launch.per_range(ranges, work, ancestor_rows(ranges, inner)).set_index("range_id")
    for rid, members in ((0, {0, 1, 2}), (1, {1}), (2, {2})):
        covered = set()
        for r, s, d in kernels:
            if r in members:
                covered |= set(range(s, s + d))
        assert got.loc[rid, "kernel_busy_ns"] == len(covered)
        assert got.loc[rid, "kernel_gap_ns"] == 100 - len(covered)
        count = sum(1 for r, _, _ in kernels if r in members)
        assert got.loc[rid, "cpu_launch_cost_ns"] == (7 * count if count else 0) or np.isnan(got.loc[rid, "cpu_launch_cost_ns"])


def test_ranges_that_launched_nothing_have_null_launch_figures():
    ranges = pd.DataFrame({"range_id": [0, 1], "parent_range_id": [-1, -1], "gpu_start_ns": pd.array([0, None], dtype="Int64"),
                           "gpu_end_ns": pd.array([10, None], dtype="Int64")})
    work = pd.DataFrame({"start_ns": [2], "end_ns": [5], "api_start_ns": [0], "api_end_ns": [1]})
    got = launch.per_range(ranges, work, ancestor_rows(ranges, np.array([0])))
    assert got.loc[0, "kernel_busy_ns"] == 3 and got.loc[0, "kernel_gap_ns"] == 7
    assert got.loc[1, ["kernel_busy_ns", "kernel_gap_ns", "cpu_launch_cost_ns"]].isna().all()


def _samples():
    # two 100 ns windows, a 50 ns gap, one more window
    return pd.DataFrame({"start_ns": [0, 100, 250], "end_ns": [100, 200, 350],
                         "dram__bytes_read.sum": [1000.0, 3000.0, 500.0], "dram__bytes_write.sum": [10.0, 20.0, 30.0],
                         "sm__warps_active.avg.pct_of_peak_sustained_elapsed": [10.0, 50.0, 90.0]})


def test_pm_counters_are_weighted_by_overlap_within_their_window():
    """The arithmetic of a window's share of each sample it overlaps (min_whole=0: no resolution rule); a window
    the samples do not cover all of (across the 50-ns gap, inside it) gets null, never the part that was covered."""
    got = sampling.window_totals(_samples(), np.array([0, 50, 150, 210, 0]), np.array([350, 150, 300, 240, 100]), min_whole=0)
    assert got.loc[1, "dram_read_sampled_bytes"] == 500.0 + 1500.0  # half of each of the first two samples
    assert got.loc[4, "dram_read_sampled_bytes"] == 1000.0 and got.loc[4, "dram_write_sampled_bytes"] == 10.0
    assert got.loc[[0, 2, 3], "dram_read_sampled_bytes"].isna().all()  # across or inside the gap: unknown, not a part
    # percentages: time-weighted over the window
    assert got.loc[1, "sm_warps_active_sampled_pct"] == pytest.approx(30.0)
    assert got.loc[4, "sm_warps_active_sampled_pct"] == pytest.approx(10.0)
    # past the last sample: unknown too
    late = sampling.window_totals(_samples(), np.array([300]), np.array([400]), min_whole=0)
    assert np.isnan(late.loc[0, "dram_read_sampled_bytes"])
    info = sampling.sample_gaps(_samples())
    assert info == {"samples": 3, "median_window_ns": 100.0, "gaps": 1, "gap_total_ns": 50, "first_ns": 0, "last_ns": 350}


def test_windows_the_samples_do_not_resolve_get_null():
    """A window gets sampled figures only with MIN_WHOLE_SAMPLES whole samples inside it; else null (never a share of
    its neighbours' samples), with the count of whole samples it had."""
    samples = pd.DataFrame({"start_ns": np.arange(0, 1000, 100), "end_ns": np.arange(100, 1100, 100),
                            "dram__bytes_read.sum": np.full(10, 1000.0), "dram__bytes_write.sum": np.full(10, 10.0)})
    start, end = np.array([0, 50, 100, 0, 950]), np.array([400, 450, 450, 1000, 1000])
    got = sampling.window_totals(samples, start, end)
    assert got["pm_whole_samples"].tolist() == [4, 3, 3, 10, 0]
    assert got.loc[0, "dram_read_sampled_bytes"] == 4000.0 and got.loc[3, "dram_read_sampled_bytes"] == 10000.0
    assert got.loc[[1, 2, 4], "dram_read_sampled_bytes"].isna().all() and got.loc[[1, 2, 4], "dram_write_sampled_bytes"].isna().all()
    assert sampling.MIN_WHOLE_SAMPLES == 4
    loose = sampling.window_totals(samples, start, end, min_whole=3)
    assert loose.loc[1, "dram_read_sampled_bytes"] == 4000.0  # 3 whole samples and two halves
    # single samples above a ceiling (GB/s = bytes/ns): 1010 bytes over 100 ns = 10.1 GB/s each
    assert sampling.above_ceiling(samples, 10.0) == {"count": 10, "samples": 10, "max_gbps": 10.1, "ceiling_gbps": 10.0}
    assert sampling.above_ceiling(samples, 20.0)["count"] == 0


def test_by_external_id_maps_launches_to_ranges():
    ranges = pd.DataFrame({"range_id": [4, 5], "external_id": pd.array([11, 12], dtype="Int64")})
    work = pd.DataFrame({"external_id": pd.array([12, None, 11, 99], dtype="Int64")})
    assert attribution.by_external_id(work, ranges).tolist() == [5, -1, 4, -1]


@pytest.mark.parametrize("fixture,cc,kernels", [
    ("ncu/h800_flash_fwd_raw.C.csv", "9.0", 4),                 # H800, ncu 2023.3, raw page
    ("ncu/a100_bert_flashattn_details_ncu2021.csv", "8.0", 10),  # A100 (SM80), ncu 2021, details page
    ("ncu/rtx2080ti_two_kernels.ncu-rep", "7.5", 2),             # RTX 2080 Ti, read with ncu_report
])
def test_calculator_equals_ncus_theoretical_occupancy_on_real_kernels(fixture, cc, kernels):
    """ncu's ``sm__maximum_warps_per_active_cycle_pct`` of kernels profiled on
    real GPUs, from their block size, registers, shared memory and the
    carveout ncu recorded."""
    from pathlib import Path

    from headcount.parsers import ncu_csv, ncu_rep

    path = Path(__file__).parent / "fixtures" / fixture
    k = ncu_rep.read_report(path) if path.suffix == ".ncu-rep" else ncu_csv.read_csv(path)
    k = k.dropna(subset=["theoretical_occupancy_pct"])
    assert len(k) == kernels
    ours = kernel_occupancy(k, LIMITS[cc])
    assert np.allclose(ours.to_numpy(), k["theoretical_occupancy_pct"].to_numpy(dtype=float))
    assert k["theoretical_occupancy_pct"].nunique() >= (3 if kernels >= 10 else 1)
