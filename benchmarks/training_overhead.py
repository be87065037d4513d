"""What profiling every N steps costs a training loop (issue 29: goal ≤ 1.04× the loop untagged).

The loop of the issue: a 4-layer BERT (hidden 256, 4 heads, intermediate 1024),
batch 4, sequence 128, on the CPU, forward + backward + SGD step, 100 steps.
Variants, each its own process (what a user runs), alternating, five
rounds; each run of a variant comes between two runs of the untagged loop,
whose mean is its baseline (this machine's speed drifts by several per cent
within a minute), and the variants' order turns from round to round; the
median of each variant's ratios is reported:

- ``plain``: the loop, untagged;
- ``background``: ``StepProfiler(model, out, every=25)``, windows built and
  written by worker processes (the default: at idle priority first, at low
  priority (nice 19) when the queue is full, at normal priority at
  ``close()`` for what they cannot finish);
- ``normal``: the same with ``writer_priority="normal"`` (one worker that
  shares the CPU with the loop);
- ``in-loop``: the same with ``background=False`` (what the loop paid before).

The loop's wall time is timed apart from ``close()`` (which waits for the
windows still being written) and from making the ``StepProfiler`` (which
starts the workers, before the loop). Prints the ratios to ``plain``,
how many of the 4 windows were written and by which worker during the loop
(``idle``, ``low``, ``normal``; the rest at ``close()``), the workers' CPU
time during the loop, and their CPU time a
window (what the loop gives up where, as here, torch keeps every core busy,
unless the worker runs at idle priority).

First, what one profiled step costs and whose part it is (one process,
alternating, median of 15 steps each): untouched, under torch.profiler alone,
under headcount's profiler, and with its attention statistics.

Run: python benchmarks/training_overhead.py [--steps 100] [--every 25] [--rounds 5] [--threads N] [--queue N]
     [--variants background,normal,in-loop]
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


def _loop_model(threads: int | None = None):
    """The issue's model, optimizer and batch (``threads``: torch's intra-op threads; default torch's own)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                     max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    model = BertForMaskedLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(1))
    return model, opt, ids


def step_cost(rounds: int) -> dict:
    """One step's time untouched, under torch.profiler alone, under headcount's profiler (torch backend)
    and with its attention statistics: alternating, ``rounds`` each, medians in ms (what a profiled step
    costs, and whose part it is)."""
    from torch.profiler import ProfilerActivity, profile

    from headcount.api import AttentionProfiler

    model, opt, ids = _loop_model()

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    variants = {
        "untouched": lambda: None,
        "torch.profiler": lambda: profile(activities=[ProfilerActivity.CPU]),
        "headcount": lambda: AttentionProfiler(model, backend="torch"),
        "headcount + attention_stats": lambda: AttentionProfiler(model, backend="torch", attention_stats={"rows": 32}),
    }
    for _ in range(3):
        step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, make in variants.items():
            ctx = make()
            if ctx is not None:
                ctx.__enter__()
            t = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - t) * 1000)
            if ctx is not None:
                ctx.__exit__(None, None, None)
    return {name: statistics.median(values) for name, values in times.items()}


def _workers_cpu(sp) -> dict[str, float]:
    """CPU seconds each window-writer process has had so far, by kind (none without workers)."""
    from headcount.build.window_writer import _cpu_seconds

    if sp is None or sp.writer is None:
        return {}
    return {kind: _cpu_seconds(p.pid) or 0.0 for kind, p in sp.writer.processes.items()}


