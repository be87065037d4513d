"""Untagged nsys exports whose layers are numbered by the trace's own module ranges: the real 2×H100
FSDP training capture (``h100x2_fsdp_{before,after}_nsys2026.2.sqlite``: flash-attn, no nn.Module
ranges, each block opened by a short ``FSDP::pre_forward (blocks.N._checkpoint_wrapped_module)``
range), counted by hand with sqlite3 alone; and the T5 export's
``FSDP::pre_forward (encoder.block.N.layer.K)`` names.
"""

from __future__ import annotations

import contextlib
import io
import re
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from headcount.attribute import untagged
from headcount.attribute.untagged_paths import block_of, hook_of
from headcount.cli.main import main

FIX = Path(__file__).parent / "fixtures" / "nsys"
BEFORE = FIX / "h100x2_fsdp_before_nsys2026.2.sqlite"
AFTER = FIX / "h100x2_fsdp_after_nsys2026.2.sqlite"
T5 = FIX / "h100x2_pytorch_nsys2026.2.sqlite"

_TEXT = "coalesce(n.text, s.value)"
_NVTX = f"select n.start, n.end, {_TEXT}, n.globalTid from NVTX_EVENTS n left join StringIds s on s.id = n.textId"


def _by_hand(path: Path) -> dict[int, list[dict]]:
    """Per process, each ``flash_attn::_flash_attn_forward`` range in time order: its block (the latest
    ``FSDP::pre_forward (blocks.N…)`` before it on its thread; before the first one, the block whose
    ``FSDP::post_forward`` comes next), its position among the block's calls (a block cut by the recording's
    start holds its last calls: counted from the end, as the whole blocks hold 2), and the grids of the
    kernels launched inside it (runtime call on the thread within the range, same correlation id)."""
    con = sqlite3.connect(path)
    rows = con.execute(f"{_NVTX} where {_TEXT} like 'FSDP::p%_forward (blocks.%' "
                       f"or {_TEXT} like 'flash_attn::_flash_attn_forward%' order by n.start").fetchall()
    launches = con.execute("""select r.globalTid, r.start, k.gridX, k.gridY, k.gridZ from CUPTI_ACTIVITY_KIND_RUNTIME r
        join CUPTI_ACTIVITY_KIND_KERNEL k on k.correlationId = r.correlationId and k.globalPid = (r.globalTid >> 24) << 24""").fetchall()
    out: dict[int, list[dict]] = {}
    state: dict[int, dict] = {}
    for start, end, text, tid in rows:
        pid = tid >> 24 & 0xFFFFFF
        mine = state.setdefault(tid, {"block": None, "pos": 0, "before": []})
        block = re.search(r"blocks\.(\d+)", text)
        if text.startswith("FSDP::pre_forward"):
            mine.update(block=int(block.group(1)), pos=0)
        elif text.startswith("FSDP::post_forward"):
            for i, call in enumerate(mine["before"]):  # the recording began inside this block
                call.update(block=int(block.group(1)), pos=2 - len(mine["before"]) + i)
            mine["before"] = []
        else:
            grids = {(x, y, z) for t, s, x, y, z in launches if t == tid and start <= s <= end}
            call = {"start": start, "block": mine["block"], "pos": mine["pos"], "grids": grids}
            out.setdefault(pid, []).append(call)
            if mine["block"] is None:
                mine["before"].append(call)
            mine["pos"] += 1
    return out


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """Each FSDP export parsed once: its report folder and what ``parse`` said."""
    out = {}
    for path in (BEFORE, AFTER):
        folder = tmp_path_factory.mktemp(path.stem) / "rep"
        with contextlib.redirect_stderr(io.StringIO()) as said:  # the notices are printed on stderr
            assert main(["parse", str(path), "-o", str(folder)]) == 0
        out[path.name] = (folder, said.getvalue())
    return out


def test_the_hand_count_of_the_before_file():
    """The figures the tests below compare with: 33 calls on process 144 and 34 on 145 (the last, blocks.19's
    first call, launched no kernel inside the recording), each block's first call on grid (244, 1, 6), its
    second on (122, 1, 12); the recording begins inside blocks.2, after its first call."""
    hand = _by_hand(BEFORE)
    assert {pid: len(calls) for pid, calls in hand.items()} == {144: 33, 145: 34}
    assert {pid: sum(1 for c in calls if c["grids"]) for pid, calls in hand.items()} == {144: 33, 145: 33}
    for calls in hand.values():
        assert (calls[0]["block"], calls[0]["pos"]) == (2, 1)
        assert all(c["grids"] == {(244, 1, 6)} for c in calls if c["pos"] == 0 and c["grids"])
        assert all(c["grids"] == {(122, 1, 12)} for c in calls if c["pos"] == 1)
    assert [(c["block"], c["pos"], bool(c["grids"])) for c in hand[145][-1:]] == [(19, 0, False)]


