"""Nsight Compute: CSV (raw and details pages, any locale) and .ncu-rep
through ncu_report give the same kernels; bad files get one clear error."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nsight import nsight_bin

from headcount.common.errors import HeadcountError
from headcount.parsers.ncu_csv import read_csv
from headcount.parsers.ncu_rep import read_report

FIX = Path(__file__).parent / "fixtures" / "ncu"
REP = FIX / "rtx2080ti_two_kernels.ncu-rep"
RAW_C = FIX / "rtx2080ti_two_kernels.raw.C.csv"

EXACT = ["ncu_id", "name", "duration_ns", "registers_per_thread", "shared_memory_bytes", "grid", "block", "device",
         "stream", "dram_bytes", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "incomplete"]
PERCENT = ["achieved_occupancy_pct", "theoretical_occupancy_pct", "dram_throughput_pct", "tensor_pipe_pct", "sm_throughput_pct",
           "memory_throughput_pct"]


def _same(a: pd.DataFrame, b: pd.DataFrame, percent_tol: float = 0.0) -> None:
    pd.testing.assert_frame_equal(a[EXACT].reset_index(drop=True), b[EXACT].reset_index(drop=True), check_dtype=False)
    for col in PERCENT:
        x, y = a[col].astype("float64").to_numpy(), b[col].astype("float64").to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), col
        assert np.allclose(x[~np.isnan(x)], y[~np.isnan(y)], atol=percent_tol, rtol=0), col


def test_raw_csv_in_c_and_en_us_locales_are_identical():
    c = read_csv(RAW_C)
    en = read_csv(FIX / "rtx2080ti_two_kernels.raw.en_US.csv")
    pd.testing.assert_frame_equal(c, en)
    assert list(c["duration_ns"]) == [1_168_077_824, 993_024]
    assert list(c["grid"]) == ["(256000, 1, 1)"] * 2 and list(c["pid"]) == ["12541"] * 2


def test_german_numbers_mean_the_same(tmp_path):
    """de_DE swaps the separators ("1.168.077.824", "99,89"); this file is the
    C export with its numbers rewritten that way (no de_DE export exists yet)."""
    rows = list(csv.reader(RAW_C.open()))

    def german(cell):
        try:
            value = float(cell)
        except ValueError:
            return cell
        text = f"{value:,.2f}" if not value.is_integer() else f"{int(value):,}"
        return text.replace(",", "X").replace(".", ",").replace("X", ".")

    rows = rows[:2] + [[german(c) if i > 10 else c for i, c in enumerate(r)] for r in rows[2:]]
    path = tmp_path / "de.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL).writerows(rows)
    assert "1.168.077.824" in path.read_text()
    pd.testing.assert_frame_equal(read_csv(path), read_csv(RAW_C))
    pd.testing.assert_frame_equal(read_csv(path, locale="de_DE"), read_csv(RAW_C))


def test_details_page_agrees_with_raw_page_to_its_printed_precision():
    details = read_csv(FIX / "rtx2080ti_two_kernels.details.C.csv")
    raw = read_csv(RAW_C)
    # the details page prints durations with three significant digits ("1.17 second")
    assert np.allclose(details["duration_ns"].astype(float), raw["duration_ns"].astype(float), rtol=5e-3)
    assert list(details["achieved_occupancy_pct"]) == list(raw["achieved_occupancy_pct"])
    assert list(details["registers_per_thread"]) == list(raw["registers_per_thread"])


def test_ncu_report_path_equals_csv_path():
    rep = read_report(REP)
    raw = read_csv(RAW_C)
    assert rep["pid"].isna().all()  # ncu_report exposes no process id
    _same(rep, raw, percent_tol=0.005)  # the CSV prints percentages with two decimals


@pytest.mark.parametrize("lang", ["C", "en_US.UTF-8"])
def test_live_ncu_import_csv_equals_ncu_report(tmp_path, lang):
    ncu = nsight_bin("ncu")
    env = {**os.environ, "LC_ALL": lang}
    out = subprocess.run([ncu, "--import", str(REP), "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    path = tmp_path / f"raw.{lang}.csv"
    path.write_text(out.stdout)
    _same(read_csv(path), read_report(REP), percent_tol=0.005)


def test_incomplete_results_stay_null_not_zero():
    h800 = read_csv(FIX / "h800_flash_fwd_raw.C.csv")
    flash = h800[h800["name"].str.contains("flash_fwd_kernel")].iloc[0]
    assert flash["incomplete"] and pd.isna(flash["duration_ns"]) and pd.isna(flash["dram_bytes"])
    others = h800[~h800["name"].str.contains("flash_fwd_kernel")]
    assert not others["incomplete"].any() and (others["duration_ns"] > 0).all()
    assert list(others["dram_read_bytes"]) == [8448, 8448, 11008, 40192]


def test_ncu_2021_details_page():
    old = read_csv(FIX / "a100_bert_flashattn_details_ncu2021.csv")
    assert len(old) == 10 and old["name"].str.contains("fmha_fwd_loop_kernel").sum() == 1
    # only LaunchStats and Occupancy were collected: no duration, and the row says so
    assert old["duration_ns"].isna().all() and (old["missing_metrics"] == "gpu__time_duration.sum").all()
    assert not old["incomplete"].any()
    fmha = old[old["name"].str.contains("fmha")].iloc[0]
    assert fmha["registers_per_thread"] == 125 and fmha["shared_memory_bytes"] == 10752


def test_warning_lines_are_skipped(tmp_path):
    lines = RAW_C.read_text().splitlines()
    mixed = ["==PROF== Connected to process 1", lines[0], "==WARNING== something", *lines[1:], "==PROF== Disconnected"]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(mixed) + "\n")
    pd.testing.assert_frame_equal(read_csv(path), read_csv(RAW_C))


@pytest.mark.parametrize("content, message", [
    ("", "empty file"),
    ('"a","b"\n"1","2"\n', "not an ncu CSV"),
    (RAW_C.read_text()[: len(RAW_C.read_text()) - 900], "truncated ncu CSV: it ends inside row 4, in a quoted field"),
    ("\x00\x01binary", "binary data"),
])
def test_bad_csv(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(HeadcountError, match=message) as info:
        read_csv(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"not a report", b"NVR\x00" + b"\x00" * 64, REP.read_bytes()[:2000]])
def test_bad_report(tmp_path, content):
    path = tmp_path / "bad.ncu-rep"
    path.write_bytes(content)
    with pytest.raises(HeadcountError, match="not a readable Nsight Compute report|holds no profiled kernel|"
                                             r"damaged or truncated \.ncu-rep \(the file ends at byte 2,000, inside block 2, "
                                             r"which runs to byte [\d,]+\): no kernel record whole before the cut") as info:
        read_report(path)
    assert str(path) in str(info.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_csv_gives_a_table_or_a_clear_error(tmp_path, data):
    text = RAW_C.read_text()
    cut = data.draw(st.integers(0, len(text)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, max(cut - 1, 0)), st.sampled_from(list('",\n x9.-'))), max_size=5))
    chars = list(text[:cut])
    for pos, ch in flips:
        if pos < len(chars):
            chars[pos] = ch
    path = tmp_path / "m.csv"
    path.write_text("".join(chars))
    try:
        frame = read_csv(path)
    except HeadcountError as exc:
        assert str(path) in str(exc)
    else:
        assert set(EXACT) <= set(frame.columns) and len(frame) >= 1


def test_parse_cli_writes_ncu_kernels(tmp_path, capsys):
    from headcount.cli.main import main

    out = tmp_path / "r"
    assert main(["parse", str(FIX / "h800_flash_fwd_raw.C.csv"), str(REP), "-o", str(out)]) == 0
    assert "5 kernels, 1 incomplete" in capsys.readouterr().err
    kernels = pd.read_parquet(out / "kernels")
    assert len(kernels) == 7 and set(kernels["source"]) == {"ncu"}
    flash = kernels[kernels["name"].str.contains("flash_fwd_kernel")].iloc[0]
    assert flash["incomplete"] and pd.isna(flash["duration_ns"])
    assert set(pd.read_parquet(out / "runs")["source"]) == {"ncu"}


def test_layers_from_ncu_kernels_under_headcount_ranges():
    """ncu NVTX stacks as ncu_report gives them ("domain@a/b;…"), put on the
    real kernels of the RTX fixture: the layer gets their summed time and
    measured bytes. (No ncu recording with headcount's ranges exists yet.)"""
    from headcount.build.ncu import tables_from_ncu

    kernels = read_csv(FIX / "h800_flash_fwd_raw.C.csv")
    kernels["nvtx_path"] = ["headcount@fwd/layer.0/head.0;NVTX@step", "headcount@fwd/layer.0/head.1",
                            "headcount@fwd/layer.1", "other@x", "headcount@bwd/layer.1"]
    tables = tables_from_ncu(kernels, "r").tables
    layers = tables["layers"].set_index(["phase", "layer_name"])
    l0 = layers.loc[("fwd", "layer.0")]
    assert l0["op_count"] == 2 and l0["duration_ns"] == 16448 + 3232
    assert l0["dram_bytes"] == 8448 * 2 and l0["dram_bytes_provenance"] == "measured"
    assert l0["duration_basis"] == "gpu_kernel_sum"
    assert np.isclose(l0["achieved_occupancy_pct"], (57.72 * 16448 + 12.45 * 3232) / (16448 + 3232))
    assert np.isclose(l0["bandwidth_gbps"], 8448 * 2 / (16448 + 3232))
    bwd = layers.loc[("bwd", "layer.1")]
    assert pd.isna(bwd["duration_ns"]) and bool(bwd["incomplete"])  # the nan kernel: null, never 0
    heads = tables["heads"]
    assert sorted(heads["head"]) == [0, 1]
    # head mode under ncu: each head's own kernels, exact bytes per head (issue 47's reference for sampled figures)
    assert (heads["dram_bytes_provenance"] == "measured").all() and heads["dram_bytes"].tolist() == [8448, 8448]
    assert heads["dram_bytes"].sum() == l0["dram_bytes"]


def test_bom_odd_values_and_repeated_ids_are_handled_and_said(tmp_path, capsys):
    """A byte-order mark is no part of the header; an occupancy above 100 %, a
    negative duration and a repeated kernel row are dropped, said in a notice
    and the kernel marked incomplete."""
    import csv as csv_module

    from headcount.cli.main import main

    rows = list(csv_module.reader((FIX / "rtx2080ti_two_kernels.raw.C.csv").read_text().splitlines()))
    header = rows[0]
    occupancy = header.index("sm__warps_active.avg.pct_of_peak_sustained_active")
    duration = header.index("gpu__time_duration.sum")
    rows[2][occupancy], rows[3][duration] = "250", "-5"
    rows.append(rows[3])
    path = tmp_path / "bom.csv"
    with path.open("w", encoding="utf-8-sig", newline="") as fh:  # writes the BOM
        csv_module.writer(fh, quoting=csv_module.QUOTE_ALL).writerows(rows)
    assert main(["parse", str(path), "-o", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "1 achieved_occupancy_pct outside [0, 100] %" in err and "1 duration_ns negative" in err
    assert "1 rows repeating a kernel ID dropped" in err
    kernels = pd.read_parquet(tmp_path / "r" / "kernels")
    assert len(kernels) == 2 and kernels["incomplete"].tolist() == [True, True]
    assert kernels["achieved_occupancy_pct"].isna().iloc[0] and kernels["duration_ns"].isna().iloc[1]


def test_a_unit_headcount_does_not_know_is_never_guessed(tmp_path, capsys):
    import csv as csv_module

    from headcount.cli.main import main

    rows = list(csv_module.reader((FIX / "rtx2080ti_two_kernels.raw.C.csv").read_text().splitlines()))
    rows[1][rows[0].index("gpu__time_duration.sum")] = "furlong"
    path = tmp_path / "units.csv"
    with path.open("w", newline="") as fh:
        csv_module.writer(fh, quoting=csv_module.QUOTE_ALL).writerows(rows)
    assert main(["parse", str(path), "-o", str(tmp_path / "r")]) == 0
    assert "2 duration_ns in 'furlong'" in capsys.readouterr().err
    kernels = pd.read_parquet(tmp_path / "r" / "kernels")
    assert kernels["duration_ns"].isna().all() and kernels["incomplete"].all()


def test_the_speed_of_light_counters_are_read_and_ncus_own_rule_gives_each_kernel_its_verdict(tmp_path):
    """The report names DRAM throughput only as ``gpu__dram_throughput…``: it is read (not left empty), with the SM
    and memory throughputs and the waves; each kernel's verdict is Nsight Compute's Speed of Light rule on them."""
    from headcount.cli.main import main

    out = tmp_path / "r"
    assert main(["parse", str(REP), "-o", str(out)]) == 0
    k = pd.read_parquet(out / "kernels").set_index("name")
    a, c = k.loc["kernel_A(double *, int, int)"], k.loc["kernel_C(double *, const double *, int)"]
    assert a["dram_throughput_pct"] == pytest.approx(0.0344, abs=1e-4) and c["dram_throughput_pct"] == pytest.approx(40.22, abs=0.01)
    assert a["sm_throughput_pct"] == pytest.approx(80.30, abs=0.01) and a["memory_throughput_pct"] == pytest.approx(9.449, abs=1e-3)
    assert a["bound"] == "compute-bound"  # SM ≥ 80 %: ncu's "High Throughput"
    assert c["bound"] == "latency-bound"  # SM and memory ≈ 40 %, 235 waves: ncu's "Latency Issue"
    _same(read_report(REP), read_csv(RAW_C), percent_tol=0.01)  # both readers read the new counters alike
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    top = page[page.index("Top kernels by time"):]
    assert "SM throughput %" in top and "compute-bound" in top and "latency-bound" in top


@pytest.mark.parametrize("sm, memory, waves, verdict", [
    (85.0, 20.0, 3.0, "compute-bound"), (20.0, 92.0, 3.0, "memory-bound"), (70.0, 55.0, 3.0, "compute-bound"),
    (62.0, 65.0, 3.0, "balanced"), (30.0, 40.0, 3.0, "latency-bound"), (30.0, 40.0, 0.5, "under-filled"),
    (float("nan"), 40.0, 3.0, None), (30.0, 40.0, float("nan"), "latency-bound")])
def test_the_verdict_follows_ncus_thresholds(sm, memory, waves, verdict):
    from headcount.derive.bound import kernel_bound

    got = kernel_bound(pd.DataFrame({"sm_throughput_pct": [sm], "memory_throughput_pct": [memory], "waves_per_sm": [waves]}))
    assert got.iloc[0] == verdict


def test_kernels_say_where_each_row_ran_and_the_help_example_ranks_gpu_work(tmp_path, capsys):
    """A torch.profiler trace's kernels table holds its CPU operators beside the GPU kernels: ``runs_on`` says
    which, and the query ``headcount query --help`` shows ranks only GPU work."""
    from headcount.cli.main import main

    kineto = Path(__file__).parent / "fixtures" / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"
    out = tmp_path / "r"
    assert main(["parse", str(REP), str(kineto), "-o", str(out), "--jobs", "1"]) == 0
    k = pd.read_parquet(out / "kernels", columns=["kind", "runs_on", "source"])
    assert set(k["runs_on"]) == {"gpu", "cpu"}
    assert (k.loc[k["kind"] == "op", "runs_on"] == "cpu").all() and (k.loc[k["kind"] != "op", "runs_on"] == "gpu").all()
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    example = next(line for line in capsys.readouterr().out.splitlines() if "FROM kernels" in line)
    query = example.split('"')[1]
    assert "runs_on = 'gpu'" in query
    capsys.readouterr()
    assert main(["query", str(out), query]) == 0
    assert "aten::" not in capsys.readouterr().out


def _without_the_wheel(tmp_path, env):
    """``env`` in which ``import ncu_report`` fails in every process, as on a machine with only Nsight Compute."""
    shadow = tmp_path / "shadow" / "ncu_report"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("no ncu-report wheel here")\n')
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent), env.get("PYTHONPATH")]))}


