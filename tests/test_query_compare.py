"""``headcount query`` (DuckDB views over a report) and ``headcount compare``."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from headcount.cli.main import main as cli_main
from headcount.common.errors import HeadcountError
from headcount.reports import html as html_report
from headcount.reports.compare import comparison
from headcount.store.query import run_query


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports")
    a, b = base / "a", base / "b"
    assert cli_main(["profile", "--steps", "2", "--seq", "32", "--batch", "2", "-o", str(a)]) == 0
    assert cli_main(["profile", "--steps", "1", "--seq", "32", "--batch", "4", "--impl", "sdpa", "-o", str(b)]) == 0
    return a, b


def test_query_sees_every_table_and_run(reports, capsys, tmp_path):
    a, _ = reports
    t = run_query(a, "SELECT implementation, count(*) AS n, sum(calls) AS calls FROM layers GROUP BY ALL ORDER BY ALL").to_pandas()
    assert t["implementation"].tolist() == ["eager", "sdpa"] and t["n"].tolist() == [8, 8] and t["calls"].tolist() == [16, 16]
    joined = run_query(a, "SELECT DISTINCT r.source FROM layers l JOIN runs r USING (run_id, implementation)").to_pandas()
    assert joined["source"].tolist() == ["torch"]
    assert cli_main(["query", str(a), "SELECT layer, max(excess_traffic) FROM heads GROUP BY layer", "--csv", str(tmp_path / "x.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "x.csv")) == 4
    assert cli_main(["query", str(a), "SELECT * FROM kernels LIMIT 3", "--parquet", str(tmp_path / "k.parquet")]) == 0
    assert len(pd.read_parquet(tmp_path / "k.parquet")) == 3
    capsys.readouterr()
    assert cli_main(["query", str(a), "SELECT implementation, phase FROM layers LIMIT 2"]) == 0
    assert "implementation" in capsys.readouterr().out


def test_query_errors_are_one_line(reports, tmp_path, capsys):
    a, _ = reports
    with pytest.raises(HeadcountError, match="query failed: .*nope"):
        run_query(a, "SELECT nope FROM layers")
    with pytest.raises(HeadcountError, match="not a headcount report"):
        run_query(tmp_path, "SELECT 1")
    assert cli_main(["query", str(a), "SELEC"]) == 2
    assert capsys.readouterr().err.startswith("headcount: error: query failed")


def test_compare_within_and_across_reports(reports, capsys):
    a, b = reports
    layers = run_query(a, "SELECT * FROM layers").to_pandas()
    runs = run_query(a, "SELECT * FROM runs").to_pandas()
    table, notes = comparison(layers, runs)
    assert table["implementation"].tolist() == ["eager", "sdpa"] and not notes
    eager, sdpa = table.iloc[0], table.iloc[1]
    assert eager["speedup"] == 1.0 and sdpa["speedup"] == pytest.approx(eager["attention_ms_per_step"] / sdpa["attention_ms_per_step"])
    assert eager["calls_per_step"] == 8 and eager["dram_bytes_provenance"] == "analytic"
    # per step: the run had 2 steps
    assert eager["attention_ms_per_step"] == pytest.approx(layers[layers["implementation"] == "eager"]["duration_ns"].sum() / 2 / 1e6)
    assert cli_main(["compare", str(a), str(b), "--baseline", "sdpa"]) == 0
    out = capsys.readouterr().out
    assert "Attention implementations" in out and "differ in batch size (2, 4)" in out.replace("\n", " ")


# ---------------------------------------------------------------- runs are never mixed (issue 10 §2)
@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A Llama eager+sdpa run, a bert-tiny sdpa run appended, then a second
    Llama run with sdpa only (comparable to the first: same config, shapes, dtype, mode)."""
    out = tmp_path_factory.mktemp("mixed") / "r"
    common = ["--steps", "3", "--seq", "32", "--batch", "2", "--device", "cpu", "-o", str(out)]
    assert cli_main(["profile", *common]) == 0
    assert cli_main(["profile", "--model", "bert-tiny", "--impl", "sdpa", "--append", *common]) == 0
    assert cli_main(["profile", "--impl", "sdpa", "--append", *common]) == 0
    assert cli_main(["profile", "--impl", "sdpa", "--mode", "head", "--append", *common]) == 0
    runs = pd.read_parquet(out / "runs")
    return out, runs


