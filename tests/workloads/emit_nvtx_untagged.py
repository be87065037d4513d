"""A CPU program whose NVTX ranges are named the way PyTorch's ``emit_nvtx``
names them, for ``nsys profile --trace=nvtx`` in tests of untagged exports.

Stands in for ``torch.autograd.profiler.emit_nvtx(record_shapes=True)`` around
a 3-layer model, which a CPU build of torch cannot run (it asserts CUDA):
the ranges carry the same text (``aten::scaled_dot_product_attention, seq = 7,
op_id = 12, sizes = [[2, 4, 16, 8], …]``; a backward node
``ScaledDotProductFlashAttentionForCpuBackward0, stashed seq = 7, …``), push
and pop on the calling thread around real torch work. Layers 0 and 2 call
SDPA; layer 1 is Megatron-style eager attention in a ``CoreAttention`` range
(matmul, softmax, matmul). No headcount tag anywhere.

Usage: ``python emit_nvtx_untagged.py``.
"""

from __future__ import annotations

import itertools

import nvtx
import torch
import torch.nn.functional as F

B, H, S, D = 2, 4, 16, 8
_ids = itertools.count(1)
_seqs = itertools.count(100)


def _sizes(*tensors) -> str:
    return "[" + ", ".join(str(list(t.shape)) if isinstance(t, torch.Tensor) else "[]" for t in tensors) + "]"


def op(name: str, *inputs, seq: int | None = None, stashed: int | None = None):
    """An NVTX range named as emit_nvtx names an operator."""
    text = name + (f", stashed seq = {stashed}" if stashed is not None else "") + (f", seq = {seq}" if seq is not None else "")
    return nvtx.annotate(f"{text}, op_id = {next(_ids)}, sizes = {_sizes(*inputs)}")


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(B, H, S, D)
    saved = []
    with nvtx.annotate("ProfilerStep#1"):
        for layer in range(3):
            with nvtx.annotate(f"model.layers.{layer}"):
                if layer == 1:
                    with nvtx.annotate("CoreAttention"):
                        s1, s2, s3 = next(_seqs), next(_seqs), next(_seqs)
                        with op("aten::matmul", x, x.transpose(-1, -2), seq=s1):
                            scores = x @ x.transpose(-1, -2)
                        with op("aten::softmax", scores, seq=s2):
                            probs = torch.softmax(scores, dim=-1)
                        with op("aten::matmul", probs, x, seq=s3):
                            x = probs @ x
                        saved.append(("eager", (s1, s2, s3), x))
                else:
                    seq = next(_seqs)
                    with op("aten::scaled_dot_product_attention", x, x, x, [], [], [], [], [], seq=seq):
                        x = F.scaled_dot_product_attention(x, x, x, is_causal=True)
                    saved.append(("sdpa", (seq,), x))
                with op("aten::add", x, x, seq=next(_seqs)):
                    x = x + 1
        for kind, seqs, y in reversed(saved):  # the backward pass, last layer first
            if kind == "sdpa":
                with op("ScaledDotProductFlashAttentionForCpuBackward0", y, stashed=seqs[0], seq=seqs[0]):
                    with op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", y, y, y, y, y):
                        torch.tanh(y).sum()
            else:
                for name, s in zip(("MmBackward0", "SoftmaxBackward0", "MmBackward0"), reversed(seqs)):
                    with op(name, y, stashed=s, seq=s):
                        torch.tanh(y).sum()
    print("done")


if __name__ == "__main__":
    main()
