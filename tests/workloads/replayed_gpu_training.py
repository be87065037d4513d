"""A training script whose aten operators "launch kernels" on the replayed GPU
of tests/cupti_replay.py (for `headcount run --backend cupti` on CPU).
It knows nothing of headcount; the replay is the process's GPU."""

import sys

import cupti_replay
import torch
from tiny_llama import tiny_llama

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model = tiny_llama()
ids = torch.randint(0, 128, (2, 16))
replay = cupti_replay.factory()[0]
for step in range(steps):
    with cupti_replay.LaunchOnEveryOp(replay):
        model(input_ids=ids, labels=ids).loss.backward()
    print(f"step {step}", flush=True)
print(f"launched {replay.launches} replayed kernels")
