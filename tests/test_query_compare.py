"""``headcount query`` (DuckDB views over a report) and ``headcount compare``."""

from __future__ import annotations

import pandas as pd
import pytest

from headcount.cli.main import main as cli_main
from headcount.errors import HeadcountError
from headcount.reports.compare import comparison
from headcount.reports.query import run_query


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
