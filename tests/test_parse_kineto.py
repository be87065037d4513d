"""``headcount parse trace.json[.gz]``: torch.profiler traces through the source registry."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from headcount import tag, untag
from headcount.build import sources
from headcount.cli.main import main
from headcount.common import process_ids
from headcount.common.errors import HeadcountError
from headcount.parsers.options import ReadOptions

KINETO = Path(__file__).parent / "fixtures" / "kineto"
SMALL = ["--steps", "2", "--batch", "1", "--seq", "32", "--device", "cpu"]
SAME = ["phase", "layer_name", "calls", "steps", "duration_ns", "op_count"]


def test_a_trace_kept_by_trace_dir_parses_into_the_same_layers(tmp_path, capsys):
    out, traces = tmp_path / "r", tmp_path / "traces"
    assert main(["profile", *SMALL, "--impl", "sdpa", "--trace-dir", str(traces), "-o", str(out)]) == 0
    parsed = tmp_path / "p"
    assert main(["parse", str(traces / "sdpa" / "trace.json"), "-o", str(parsed)]) == 0
    ours = pd.read_parquet(out / "layers").sort_values(["phase", "layer_name"]).reset_index(drop=True)
    theirs = pd.read_parquet(parsed / "layers").sort_values(["phase", "layer_name"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(ours[SAME], theirs[SAME])
    assert theirs["flop"].isna().all()  # no call log in a trace: no analytic figures, never invented
    runs = pd.read_parquet(parsed / "runs")
    assert runs["source"].tolist() == ["torch"] and runs["device_kind"].tolist() == ["cpu"]


def test_a_plain_torch_profiler_trace_of_a_tagged_model(tmp_path, tiny_llama, llama_inputs):
    tagger = tag(tiny_llama)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            tiny_llama(**llama_inputs).loss.backward()
    finally:
        untag(tagger)
    trace = tmp_path / "mine.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    gz = tmp_path / "mine.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    for path, out in ((trace, tmp_path / "a"), (gz, tmp_path / "b")):
        assert main(["parse", str(path), "-o", str(out)]) == 0
    a, b = (pd.read_parquet(tmp_path / o / "layers").sort_values(["phase", "layer_name"]).reset_index(drop=True) for o in "ab")
    pd.testing.assert_frame_equal(a[SAME], b[SAME])
    assert sorted(a["layer_name"].unique()) == ["layer.0", "layer.1"] and set(a["phase"]) == {"fwd", "bwd"}
    assert (a["calls"] == 1).all() and (a["provenance"] == "measured").all()


@pytest.mark.parametrize("name, layers, orphan_kernels", [
    ("h100_bert-small_sdpa_kineto.json.gz", 4, 0),
    ("h100_qwen1.5-0.5b_kineto.json.gz", 24, 436),
])
def test_real_h100_traces_without_tags_get_layers_from_module_ranges(tmp_path, capsys, name, layers, orphan_kernels):
    out = tmp_path / "r"
    assert main(["parse", str(KINETO / name), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    if orphan_kernels:
        assert f"({orphan_kernels} kernels) have no launch call in the trace" in err
    table = pd.read_parquet(out / "layers")
    assert len(table) == layers and set(table["phase"]) == {"fwd"}
    assert sorted(table["layer"]) == list(range(layers)) and (table["provenance"] == "module ranges").all()
    kernels = pd.read_parquet(out / "kernels")
    gpu = kernels[kernels["kind"] == "kernel"]
    flash = gpu[gpu["name"].str.contains("flash_fwd_kernel")]
    per_layer = flash.dropna(subset=["layer_name"]).groupby("layer_name").size()
    assert len(per_layer) == layers and (per_layer == 1).all()  # every layer its own flash attention kernel
    assert gpu.loc[gpu["layer_name"].notna(), "name"].str.contains("flash_fwd_kernel").all()  # and nothing else
    # the rest of each attention module's work is in the module's range (its projections, copies): no layer of its own
    ranges = pd.read_parquet(out / "ranges")
    in_module = kernels["range_id"].isin(ranges.loc[ranges["level"] == "module", "range_id"]) & (kernels["runs_on"] == "gpu")
    assert kernels.loc[in_module, "layer_name"].isna().all()
    assert in_module.sum() + len(flash.dropna(subset=["layer_name"])) == table["module_kernel_count"].sum()
    runs = pd.read_parquet(out / "runs")
    assert runs["device_name"].tolist() == ["NVIDIA H100 80GB HBM3"] and runs["device_sm_count"].tolist() == [132]
    # far from both ceilings (≤ 20 % of the H100's bandwidth, ≤ 10 % of its bf16 FLOP/s): no "memory-bound" from the
    # model alone; BERT-small's 16-CTA flash grid fills 6 % of one wave of the 132 SMs: under-filled
    assert table["flop"].notna().all() and (table["peak_bandwidth_pct"] < 25).all() and (table["peak_flop_pct"] < 12).all()
    expected = "under-filled" if "bert" in name else "latency-bound"
    assert (table["roofline_class"] == expected).all(), table["roofline_class"].tolist()
    if "bert" in name:
        assert np.allclose(table["waves_per_sm"], 16 / 264)  # 16 CTAs ÷ (132 SMs × 2 resident blocks)


def test_module_range_figures_by_hand():
    """Qwen1.5-0.5B layer 0 (causal SDPA, B 16, H 16, S 559, D 64, bf16), worked by hand."""
    from headcount.build.kineto import tables_from_kineto
    from headcount.parsers.kineto_json import read_trace

    tables = tables_from_kineto(read_trace(KINETO / "h100_qwen1.5-0.5b_kineto.json.gz"), "x").tables
    row = tables["layers"].set_index("layer_name").loc["layer.0"]
    pairs = 559 * 559 - 559 * 558 // 2                     # attended (query, key) pairs under a causal mask
    assert row["flop"] == 2 * 16 * 16 * pairs * (64 + 64)  # 2·B·H·P·(D + Dv)
    assert row["analytic_min_bytes"] == 4 * 16 * 16 * 559 * 64 * 2  # Q, K, V read, O written, bf16


def test_the_registry_chooses_by_name_and_refuses_the_rest(tmp_path):
    assert sources.for_path(Path("x.pt.trace.json")).name == "torch"
    assert sources.for_path(Path("x.json.gz")).name == "torch"
    assert sources.for_path(Path("run.nsys-rep")).name == "nsys"
    assert sources.for_path(Path("k.csv")).name == "ncu"
    with pytest.raises(HeadcountError, match=r"\.txt input is not supported yet.*torch.profiler trace"):
        sources.for_path(Path("notes.txt"))
    # a trace without attention is read, not refused: its operators, one step for the whole recording, and a notice
    plain = tmp_path / "plain.json"
    plain.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}]}')
    parsed = sources.for_path(plain).parse(plain, "r", ReadOptions())
    tables = parsed.gather()
    assert any("no attention found" in n for n in parsed.notices)
    assert len(tables["kernels"]) == 1 and not len(tables["layers"])
    steps = tables["steps"]
    assert len(steps) == 1 and steps["window_ns"].iloc[0] == 2_000 and np.isnan(steps["attention_share_pct"].iloc[0])


def test_every_registered_wrapper_and_recorder_has_an_implementation():
    from headcount.api import BACKENDS
    from headcount.wrap import wrappers as tools

    assert set(tools.WRAPPERS) == set(sources.WRAPPERS)
    assert set(BACKENDS) == {"auto", *sources.RECORDERS}


def test_graph_replayed_kernels_in_a_trace_are_named_and_said(tmp_path, capsys):
    """Kineto marks a kernel replayed from a CUDA graph with ``graph node id`` in
    its args; the H100 BERT trace has no graph, so three of its flash kernels
    are given one here (a stand-in for a graph-replayed trace). The kernels
    table keeps the node id and the parse says that the trace cannot tell
    which range captured them."""
    import json

    trace = json.loads(gzip.open(KINETO / "h100_bert-small_sdpa_kineto.json.gz").read())
    flash = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "flash_fwd_kernel" in e.get("name", "")]
    for node, event in enumerate(flash[:3], start=40):
        event["args"]["graph id"], event["args"]["graph node id"] = 7, node
    path = tmp_path / "graphed.json"
    path.write_text(json.dumps(trace))
    out = tmp_path / "r"
    assert main(["parse", str(path), "-o", str(out)]) == 0
    assert "3 GPU operations were replayed from CUDA graphs" in capsys.readouterr().err
    kernels = pd.read_parquet(out / "kernels")
    marked = kernels[kernels["graph_node_id"].notna()]
    assert sorted(marked["graph_node_id"]) == [40, 41, 42] and marked["name"].str.contains("flash_fwd_kernel").all()


def _rank_trace(path: Path, rank: int | None) -> None:
    """The real H100 BERT trace, saying it is ``rank`` of 2 (as torch.distributed's traces do), gzip."""
    import json

    with gzip.open(KINETO / "h100_bert-small_sdpa_kineto.json.gz", "rt") as file:
        trace = json.load(file)
    if rank is not None:
        trace["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    with gzip.open(path, "wt") as file:
        json.dump(trace, file)


def test_a_directory_of_rank_traces_is_a_run_per_file(tmp_path, capsys):
    """HTA's trace_dir habit: ``headcount parse traces/`` reads each trace in it as its own run, with the
    rank its distributedInfo states; in parallel the same tables."""
    import json

    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1, 10):
        _rank_trace(traces / f"rank{rank}.json.gz", rank if rank < 2 else None)
    (traces / "README.txt").write_text("not a trace: left alone")
    tables = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"r{jobs}"
        assert main(["parse", str(traces), "-o", str(out), "--jobs", jobs]) == 0
        err = capsys.readouterr().err
        assert "(rank 1)" in err
        runs = pd.read_parquet(out / "runs")
        inputs = {path.parent.name.removeprefix("run_id="): json.loads(path.read_text())["input"]
                  for path in (out / "manifests").glob("run_id=*/run.json")}
        runs["input"] = runs["run_id"].astype(str).map(inputs)
        runs = runs.sort_values("input").reset_index(drop=True)
        assert [Path(p).name for p in runs["input"]] == ["rank0.json.gz", "rank1.json.gz", "rank10.json.gz"]
        assert runs["rank"].tolist()[:2] == [0, 1] and pd.isna(runs["rank"].iloc[2])  # rank10's trace names none
        assert runs["world_size"].tolist()[:2] == [2, 2]
        layers = pd.read_parquet(out / "layers").merge(runs[["run_id", "input"]], on="run_id")
        tables[jobs] = layers.drop(columns=["run_id"]).sort_values(["input", "phase", "layer_name"]).reset_index(drop=True)
    assert tables["1"].groupby("input").size().nunique() == 1 and len(tables["1"]) > 0  # the same trace thrice
    pd.testing.assert_frame_equal(tables["1"], tables["2"])
    assert sources.expand(traces / "rank1.json.gz") == [traces / "rank1.json.gz"]  # a file is itself
    names = tmp_path / "names"
    names.mkdir()
    for name in ("rank10.json", "rank2.json.gz", "rank1.json"):
        (names / name).write_text("{}")
    assert [f.name for f in sources.expand(names)] == ["rank1.json", "rank2.json.gz", "rank10.json"]  # natural order


@pytest.mark.parametrize("name", sorted(p.name for p in KINETO.glob("*.json*")))
def test_events_read_in_pieces_give_the_tables_of_the_whole_file(monkeypatch, name):
    """The reader reads, decodes and tabulates a piece of the file at a time (memory follows a piece, not
    the file): every table of each real trace is what reading the whole file at once gives."""
    from headcount.build import parse_file
    from headcount.parsers import kineto_json as kineto

    monkeypatch.setattr(kineto, "CHUNK_BYTES", 10**12)
    whole = parse_file.from_torch_trace(KINETO / name, "r", ReadOptions())
    whole.gather()
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 20_000)  # pieces end mid-step, mid-range, between a launch and its kernel
    pieces = parse_file.from_torch_trace(KINETO / name, "r", ReadOptions())
    pieces.gather()
    assert whole.tables.keys() == pieces.tables.keys() and len(whole.tables["kernels"]) > 0
    for table, frame in whole.tables.items():
        pd.testing.assert_frame_equal(frame, pieces.tables[table], obj=table)
    assert whole.notices == pieces.notices


