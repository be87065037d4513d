"""Per-head attention statistics, against the weights eager attention returns."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import bert_model, gpt2_model, llama_model, t5_model

from headcount import AttentionProfiler
from headcount.tagging.attention_stats import STATS, head_statistics, probabilities, sample_rows


def _expected(attentions, top_k=5):
    """The statistics from eager's returned weights (B, H, Q, K), per layer and head."""
    out = {}
    for layer, w in enumerate(attentions):
        w = w.double()
        allowed = w > 0
        logw = torch.where(w > 0, w.log(), torch.zeros_like(w))
        entropy = -(w * logw).sum(-1)
        n = allowed.sum(-1).clamp_min(1).double()
        normalized = torch.where(n > 1, entropy / n.log(), torch.zeros_like(entropy))
        stats = {"entropy_nats": entropy, "normalized_entropy": normalized, "max_attention": w.max(-1).values,
                 "top_k_mass": w.topk(min(top_k, w.shape[-1]), dim=-1).values.sum(-1), "effective_tokens": entropy.exp()}
        for name, value in stats.items():
            for h, v in enumerate(value.mean(dim=(0, 2)).tolist()):
                out[(layer, h, name)] = v
    return out


@pytest.mark.parametrize("build,inputs", [
    (lambda: llama_model("eager"), lambda: {"input_ids": torch.randint(0, 64, (2, 12))}),                      # causal, GQA
    (lambda: bert_model("eager"), lambda: {"input_ids": torch.randint(0, 64, (2, 12)),
                                      "attention_mask": torch.tensor([[1] * 12, [1] * 7 + [0] * 5])}),   # padding
    (lambda: gpt2_model("eager"), lambda: {"input_ids": torch.randint(0, 64, (2, 12))}),
])
def test_statistics_match_eager_weights(build, inputs):
    model = build().eval()
    batch = inputs()
    with torch.no_grad():
        reference = model(**batch, output_attentions=True).attentions
    prof = AttentionProfiler(model, attention_stats={"rows": None})
    with prof, torch.no_grad():
        model(**batch)
    stats = prof.get_stats()["attention_stats"]
    expected = _expected(reference)
    assert len(stats) == len(reference) * reference[0].shape[1]
    for row in stats.itertuples(index=False):
        for name in STATS:
            assert getattr(row, name) == pytest.approx(expected[(int(row.layer), int(row.head), name)], abs=1e-5), (row.layer, row.head, name)


def test_t5_position_bias_arrives_in_the_mask():
    model = t5_model("eager").eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=ids[:, :6], output_attentions=True)
    prof = AttentionProfiler(model, attention_stats={"rows": None})
    with prof, torch.no_grad():
        model(input_ids=ids, decoder_input_ids=ids[:, :6])
    stats = prof.get_stats()["attention_stats"]
    enc = stats[stats["layer_name"].str.startswith("encoder")]
    expected = _expected(out.encoder_attentions)
    for row in enc.itertuples(index=False):
        assert row.entropy_nats == pytest.approx(expected[(int(row.layer), int(row.head), "entropy_nats")], abs=1e-5)


def test_known_distributions():
    q = torch.zeros(1, 2, 4, 8)
    k = torch.randn(1, 2, 4, 8)
    probs, allowed = probabilities(q, k)  # q = 0: uniform over 4 keys
    stats = head_statistics(probs, allowed, top_k=2)
    assert stats["entropy_nats"].tolist() == pytest.approx([math.log(4)] * 2)
    assert stats["normalized_entropy"].tolist() == pytest.approx([1.0, 1.0])
    assert stats["effective_tokens"].tolist() == pytest.approx([4.0, 4.0]) and stats["top_k_mass"].tolist() == pytest.approx([0.5, 0.5])
    probs, allowed = probabilities(q, k, causal=True)  # row i sees i + 1 keys
    stats = head_statistics(probs, allowed)
    assert stats["entropy_nats"][0].item() == pytest.approx(sum(math.log(i) for i in range(1, 5)) / 4)
    assert sample_rows(100, 5).tolist() == [0, 25, 50, 74, 99] and sample_rows(3, 64).tolist() == [0, 1, 2]


def test_statistics_are_off_by_default_and_saved_when_on(tmp_path):
    import pandas as pd

    model = llama_model("sdpa")
    ids = torch.randint(0, 64, (1, 8))
    prof = AttentionProfiler(model)
    with prof:
        model(input_ids=ids)
    assert "attention_stats" not in prof.get_stats()
    prof = AttentionProfiler(model, attention_stats={"rows": 4})
    with prof:
        model(input_ids=ids, labels=ids).loss.backward()
    stats = prof.get_stats()["attention_stats"]
    assert (stats["rows_per_call"] == 4).all() and (stats["calls"] == 1).all()  # forward calls only
    assert set(stats["kv_head"]) == {0, 1}
    out = prof.save(tmp_path / "r")
    assert len(pd.read_parquet(out / "attention_stats")) == len(stats)


def test_statistics_leave_no_operator_in_the_trace():
    """The statistics' operators run with record_function off: the window's torch.profiler trace holds
    none of them (topk is theirs alone in BERT), and every operator after them is recorded as before."""
    import gzip
    import json

    model = bert_model("sdpa")
    ids = torch.randint(0, 64, (2, 12))

    def operators(attention_stats):
        model.zero_grad(set_to_none=True)  # the same backward both times (no gradient to accumulate into)
        prof = AttentionProfiler(model, backend="torch", attention_stats=attention_stats)
        with prof:
            model(input_ids=ids, labels=ids).loss.backward()
        path = prof.recording().path
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as file:
            names = [e["name"] for e in json.load(file)["traceEvents"] if e.get("cat") == "cpu_op"]
        return prof, sorted(names)

    without, plain = operators(False)
    with_stats, observed = operators({"rows": 4})
    assert len(with_stats.get_stats()["attention_stats"]) == 2 * 4  # the statistics were computed: 2 layers × 4 heads
    assert "aten::topk" not in observed
    assert observed == plain  # the same operators, none lost after the statistics turned record_function back on
    assert torch.autograd._profiler_enabled() is False
