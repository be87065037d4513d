"""The tiny Llama the test workloads train: 2 layers, 4 query heads sharing 2
key/value heads (GQA), hidden 64, sdpa attention, seed 0."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 128):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)