def test_a_damaged_event_is_named_by_its_place_in_the_file(tmp_path, monkeypatch):
    from headcount.parsers import kineto_json as kineto

    monkeypatch.setattr(kineto, "CHUNK_BYTES", 100)  # about two events a piece
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [' + ", ".join(['{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}'] * 4)
                   + ', {"ph": "X", "cat": "cpu_op", "name": "y", "ts": "soon", "dur": 2}]}')
    with pytest.raises(HeadcountError, match=r"bad.json: an event has no valid ts/dur .*\$\.traceEvents\[4\]\.ts"):
        kineto.load_trace(bad)


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("gz", [False, True])
def test_pieces_end_only_between_events_whatever_the_text_holds(tmp_path, monkeypatch, indent, gz):
    """Event names holding ``},{``, arguments holding lists of objects, the document's other fields after
    the events (a list of objects among them), compact or indented, plain or gzip: read in pieces of a
    few hundred bytes, the events table is the whole file's, and the device and rank are read."""
    import gzip
    import json

    from headcount.parsers import kineto_json as kineto

    events = []
    for i in range(60):
        name = f'aten::odd}},{{"name": "{i}"' if i % 7 == 0 else f"aten::mm_{i}"
        args = {"Input Dims": [[4, 8], [8, 4]], "Concrete Inputs": ["", "[{}, {}]"], "Sequence number": i}
        if i % 5 == 0:
            args["extra"] = [{"a": 1}, {"b": [{"c": "},{"}]}]
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 2, "ts": 1000.5 + 10 * i, "dur": 4.25, "args": args})
    document = {"schemaVersion": 1, "traceEvents": events, "distributedInfo": {"rank": 3, "world_size": 4},
                "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}, {"id": 1, "name": "x"}],
                "traceName": "t.json"}
    text = json.dumps(document, indent=indent).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 10**12)
    whole = kineto.read_trace(path)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 300)
    pieces = kineto.read_trace(path)
    assert len(whole["events"]) == 60 and whole["events"]["name"].iloc[0] == 'aten::odd},{"name": "0"'
    pd.testing.assert_frame_equal(whole["events"], pieces["events"])
    assert pieces["distributed"] == {"rank": 3, "world_size": 4} and pieces["devices"][0]["numSms"] == 132


