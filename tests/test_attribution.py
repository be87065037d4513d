"""Attribution invariants, on generated nested ranges (property tests) and on
the Kineto trace parser's exact nanoseconds."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.attribute import attribution, nesting
from headcount.common.errors import HeadcountError
from headcount.parsers.kineto_json import load_trace


@st.composite
def nested_ranges(draw):
    """A random forest of properly nested ranges on 1-2 threads, and ops."""
    rows = []

    def build(start, end, depth, tid, prefix):
        t = start
        while t < end - 2 and len(rows) < 40:
            if draw(st.booleans()) or depth > 4:
                t += draw(st.integers(1, 5))
                continue
            length = draw(st.integers(1, max(1, end - t - 1)))
            s, e = t, min(t + length, end)
            name = f"r{len(rows)}"
            rows.append(("1", tid, "headcount", name, s, e, prefix + name))
            build(s + 1, e, depth + 1, tid, prefix + name + "/")
            t = e + 1

    for tid in ("10", "11")[: draw(st.integers(1, 2))]:
        build(0, 200, 0, tid, "")
    ranges = pd.DataFrame(rows, columns=["pid", "tid", "domain", "name", "start_ns", "end_ns", "expected_path"])
    ops = draw(st.lists(st.tuples(st.sampled_from(["10", "11"]), st.integers(0, 200), st.integers(0, 6)), max_size=60))
    ops = pd.DataFrame([("1", tid, s, s + d) for tid, s, d in ops], columns=["pid", "tid", "start_ns", "end_ns"])
    return ranges, ops


@settings(max_examples=150, deadline=None)
@given(nested_ranges())
def test_nesting_and_containment_invariants(data):
    ranges, ops = data
    nested = nesting.nest_ranges(ranges)
    assert list(nested["path"]) == list(nested["expected_path"])
    inner = nesting.innermost_range(ops, nested, "start_ns", "end_ns")
    by_id = nested.set_index("range_id")
    for i, rid in enumerate(inner):
        op = ops.iloc[i]
        containing = nested[(nested.tid == op.tid) & (nested.start_ns <= op.start_ns) & (nested.end_ns >= op.end_ns)]
        if rid < 0:
            assert containing.empty
        else:
            # the innermost: the deepest range that contains the op
            assert by_id.loc[rid, "depth"] == containing["depth"].max()
            assert by_id.loc[rid, "tid"] == op.tid
    projected = attribution.project(nested, ops, inner)
    # totals are preserved: a range counts exactly the ops of its subtree, and
    # each op counts once per depth
    for row in projected.itertuples():
        inside = (nested.loc[inner[inner >= 0], "path"] if len(ops) else pd.Series([], dtype=object))
        expected = sum(1 for p in inside if p == row.path or p.startswith(row.path + "/"))
        assert row.op_count == expected
    roots = projected[projected.depth == 0]["op_count"].sum()
    assert roots == (inner >= 0).sum()
    assert (projected["op_count"] >= 0).all()


def test_point_launches_use_the_range_open_at_the_call():
    ranges = nesting.nest_ranges(pd.DataFrame(
        [("1", "1", "d", "A", 0, 100), ("1", "1", "d", "B", 10, 20), ("1", "1", "d", "C", 50, 60)],
        columns=["pid", "tid", "domain", "name", "start_ns", "end_ns"]))
    launches = pd.DataFrame({"pid": "1", "tid": "1", "t": [5, 15, 30, 55, 100, 101]})
    ids = nesting.innermost_range(launches, ranges, "t", None)
    names = [ranges.set_index("range_id").loc[i, "path"] if i >= 0 else None for i in ids]
    assert names == ["A", "A/B", "A", "A/C", "A", None]
    other_thread = launches.assign(tid="2")
    assert (nesting.innermost_range(other_thread, ranges, "t", None) == -1).all()


def test_kineto_timestamps_are_exact_nanoseconds(tmp_path):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "headcount@fwd", "pid": 7, "tid": 7, "ts": 5380736711850.809, "dur": 2465.204},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 5380736711851.001, "dur": 0.999},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 5380736711852.5, "dur": 3.25,
         "args": {"correlation": 42, "device": 0, "stream": 7, "grid": [128, 1, 1], "block": [256, 1, 1],
                  "registers per thread": 96, "shared memory": 49152, "est. achieved occupancy %": 50}},
        {"ph": "i", "name": "marker", "ts": 1},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace).replace("5380736711850.809", "5380736711850.809"))
    events = load_trace(path)
    assert list(events["start_ns"]) == [5380736711850809, 5380736711851001, 5380736711852500]
    assert list(events["end_ns"] - events["start_ns"]) == [2465204, 999, 3250]
    kernel = events[events.kind == "kernel"].iloc[0]
    assert (kernel.grid, kernel.block, kernel.registers_per_thread, kernel.correlation_id) == ("(128, 1, 1)", "(256, 1, 1)", 96, 42)


@pytest.mark.parametrize("content, message", [
    ("{not json", "invalid JSON"),
    ('{"foo": 1}', "no traceEvents"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "abc"}]}', "no valid ts/dur"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x"}]}', "'x' has no valid ts/dur"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1e400}]}', "ts/dur is out of range|invalid JSON|no valid ts"),
    ('{"traceEvents": {"ph": "X"}}', "no traceEvents list"),
    ("[]", "not a torch.profiler trace"),
])
def test_kineto_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(HeadcountError, match=message):
        load_trace(path)
    with pytest.raises(HeadcountError, match="no such file"):
        load_trace(tmp_path / "missing.json")


def test_kineto_truncated_gzip(tmp_path):
    import gzip

    whole = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}] * 50}).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(HeadcountError, match="cut.json.gz: truncated torch.profiler trace: the gzip stream ends before its end marker"):
        load_trace(path)


def test_partially_overlapping_ranges_take_the_tightest_container():
    # B starts inside A and ends after it (start/end ranges can do that); C is
    # inside both, with less slack in A (6 + 1) than in B (1 + 11)
    ranges = pd.DataFrame([("1", "1", "d", "A", 0, 10), ("1", "1", "d", "B", 5, 20), ("1", "1", "d", "C", 6, 9)],
                          columns=["pid", "tid", "domain", "name", "start_ns", "end_ns"])
    nested = nesting.nest_ranges(ranges)
    assert list(nested["path"]) == ["A", "B", "A/C"]
    assert list(nested["depth"]) == [0, 0, 1]
    assert not nested["nested"].any()


@pytest.mark.parametrize("ts, dur, start_ns, length_ns", [
    ("5380736711850.809", "2465.204", 5380736711850809, 2465204),  # float64 pins the nanosecond
    ("9999999999999.999", "0.001", 9999999999999999, 1),  # beyond 2**43 µs: from the digits
    ("12.0005", "1.0009", 12000, 1000),  # a fourth decimal: from the digits, truncated as before
])
def test_kineto_times_fall_back_to_the_digits(tmp_path, ts, dur, start_ns, length_ns):
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": %s, "dur": %s}]}' % (ts, dur))
    events = load_trace(path)
    assert (int(events["start_ns"].iloc[0]), int(events["end_ns"].iloc[0] - events["start_ns"].iloc[0])) == (start_ns, length_ns)


def test_graph_node_clones_follow_back_to_the_range_that_made_them():
    from headcount.attribute.graphs import NO_RANGE, follow_clones

    made = {1: 10, 2: None}
    origin = {11: 1, 21: 11, 12: 2, 30: 31, 31: 30}  # a clone of a clone; a node made outside; a cycle never made
    assert follow_clones(made, origin) == {1: 10, 2: NO_RANGE, 11: 10, 21: 10, 12: NO_RANGE}


def test_calls_pair_with_range_instances_in_time_order_per_layer_and_head():
    """The k-th instance of (phase, layer, head) in time order takes the k-th logged call of that key,
    whatever the rows' order; an instance with no logged call keeps null shapes; rows come back in
    range_id order, and a range column the log also has keeps the range's value."""
    from headcount.attribute.calls import attach_calls, calls_frame
    from headcount.common.call_log import CallLog, CallShape

    def shape(q_len):
        return CallShape("sdpa", 2, 4, 4, q_len, q_len, 16, 16, "float32", 4, True)

    calls = [CallLog(1, "fwd", "layer.0", 0, None, None, shape(10), "M"), CallLog(1, "fwd", "layer.1", 1, None, None, shape(20), "M"),
             CallLog(1, "fwd", "layer.0", 0, None, None, shape(30), "M"), CallLog(1, "bwd", "layer.0", 0, None, None, shape(40), "M")]
    ranges = pd.DataFrame({  # range_id order differs from time order; layer.0 fwd runs 3 times, logged twice
        "range_id": [5, 3, 9, 7, 1], "phase": pd.Categorical(["fwd", "fwd", "bwd", "fwd", "fwd"]),
        "layer_name": ["layer.0", "layer.0", "layer.0", "layer.1", "layer.0"],
        "head": pd.array([pd.NA] * 5, dtype="Int64"), "start_ns": [200, 100, 500, 150, 900],
        "implementation": ["kept"] * 5,
    })
    out = attach_calls(ranges, calls_frame(calls))
    assert out["range_id"].tolist() == [1, 3, 5, 7, 9]
    assert out["q_len"].tolist()[:4] == [pytest.approx(float("nan"), nan_ok=True), 10, 30, 20]  # 1 started last: no third call
    assert out["q_len"].iloc[4] == 40 and out["implementation"].tolist() == ["kept"] * 5
    assert out["implementation_call"].tolist()[1:] == ["sdpa"] * 4 and pd.isna(out["implementation_call"].iloc[0])
