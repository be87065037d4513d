"""Tagging: range names, backward and recompute phases, head mode equality, untag."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import MODEL_BUILDERS, inputs_for, llama_model, train_step

from headcount import AttentionTagger, attention_range, tag, tag_attention, untag
from headcount.common.errors import HeadcountError
from headcount.common.naming import parse_path, sanitize
from headcount.tagging.layer_names import layer_names
from headcount.tagging.tagger import head_order


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(MODEL_BUILDERS))
def test_head_mode_equals_fused_exactly(name, impl):
    """Head mode computes one head at a time; in fp32 on CPU the outputs and
    every parameter gradient are bit-for-bit those of the fused model."""
    model = MODEL_BUILDERS[name](impl)
    inputs = inputs_for(name)
    ref_logits, ref_grads = train_step(model, **inputs)
    with AttentionTagger([model], mode="head") as tagger:
        logits, grads = train_step(model, **inputs)
    assert torch.equal(ref_logits, logits)
    assert ref_grads.keys() == grads.keys() and len(grads) > 0
    for key in ref_grads:
        assert torch.equal(ref_grads[key], grads[key]), key
    heads = [c for c in tagger.calls if c.head is not None]
    assert {c.phase for c in heads} == {"fwd", "bwd"}


def test_llama_gqa_head_mode_ranges():
    model = llama_model("sdpa", layers=2, heads=4, kv_heads=2)
    with AttentionTagger([model], mode="head") as tagger:
        train_step(model, **inputs_for("llama_gqa"))
    calls = tagger.calls
    layer_calls = [(c.phase, c.layer_name) for c in calls if c.head is None]
    assert layer_calls == [("fwd", "layer.0"), ("fwd", "layer.1"), ("bwd", "layer.1"), ("bwd", "layer.0")]
    fwd_heads = [(c.layer_name, c.head, c.kv_head) for c in calls if c.head is not None and c.phase == "fwd"]
    # each call computes its heads in its drawn order (tagger.head_order), each with its GQA key/value head
    assert fwd_heads == [(f"layer.{i}", h, h // 2) for i in range(2) for h in head_order(f"layer.{i}", 0, 4)]
    # backward heads run in reverse order, inside their layer
    bwd_heads = [(c.layer_name, c.head) for c in calls if c.head is not None and c.phase == "bwd"]
    assert bwd_heads == [(f"layer.{i}", h) for i in (1, 0) for h in reversed(head_order(f"layer.{i}", 0, 4))]
    assert all(c.shape.q_heads == 4 and c.shape.kv_heads == 2 for c in calls if c.head is None)
    assert all(c.shape.q_heads == 1 and c.shape.kv_heads == 1 for c in calls if c.head is not None)


def test_t5_stacks_and_cross_attention_get_distinct_names():
    model = MODEL_BUILDERS["t5"]("eager")
    with AttentionTagger([model]) as tagger:
        train_step(model, **inputs_for("t5"))
    names = {c.layer_name for c in tagger.calls}
    assert names == {"encoder.layer.0", "encoder.layer.1", "decoder.layer.0.self", "decoder.layer.0.cross",
                     "decoder.layer.1.self", "decoder.layer.1.cross"}
    cross = [c for c in tagger.calls if c.layer_name.endswith("cross") and c.phase == "fwd"]
    assert cross and all(c.shape.q_len == 8 and c.shape.kv_len == 16 and not c.shape.causal for c in cross)
    self_dec = [c for c in tagger.calls if c.layer_name.endswith("self") and c.phase == "fwd"]
    assert all(c.shape.causal for c in self_dec)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_layer_names_single_stack(name):
    model = MODEL_BUILDERS[name]("sdpa")
    with AttentionTagger([model]) as tagger:
        train_step(model, **inputs_for(name))
    assert {c.layer_name for c in tagger.calls} == {"layer.0", "layer.1"}


def test_layer_names_rules():
    class M:
        pass

    names = layer_names({"encoder.block.0.layer.0.SelfAttention": M(), "decoder.block.0.layer.0.SelfAttention": M(),
                         "decoder.block.0.layer.1.EncDecAttention": M()})
    assert names["encoder.block.0.layer.0.SelfAttention"] == ("encoder.layer.0", 0)
    assert names["decoder.block.0.layer.0.SelfAttention"] == ("decoder.layer.0.self", 0)
    assert names["decoder.block.0.layer.1.EncDecAttention"] == ("decoder.layer.0.cross", 0)
    for name, _ in names.values():
        assert "/" not in name and ":" not in name
    assert sanitize("a/b:c d") == "a_b_c_d"
    parsed = parse_path("bwd/decoder.layer.3.cross/head.7")
    assert (parsed.phase, parsed.layer_name, parsed.layer, parsed.head) == ("bwd", "decoder.layer.3.cross", 3, 7)


def test_untag_restores_everything(tiny_llama, llama_inputs):
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface.get_interface
    state = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    ref, _ = train_step(tiny_llama, **llama_inputs)
    tagger = tag(tiny_llama, mode="head", log_calls=True)
    assert AttentionInterface.get_interface is not original
    train_step(tiny_llama, **llama_inputs)
    untag(tagger)
    assert AttentionInterface.get_interface is original
    assert all(torch.equal(state[k], v) for k, v in tiny_llama.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in tiny_llama.modules())
    n = len(tagger.calls)
    assert n > 0
    again, _ = train_step(tiny_llama, **llama_inputs)
    assert len(tagger.calls) == n  # nothing tagged after untag
    assert torch.equal(ref, again)


def test_auto_mode_tags_any_transformers_model(llama_inputs):
    model = llama_model("eager")
    import torch.nn.modules.module as module_mod

    hooks_before = len(module_mod._global_forward_pre_hooks)
    with AttentionTagger(auto=True) as tagger:
        train_step(model, **llama_inputs)
    assert len(module_mod._global_forward_pre_hooks) == hooks_before
    assert {(c.phase, c.layer_name) for c in tagger.calls} >= {("fwd", "layer.0"), ("bwd", "layer.1")}


def test_unregistered_model_is_not_tagged(llama_inputs):
    tagged, other = llama_model(), llama_model()
    with AttentionTagger([tagged]) as tagger:
        train_step(other, **llama_inputs)
    assert tagger.calls == []


def test_inference_tags_forward_only(tiny_llama, llama_inputs):
    with AttentionTagger([tiny_llama]) as tagger, torch.no_grad():
        tiny_llama(**llama_inputs)
    assert [c.phase for c in tagger.calls] == ["fwd", "fwd"]


def test_activation_checkpointing_is_labelled_recompute(llama_inputs):
    model = llama_model("sdpa")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    with AttentionTagger([model]) as tagger:
        train_step(model, **llama_inputs)
    phases = [c.phase for c in tagger.calls]
    assert phases.count("fwd") == 2 and phases.count("recompute") == 2 and phases.count("bwd") == 2


class _UserAttention(torch.nn.Module):
    def __init__(self, heads=4, dim=32):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

        @tag_attention(layer=0, causal=True)
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        self.attend = attend

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.attend(q, k, v).transpose(1, 2).reshape(b, s, d)


def test_manual_api_tags_plain_sdpa_and_splits_heads():
    torch.manual_seed(0)
    module = _UserAttention()
    x = torch.randn(2, 8, 32)
    ref = module(x)
    ref.sum().backward()
    ref_grad = module.qkv.weight.grad.clone()
    module.zero_grad()
    with AttentionTagger(mode="head") as tagger:
        out = module(x)
        out.sum().backward()
    assert torch.equal(ref, out)
    assert torch.equal(ref_grad, module.qkv.weight.grad)
    assert [(c.phase, c.head) for c in tagger.calls if c.head is None] == [("fwd", None), ("bwd", None)]
    assert sorted(c.head for c in tagger.calls if c.head is not None and c.phase == "bwd") == [0, 1, 2, 3]
    assert tagger.calls[0].layer_name == "layer.0" and tagger.calls[0].shape.causal


def test_attention_range_context_manager():
    with AttentionTagger() as tagger:
        with attention_range("my_block"):
            pass
    assert [(c.phase, c.layer_name) for c in tagger.calls] == [("fwd", "my_block")]
    with attention_range("my_block"):  # inactive: a no-op
        pass


def test_bad_mode_and_layout():
    with pytest.raises(HeadcountError, match="unknown mode"):
        AttentionTagger(mode="heads")
    with pytest.raises(HeadcountError, match="layout"):
        tag_attention(layer=0, layout="sbhd")
    with pytest.raises(HeadcountError, match="torch.nn.Module"):
        AttentionTagger(["not a model"])


def test_flex_attention_forward_head_mode_equals_fused():
    """flex_attention (forward only on CPU): its BlockMask is shared by all heads, so head mode may split it."""
    model = llama_model("flex_attention")
    inputs = inputs_for("llama_gqa")
    with torch.no_grad():
        ref = model(**inputs).logits
        with AttentionTagger([model], mode="head") as tagger:
            out = model(**inputs).logits
    assert torch.equal(ref, out)
    assert {c.shape.implementation for c in tagger.calls} == {"flex_attention"}
    assert sorted({c.head for c in tagger.calls if c.head is not None}) == [0, 1, 2, 3]


def test_head_mode_splits_attention_sinks_bit_for_bit():
    """gpt-oss reads one sink logit per head from the module (``module.sinks``)
    and expands it to ``(batch, heads, queries, 1)``: head mode hands each head
    its slice of the whole expanded tensor, so that the sinks' gradient is
    summed with the fused call's strides. Outputs and every gradient, the
    sinks' included, are bit-for-bit the fused model's (issue 16)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                       max_position_embeddings=128, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg)
    inputs = inputs_for("llama_gqa")
    ref_logits, ref_grads = train_step(model, **inputs)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with AttentionTagger([model], mode="head") as tagger:
        logits, grads = train_step(model, **inputs)
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters())  # the sinks are read, never written
    assert torch.equal(ref_logits, logits)
    assert ref_grads.keys() == grads.keys() and any(k.endswith(".sinks") for k in grads)
    for key in ref_grads:
        assert torch.equal(ref_grads[key], grads[key]), key
    heads = {(c.phase, c.layer_name, c.head) for c in tagger.calls if c.head is not None}
    assert heads == {(phase, f"layer.{i}", h) for phase in ("fwd", "bwd") for i in range(2) for h in range(4)}
