"""What headcount's tags do to a torch.compile'd model (the figures in docs/tagging.md).

For the tiny Llama (GQA), GPT-2 and BERT of the tests, sdpa, CPU, Inductor:
Dynamo's graph-break count untagged and tagged (layer and head mode), and the
kernels of the compiled forward+backward program (Inductor's generated
``call`` functions: fused C++/Triton kernels, extern kernels, fallback
operators; headcount's own operators not counted), untagged and tagged,
with whether loss and gradients match.

Counts, not times: nothing here depends on the machine's load.

Run: python benchmarks/compile_tags.py
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import MODEL_BUILDERS, inputs_for  # noqa: E402

from headcount.tagging.tagger import tag  # noqa: E402

_CALL = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+|extern_kernels\.\w+|torch\.ops\.[\w.]+)\(", re.M)


def breaks(name: str, mode: str | None) -> int:
    torch._dynamo.reset()
    model, inputs = MODEL_BUILDERS[name](), inputs_for(name)
    tagger = tag(model, mode=mode) if mode else None
    try:
        return torch._dynamo.explain(lambda **kw: model(**kw).loss)(**inputs).graph_break_count
    finally:
        if tagger:
            tagger.deactivate()


def kernels(name: str, mode: str | None):
    torch._dynamo.reset()
    model, inputs = MODEL_BUILDERS[name](), inputs_for(name)
    compiled = torch.compile(model)
    tagger = tag(model, mode=mode) if mode else None

    def step():
        loss = compiled(**inputs).loss
        loss.backward()
        return loss

    try:
        loss, codes = run_and_get_code(step)
    finally:
        if tagger:
            tagger.deactivate()
    calls = Counter()
    for code in codes:
        calls.update(c for c in _CALL.findall(code[code.index("def call("):]) if "headcount" not in c)
    return sum(calls.values()), loss.detach(), [p.grad for p in model.parameters()]


def main() -> None:
    print(f"torch {torch.__version__}, Inductor on {torch.get_num_threads()} CPU threads")
    for name in ("llama_gqa", "gpt2", "bert"):
        b = {m: breaks(name, m) for m in (None, "layer", "head")}
        n0, loss0, grads0 = kernels(name, None)
        line = [f"{name}: graph breaks untagged {b[None]}, layer {b['layer']}, head {b['head']}; kernels untagged {n0}"]
        for mode in ("layer", "head"):
            n, loss, grads = kernels(name, mode)
            same = torch.allclose(loss, loss0, atol=1e-4) and all(torch.allclose(a, g, atol=1e-4) for a, g in zip(grads, grads0))
            line.append(f"{mode} {n} (loss and gradients equal: {same})")
        print(", ".join(line))


if __name__ == "__main__":
    main()
