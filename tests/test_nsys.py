"""The real nsys (2023.4.4, CPU-only recording) sees headcount's NVTX ranges.

Records ``tests/workloads/tagged_llama.py`` (tiny Llama, head mode, 2 steps of
forward + backward) with ``nsys profile --trace=nvtx``, exports SQLite and
checks the ranges against what the naming scheme promises (docs/architecture.md §2).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from nsight import nsight_bin

WORKLOAD = Path(__file__).parent / "workloads" / "tagged_llama.py"
STEPS, LAYERS, HEADS = 2, 2, 4


@pytest.fixture(scope="module")
def nsys_rep_path(tmp_path_factory):
    nsys = nsight_bin("nsys")
    tmp = tmp_path_factory.mktemp("nsys")
    rep = tmp / "tagged"
    subprocess.run([nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(rep), "--force-overwrite", "true",
                    sys.executable, str(WORKLOAD), str(STEPS)], check=True, capture_output=True, timeout=300)
    return Path(str(rep) + ".nsys-rep")


@pytest.fixture(scope="module")
def nsys_sqlite_path(nsys_rep_path):
    nsys = nsight_bin("nsys")
    sqlite_path = nsys_rep_path.with_suffix(".sqlite")
    subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(sqlite_path), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    return sqlite_path


@pytest.fixture(scope="module")
def nsys_ranges(nsys_sqlite_path):
    con = sqlite3.connect(nsys_sqlite_path)
    domains = {d: name for d, name in con.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = 75")}
    rows = con.execute(
        "SELECT e.start, e.end, e.globalTid, e.domainId, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
        "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 ORDER BY e.globalTid, e.start, e.end DESC"
    ).fetchall()
    return [(start, end, tid, domains.get(dom), name) for start, end, tid, dom, name in rows]


def _paths(ranges, domain):
    """Nesting by containment on each thread, from the raw nsys rows."""
    out = []
    stack = []
    for start, end, tid, dom, name in ranges:
        if dom != domain:
            continue
        while stack and (stack[-1][2] != tid or end > stack[-1][1]):
            stack.pop()
        path = (stack[-1][3] + "/" if stack else "") + name
        stack.append((start, end, tid, path))
        out.append((path, start, end, tid))
    return out


def test_domain_and_names(nsys_ranges):
    domains = {dom for *_, dom, _ in nsys_ranges}
    assert {"headcount", "headcount.step"} <= domains
    names = {name for *_, dom, name in nsys_ranges if dom == "headcount"}
    assert names == {"fwd", "bwd", "layer.0", "layer.1", *(f"head.{h}" for h in range(HEADS))}
    assert not any("/" in n or ":" in n for n in names)


def test_one_range_per_layer_head_phase_step(nsys_ranges):
    counts = Counter(path for path, *_ in _paths(nsys_ranges, "headcount"))
    for phase in ("fwd", "bwd"):
        assert counts[phase] == STEPS * LAYERS
        for layer in range(LAYERS):
            assert counts[f"{phase}/layer.{layer}"] == STEPS
            for head in range(HEADS):
                assert counts[f"{phase}/layer.{layer}/head.{head}"] == STEPS
    assert sum(counts.values()) == STEPS * 2 * LAYERS * (2 + HEADS)  # nothing else, no stray nesting


def test_backward_ranges_follow_forward_in_each_step(nsys_ranges):
    steps = sorted((s, e) for s, e, _, dom, name in nsys_ranges if dom == "headcount.step")
    assert len(steps) == STEPS
    paths = _paths(nsys_ranges, "headcount")
    for step_start, step_end in steps:
        inside = [(p, s) for p, s, e, _ in paths if step_start <= s and e <= step_end]
        fwd = [s for p, s in inside if p == "fwd"]
        bwd = [s for p, s in inside if p == "bwd"]
        assert len(fwd) == LAYERS and len(bwd) == LAYERS
        assert max(fwd) < min(bwd)
        # backward visits layers in reverse order
        bwd_layers = [p for p, s in sorted(inside, key=lambda x: x[1]) if p.startswith("bwd/") and p.count("/") == 1]
        assert bwd_layers == [f"bwd/layer.{i}" for i in reversed(range(LAYERS))]


def test_cpu_only_capture_parses_into_ranges(nsys_sqlite_path):
    """An export with NVTX ranges but no CUDA activity: a ranges table, no GPU work."""
    from headcount.build.nsys import tables_from_nsys
    from headcount.parsers.nsys_sqlite import read_export

    export = read_export(nsys_sqlite_path)
    assert export.gpu.empty
    tables = tables_from_nsys(export, "cpu-run").tables
    ranges = tables["ranges"]
    ours = ranges[ranges["domain"] == "headcount"]
    assert set(ours["level"]) == {"phase", "layer", "head"}
    assert (ours["gpu_op_count"] == 0).all() and tables["kernels"].empty
    assert set(ours.loc[ours.level == "head", "step"]) == {0, 1}


def test_parse_nsys_rep_with_the_nsys_on_path(nsys_rep_path, tmp_path, monkeypatch, capsys):
    import pandas as pd

    from headcount.cli.main import main

    monkeypatch.setenv("HEADCOUNT_NSYS", nsight_bin("nsys"))
    out = tmp_path / "r"
    assert main(["parse", str(nsys_rep_path), "-o", str(out)]) == 0
    ranges = pd.read_parquet(out / "ranges")
    # all domains of a thread nest together, as in nsys: the step range leads the path
    assert (ranges["path"] == "step.0/bwd/layer.1/head.3").sum() == 1
    assert (ranges["path"].str.endswith("bwd/layer.1/head.3")).sum() == STEPS
    assert "no GPU operation was launched" in capsys.readouterr().err

    monkeypatch.setenv("HEADCOUNT_NSYS", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere
    assert main(["parse", str(nsys_rep_path), "-o", str(tmp_path / "r2")]) == 3  # a missing tool: exit 3, as for headcount run
    assert "no nsys on PATH" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def test_damaged_nsys_rep(tmp_path, monkeypatch, capsys):
    from headcount.cli.main import main

    monkeypatch.setenv("HEADCOUNT_NSYS", nsight_bin("nsys"))
    bad = tmp_path / "bad.nsys-rep"
    bad.write_bytes(b"\x00" * 4096)
    assert main(["parse", str(bad), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: nsys could not open it as a report: damaged, truncated or not an .nsys-rep (nsys said: " in err
    assert len(err.strip().splitlines()) == 1 and "Dynamic exception type" not in err  # the explanation first, nsys boiled down
    assert not (tmp_path / "r").exists()


def test_real_parquetdir_export_equals_sqlite_export(nsys_rep_path, nsys_sqlite_path, tmp_path):
    from headcount.parsers.nsys_sqlite import read_export

    nsys = nsight_bin("nsys")
    pqdir = tmp_path / "pq"
    subprocess.run([nsys, "export", "--type", "parquetdir", "-o", str(pqdir), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    import pandas as pd

    a, b = read_export(pqdir).ranges, read_export(nsys_sqlite_path).ranges
    assert len(a) == STEPS * 2 * LAYERS * (2 + HEADS) + STEPS  # headcount ranges + step ranges
    pd.testing.assert_frame_equal(a, b, check_dtype=False)  # range ids included: rowid = row position


@pytest.mark.parametrize("per_process_reads", [False, True])
def test_parquetdir_split_across_workers_equals_the_sqlite_parse(nsys_rep_path, nsys_sqlite_path, tmp_path, monkeypatch,
                                                                  per_process_reads):
    """The shard and per-process SQL filters also hold on DuckDB's view of a
    real parquetdir export (unsigned ids there): same tables as the SQLite export parsed whole."""
    import pandas as pd
    import pyarrow.dataset as ds

    from headcount.build import batch
    from headcount.cli.main import main
    from headcount.parsers import nsys_sqlite

    nsys = nsight_bin("nsys")
    pqdir = tmp_path / "pq"
    subprocess.run([nsys, "export", "--type", "parquetdir", "-o", str(pqdir), "--force-overwrite", "true", str(nsys_rep_path)],
                   check=True, capture_output=True, timeout=300)
    whole = tmp_path / "whole"
    assert main(["parse", str(nsys_sqlite_path), "-o", str(whole), "--jobs", "1"]) == 0
    monkeypatch.setattr(batch, "SHARD_ROWS", 1)
    if per_process_reads:
        monkeypatch.setattr(nsys_sqlite, "STREAM_ROWS", 0)
    split = tmp_path / "split"
    assert main(["parse", str(pqdir), "-o", str(split), "--jobs", "2"]) == 0
    assert list((split / "ranges").glob("*/part-s*.parquet"))  # it was split (one process: one shard holds it)
    for name in ("ranges", "kernels", "layers", "heads"):
        a = ds.dataset(whole / name, partitioning="hive").to_table().to_pandas().drop(columns=["run_id"])
        b = ds.dataset(split / name, partitioning="hive").to_table().to_pandas().drop(columns=["run_id"])
        keys = [c for c in ("range_id", "correlation_id", "phase", "layer", "head") if c in a.columns]
        a, b = (f.sort_values(keys).reset_index(drop=True) for f in (a, b))
        assert len(a) > 0 or name != "ranges"  # a CPU-only capture: ranges, no GPU work
        pd.testing.assert_frame_equal(a, b, check_dtype=False)


def _graphed_export(nsys_sqlite_path, path, replays: int = 2, after_the_run: bool = False):
    """Stands in for an export of ``nsys profile --trace=cuda,nvtx
    --cuda-graph-trace=node`` of a CUDA-graphed model (no GPU here): the real
    export of the tagged CPU run above, with the CUDA rows nsys would add.
    The forward of step 0 is the capture: inside each of its head ranges one
    graph node is made (``CUDA_GRAPH_NODE_EVENTS``, the schema nsys's own
    recipes read), one more is made outside every attention range, and each
    is cloned into the executable graph. In step 1, before its forward, the
    graph is launched ``replays`` times (one ``cudaGraphLaunch`` each), every
    clone's kernel carrying the launch's correlation id and its
    ``graphNodeId``; ``after_the_run``: the launches follow the recorded run
    instead (room for any number of them, outside every step). Kernel and
    runtime tables use the schema of nsys 2026.2 (copied from the H100 fixture).

    Returns:
        ``(captured, outside_node)``: the captured head ranges (headcount's
        ranges table rows) and the node made outside them.
    """
    import shutil

    from headcount.build.nsys import tables_from_nsys
    from headcount.parsers.nsys_sqlite import read_export

    shutil.copy(nsys_sqlite_path, path)
    ranges = tables_from_nsys(read_export(path), "plain").tables["ranges"]
    ours = ranges[ranges["domain"] == "headcount"]
    captured = ours[(ours["level"] == "head") & (ours["phase"] == "fwd") & (ours["step"] == 0)].sort_values("start_ns")
    pid, tid = int(captured["pid"].iloc[0]), int(captured["tid"].iloc[0])
    gtid = (pid << 24) | tid
    fixture = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
    with sqlite3.connect(fixture) as ref:
        create = [sql for (sql,) in ref.execute("SELECT sql FROM sqlite_master WHERE name IN "
                                                "('CUPTI_ACTIVITY_KIND_KERNEL', 'CUPTI_ACTIVITY_KIND_RUNTIME')")]
    con = sqlite3.connect(path)
    for sql in create:
        con.execute(sql)
    con.execute("CREATE TABLE CUDA_GRAPH_NODE_EVENTS (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
                "globalTid INTEGER, nameId INTEGER NOT NULL, graphNodeId INTEGER NOT NULL, originalGraphNodeId INTEGER)")
    next_string = con.execute("SELECT max(id) FROM StringIds").fetchone()[0] + 1
    strings = {}

    def string(text):
        if text not in strings:
            strings[text] = next_string + len(strings)
            con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (strings[text], text))
        return strings[text]

    first_attention = int(ours.loc[ours["step"] == 0, "start_ns"].min())
    nodes = [(int(r.start_ns) + (int(r.end_ns) - int(r.start_ns)) // 2, 100 + i) for i, r in enumerate(captured.itertuples())]
    outside_node = 100 + len(nodes)
    nodes.append((first_attention - 2, outside_node))
    for t, node in nodes:
        con.execute("INSERT INTO CUDA_GRAPH_NODE_EVENTS VALUES (?, ?, 0, ?, ?, ?, NULL)", (t, t + 1, gtid, string("cudaLaunchKernel"), node))
    done = int(captured["end_ns"].max()) + 10
    for _, node in nodes:  # instantiation clones every node
        con.execute("INSERT INTO CUDA_GRAPH_NODE_EVENTS VALUES (?, ?, 0, ?, ?, ?, ?)", (done, done + 1, gtid, string("cudaGraphInstantiate"),
                                                                                        node + 1000, node))
    if after_the_run:
        first = int(ranges["end_ns"].max()) + 1000
    else:
        step1 = int(ranges.loc[(ranges["name"] == "step.1"), "start_ns"].iloc[0])
        assert int(ours.loc[ours["step"] == 1, "start_ns"].min()) - step1 > 20 * replays + 20, \
            "no gap before step 1's forward to launch the graph in"
        first = step1 + 10
    names = {node: string(f"attention_node_{node}" if node != outside_node else "embedding_node") for _, node in nodes}
    launch = string("cudaGraphLaunch_v10000")
    calls, kernels = [], []
    gpu_t = int(ranges["end_ns"].max()) + 10_000_000
    for r in range(replays):
        t, corr = first + 20 * r, 5000 + r
        calls.append((t, t + 5, gtid, corr, launch))
        for _, node in nodes:
            kernels.append((gpu_t, gpu_t + 1000, corr, pid << 24, names[node], names[node], gpu_t, node + 1000))
            gpu_t += 1500
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue) "
                    "VALUES (?, ?, 1, ?, ?, ?, 0)", calls)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid, "
        "demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
        "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, graphNodeId, graphId, tensorSizeMinusOneElements) "
        "VALUES (?, ?, 0, 1, 7, ?, ?, ?, ?, 32, 8, 1, 1, 128, 1, 1, 0, 0, 0, 0, ?, ?, 1, '')", kernels)
    con.commit()
    con.close()
    return captured, outside_node


def test_graph_replays_in_an_export_belong_to_the_ranges_that_captured_them(nsys_sqlite_path, tmp_path):
    """Every replayed kernel lands in a replay instance of the head range that
    captured its node (path, step of the replay), one instance per replay; the
    node made outside every attention range stays outside; the captured ranges
    are not calls of the figures."""
    from headcount.build.nsys import tables_from_nsys
    from headcount.parsers.nsys_sqlite import read_export

    path = tmp_path / "graphed.sqlite"
    captured, outside_node = _graphed_export(nsys_sqlite_path, path, replays=2)
    tables = tables_from_nsys(read_export(path), "graphed").tables
    ranges, kernels = tables["ranges"], tables["kernels"]
    assert kernels["graph_node_id"].notna().all() and len(kernels) == 2 * (len(captured) + 1)
    instances = ranges[ranges["replay_of"].notna()]
    heads = instances[instances["level"] == "head"]
    assert len(heads) == 2 * len(captured) and set(heads["replay_of"]) == set(captured["range_id"])
    assert set(instances["step"]) == {1}  # the replays ran in step 1
    assert not (instances["domain"] == "headcount.step").any()  # steps are matched by time, never replayed
    by_id = captured.set_index("range_id")
    assert (heads["path"].astype(str).to_numpy() == by_id.loc[heads["replay_of"].astype(int), "path"].astype(str).to_numpy()).all()
    inside = kernels[kernels["graph_node_id"] != outside_node + 1000]
    assert set(inside["range_id"].astype(int)) == set(heads["range_id"])  # one kernel per head instance
    assert (inside["step"] == 1).all() and inside["head"].notna().all()
    assert kernels.loc[kernels["graph_node_id"] == outside_node + 1000, "range_id"].isna().all()
    fwd = tables["heads"][tables["heads"]["phase"] == "fwd"]
    assert (fwd["op_count"] == 2).all() and (fwd["calls"] == 3).all()  # 2 replays + step 1's own call (no kernels on CPU)
    for table in ("layers", "heads"):  # the capture is not a call: the step-0 forward is gone from the figures
        assert tables[table].loc[tables[table]["phase"] == "fwd", "steps"].eq(1).all()


def test_headcount_parse_writes_the_replay_instances(nsys_sqlite_path, tmp_path):
    """``headcount parse`` of the graphed export (stand-in as above): the report's
    ranges carry ``replay_of`` and DuckDB finds each head's replays."""
    import duckdb

    from headcount.cli.main import main

    path = tmp_path / "graphed.sqlite"
    captured, _ = _graphed_export(nsys_sqlite_path, path, replays=3)
    out = tmp_path / "report"
    assert main(["parse", str(path), "-o", str(out)]) == 0
    rows = duckdb.sql(f"SELECT replay_of, count(*), sum(gpu_op_count) FROM read_parquet('{out}/ranges/**/*.parquet', "
                      "hive_partitioning=true) WHERE replay_of IS NOT NULL AND level = 'head' GROUP BY 1").fetchall()
    assert sorted(r[0] for r in rows) == sorted(captured["range_id"]) and {(r[1], r[2]) for r in rows} == {(3, 3)}