@pytest.mark.parametrize("cut", [0.3, 0.999])
def test_a_trace_cut_short_is_refused_in_one_line(tmp_path, monkeypatch, cut):
    """A file that ends inside its events (a copy interrupted) is refused, naming the file, however it is read."""
    from headcount.parsers import kineto_json as kineto

    source = gzip_text(KINETO / "h100_bert-small_sdpa_kineto.json.gz")
    path = tmp_path / "cut.json"
    path.write_bytes(source[: int(len(source) * cut)])
    said = set()
    for chunk in (10**12, 20_000):
        monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
        with pytest.raises(HeadcountError, match=r"cut.json: truncated or damaged torch.profiler trace: its events array "
                                                 r"breaks off after event \d+ and never closes") as info:
            kineto.load_trace(path)
        said.add(info.value.message)
    assert len(said) == 1  # the same event counted whichever way the file is read


def gzip_text(path):
    import gzip

    return gzip.decompress(path.read_bytes())


def _replicated(tmp_path, copies: int) -> Path:
    """The H100 Qwen fixture replicated ``copies`` times in time (the scale benchmark's builder)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kineto_scale", Path(__file__).resolve().parent.parent / "benchmarks" / "kineto_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / f"qwen-{copies}x.json"
    module.build(path, copies)
    return path


def _comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """A table with its rows in a fixed order, range ids left out (each group numbers its own) and
    text columns as objects with one null (a group's concatenation gives None where the whole gives NaN); ids as the
    tables hold them (a streamed piece is typed on its way to Parquet, a whole build at its end)."""
    frame = process_ids.as_integers(frame, "compared")
    frame = frame.drop(columns=[c for c in ("run_id", "range_id", "parent_range_id") if c in frame])
    keys = [c for c in ("start_ns", "pid", "tid", "kind", "name", "step", "phase", "layer_name", "head", "subject") if c in frame]
    frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    text = [c for c in frame.columns if frame[c].dtype == object or str(frame[c].dtype) in ("str", "string", "category")]
    frame = frame.astype({c: object for c in text})
    frame[text] = frame[text].where(frame[text].notna(), None)
    return frame


def test_a_trace_attributed_a_group_of_steps_at_a_time_gives_the_whole_traces_tables(tmp_path, monkeypatch):
    """Three steps of a real H100 trace, each step its own group, read in pieces of 200 kB, every piece written to disk:
    every table (ranges, kernels, steps, layers, heads, findings) and every notice is what
    attributing the whole trace at once gives; nothing is left on disk."""
    from headcount.build.kineto import kineto_pieces, tables_from_kineto
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers.kineto_steps import Pieces

    path = _replicated(tmp_path, 3)
    whole = tables_from_kineto(kineto.read_trace(path), "r")
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 200_000)
    with Pieces(path, group_rows=1, held_bytes=0) as pieces:
        pieces.read()
        directory = pieces._directory
        assert pieces.count == 3 and pieces.spilled and len(list(directory.iterdir())) > 3
        notices = list(pieces.notices)
        parts: dict[str, list[pd.DataFrame]] = {}
        for name, frame in kineto_pieces(pieces.groups(), pieces.described["devices"], notices, launched=pieces.launched):
            parts.setdefault(name, []).append(frame)
    assert not directory.exists()
    assert len(parts["ranges"]) == 3 and notices == whole.notices
    assert "72 calls" in notices[0]  # 24 layers × 3 steps, summed over the groups
    for name in ("ranges", "kernels", "steps", "layers", "heads", "findings"):
        got = pd.concat(parts[name], ignore_index=True)
        expected = whole.tables[name]
        assert len(got) == len(expected) > 0 or name == "findings"
        pd.testing.assert_frame_equal(_comparable(got)[list(_comparable(expected).columns)], _comparable(expected),
                                      check_dtype=False, obj=name)
    ids = pd.concat(parts["ranges"])["range_id"]
    assert ids.is_unique  # one run's ranges: ids unique across the groups


def test_a_step_crossed_by_an_open_event_is_not_cut(tmp_path):
    """An annotation around two steps: no cut falls inside it, so those steps are one group."""
    import json

    from headcount.parsers.kineto_steps import Pieces

    def op(name, ts, dur, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [op("ProfilerStep#1", 0, 10, "user_annotation"), op("ProfilerStep#2", 10, 10, "user_annotation"),
              op("ProfilerStep#3", 20, 10, "user_annotation"), op("outer", 5, 10, "user_annotation"),
              op("aten::mm", 1, 1), op("aten::mm", 12, 1), op("aten::mm", 22, 1)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with Pieces(path, group_rows=1) as pieces:
        pieces.read()
        groups = [sorted(g["name"]) for _, g in pieces.groups()]
    assert pieces.count == 2
    assert groups[0] == ["ProfilerStep#1", "ProfilerStep#2", "aten::mm", "aten::mm", "outer"]
    assert groups[1] == ["ProfilerStep#3", "aten::mm"]


def _report(out: Path) -> dict[str, pd.DataFrame]:
    import pyarrow.dataset as ds

    return {name: _comparable(ds.dataset(out / name, partitioning="hive").to_table().to_pandas())
            for name in ("ranges", "kernels", "steps", "layers", "heads", "findings")}


@pytest.fixture
def three_steps(tmp_path_factory):
    return _replicated(tmp_path_factory.mktemp("trace"), 3)


def test_a_large_trace_read_in_spans_by_two_workers_gives_one_workers_report(tmp_path, monkeypatch, capsys, three_steps):
    """A plain trace read in two spans by two worker processes (bounds where an event begins), cut
    into groups of one step, the groups built by both workers: every table and notice is one
    worker's, and no temporary piece is left behind."""
    import tempfile

    from headcount.cli.main import main
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers import kineto_steps

    one, two, scratch = tmp_path / "one", tmp_path / "two", tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 300_000)
    monkeypatch.setattr(kineto_steps, "GROUP_ROWS", 1)
    assert main(["parse", str(three_steps), "-o", str(one), "--jobs", "1"]) == 0
    single = capsys.readouterr().err
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 0)  # as if the file were large
    spans = kineto.spans(three_steps, 2)
    assert spans is not None and len(spans) == 2 and spans[0].stop == spans[1].start
    assert main(["parse", str(three_steps), "-o", str(two), "--jobs", "2"]) == 0
    split = capsys.readouterr().err
    assert "attributed in 3 groups of steps (2 workers)" in split and "attributed in 3 groups of steps" in single
    a, b = _report(one), _report(two)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name][list(a[name].columns)], check_dtype=False, obj=name)
    assert len(a["kernels"]) > 0 and len(a["layers"]) == 24 and (a["layers"]["calls"] == 3).all()
    notices = [sorted(json.loads(p.read_text())["notices"]) for out in (one, two) for p in out.glob("manifests/*/run.json")]
    assert notices[0] == notices[1] and any("72 calls" in n for n in notices[0])
    assert list(scratch.iterdir()) == []