@pytest.mark.parametrize("name", [BEFORE.name, AFTER.name])
def test_every_call_sits_in_its_fsdp_block(parsed, name):
    """Every attention call's layer is the block FSDP's hook ranges place it in, counted by hand; the two
    calls of a block are two layer rows, each of one kernel grid; numbered by module ranges."""
    folder, _ = parsed[name]
    hand = _by_hand(FIX / name)
    ranges = pd.read_parquet(folder / "ranges")
    calls = ranges[(ranges["level"] == "layer").to_numpy()].sort_values("start_ns")
    kernels = pd.read_parquet(folder / "kernels")
    kernels = kernels[kernels["layer_name"].notna().to_numpy()]
    for pid, expected in hand.items():
        mine = calls[calls["pid"].astype(int) == pid]
        assert list(mine["start_ns"]) == [c["start"] for c in expected]
        assert list(mine["layer"].astype(int)) == [c["block"] for c in expected]
        assert list(mine["layer_name"]) == [f"layer.{c['block']}.call{c['pos']}" for c in expected]
        assert set(mine["phase"]) == {"fwd"}
        grids = kernels[kernels["pid"].astype(int) == pid].groupby("layer_name", observed=True)["grid"].agg(set)
        by_hand = {f"layer.{c['block']}.call{c['pos']}": {str(g) for g in c["grids"]} for c in expected if c["grids"]}
        assert grids.to_dict() == by_hand  # one grid per layer row, the grid the hand count found
    layers = pd.read_parquet(folder / "layers")
    assert len(layers) == sum(len(v) for v in hand.values())  # one call per block and position: no two share a row
    assert (layers["provenance"] == "module ranges").all()
    assert layers["found_as"].str.fullmatch(r"blocks\.\d+\._checkpoint_wrapped_module/flash_attn::_flash_attn_forward").all()


def test_the_notices_are_said_once_for_both_processes_with_nsys_advice(parsed):
    _, err = parsed[BEFORE.name]
    lines = [line for line in err.splitlines() if line.startswith("headcount: ")]
    assert lines and all("processes 144, 145" in line for line in lines)
    assert not any("process 144:" in line or "process 145:" in line for line in lines)
    assert len(lines) == len(set(lines)) == 3
    assert "processes 144, 145, each: attention found without headcount's tags: 33–34 calls" in lines[0]
    no_shapes = [line for line in lines if "have no shapes" in line]
    assert len(no_shapes) == 1 and "torch.autograd.profiler.emit_nvtx(record_shapes=True)" in no_shapes[0]
    assert "processes 144, 145: 1 attention kernels have no launch call" in err
    # every call was numbered by the FSDP ranges: no call-order notice, and no torch.profiler advice for an nsys file
    assert "naming their layer" not in err and "with_modules" not in err
    _, after = parsed[AFTER.name]
    assert "processes 148, 149: attention found without headcount's tags: 30 calls" in after  # alike: said as is


def test_the_t5_exports_fsdp_ranges_name_their_blocks():
    """The T5 export's hooks (``FSDP::pre_forward (encoder.block.N.layer.K), op_id = …``): block N, the sub-layer
    index K left in the path; its eager attention is named by nothing, so no call is made up (its own test)."""
    con = sqlite3.connect(T5)
    names = [r[0] for r in con.execute(f"select distinct {_TEXT} from NVTX_EVENTS n left join StringIds s "
                                       f"on s.id = n.textId where {_TEXT} like 'FSDP::%'")]
    hooks = [(n, hook_of(n)) for n in names]
    named = [(n, h) for n, h in hooks if re.search(r"\(encoder\.block\.\d+\.layer\.\d+\)", n)]
    assert len(named) > 50
    for n, (edge, hooked, block) in named:
        assert edge == n[6:n.index("_")] and hooked == "forward"
        assert block.index == int(re.search(r"block\.(\d+)", n).group(1)) and block.stack == "encoder.block"
        assert block.path == re.search(r"\((.*)\)", n).group(1)


