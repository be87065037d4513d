"""A training script whose aten operators "launch kernels" on the replayed GPU
of tests/cupti_replay.py (for `headcount run --backend cupti` on CPU).
It knows nothing of headcount; the replay is the process's GPU."""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import cupti_replay

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = LlamaForCausalLM(cfg)
ids = torch.randint(0, 128, (2, 16))
replay, _ = cupti_replay.factory()
for _ in range(steps):
    with cupti_replay.LaunchOnEveryOp(replay):
        model(input_ids=ids, labels=ids).loss.backward()
print(f"launched {replay.launches} replayed kernels")
