"""Process and thread ids in the tables (issue 58): integers in every table that has them, so that a join with another
tool's integer pids works; a graph replay's calls on a lane of their own (``ranges.lane``), their thread the launching
one as the recording gives it; the API's DataFrames as the Parquet."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.types as pat
import pytest
from conftest import llama_model

from headcount import AttentionProfiler
from headcount.cli.main import main
from headcount.common import process_ids
from headcount.common.errors import HeadcountError
from headcount.reports.trace_export import export_traces

KINETO = Path(__file__).resolve().parent / "fixtures" / "kineto"
VLLM_GRAPH = KINETO / "mi300x_vllm_decode_full_graph_kineto.json.gz"  # a real MI300X vLLM decode, one graph launch
TABLES = ("kernels", "ranges", "steps", "runs")


@pytest.fixture(scope="module")
def graph_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ids") / "out"
    assert main(["parse", str(VLLM_GRAPH), "-o", str(out)]) == 0
    return out


def _launcher(path: Path) -> tuple[int, int]:
    """The thread that launched the trace's graph, from the raw events: the (pid, tid) of its graph launch call."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    launches = {(e["pid"], e["tid"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "GraphLaunch" in e.get("name", "")}
    assert len(launches) == 1
    return launches.pop()


def test_ids_are_integers_in_every_table(graph_report):
    for name in TABLES:
        schema = ds.dataset(graph_report / name, format="parquet").schema
        for column in ("pid", "tid"):
            if column in schema.names:
                assert pat.is_int64(schema.field(column).type), (name, column, schema.field(column).type)


def test_a_join_with_an_integer_pid_works(graph_report):
    """The question the issue could not ask: this process's kernels, by its integer pid, in DuckDB and pandas alike."""
    pid, _ = _launcher(VLLM_GRAPH)
    con = duckdb.connect()
    by_sql = con.execute(f"SELECT count(*) FROM read_parquet('{graph_report}/kernels/**/*.parquet') WHERE pid = ?", [pid]).fetchall()[0][0]
    kernels = pd.read_parquet(graph_report / "kernels", dtype_backend="numpy_nullable")
    assert by_sql > 0 and by_sql == int((kernels["pid"] == pid).sum())
    steps = pd.read_parquet(graph_report / "steps", dtype_backend="numpy_nullable")
    assert steps.merge(pd.DataFrame({"pid": [pid]}), on="pid").shape[0] == int((steps["pid"] == pid).sum()) > 0


def test_a_replays_calls_are_on_their_lane_of_the_launching_thread(graph_report):
    """Every range on the replay lane is the launching thread's (its pid and tid, from the raw trace); no tid carries
    a suffix any more; the other ranges have no lane."""
    pid, tid = _launcher(VLLM_GRAPH)
    ranges = pd.read_parquet(graph_report / "ranges", dtype_backend="numpy_nullable")
    lane = ranges[ranges["lane"].notna()]
    assert len(lane) == 48 and set(lane["lane"]) == {"graph replay"}
    assert set(zip(lane["pid"], lane["tid"])) == {(pid, tid)}
    assert set(ranges.loc[ranges["lane"].isna(), "level"]) and ranges["tid"].dtype == "Int64"


def test_an_exported_replay_lane_is_a_thread_of_its_own(graph_report, tmp_path):
    """In the exported timeline the lane's ranges sit on a thread named for the lane, not on the launching thread."""
    written, _ = export_traces(graph_report, tmp_path)
    events = json.loads(written[0].read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    pid, tid = _launcher(VLLM_GRAPH)
    lanes = [key for key, name in names.items() if name == f"thread {tid} (graph replay)"]
    assert len(lanes) == 1 and lanes[0] != (pid, tid)
    on_lane = [e for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) == lanes[0]]
    assert len(on_lane) == 48


def test_the_apis_dataframes_hold_the_ids_as_the_parquet(tmp_path):
    """``get_stats()`` on CPU: pid and tid are nullable integers, this process's pid among them; saved, the same."""
    import os

    import torch

    model = llama_model("sdpa")
    ids = torch.randint(0, 128, (1, 8))
    with AttentionProfiler(model) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    stats = prof.get_stats()
    for name in ("kernels", "ranges", "steps"):
        for column in ("pid", "tid"):
            if column in stats[name]:
                assert str(stats[name][column].dtype) == "Int64", (name, column)
    assert os.getpid() in set(stats["ranges"]["pid"].dropna())


def test_an_id_that_is_not_a_number_is_named():
    frame = pd.DataFrame({"pid": ["144", "GPU 0"], "tid": ["7 (graph replay)", "8"]})
    with pytest.raises(HeadcountError, match=r"table kernels: pid 'GPU 0' is not a whole number \(1 rows\)"):
        process_ids.as_integers(frame, "kernels")
    fine = process_ids.as_integers(frame.iloc[:1], "ranges")
    assert fine["pid"].tolist() == [144] and fine["tid"].tolist() == [7] and fine["lane"].tolist() == ["graph replay"]
