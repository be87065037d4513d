"""A training loop that prints ``step N`` after each step and runs until it is interrupted (for the tests of
Ctrl-C under ``headcount run``; a bound of 100,000 steps keeps a forgotten one from running for ever).

With ``--ignore-sigint`` it ignores SIGINT (a program that will not stop: only a kill ends it).
"""

import argparse
import signal

import torch
from tiny_llama import tiny_llama

p = argparse.ArgumentParser()
p.add_argument("--ignore-sigint", action="store_true")
args = p.parse_args()
if args.ignore_sigint:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
model = tiny_llama()
ids = torch.randint(0, 128, (2, 16))
for step in range(100_000):
    model(input_ids=ids, labels=ids).loss.backward()
    print(f"step {step}", flush=True)