def test_nsight_computes_own_ncu_report_is_found(tmp_path, monkeypatch):
    """Without the ncu-report wheel, headcount looks for the ncu_report.py that Nsight Compute ships in
    extras/python: beside the ncu that $HEADCOUNT_NCU names, or two folders above the binary it runs (the
    installer's layout). Whether that module then reads a report depends on its release; not checked here."""
    from headcount.parsers.ncu_rep import nsight_python_dirs

    install = tmp_path / "nsight-compute" / "2025.3.1"
    binary = install / "target" / "linux-desktop-glibc_2_11_3-x64" / "ncu"
    binary.parent.mkdir(parents=True)
    (install / "extras" / "python").mkdir(parents=True)
    (install / "extras" / "python" / "ncu_report.py").write_text("")
    binary.write_text("")
    (install / "ncu").write_text("")
    for ncu in (install / "ncu", binary):
        monkeypatch.setenv("HEADCOUNT_NCU", str(ncu))
        assert nsight_python_dirs()[0] == install / "extras" / "python"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ncu").symlink_to(install / "ncu")  # a link on PATH to the installer's script
    monkeypatch.setenv("HEADCOUNT_NCU", str(tmp_path / "bin" / "ncu"))
    assert nsight_python_dirs()[0] == install / "extras" / "python"


