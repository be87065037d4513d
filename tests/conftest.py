"""Shared test fixtures: tiny models built from configs (no hub access)."""

# ruff: noqa: E402 - headcount is imported before torch, on purpose
from __future__ import annotations

from headcount.collector import cupti_home

# the cupti source's own cupti-python and libcupti (`headcount cupti install`, run by make setup), before torch and
# before any test imports cupti: a CUDA torch then loads the folder's libcupti, and tests see what the product loads
cupti_home.put_first()
cupti_home.activate()

import os

import pytest
import torch
from hypothesis import settings

# Property tests draw the same examples on every run (CI included), so a failure
# is reproducible; HYPOTHESIS_PROFILE=explore draws new ones.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def llama_model(impl: str = "sdpa", layers: int = 2, heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def bert_model(impl: str = "sdpa"):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=128)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return BertForMaskedLM(cfg)


def gpt2_model(impl: str = "sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def t5_model(impl: str = "sdpa"):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return T5ForConditionalGeneration(cfg)


MODEL_BUILDERS = {"llama_gqa": llama_model, "bert": bert_model, "gpt2": gpt2_model, "t5": t5_model}


def train_step(model, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training step from zeroed gradients: the logits and every parameter's gradient (copies)."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return out.logits.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def profiled(model, mode: str = "layer", steps: int = 1, inputs: dict | None = None, **kw):
    """``AttentionProfiler(model, mode, **kw)`` around ``steps`` forward+backward steps (``inputs``: llama's by default)."""
    from headcount import AttentionProfiler

    inputs = inputs if inputs is not None else inputs_for("llama_gqa")
    prof = AttentionProfiler(model, mode=mode, **kw)
    with prof:
        for _ in range(steps):
            out = model(**inputs)
            out.loss.backward()
    return prof


def inputs_for(name: str, batch: int = 2, seq: int = 16) -> dict:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 128, (batch, seq), generator=gen)
    if name == "t5":
        return {"input_ids": ids, "labels": ids[:, : seq // 2].contiguous()}
    if name == "bert":
        mask = torch.ones_like(ids)
        mask[0, -3:] = 0  # padding: the mask differs per batch row
        return {"input_ids": ids, "attention_mask": mask, "labels": ids}
    return {"input_ids": ids, "labels": ids}


@pytest.fixture
def tiny_llama():
    return llama_model()


@pytest.fixture
def llama_inputs():
    return inputs_for("llama_gqa")


@pytest.fixture
def nsight_path(monkeypatch):
    """PATH with the real nsys and ncu (and this venv's python, torchrun) first."""
    import sys
    from pathlib import Path

    from tests.nsight import nsight_bin

    tools = Path(nsight_bin("nsys")).parent
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("HEADCOUNT_NSYS", raising=False)
    return tools
