"""A plain training script that knows nothing of headcount (for `headcount run` tests).

A tiny Llama (2 layers, 4 query heads, 2 kv heads) trains STEPS steps on CPU.
With ``--ddp`` it runs under torchrun with the gloo backend (DistributedDataParallel).
With ``--sdpa-outside`` it also calls F.scaled_dot_product_attention itself once a step.
With ``--fail`` it raises after the last step (a crashing program).
With ``--compile`` the model runs under ``torch.compile`` (Inductor; the first step compiles).
"""

import argparse
import os

import torch
import torch.nn.functional as F
from tiny_llama import tiny_llama

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--ddp", action="store_true")
p.add_argument("--sdpa-outside", action="store_true")
p.add_argument("--fail", action="store_true")
p.add_argument("--exit", type=int, default=0)
p.add_argument("--compile", action="store_true")
args = p.parse_args()

if args.ddp:
    torch.distributed.init_process_group("gloo")
model = tiny_llama()
if args.ddp:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
if args.compile:
    model = torch.compile(model)
ids = torch.randint(0, 128, (2, 16))
for step in range(args.steps):
    loss = model(input_ids=ids, labels=ids).loss
    if args.sdpa_outside:
        q = torch.randn(1, 2, 8, 16, requires_grad=True)
        loss = loss + F.scaled_dot_product_attention(q, q, q).sum() * 0
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"trained {args.steps} steps (rank {os.environ.get('RANK', '-')})", flush=True)
if args.fail:
    raise RuntimeError("the program failed on purpose")
if args.ddp:
    torch.distributed.destroy_process_group()
raise SystemExit(args.exit)