def test_no_ncu_report_anywhere_is_one_line_with_the_ways_out(tmp_path):
    import sys

    env = _without_the_wheel(tmp_path, {**os.environ, "HEADCOUNT_NCU": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"})
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(REP), "-o", str(tmp_path / "r")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "pip install ncu-report" in done.stderr and "HEADCOUNT_NCU" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_ncu_replay_cost_is_read_from_its_log():
    """What ncu's exact counters cost (issue 47, item 3), from the real log of the H100 run: 5 kernels of
    layer 0, each replayed in 10 passes; said in one line with the program's time under ncu."""

    from headcount.wrap.nvidia_tools import ncu_cost_notice, ncu_passes

    log = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05" / "interrupt-ncu" / "ncu.log"
    cost = ncu_passes(log.read_text().splitlines())
    assert cost == {"kernels": 5, "passes": 50, "passes_per_kernel": 10}
    assert ncu_cost_notice(cost, 12.5) == ("ncu measured 5 kernels by replaying each 10 times (median; 50 passes in all; the "
                                           "program ran 12.5 s under ncu): exact DRAM bytes per kernel, layer and head, at that cost")
    assert ncu_passes(["==PROF== Connected to process 1"]) == {"kernels": 0, "passes": 0, "passes_per_kernel": None}
    assert ncu_cost_notice(ncu_passes([]), None) is None