def one(variant: str, steps: int, every: int, out: Path, threads: int | None, queue: int = 2) -> dict:
    if variant == "step-cost":
        return step_cost(rounds=steps)
    model, opt, ids = _loop_model(threads)
    sp = None
    made_s = 0.0
    if variant != "plain":
        from headcount.training import StepProfiler

        t = time.perf_counter()
        sp = StepProfiler(model, out, every=every, background=variant != "in-loop", queue=queue,
                          writer_priority="normal" if variant == "normal" else "idle")  # starts the workers
        made_s = time.perf_counter() - t

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # one warm-up step, untimed, in every variant
    workers_cpu_before = _workers_cpu(sp)  # their start-up, left out
    t0 = time.perf_counter()
    for i in range(steps):
        if sp is None:
            step()
        else:
            with sp.step(i):
                step()
    loop_s = time.perf_counter() - t0
    in_loop = dict(sp.writer.written_by) if sp is not None and sp.writer is not None else {}
    workers_cpu_s = {kind: cpu - workers_cpu_before.get(kind, 0.0) for kind, cpu in _workers_cpu(sp).items()} \
        if sp is not None and sp.writer is not None else None
    t1 = time.perf_counter()
    if sp is not None:
        sp.close()
    close_s = time.perf_counter() - t1
    written = 0
    if sp is not None and (out / "runs").exists():
        import pandas as pd

        written = len(pd.read_parquet(out / "runs"))
    worker_cpu = sorted(sp.writer.cpu_seconds.values()) if sp is not None and sp.writer is not None else []
    by = {kind: sum(k == kind for k in in_loop.values()) for kind in ("idle", "low", "normal")}
    return {"variant": variant, "loop_s": loop_s, "close_s": close_s, "written": written, "made_s": made_s, "in_loop": by,
            "worker_cpu_s": statistics.median(worker_cpu) if worker_cpu else None, "workers_cpu_in_loop_s": workers_cpu_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the loop (default: torch's, every core); 1 leaves a core free, as a "
                             "GPU training process whose Python thread drives the GPU does")
    parser.add_argument("--queue", type=int, default=2, help="StepProfiler's queue (windows that may wait)")
    parser.add_argument("--variants", default="background,normal,in-loop",
                        help="which variants to run, comma-separated (default: all three)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.every, Path(args.out), args.threads, args.queue)))
        return
    done = subprocess.run([sys.executable, __file__, "--one", "step-cost", "--steps", "15", "--out", "-"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"step-cost failed: {done.stderr.strip()[-2000:]}")
    cost = json.loads(done.stdout.strip().splitlines()[-1])
    print("one step, median of 15 (ms): " + "; ".join(f"{name} {ms:.1f}" for name, ms in cost.items()))
    results: dict[str, list[dict]] = {}
    variants = tuple(v for v in args.variants.split(",") if v)
    if unknown := set(variants) - {"background", "normal", "in-loop"}:
        parser.error(f"--variants: unknown {', '.join(sorted(unknown))} (background, normal, in-loop)")

    def run(variant: str) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run([sys.executable, __file__, "--one", variant, "--steps", str(args.steps), "--every",
                                   str(args.every), "--out", str(Path(tmp) / "out"), "--queue", str(args.queue),
                                   *(["--threads", str(args.threads)] if args.threads else [])],
                                  capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{variant} failed: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    for r in range(args.rounds):
        # each variant between two untagged runs, its ratio to their mean (this machine's speed drifts within a
        # minute); the variants' order turns from round to round, so that none always follows another
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        before = run("plain")
        results.setdefault("plain", []).append(before)
        for variant in order:
            row, after = run(variant), run("plain")
            row["ratio"] = row["loop_s"] / statistics.mean([before["loop_s"], after["loop_s"]])
            results.setdefault(variant, []).append(row)
            results["plain"].append(after)
            before = after
    windows = len(range(0, args.steps, args.every))
    plain = sorted(r["loop_s"] for r in results["plain"])
    print(f"plain loop: {args.steps} steps in {statistics.median(plain):.2f} s (median of {len(plain)} runs, "
          f"{plain[0]:.2f} to {plain[-1]:.2f})")
    for variant in variants:
        rows = results[variant]
        ratio = statistics.median(r["ratio"] for r in rows)
        close = statistics.median(r["close_s"] for r in rows)
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in rows)
        made = statistics.median(r["made_s"] for r in rows)
        cpu = [r["worker_cpu_s"] for r in rows if r["worker_cpu_s"] is not None]
        worker = f"; worker CPU {statistics.median(cpu) * 1000:.0f} ms a window" if cpu else ""
        if variant != "in-loop":
            during = ", ".join("+".join(str(r["in_loop"][kind]) for kind in ("idle", "low", "normal")) for r in rows)
            worker += f"; written during the loop by the idle+low+normal-priority worker: {during}"
            kinds = sorted({kind for r in rows for kind in (r["workers_cpu_in_loop_s"] or {})})
            in_loop_cpu = ", ".join(f"{kind} {statistics.median(r['workers_cpu_in_loop_s'].get(kind, 0.0) for r in rows) * 1000:.0f}"
                                    for kind in kinds)
            if in_loop_cpu:
                worker += f"; the workers' CPU during the loop (ms, median): {in_loop_cpu}"
        print(f"{variant}: loop {ratio:.3f}× plain, median of its rounds ({ratios}); "
              f"close() {close:.2f} s; StepProfiler() {made:.2f} s; windows written {[r['written'] for r in rows]} "
              f"of {windows}{worker}")

if __name__ == "__main__":
    main()
