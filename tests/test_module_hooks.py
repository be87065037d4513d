"""Models whose attention bypasses transformers' attention interface (Bloom,
MPT, DeBERTa-v2; Falcon goes through it, with or without ALiBi: see
test_head_split.py for its head mode): tagged through module hooks in layer
mode, outputs and gradients unchanged; head mode refused with one line
(issue 16)."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import train_step

from headcount import AttentionProfiler, AttentionTagger
from headcount.common.errors import HeadcountError


def _tiny(family: str):
    torch.manual_seed(0)
    if family == "falcon":
        return T.FalconForCausalLM(T.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                  alibi=False, new_decoder_architecture=False, multi_query=True))
    if family == "bloom":
        return T.BloomForCausalLM(T.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4))
    if family == "mpt":
        return T.MptForCausalLM(T.MptConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=64))
    return T.DebertaV2ForMaskedLM(T.DebertaV2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128, max_position_embeddings=64))


@pytest.mark.parametrize("family, path", [("falcon", "attention interface"), ("bloom", "module hooks"),
                                          ("mpt", "module hooks"), ("debertav2", "module hooks")])
def test_layer_mode_tags_every_layer_and_changes_nothing(family, path):
    model = _tiny(family).eval()  # no dropout: two steps must compute the same numbers
    ids = torch.randint(2, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_grads = train_step(model, input_ids=ids, labels=ids)
    with AttentionTagger([model]) as tagger:
        logits, grads = train_step(model, input_ids=ids, labels=ids)
    assert torch.equal(ref_logits, logits)
    assert ref_grads.keys() == grads.keys() and all(torch.equal(ref_grads[k], grads[k]) for k in ref_grads)
    assert {(c.phase, c.layer_name) for c in tagger.calls} == {(p, f"layer.{i}") for p in ("fwd", "bwd") for i in range(2)}
    assert tagger.paths == {type(model).__name__: path}
    assert all("forward" not in vars(m) for m in model.modules())  # the wrappers are gone after the block


@pytest.mark.parametrize("family", ["bloom", "mpt", "debertav2"])
def test_head_mode_is_refused_in_one_line_before_the_forward(family, capsys):
    model = _tiny(family)
    with pytest.raises(HeadcountError, match="does not go through transformers' attention interface, so head mode"):
        AttentionTagger([model], mode="head")
    prof = AttentionProfiler(model, mode="head")
    ids = torch.randint(2, 128, (2, 16))
    with prof:  # not strict: one line, and the user's step still runs
        model(input_ids=ids, labels=ids).loss.backward()
    err = [line for line in capsys.readouterr().err.splitlines() if "head mode cannot" in line]
    assert len(err) == 1 and "--mode layer" in err[0]
    with pytest.raises(HeadcountError, match="nothing was recorded"):
        prof.get_stats()


def test_the_profiler_reports_a_hooked_model_and_says_how_it_was_tagged():
    model = _tiny("bloom")
    ids = torch.randint(2, 128, (2, 16))
    with AttentionProfiler(model) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    layers = prof.get_stats()["layers"]
    assert set(zip(layers["phase"], layers["layer"])) == {(p, i) for p in ("fwd", "bwd") for i in range(2)}
    assert (layers["calls"] == 1).all() and layers["flop"].gt(0).all()
    assert prof.run_metadata()["tagged_through"] == {"BloomForCausalLM": "module hooks"}


def test_a_model_found_while_running_is_hooked_too():
    """``AttentionProfiler()`` with no model: Bloom is found at its first forward
    and its attention modules are wrapped before they run."""
    model = _tiny("bloom")
    ids = torch.randint(2, 128, (2, 16))
    with AttentionProfiler() as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    layers = prof.get_stats()["layers"]
    assert set(zip(layers["phase"], layers["layer"])) == {(p, i) for p in ("fwd", "bwd") for i in range(2)}
    assert all("forward" not in vars(m) for m in model.modules())
