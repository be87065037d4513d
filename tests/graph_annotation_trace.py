"""A real CUDA-graph trace with kernel annotations baked in as torch 2.15 bakes them (issue 59, route 2).

Stands in for: a torch.profiler trace of a model captured into CUDA graphs under
``torch.cuda.graph(g, enable_annotations=True)`` with ``mark_kernels`` scopes, exported with
``prof.export_chrome_trace(path, cuda_graph_annotations=get_kernel_annotations())`` — which needs CUDA ≥ 13.1 and a GPU.
How it is made: the real A100 trace ``tests/fixtures/kineto/a100-80gb_rank0of16_cudagraph_nccl_kineto.json.gz``
(70 ``cudaGraphLaunch`` calls, 345 replayed GPU operations, which its Kineto recorded without graph node ids);
each replayed kernel chosen below gets the args torch's exporter writes for an annotated node: torch 2.15's own
renderer (``torch.profiler._chrome_trace_export._annotation_args``) where it imports, else the same format as
that function documents (each key, its value as text). The annotations are made up for the test — which kernels
"belong" to which region is the stand-in's choice; the kernels, their launches and their times are real:

- the 10 replays of 20 operations: their kernels' first half ``{"name": "headcount@fwd/layer.0"}``, the rest
  ``{"name": "headcount@fwd/layer.1"}`` (what headcount's tagger marks inside a capture);
- the 5 replays of 9 operations: their kernels ``{"name": "dense_arch", "autograd_phase": "backward"}`` (a user's
  own label on backward work).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

TRACE = Path(__file__).parent / "fixtures" / "kineto" / "a100-80gb_rank0of16_cudagraph_nccl_kineto.json.gz"


def _rendered(annotation: dict) -> dict:
    """The args torch's exporter writes for ``annotation`` (its ``stream`` key aside, which moves the event's lane)."""
    try:
        from torch.profiler._chrome_trace_export import _annotation_args
    except ImportError:
        return {str(k): str(v) for k, v in annotation.items() if k != "stream"}
    fragment, _, _ = _annotation_args(annotation)
    return json.loads("{" + fragment + "}") if fragment else {}


def replays(doc: dict) -> dict[int, list[dict]]:
    """Each graph launch's correlation id → its replayed GPU operations, in time order."""
    launches = {ev["args"]["correlation"] for ev in doc["traceEvents"] if ev.get("name") == "cudaGraphLaunch"}
    out: dict[int, list[dict]] = {}
    for ev in doc["traceEvents"]:
        if ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and ev.get("args", {}).get("correlation") in launches:
            out.setdefault(ev["args"]["correlation"], []).append(ev)
    return {c: sorted(evs, key=lambda e: e["ts"]) for c, evs in out.items()}


def annotated(path: Path) -> dict:
    """Write the annotated trace to ``path``; returns {"layer.0"|"layer.1"|"dense_arch": [(correlation, [kernel events])]}."""
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    marked: dict[str, list] = {"layer.0": [], "layer.1": [], "dense_arch": []}
    for corr, ops in replays(doc).items():
        kernels = [ev for ev in ops if ev["cat"] == "kernel"]
        if len(ops) == 20:
            half = len(kernels) // 2
            for label, part in (("layer.0", kernels[:half]), ("layer.1", kernels[half:])):
                for ev in part:
                    ev["args"].update(_rendered({"name": f"headcount@fwd/{label}"}))
                marked[label].append((corr, part))
        elif len(ops) == 9:
            for ev in kernels:
                ev["args"].update(_rendered({"name": "dense_arch", "autograd_phase": "backward"}))
            marked["dense_arch"].append((corr, kernels))
    path.write_text(json.dumps(doc))
    return marked
