"""What profiling every N steps costs a training loop (issue 29: goal ≤ 1.04× the loop untagged).

The loop of the issue: a 4-layer BERT (hidden 256, 4 heads, intermediate 1024),
batch 4, sequence 128, on the CPU, forward + backward + SGD step, 100 steps.
Three variants, each its own process (what a user runs), alternating, three
rounds, medians reported:

- ``plain``: the loop, untagged;
- ``background``: ``StepProfiler(model, out, every=25)``, windows built and
  written by a worker process (the default);
- ``in-loop``: the same with ``background=False`` (what the loop paid before).

The loop's wall time is timed apart from ``close()`` (which waits for the
windows still being written). Prints the ratios to ``plain`` and how many of
the 4 windows were written.

Run: python benchmarks/training_overhead.py [--steps 100] [--every 25] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(variant: str, steps: int, every: int, out: Path) -> dict:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                     max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    model = BertForMaskedLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(1))
    sp = None
    if variant != "plain":
        from headcount.training import StepProfiler

        sp = StepProfiler(model, out, every=every, background=variant == "background")

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # one warm-up step, untimed, in every variant
    t0 = time.perf_counter()
    for i in range(steps):
        if sp is None:
            step()
        else:
            with sp.step(i):
                step()
    loop_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if sp is not None:
        sp.close()
    close_s = time.perf_counter() - t1
    written = 0
    if sp is not None and (out / "runs").exists():
        import pandas as pd

        written = len(pd.read_parquet(out / "runs"))
    return {"variant": variant, "loop_s": loop_s, "close_s": close_s, "written": written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.every, Path(args.out))))
        return
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):  # alternating, so that a slow spell of the machine hits every variant alike
        for variant in ("plain", "background", "in-loop"):
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run([sys.executable, __file__, "--one", variant, "--steps", str(args.steps), "--every",
                                       str(args.every), "--out", str(Path(tmp) / "out")], capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{variant} failed: {done.stderr.strip()[-2000:]}")
                results.setdefault(variant, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    plain = statistics.median(r["loop_s"] for r in results["plain"])
    windows = len(range(0, args.steps, args.every))
    runs = ", ".join(f"{r['loop_s']:.2f}" for r in results["plain"])
    print(f"plain loop: {plain:.2f} s for {args.steps} steps (median of {runs})")
    for variant in ("background", "in-loop"):
        rows = results[variant]
        loop = statistics.median(r["loop_s"] for r in rows)
        close = statistics.median(r["close_s"] for r in rows)
        ratios = ", ".join(f"{r['loop_s'] / plain:.3f}" for r in rows)
        print(f"{variant}: loop {loop:.2f} s = {loop / plain:.3f}× plain (runs {ratios}); "
              f"close() {close:.2f} s; windows written {[r['written'] for r in rows]} of {windows}")


if __name__ == "__main__":
    main()