def test_a_span_that_does_not_end_between_two_events_reads_the_file_whole(tmp_path, monkeypatch, capsys, three_steps):
    """Span bounds a few bytes inside an event (as a bound inside an event's arguments would be): the
    span readers refuse them, and the file is read whole by one worker, giving the same report."""
    from dataclasses import replace

    from headcount.cli.main import main
    from headcount.parsers import kineto_json as kineto

    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["parse", str(three_steps), "-o", str(one), "--jobs", "1"]) == 0
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 0)
    aligned = kineto.spans

    def inside(path, parts):
        found = aligned(path, parts)
        return [replace(s, start=None if s.start is None else s.start + 7, stop=None if s.stop is None else s.stop + 7) for s in found]

    monkeypatch.setattr(kineto, "spans", inside)
    capsys.readouterr()
    assert main(["parse", str(three_steps), "-o", str(two), "--jobs", "2"]) == 0
    assert "(2 workers)" not in capsys.readouterr().err
    a, b = _report(one), _report(two)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name][list(a[name].columns)], check_dtype=False, obj=name)


def test_notices_of_several_groups_are_one_line_each_with_their_counts_summed():
    from headcount.parsers.kineto_steps import merged

    said = ["3 events dropped as implausible (3 ending before they start)", "attention found: 24 calls (Qwen1.5 on cuda:0)",
            "a note without a count", "2 events dropped as implausible (2 ending before they start)",
            "attention found: 24 calls (Qwen1.5 on cuda:0)", "a note without a count"]
    assert merged(said) == ["5 events dropped as implausible (5 ending before they start)",
                            "attention found: 48 calls (Qwen1.5 on cuda:0)", "a note without a count"]


