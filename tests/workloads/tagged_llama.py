"""Workload recorded by the real nsys in tests/test_nsys.py.

A tiny Llama (2 layers, 4 query heads, 2 kv heads) runs STEPS training steps
(forward + backward) in head mode, each step inside a ``step.N`` range of the
``headcount.step`` domain.
"""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from headcount import AttentionTagger
from headcount.collector.naming import STEP_DOMAIN
from headcount.collector.ranges import RangeEmitter

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = LlamaForCausalLM(cfg)
ids = torch.randint(0, 128, (1, 8))
steps = RangeEmitter(domain=STEP_DOMAIN, torch_ranges=False)
with AttentionTagger([model], mode="head", torch_ranges=False):
    for i in range(STEPS):
        token = steps.push(f"step.{i}")
        model(input_ids=ids, labels=ids).loss.backward()
        steps.pop(token)