@pytest.mark.parametrize("text,stack,index", [
    ("model.layers.12", "model.layers", 12), ("model.layers.12.self_attn", "model.layers", 12), ("h.5", "h", 5),
    ("layers.3", "layers", 3), ("decoder.layers.4.self_attention", "decoder.layers", 4), ("blocks.9._checkpoint_wrapped_module", "blocks", 9),
    ("_fsdp_wrapped_module.layers.7._checkpoint_wrapped_module", "layers", 7), ("transformer_blocks.2", "transformer_blocks", 2),
    ("Block 3", "Block", 3),
])
def test_module_paths_that_name_a_block(text, stack, index):
    block = block_of(text)
    assert (block.stack, block.index, block.path) == (stack, index, text)


@pytest.mark.parametrize("text", ["ProfilerStep#3", "step.3", "python3.11", "nccl:all_reduce", "model.embed_tokens",
                                  "FSDP::pre_forward (blocks.3)"])
def test_names_that_name_no_block(text):
    assert block_of(text) is None


def _event(kind: str, name: str, start: int, end: int, tid: int = 1) -> dict:
    return {"kind": kind, "name": name, "pid": 1, "tid": tid, "start_ns": start, "end_ns": end, "correlation_id": None,
            "args": None, "sequence": None, "graph_node_id": None}


def test_sub_layer_hooks_two_stacks_and_backward_hooks():
    """FSDP around T5's sub-layers (``decoder.block.N.layer.0`` self-attention, ``.layer.1`` cross-attention, each
    hooked alone), an encoder and a decoder stack, and backward hooks around unlinked backward calls: a block's
    sub-layers are one block (its two calls two positions), each stack keeps its name, and a backward call counts
    from the block's end (the block's last forward call runs backward first)."""
    fwd, bwd = "flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward"
    events, t = [], 0

    def hooked(name: str, call: str | None, tid: int = 1):
        nonlocal t
        events.append(_event("range", f"FSDP::pre_{name}", t, t + 5, tid))
        if call:
            events.append(_event("op", call, t + 10, t + 20, tid))
        events.append(_event("range", f"FSDP::post_{name}", t + 30, t + 35, tid))
        t += 100

    for stack in ("encoder", "decoder"):
        for block in range(2):
            hooked(f"forward ({stack}.block.{block}.layer.0)", fwd)
            hooked(f"forward ({stack}.block.{block}.layer.1)", fwd if stack == "decoder" else None)
    for block in (1, 0):
        events.append(_event("range", f"FSDP::pre_backward (decoder.block.{block})", t, t + 5, 2))
        events += [_event("op", bwd, t + 10, t + 20, 2), _event("op", bwd, t + 30, t + 40, 2)]
        events.append(_event("range", f"FSDP::post_backward_reduce (decoder.block.{block})", t + 50, t + 55, 2))
        t += 100
    found = untagged.find_calls(pd.DataFrame(events))
    got = [(c.phase, c.layer_name, c.layer, c.numbered_by) for c in found.calls]
    assert got == [
        ("fwd", "encoder.layer.0.call0", 0, "module ranges"), ("fwd", "encoder.layer.1.call0", 1, "module ranges"),
        ("fwd", "decoder.layer.0.call0", 0, "module ranges"), ("fwd", "decoder.layer.0.call1", 0, "module ranges"),
        ("fwd", "decoder.layer.1.call0", 1, "module ranges"), ("fwd", "decoder.layer.1.call1", 1, "module ranges"),
        ("bwd", "decoder.layer.1.call1", 1, "module ranges"), ("bwd", "decoder.layer.1.call0", 1, "module ranges"),
        ("bwd", "decoder.layer.0.call1", 0, "module ranges"), ("bwd", "decoder.layer.0.call0", 0, "module ranges")]
    assert found.calls[3].found_as == "decoder.block.0.layer.1/flash_attn::_flash_attn_forward"
    assert not any("naming their layer" in n for n in found.notices)


def test_a_notice_of_one_process_and_of_several():
    from headcount.build.process_notices import merged

    assert merged([(7, "2 calls are odd"), (7, "2 calls are odd")]) == ["process 7: 2 calls are odd"]
    assert merged([(7, "x: 1.5 ms"), (8, "x: 2 ms"), (8, "y")]) == ["processes 7, 8, each: x: 1.5–2 ms", "process 8: y"]
