"""What names communication in a recording: one table of kernel names, like the attention signals.

A bottom module (no torch, nothing of headcount's): :mod:`headcount.derive.steps` counts a kernel as
communication where a row below matches its name, and :mod:`headcount.derive.collectives` sorts the
calls by kind. **Adding a library is one line** in :data:`SIGNALS`: a regular expression searched in
the kernel name (Python :func:`re.search`, case-insensitive), the library, and where its names come
from (a real trace or the library's source). docs/report-format.md lists the table.

The kind of a collective (:data:`KINDS`) comes from the same name: NCCL's kernels say it
(``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_SendRecv…``); expert-parallel dispatch and
combine are all-to-all exchanges; a kind the name does not say is ``other``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class CommSignal:
    """One row of the table.

    Attributes:
        pattern: regular expression searched in the kernel name (case-insensitive).
        library: who names kernels so.
        source: where the names come from.
    """

    pattern: str
    library: str
    source: str


SIGNALS: tuple[CommSignal, ...] = (
    CommSignal(r"nccl", "NCCL", "ncclDevKernel_… / ncclKernel_… in torch.profiler and nsys traces (tests/fixtures/kineto)"),
    CommSignal(r"rccl", "RCCL (ROCm)", "RCCL's kernels keep NCCL's ncclDevKernel_ names; rccl_ in ROCm's own tools"),
    CommSignal(r"dpsk::ep|deep_ep|\bintranode::(dispatch|combine|notify)|\binternode::(dispatch|combine|notify)",
               "DeepEP (expert-parallel dispatch/combine)", "deepseek-ai/DeepEP csrc/kernels/{intranode,internode}.cu"),
    CommSignal(r"multimem_all_reduce|multimem_all_gather|one_shot_all_reduce|two_shot_all_reduce|symm_mem",
               "PyTorch symmetric memory", "pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu"),
    CommSignal(r"cross_device_reduce", "vLLM / SGLang / aiter custom all-reduce",
               "vllm csrc/custom_all_reduce.cuh (cross_device_reduce_1stage/_2stage); sglang and aiter keep the names"),
    CommSignal(r"allreduce_fusion|oneShotAllReduce|twoShotAllReduce|lamport\w*all_?reduce|customAllReduce",
               "TensorRT-LLM all-reduce", "TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu"),
    CommSignal(r"quick_?all_?reduce|allreduce_prototype", "vLLM quick all-reduce (ROCm)", "vllm csrc/quickreduce"),
    CommSignal(r"nvshmem", "NVSHMEM", "nvshmem kernels and device-initiated puts (nvshmemi_…)"),
    CommSignal(r"mscclpp", "MSCCL++", "microsoft/mscclpp kernels (mscclpp…)"),
    CommSignal(r"pplx|all_?to_?all_?(dispatch|combine)", "pplx-kernels (expert-parallel all-to-all)",
               "ppl-ai/pplx-kernels csrc/all_to_all"),
)

KINDS: tuple[tuple[str, str], ...] = (
    ("all_reduce", r"all_?reduce"),
    ("all_gather", r"all_?gather"),
    ("reduce_scatter", r"reduce_?scatter"),
    ("all_to_all", r"all_?to_?all|alltoall|dispatch|combine|notify"),
    ("send_recv", r"send_?recv|\bsend\b|\brecv\b|_send|_recv|sendrecv"),
    ("broadcast", r"broadcast|\bbcast"),
    ("reduce", r"reduce"),
)
"""Collective kinds, in the order they are tried on a communication kernel's name (the first match)."""


@lru_cache(maxsize=4096)
def _library(name: str) -> str | None:
    for signal in SIGNALS:
        if re.search(signal.pattern, name, re.IGNORECASE):
            return signal.library
    return None


def library_of(name: str) -> str | None:
    """The library of a communication kernel (:data:`SIGNALS`), or ``None``: not communication."""
    return _library(str(name))


@lru_cache(maxsize=1024)
def kind_of_collective(name: str) -> str:
    """The kind (:data:`KINDS`) of a collective as torch.distributed names it (``allreduce``, ``_allgather_base``,
    ``all_to_all``, ``reduce_scatter_tensor``, ``send``…; ``other`` for ``barrier`` and the like)."""
    for kind, pattern in KINDS:
        if re.search(pattern, str(name), re.IGNORECASE):
            return kind
    return "other"


@lru_cache(maxsize=4096)
def kind_of(name: str) -> str | None:
    """The collective kind of a communication kernel (:data:`KINDS`, ``other`` where the name does not say it),
    or ``None`` where the name is not communication."""
    if _library(str(name)) is None:
        return None
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"
