"""A CPU-only program with a repeated unit, to record before/after pairs with nsys.

A stack of 8 small transformer-like layers (pre-norm attention through
``torch.nn.functional.scaled_dot_product_attention`` + an MLP) runs forward on the
CPU for ``--iters`` passes.  Each layer's forward is wrapped in an NVTX push/pop
range named like torchtitan's module hooks, ``layers.0`` … ``layers.7`` (package
``nvtx``, default domain).  There are NO step ranges (no ProfilerStep, nothing
named "step"): the only repeated unit is the layer.

``--extra-work F`` adds a known amount of CPU work inside every layer's range:
after the layer's own forward, the layer busy-waits (``time.perf_counter_ns``
spin, no sleep) for F x the time that layer's forward just took, so each range
lasts (1 + F) x its own time.  With F = 0.25 the range and the period of the unit
(start of ``layers.N+1`` minus start of ``layers.N``) grow by about +25 % (a bit
less for the period, which also holds the short gap between two ranges).

Before the recorded passes, ``--warmup`` passes run with no NVTX ranges at all.
torch runs with one intra-op thread, so every range is on the main thread.

Recorded on a CPU machine with nsys 2023.4.4 (``bash ../shared/tools/install-nsight.sh
/tmp/nsight``; nvtx==0.2.11, the version pinned in the venv: later nvtx
packages emit ranges that nsys 2023.4.4 does not record).  nsys writes the
profiled process's whole environment into the report (META_DATA_CAPTURE,
TARGET_INFO_SYSTEM_ENV), so it runs under ``env -i`` with a minimal one::

    N="env -i PATH=/usr/bin:/bin HOME=/tmp /tmp/nsight/bin/nsys"
    F=tests/fixtures/nsys
    for name in base base2; do
      $N profile -t nvtx --sample=none --cpuctxsw=none --force-overwrite=true \\
         -o /tmp/cpu_layers_$name .venv/bin/python scripts/record_cpu_pair.py --iters 30
    done
    $N profile -t nvtx --sample=none --cpuctxsw=none --force-overwrite=true \\
       -o /tmp/cpu_layers_slower .venv/bin/python scripts/record_cpu_pair.py --iters 30 --extra-work 0.25
    for name in base base2 slower; do
      $N export --type sqlite --force-overwrite=true \\
         -o $F/cpu_layers_${name}_nsys2023.4.sqlite /tmp/cpu_layers_$name.nsys-rep
    done

(``-t nvtx`` alone: ``osrt`` is not needed for NVTX and only adds OS-runtime
rows; ``--sample=none --cpuctxsw=none`` keep the file small.)  The ranges then
sit in the export's ``NVTX_EVENTS`` (eventType 59, push/pop), one row per range.
"""

from __future__ import annotations

import argparse
import time

import nvtx
import torch
import torch.nn.functional as F


class Layer(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def spin_ns(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=30, help="recorded passes over the 8 layers")
    ap.add_argument("--warmup", type=int, default=5, help="passes before, with no NVTX ranges")
    ap.add_argument("--extra-work", type=float, default=0.0,
                    help="busy-wait F x the layer's own time inside every layer range")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [Layer(args.dim, args.heads).eval() for _ in range(args.layers)]
    x0 = torch.randn(args.batch, args.seq, args.dim)

    def one_pass(ranges: bool) -> None:
        x = x0
        for i, layer in enumerate(layers):
            if ranges:
                nvtx.push_range(f"layers.{i}")
            t0 = time.perf_counter_ns()
            x = layer(x)
            if args.extra_work > 0:
                spin_ns(int(args.extra_work * (time.perf_counter_ns() - t0)))
            if ranges:
                nvtx.pop_range()

    with torch.inference_mode():
        for _ in range(args.warmup):
            one_pass(False)
        t = time.perf_counter()
        for _ in range(args.iters):
            one_pass(True)
        t = time.perf_counter() - t
    per_layer_ms = 1e3 * t / (args.iters * args.layers)
    print(f"{args.iters} passes x {args.layers} layers, extra_work={args.extra_work}: "
          f"{t:.3f} s, {per_layer_ms:.3f} ms per layer")


if __name__ == "__main__":
    main()
