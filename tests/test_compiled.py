"""Tags under torch.compile (Inductor on the CPU): no added graph break, every
range once per call in program order around its own kernels, outputs and
gradients of the untagged compiled model, compile steps kept out of the figures."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_BUILDERS, inputs_for

from headcount.api import AttentionProfiler
from headcount.tagging.tagger import tag, tag_attention

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SDPA = "scaled_dot_product"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # every test compiles new model objects: stay under Dynamo's recompile limit
    yield
    torch._dynamo.reset()


def _breaks(model, inputs) -> int:
    return torch._dynamo.explain(lambda **kw: model(**kw).loss)(**inputs).graph_break_count


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "bert"])
def test_tags_add_no_graph_break(name):
    model, inputs = MODEL_BUILDERS[name](), inputs_for(name)
    untagged = _breaks(model, inputs)
    for mode in ("layer", "head"):
        torch._dynamo.reset()
        tagger = tag(model, mode=mode)
        try:
            assert _breaks(model, inputs) == untagged, mode
        finally:
            tagger.deactivate()


def _profile_compiled(name: str, mode: str, impl: str = "sdpa"):
    """Warm up (compile) under the tags, then profile one compiled forward+backward."""
    model, inputs = MODEL_BUILDERS[name](impl), inputs_for(name)
    compiled = torch.compile(model)
    with tag(model, mode=mode):
        compiled(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    prof = AttentionProfiler(model, mode=mode, backend="torch")
    with prof:
        loss = compiled(**inputs).loss
        loss.backward()
    return model, prof, loss


@pytest.mark.parametrize("name, mode, impl", [("llama_gqa", "layer", "sdpa"), ("llama_gqa", "head", "sdpa"),
                                              ("llama_gqa", "layer", "eager"), ("gpt2", "head", "sdpa"),
                                              ("bert", "head", "sdpa")])
def test_compiled_step_has_every_range_once_around_its_kernels(name, mode, impl):
    model, prof, loss = _profile_compiled(name, mode, impl)
    stats = prof.get_stats()
    assert not prof.compiled_steps and "compiled_during_profile" not in prof.run_metadata()  # no recompile in the profiled block
    layers = stats["layers"]
    n_layers = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer
    assert sorted(zip(layers["phase"], layers["layer"])) == sorted((p, i) for p in ("fwd", "bwd") for i in range(n_layers))
    assert (layers["calls"] == 1).all()
    if mode == "head":
        heads = stats["heads"]
        n_heads = model.config.num_attention_heads if hasattr(model.config, "num_attention_heads") else model.config.n_head
        got = sorted(zip(heads["phase"], heads["layer"], heads["head"]))
        assert got == sorted((p, i, h) for p in ("fwd", "bwd") for i in range(n_layers) for h in range(n_heads))
        assert (heads["calls"] == 1).all()
    kernels = stats["kernels"]
    attention = kernels[kernels["name"].str.contains(SDPA if impl == "sdpa" else "aten::bmm")]
    # every attention operator of the compiled graphs ran inside its own layer's range
    assert len(attention) and attention["layer"].notna().all()
    per_range = attention.groupby(["phase", "layer"]).size()
    assert len(per_range) == 2 * n_layers and per_range.groupby(level="phase").nunique().eq(1).all()  # same work per layer
    if impl == "sdpa":
        backward = attention["name"].str.contains("backward")
        assert (attention.loc[backward, "phase"] == "bwd").all() and (attention.loc[~backward, "phase"] == "fwd").all()
    if mode == "head":
        assert attention["head"].notna().all() and attention.groupby(["phase", "layer", "head"]).size().eq(1).all()

    torch._dynamo.reset()
    untagged = MODEL_BUILDERS[name](impl)
    reference = torch.compile(untagged)(**inputs_for(name)).loss
    assert torch.allclose(loss, reference, atol=1e-4)


def test_compiled_gradients_equal_the_untagged_compiled_model():
    inputs = inputs_for("llama_gqa")
    grads = []
    for tagged in (False, True):
        torch._dynamo.reset()
        model = MODEL_BUILDERS["llama_gqa"]()
        compiled = torch.compile(model)
        tagger = tag(model, mode="head") if tagged else None
        compiled(**inputs).loss.backward()
        if tagger:
            tagger.deactivate()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(*grads))


def test_a_step_that_compiles_is_left_out_of_the_figures(capsys):
    model, inputs = MODEL_BUILDERS["llama_gqa"](), inputs_for("llama_gqa")
    compiled = torch.compile(model)
    prof = AttentionProfiler(model, backend="torch")
    with prof:
        for i in range(3):
            with prof.step(i):
                compiled(**inputs).loss.backward()
    stats = prof.get_stats()
    assert prof.compiled_steps == [0]
    assert "compiled during step(s) 0" in capsys.readouterr().err
    assert (stats["layers"]["calls"] == 2).all() and (stats["layers"]["steps"] == 2).all()
    assert set(stats["ranges"]["step"]) == {0, 1, 2}  # the rows stay, the figures leave them out
    assert prof.run_metadata()["compiled_during_profile"]["steps_left_out"] == [0]


def test_a_block_that_only_compiles_says_so(capsys):
    model, inputs = MODEL_BUILDERS["llama_gqa"](), inputs_for("llama_gqa")
    compiled = torch.compile(model)
    prof = AttentionProfiler(model, backend="torch")
    with prof:
        compiled(**inputs).loss.backward()
    prof.get_stats()
    assert "figures include compilation time" in capsys.readouterr().err
    assert prof.run_metadata()["compiled_during_profile"]["steps_left_out"] == []


def test_manual_tag_attention_compiles_without_break():
    @tag_attention(layer=0, causal=True)
    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def block(x, w):
        q = k = v = (x @ w).view(2, 8, 4, 16).transpose(1, 2)
        return attend(q, k, v).sum()

    x, w = torch.randn(2, 8, 64), torch.randn(64, 64, requires_grad=True)
    with tag(torch.nn.Linear(1, 1), mode="head"):
        assert torch._dynamo.explain(block)(x, w).graph_break_count == 0
        compiled = torch.compile(block)
        compiled(x, w).backward()
        prof = AttentionProfiler(backend="torch", mode="head")
        with prof:
            compiled(x, w).backward()
    heads = prof.get_stats()["heads"]
    assert sorted(zip(heads["phase"], heads["head"])) == sorted((p, h) for p in ("fwd", "bwd") for h in range(4))


def test_activation_checkpointing_keeps_forward_and_backward_ranges():
    model, inputs = MODEL_BUILDERS["llama_gqa"](), inputs_for("llama_gqa")
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable  # renamed in transformers 5.x
    enable()
    model.train()
    compiled = torch.compile(model)
    with tag(model):
        compiled(**inputs).loss.backward()
    prof = AttentionProfiler(model, backend="torch")
    with prof:
        compiled(**inputs).loss.backward()
    layers = prof.get_stats()["layers"]
    grid = sorted(zip(layers["phase"], layers["layer"].astype(int)))
    assert [g for g in grid if g[0] != "recompute"] == [("bwd", 0), ("bwd", 1), ("fwd", 0), ("fwd", 1)]
    # transformers 5.25's checkpointing breaks Dynamo's graph (4 breaks untagged, 1 with 5.24): the checkpointed
    # layers then run outside the compiled graph and their recompute is tagged; with 5.24 Inductor recomputes
    # them inside it, untagged. Never one layer only
    assert [g for g in grid if g[0] == "recompute"] in ([], [("recompute", 0), ("recompute", 1)])


def test_profile_command_compiles_before_measuring(tmp_path, capsys):
    import pandas as pd

    from headcount.cli.main import main

    out = tmp_path / "r"
    assert main(["profile", "--compile", "--impl", "sdpa", "--mode", "head", "--steps", "2", "--batch", "1", "--seq", "32",
                 "-o", str(out)]) == 0
    assert "compiled" not in capsys.readouterr().err.split("unmeasured", 1)[-1]  # nothing compiled in the measured steps
    runs = pd.read_parquet(out / "runs")
    assert list(runs["compile_mode"]) == ["default"]
    heads = pd.read_parquet(out / "heads")
    measured = heads[heads["provenance"] == "measured"]
    assert len(measured) == 2 * 4 * 8 and (measured["calls"] == 2).all()  # phases x layers x heads, both steps


def test_profile_compiled_against_uncompiled_in_one_report(tmp_path, capsys):
    """``--compile none,default``: one run per mode in one report, and ``compare``
    puts each compiled implementation against its uncompiled run."""
    import pandas as pd

    from headcount.cli.main import main
    from headcount.reports.compare import comparison
    from headcount.store.query import connect

    out = tmp_path / "r"
    assert main(["profile", "--compile", "none,default", "--impl", "sdpa", "--steps", "1", "--batch", "1", "--seq", "32",
                 "--no-backward", "-o", str(out)]) == 0
    runs = pd.read_parquet(out / "runs")
    assert runs["run_id"].nunique() == 2 and sorted(runs["compile_mode"].fillna("none")) == ["default", "none"]
    con = connect(out)
    table, _ = comparison(con.sql("SELECT * FROM layers").df(), con.sql("SELECT * FROM runs").df())
    compiled = table[table["compile_mode"] == "default"]
    plain = table[table["compile_mode"].isna()]
    by_hand = plain["attention_ms_per_step"].iloc[0] / compiled["attention_ms_per_step"].iloc[0]
    assert compiled["speedup_vs_uncompiled"].iloc[0] == pytest.approx(by_hand) and plain["speedup_vs_uncompiled"].isna().all()
    capsys.readouterr()
    assert main(["compare", str(out)]) == 0
    assert "vs uncompiled" in capsys.readouterr().out


def test_profile_refuses_an_unknown_compile_mode(tmp_path, capsys):
    from headcount.cli.main import main

    assert main(["profile", "--compile", "none,fast", "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--compile none,fast: unknown mode fast" in err and "none, default" in err