def test_compare_takes_speed_ups_only_within_a_run_or_from_a_comparable_one(mixed, tmp_path, capsys):
    out, runs = mixed
    assert cli_main(["compare", str(out), "--csv", str(tmp_path / "c.csv")]) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    table = pd.read_csv(tmp_path / "c.csv")
    model = dict(zip(runs["run_id"], runs["model"]))
    mode = runs.drop_duplicates("run_id").set_index("run_id")["mode"]
    table["model"] = table["run_id"].map(model)
    llama = runs[runs["model"].str.startswith("default") & (runs["implementation"] == "eager")]["run_id"].iloc[0]
    bert = table[table["model"].str.startswith("bert-tiny")]
    assert len(bert) == 1 and bert["speedup"].isna().all() and bert["baseline_run"].isna().all()
    own = table[table["run_id"] == llama].set_index("implementation")
    assert own.loc["eager", "speedup"] == 1.0
    assert own.loc["sdpa", "speedup"] == pytest.approx(own.loc["eager", "attention_ms_per_step"] / own.loc["sdpa", "attention_ms_per_step"])
    # the second Llama run (sdpa only, layer mode) is compared with the first run's eager, and says so
    second = table[(table["run_id"] != llama) & table["model"].str.startswith("default") & (table["run_id"].map(mode) == "layer")]
    assert len(second) == 1 and second["baseline_run"].iloc[0] == llama
    assert second["speedup"].iloc[0] == pytest.approx(own.loc["eager", "attention_ms_per_step"] / second["attention_ms_per_step"].iloc[0])
    assert f"its sdpa speed-up is against run {llama}" in printed
    # head mode is another workload: never compared with layer mode's eager
    head = table[table["run_id"].map(mode) == "head"]
    assert len(head) == 1 and head["speedup"].isna().all()


def test_console_and_page_keep_runs_apart(mixed, capsys):
    out, runs = mixed
    assert cli_main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    for run_id in runs["run_id"].unique():
        assert f"Run {run_id}" in printed
    # calls per step within one run: the 2-layer bert-tiny shows 2 per phase, never the sum over runs
    bert_part = printed.split("bert-tiny")[1].split("Top 5")[0]
    rows = [line for line in bert_part.splitlines() if " sdpa " in line and (" fwd " in line or " bwd " in line)]
    assert rows and all(cells.split("│")[4].strip() == "2" for cells in rows)

    page = (out / "report.html").read_text()
    headings = [h for h in page.split("<h2>")[1:] if h.startswith("Run ")]
    assert len(headings) == runs["run_id"].nunique()
    assert sum("bert-tiny" in h.split("</h2>")[0] for h in headings) == 1
    assert sum("default (Llama" in h.split("</h2>")[0] for h in headings) == 3
    # every heatmap cell is one row of one run: its value is that row's median per call, never a sum over runs
    heads = pd.read_parquet(out / "heads")
    for section in headings:
        run_id = section.split(":")[0].removeprefix("Run ").strip()
        mine = heads[heads["run_id"] == run_id]
        grids = re.findall(r"<h3>Layer × head: (\w+), (\w+)</h3>(.*?)</div>", section)
        assert grids
        for impl, phase, svg in grids:
            cells = mine[(mine["implementation"] == impl) & (mine["phase"] == phase)]
            titles = re.findall(r"<title>(\S+?)(?: head (\d+)|, every head): ([\d,.]+) µs per call \(time [a-z/]+\)</title>", svg)
            every_head = all(head == "" for _, head, _ in titles)  # layer mode: apportioned, one column per layer
            assert len(titles) == (cells["layer_name"].nunique() if every_head else len(cells))
            for layer, head, value in titles:
                mine_cells = cells[(cells["layer_name"] == layer) & ((cells["head"] == int(head)) if head else True)]
                for row in mine_cells.itertuples():
                    assert value == html_report.exact(row.duration_per_call_p50_ns * 1e-3)


def test_step_profiler_runs_are_summarised_one_by_one(tmp_path, capsys):
    """Three profiled steps are three runs: the summary shows 2 calls per step for a 2-layer model, not 6."""
    import torch
    from conftest import llama_model

    from headcount.training import StepProfiler

    model = llama_model("sdpa")
    ids = torch.randint(0, 128, (2, 16))
    sp = StepProfiler(model, tmp_path / "out", every=1, queue=3)  # room for every window: none skipped, however slow
    for step in range(3):
        with sp.step(step):
            model(input_ids=ids, labels=ids).loss.backward()
    sp.close()
    capsys.readouterr()
    assert cli_main(["report", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("│ sdpa") and "│ fwd " in line and line.count("│") == 9]
    assert len(rows) == 3 and all(line.split("│")[4].strip() == "2" for line in rows)


def test_tables_come_as_json_too(reports, capsys, tmp_path):
    import json

    a, b = reports
    capsys.readouterr()
    assert cli_main(["query", str(a), "SELECT implementation, sum(calls) AS calls FROM layers GROUP BY ALL ORDER BY ALL", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"implementation": "eager", "calls": 16}, {"implementation": "sdpa", "calls": 16}]
    assert cli_main(["compare", str(a), str(b), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    table, notes = comparison(pd.concat([run_query(r, "SELECT * FROM layers").to_pandas() for r in (a, b)]),
                              pd.concat([run_query(r, "SELECT * FROM runs").to_pandas() for r in (a, b)]))
    assert [r["implementation"] for r in doc["rows"]] == table["implementation"].tolist() and doc["notes"] == notes
    assert [r["speedup"] for r in doc["rows"]] == [None if pd.isna(v) else pytest.approx(v) for v in table["speedup"]]
    assert cli_main(["compare", str(a), "--json", str(tmp_path / "c.json")]) == 0
    assert len(json.loads((tmp_path / "c.json").read_text())["rows"]) == 2
