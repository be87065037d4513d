"""Workload recorded by the real nsys in tests/test_nsys.py.

A tiny Llama (2 layers, 4 query heads, 2 kv heads) runs STEPS training steps
(forward + backward) in head mode, each step inside a ``step.N`` range of the
``headcount.step`` domain.
"""

import sys

import torch
from tiny_llama import tiny_llama

from headcount import AttentionTagger
from headcount.common.naming import STEP_DOMAIN
from headcount.tagging.ranges import RangeEmitter

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

model = tiny_llama()
ids = torch.randint(0, 128, (1, 8))
steps = RangeEmitter(domain=STEP_DOMAIN, torch_ranges=False)
with AttentionTagger([model], mode="head", torch_ranges=False):
    for i in range(STEPS):
        token = steps.push(f"step.{i}")
        model(input_ids=ids, labels=ids).loss.backward()
        steps.pop(token)