def test_pieces_that_cannot_be_written_to_disk_are_refused_in_one_line(tmp_path):
    from headcount.parsers.kineto_steps import Pieces

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    trace = KINETO / "h100_bert-small_sdpa_kineto.json.gz"
    with pytest.raises(HeadcountError, match=r"bert-small_sdpa_kineto.json.gz: cannot hold the trace's events in .*file"), \
            Pieces(trace, held_bytes=0, directory=not_a_folder) as pieces:
        pieces.read()


def test_a_damaged_trace_read_in_spans_is_refused_as_when_read_whole(tmp_path, monkeypatch, capsys, three_steps):
    """A trace cut short, parsed by two workers: its last span fails, the file is read whole, and the
    error is the one-line error of a whole read; nothing is written and no temporary piece is left."""
    import tempfile

    from headcount.parsers import kineto_json as kineto

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 0)
    cut = tmp_path / "cut.json"
    cut.write_bytes(three_steps.read_bytes()[:-5000])
    assert main(["parse", str(cut), "-o", str(tmp_path / "out"), "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert "cut.json: truncated or damaged torch.profiler trace: its events array breaks off" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []


def test_each_layer_says_its_share_of_the_phases_attention_of_the_step_and_of_gpu_busy_time(tmp_path):
    """The Qwen trace: shares named for what they are of. Checked by hand against the steps table: the layers'
    shares of GPU busy time sum to the step's attention share (2.72 ms of 31.9 ms busy), their shares of the step
    to attention's part of the 34.9 ms window; a phase's shares of its attention time sum to 100 %."""
    out = tmp_path / "r"
    assert main(["parse", str(KINETO / "h100_qwen1.5-0.5b_kineto.json.gz"), "-o", str(out)]) == 0
    layers, steps = pd.read_parquet(out / "layers"), pd.read_parquet(out / "steps")
    step = steps[steps["step"].notna()].iloc[0]
    assert layers["share_of_gpu_busy_pct"].sum() == pytest.approx(step["attention_share_pct"], rel=1e-9)
    assert layers["share_of_step_pct"].sum() == pytest.approx(100 * step["attention_gpu_ns"] / step["window_ns"], rel=1e-9)
    assert layers.groupby("phase")["share_of_phase_pct"].sum().tolist() == pytest.approx([100.0])
    assert 7 < layers["share_of_step_pct"].sum() < 8.5


@pytest.mark.parametrize("name, groups", [("v100_rank1of2_cudagraph_nccl_kineto.json.gz", 2),
                                          ("a100_ddp_rank0of2_nccl_annotations_kineto.json.gz", 3)])
def test_pipelined_steps_are_not_cut_apart(name, groups):
    """Groups of about one step each: in the V100 DDP trace four of the six steps run into the next on the GPU (by
    hand: tests/fixtures/hand_counts), so cuts fall only where no work crosses (two groups) and the device view of
    every step is the whole trace's; the A100 DDP trace's steps do not overlap and are cut one per group. Either way
    the steps table is the whole's."""
    from headcount.build.kineto import kineto_pieces, tables_from_kineto
    from headcount.parsers import kineto_json as kineto
    from headcount.parsers.kineto_steps import Pieces

    path = KINETO / name
    whole = tables_from_kineto(kineto.read_trace(path), "r")
    rows = sum(1 for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X")
    with Pieces(path, group_rows=rows // 8) as pieces:
        pieces.read()
        assert pieces.count == groups
        notices = list(pieces.notices)
        parts: dict[str, list[pd.DataFrame]] = {}
        for table, frame in kineto_pieces(pieces.groups(), pieces.described["devices"], notices, launched=pieces.launched):
            parts.setdefault(table, []).append(frame)
    got, expected = pd.concat(parts["steps"], ignore_index=True), whole.tables["steps"]
    # the device's view: exact. (How a gap right after a cut splits between launch-bound and host time can differ: the
    # launching thread's previous call may be in the group before — a limit of building in groups, not of the cut.)
    device = ["step", "window_ns", "gpu_busy_ns", "own_busy_ns", "others_busy_ns", "windows_overlap", "idle_ns",
              "communication_ns", "communication_exposed_ns", "graph_launches", "graph_ops"]
    pd.testing.assert_frame_equal(_comparable(got)[device], _comparable(expected)[device], check_dtype=False)
