"""Head mode's split, bit for bit (issue 16): query heads that share a
key/value head (multi-query Falcon, GPT-BigCode), per-head module tensors the
attention function broadcasts (gpt-oss's sinks in test_tagging.py,
Granite-SWA's here), and the backward ranges of a layer-mode call whose
attention reads the hidden states more than once (Inkling2) or whose key and
value are another layer's (Gemma3n's shared key/value cache)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import train_step

from headcount import AttentionTagger
from headcount.tagging.head_split import grouped_heads
from headcount.tagging.tagger import head_order

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import attention_coverage  # noqa: E402


def _equal(a, b) -> list[str]:
    """The names whose gradients differ (empty: bit for bit the same), logits first."""
    bad = [] if torch.equal(a[0], b[0]) else ["logits"]
    return bad + [k for k in a[1] if not torch.equal(a[1][k], b[1][k])] + sorted(a[1].keys() ^ b[1].keys())


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 8])
def test_grouped_heads_sum_a_group_as_repeat_kv_does(groups):
    """The gradient of a key/value head shared by ``groups`` query heads equals,
    bit for bit, the one transformers' ``repeat_kv`` (expand + reshape) gives."""
    from transformers.models.llama.modeling_llama import repeat_kv

    torch.manual_seed(groups)
    key = torch.randn(2, 2, 33, 16, requires_grad=True)
    upstream = torch.randn(2, 2 * groups, 33, 16)
    (repeat_kv(key, groups) * upstream).sum().backward()
    fused = key.grad.clone()
    key.grad = None
    heads = grouped_heads(key, 1, groups)
    assert len(heads) == 2 * groups and all(torch.equal(h, key[:, i // groups : i // groups + 1]) for i, h in enumerate(heads))
    # the heads' gradients arrive one by one, as in head mode
    sum((h * upstream[:, i : i + 1]).sum() for i, h in enumerate(heads)).backward()
    assert torch.equal(fused, key.grad)


def test_multi_query_falcon_with_alibi_head_mode_is_the_fused_model():
    """Falcon with ALiBi (its position bias rides in the mask) and one key/value
    head for 4 query heads: layer and head mode give every (phase, layer) and
    every head, with outputs and gradients bit for bit unchanged."""
    torch.manual_seed(0)
    model = T.FalconForCausalLM(T.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               alibi=True, new_decoder_architecture=False, multi_query=True)).eval()
    ids = torch.randint(2, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = train_step(model, input_ids=ids, labels=ids)
    for mode in ("layer", "head"):
        with AttentionTagger([model], mode=mode) as tagger:
            tagged = train_step(model, input_ids=ids, labels=ids)
        assert _equal(reference, tagged) == [], mode
        assert {(c.phase, c.layer_name) for c in tagger.calls} == {(p, f"layer.{i}") for p in ("fwd", "bwd") for i in range(2)}
    assert {(c.phase, c.layer_name, c.head) for c in tagger.calls if c.head is not None} == {
        (p, f"layer.{i}", h) for p in ("fwd", "bwd") for i in range(2) for h in range(4)}
    assert {c.kv_head for c in tagger.calls if c.head is not None} == {0}


@pytest.mark.parametrize("family", ["granite_swa", "gpt_bigcode", "inkling2_text"])
def test_families_that_differed_are_now_the_fused_model(family):
    """Granite-SWA broadcasts its sinks inside a subtraction; GPT-BigCode is
    multi-query; Inkling2's attention module reads the hidden states six times
    (identity functions on q/k/v reordered the sum of their gradients in layer
    mode). Each, in both modes: bit for bit the untagged model, ranges nested."""
    outcome = attention_coverage.try_family(family)
    assert outcome.deterministic is True, outcome.detail
    assert outcome.layer_exact is True and outcome.head == "exact", outcome.detail
    assert outcome.nested is True


def _gemma3n_shared_kv():
    config = T.Gemma3nTextConfig(
        vocab_size=128, vocab_size_per_layer_input=128, hidden_size=64, hidden_size_per_layer_input=8, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8, laurel_rank=4, altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * 4)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return T.Gemma3nForCausalLM(config).eval()


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_shared_key_value_layers_close_their_backward_range_in_time(mode):
    """Gemma3n's last two layers attend over the keys and values of two earlier
    layers (the same tensors). Their gradients complete only after the earlier
    layer's backward, so a range waiting on them would stay open across the
    layers in between: each bwd range must hold its own layer only."""
    model = _gemma3n_shared_kv()
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = train_step(model, input_ids=ids, labels=ids)
    tagger = AttentionTagger([model], mode=mode)
    tagger.emitter = recorder = attention_coverage._Recorder()
    with tagger:
        tagged = train_step(model, input_ids=ids, labels=ids)
    assert attention_coverage.ranges_nested(recorder), [p for p in recorder.opened if len(p) > 2 and not p[2].startswith("head.")]
    bwd = [p[1] for p in recorder.opened if p[0] == "bwd" and len(p) == 2]
    assert bwd == ["layer.3", "layer.2", "layer.1", "layer.0"]
    if mode == "layer":
        assert _equal(reference, tagged) == []


def test_a_failure_inside_the_split_is_one_headcount_error_naming_the_features():
    """An attention function that cannot run on one head (registered under its
    own name, as a user or a kernel library would) fails head mode with a
    HeadcountError naming the call's features, never the function's raw
    exception; the model is unchanged and runs as before afterwards."""
    from conftest import inputs_for, llama_model
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from headcount.common.errors import HeadcountError

    def needs_every_head(module, query, key, value, attention_mask, **kwargs):
        if query.shape[1] == 1:
            raise RuntimeError("this kernel needs at least two heads")
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("needs_every_head", needs_every_head)
    model = llama_model("sdpa")
    model.config._attn_implementation = "needs_every_head"
    inputs = inputs_for("llama_gqa")
    reference = train_step(model, input_ids=inputs["input_ids"], labels=inputs["input_ids"])
    with pytest.raises(HeadcountError) as caught:
        with AttentionTagger([model], mode="head"):
            train_step(model, input_ids=inputs["input_ids"], labels=inputs["input_ids"])
    text = caught.value.one_line()
    assert "LlamaAttention: head mode could not compute head 0 alone (grouped key/value heads)" in text
    assert "RuntimeError: this kernel needs at least two heads" in text and "--mode layer" in text
    assert _equal(reference, train_step(model, input_ids=inputs["input_ids"], labels=inputs["input_ids"])) == []
    with AttentionTagger([model]) as tagger:  # layer mode works on it
        assert _equal(reference, train_step(model, input_ids=inputs["input_ids"], labels=inputs["input_ids"])) == []
    assert {c.phase for c in tagger.calls} == {"fwd", "bwd"}


def test_a_per_head_bias_followed_through_copies_and_in_place_ops_stays_exact():
    """A hand-registered attention function that reads a per-head tensor from
    the module (a learned logit bias per head), copies it, scales it in place,
    goes through ``1.0 - …`` and indexing, casts and reshapes it, and adds it
    to the scores in place, by broadcasting: head
    mode follows the head's slice through all of that, never applies the
    in-place op to the module's tensor, and gives the fused model's numbers
    bit for bit, the bias's gradient included."""
    from conftest import inputs_for, llama_model
    from transformers import AttentionInterface
    from transformers.models.llama.modeling_llama import repeat_kv

    def biased(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
        bias = module.head_bias.clone()
        bias.mul_(0.5)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        bias = (1.0 - (1.0 - bias))[None]  # Python's reflected operator and indexing: followed like any other op
        scores += bias.float().view(1, -1, 1, 1)  # broadcast in place (Granite-SWA's is out of place)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    AttentionInterface.register("biased_heads", biased)
    model = llama_model("eager")
    model.config._attn_implementation = "biased_heads"
    torch.manual_seed(3)
    for layer in model.model.layers:
        layer.self_attn.head_bias = torch.nn.Parameter(torch.randn(model.config.num_attention_heads))
    ids = inputs_for("llama_gqa")["input_ids"]
    reference = train_step(model, input_ids=ids, labels=ids)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with AttentionTagger([model], mode="head") as tagger:
        split = train_step(model, input_ids=ids, labels=ids)
    assert _equal(reference, split) == [] and any(k.endswith("head_bias") for k in split[1])
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters())
    assert {c.head for c in tagger.calls if c.head is not None} == set(range(model.config.num_attention_heads))


def test_each_call_of_a_layer_draws_its_head_order_and_stays_the_fused_model():
    """The first head a call computes (and the last, whose backward runs first) pays for warm-up: each call of a
    layer draws its own order of heads (reproducibly, balanced over each 4 calls), so position cannot pass for a head. Forward and backward
    orders change from call to call; outputs and gradients stay bit for bit those of the fused model (grouped
    key/value heads included)."""
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2)
    model = T.LlamaForCausalLM(config).eval()
    ids = torch.randint(2, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = [train_step(model, input_ids=ids, labels=ids) for _ in range(6)]
    with AttentionTagger([model], mode="head") as tagger:
        tagged = [train_step(model, input_ids=ids, labels=ids) for _ in range(6)]
    assert all(_equal(r, t) == [] for r, t in zip(reference, tagged))

    def orders(phase: str) -> list[list[int]]:
        heads = [c.head for c in tagger.calls if c.layer_name == "layer.0" and c.phase == phase and c.head is not None]
        return [heads[i:i + 4] for i in range(0, len(heads), 4)]

    forward = orders("fwd")
    assert forward == [head_order("layer.0", k, 4) for k in range(6)]  # the drawn orders, in call order
    assert all(sorted(o) == [0, 1, 2, 3] for o in forward) and len({tuple(o) for o in forward}) >= 4
    assert all(sorted(o[place] for o in forward[:4]) == [0, 1, 2, 3] for place in range(4))  # 4 calls: each head once at each place
    assert len({tuple(o) for o in orders("bwd")}) >= 4  # the backward order changes with it
