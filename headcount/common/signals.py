"""What names attention in a recording made without headcount's tags: one table.

A bottom module (no torch, nothing of headcount's): the Kineto parser reads it to
know which operators' inputs to keep, :mod:`headcount.attribute.untagged` to find calls.

A call is found by one of three signals, in this order of precedence
(:mod:`headcount.attribute.untagged` applies them):

1. ``operator``: a CPU operator (Kineto ``cpu_op``, or an NVTX range that
   PyTorch's ``emit_nvtx`` named after one) whose name matches a row below;
   its recorded input dims give the call's shapes (``layout``).
2. ``module``: the innermost ``nn.Module`` range whose class name matches
   (``…Attention``, ``…SelfAttention``, ``RadixAttention``, ``CoreAttention``;
   not the decoder block around it) and that holds no operator of 1.
3. ``kernel``: a GPU kernel whose name matches, launched outside every call
   of 1 and 2: a run of such kernels launched one after another (FlashAttention-3's
   backward preprocess, main and ``dQ`` conversion) is one call; inside a CUDA/HIP graph
   replay, each run of them among the replay's kernels.

A ``companion`` row names a kernel that is attention only right after one of
3 (vLLM's ``reduce_segments`` after its 3-D unified attention): it joins that
call and never starts one (the name alone says too little). A ``prologue`` row
names one that is attention only when one of 3 follows within
:data:`PROLOGUE_REACH` kernels (SageAttention's q/k quantization): it joins
that call (the kernels between do not).

Kernel rows say where their names come from (``source``): a real trace or the
library's own source.

**Adding a framework is one line** in :data:`SIGNALS`: its kind, a regular
expression searched in the name (Python :func:`re.search`), the framework
it stands for, and for operators the ``implementation`` recorded for its
calls, the layout of q/k/v in its recorded input dims and which argument
says causal. docs/cli.md lists the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Signal:
    """One row of the table.

    Attributes:
        kind: ``operator``, ``module`` or ``kernel``.
        pattern: regular expression searched in the operator name, the module's
            class name (instance suffix ``_N`` removed) or the kernel name.
        framework: who names things so (shown in docs and in ``found_as``).
        implementation: the ``implementation`` of calls found by this row.
        layout: operators only: q/k/v in the input dims as ``bhsd`` (batch, heads,
            sequence, head dim: PyTorch SDPA) or ``bshd`` (flash-attn, xFormers);
            3-D inputs are always packed tokens ``(tokens, heads, head dim)``.
        causal_arg: operators only: index of the ``is_causal`` argument in the
            recorded concrete inputs (``None``: the operator does not record it).
        source: where the names come from (kernel rows: a trace or the library's source).
    """

    kind: str
    pattern: str
    framework: str
    implementation: str | None = None
    layout: str | None = None
    causal_arg: int | None = None
    source: str = ""


SIGNALS: tuple[Signal, ...] = (
    # ---- operators (forward and backward; a backward operator is one whose name says so, BACKWARD below)
    Signal("operator", r"^aten::scaled_dot_product_attention$", "PyTorch SDPA", "sdpa", "bhsd", 5),
    Signal("operator", r"^aten::_scaled_dot_product_(flash_attention|flash_attention_for_cpu)$", "PyTorch SDPA (flash)", "sdpa", "bhsd", 4),
    Signal("operator", r"^aten::_scaled_dot_product_(efficient|cudnn)_attention$", "PyTorch SDPA (efficient, cuDNN)", "sdpa", "bhsd", 6),
    Signal("operator", r"^aten::_scaled_dot_product_\w*attention\w*_backward$", "PyTorch SDPA backward", "sdpa", "bhsd"),
    Signal("operator", r"^aten::_(flash|efficient|cudnn)_attention(_forward|_backward)?$", "PyTorch fused attention", "sdpa", "bshd"),
    Signal("operator", r"^aten::_scaled_dot_product_attention_math$", "PyTorch SDPA (math)", "sdpa", "bhsd"),
    Signal("operator", r"^flash_attn\w*::\w*(fwd|bwd|forward|backward)\w*$", "flash-attn (flash_attn::, flash_attn_3::)", "flash_attention_2", "bshd", 5),
    Signal("operator", r"^xformers\w*::\w*(attention|flash|fmha)\w*$", "xFormers", "xformers", "bshd"),
    Signal("operator", r"^vllm::unified_(mla_)?attention(_with_output)?$", "vLLM", "vllm", "bshd"),
    Signal("operator", r"^_(rocm_)?C::paged_attention", "vLLM paged attention", "vllm", "bshd"),
    Signal("operator", r"^flashinfer::\w*(prefill|decode|attention|mla)\w*$", "FlashInfer", "flashinfer", "bshd"),
    Signal("operator", r"^sglang_profiler::\w*(mha|attention|attn)\w*$", "SGLang (its profiler's operator ranges)", "sglang", "bshd"),
    Signal("operator", r"^sgl_kernel::\w*(attention|mla|fmha)\w*$", "sgl-kernel", "sglang", "bshd"),
    Signal("operator", r"^aiter::\w*(mha|fmha|attention|paged_attention)\w*$", "AMD aiter", "aiter", "bshd"),
    # ---- nn.Module class names: HF …Attention / …SelfAttention / …FlashAttention2, SGLang RadixAttention,
    # vLLM Attention, Megatron CoreAttention, Transformer Engine DotProductAttention, torch.nn.MultiheadAttention
    Signal("module", r"(Attention|Attn)\d*$", "nn.Module classes named …Attention (Hugging Face, SGLang, vLLM, Megatron, TE)", "eager"),
    # ---- kernel names: the more specific first (the first row that matches names the framework)
    Signal("kernel", r"^sage_fwd|qk_int8?_sv_f(8|16)_attn|sageattn", "SageAttention", "sageattention",
           source="sage_fwd: TraceLens xdit_flux.1_aiter_sage trace (MI300X); "
                  "qk_int_sv_f8_attn_kernel, qk_int8_sv_f8_attn_kernel: thu-ml/SageAttention csrc/qattn"),
    Signal("kernel", r"FlashAttention(Forward|Backward)\w*Sm\d+|flash_attn\w*cute", "FlashAttention-4 (CuTe DSL, SM90/SM100)",
           "flash_attention_4", source="FlashAttentionForwardSm100, FlashAttentionBackwardSm100, "
                                       "FlashAttentionBackwardPreprocess: Dao-AILab/flash-attention flash_attn/cute"),
    Signal("kernel", r"flash_fwd_splitkv_mla|flash_mla|FlashMLA|sparse_attn_fwd_kernel", "FlashMLA", "flashmla",
           source="flash_fwd_splitkv_mla_kernel, flash_fwd_splitkv_mla_combine_kernel: deepseek-ai/FlashMLA csrc"),
    Signal("kernel", r"^fmhaSm\d+\w*Kernel|^fmha_v2_|xqa_kernel|^kernel_mha", "TensorRT-LLM fmha (trtllm-gen, fmha_v2, XQA)",
           "trtllm", source="fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKv…: TraceLens b200 eager_trace (vLLM, B200); "
                            "fmha_v2_*, xqa_kernel: NVIDIA/TensorRT-LLM cpp/kernels"),
    Signal("kernel", r"fmha_cutlass[FB]_", "xFormers / PyTorch memory-efficient (CUTLASS fmha)", "sdpa",
           source="fmha_cutlassF_*, fmha_cutlassB_*: facebookresearch/xformers kernels/cuda/fmha (vendored in PyTorch)"),
    Signal("kernel", r"flash_fwd|flash_bwd|flash::|FlashAttn|flash_attn|compute_attn_ws", "FlashAttention kernels (PyTorch, flash-attn 2/3)",
           "flash_attention_2", source="pytorch_flash::flash_fwd_kernel: TraceLens h100 traces; flash::compute_attn_ws, "
                                       "FlashAttnBwdPreprocess, FlashAttnBwd, FlashAttnBwdPostprocessConvertdQ: "
                                       "deepseek-ai/profile-data train.json (FA3, H800)"),
    Signal("kernel", r"fmha|Fmha", "fmha kernels (CUTLASS, ck_tile FmhaBatchPrefill/FmhaBwd, aiter)",
           source="ck_tile FmhaBatchPrefillWithPagedKVCacheKernel: TraceLens sglang_prefilldecode trace (MI300X)"),
    Signal("kernel", r"[Pp]aged_?[Aa]ttention|unified_attention", "paged / unified attention kernels (vLLM, SGLang, aiter)",
           source="kernel_unified_attention_2d/3d: TraceLens vllm_decode_full; paged_attention_ll4mi_*: sglang_decode (MI300X)"),
    Signal("kernel", r"PrefillWithPagedKVCache|DecodeWithPagedKVCache|PrefillWithKVCache|DecodeWithKVCache", "FlashInfer kernels",
           "flashinfer", source="BatchPrefillWithPagedKVCacheKernel, BatchDecodeWithPagedKVCacheKernel: flashinfer-ai/flashinfer"),
    Signal("kernel", r"native_sdpa|_sdpa_|sdpa_sm\d|cudnn\d*fusion\d*(compute_dot_do_o|convert_dq)", "cuDNN SDPA kernels", "sdpa",
           source="cudnn_generated_fort_native_sdpa_sm90_flash_fprop/bprop, cudnn::fusion::compute_dot_do_o_specialized, "
                  "convert_dq_to_16bits: tests/fixtures/gpu/h100-2026-12-05 records-layer/sdpa (H100)"),
    Signal("kernel", r"AttentionKernel|attention_kernel|_attn_fwd|_attn_bwd|^attn_fwd|^attn_bwd|mha_fwd|mha_bwd|fused_attn",
           "other attention kernels (CUTLASS, Triton, TE)",
           source="attn_fwd (Triton/aiter): TraceLens xdit_sd_3.5 and torch_compile_triton traces; _attn_bwd: Triton tutorial 06"),
    # ---- prologues: attention only when an attention kernel above follows within PROLOGUE_REACH kernels
    Signal("prologue", r"^sage_quant|QuantInt8Kernel", "SageAttention's q/k quantization",
           source="sage_quant_kernel, then 4 Inductor kernels, then sage_fwd: TraceLens xdit_flux.1_aiter_sage trace; "
                  "QuantInt8Kernel: thu-ml/SageAttention csrc/fused"),
    # ---- companions: attention only right after a kernel above
    Signal("companion", r"^reduce_segments$|merge_states|MergeStates|_combine_kernel$", "split-KV reductions (vLLM unified "
           "attention, FlashInfer merge states, FlashMLA combine)",
           source="reduce_segments: TraceLens vllm_decode_full (after kernel_unified_attention_3d); "
                  "VariableLengthMergeStatesKernel: flashinfer-ai/flashinfer"),
)

BACKWARD = re.compile(r"backward|Backward|_bwd|bwd_")
"""A found operator whose name matches is a backward call."""

BACKWARD_KERNEL = re.compile(r"[Bb]ackward|[Bb]wd|bprop|dgrad|dot_do_o|convert_dq|dq_dk_dv|cutlassB_|OGradDotO|QGrad")
"""A found kernel whose name matches is backward work: FlashAttention 2/3/4 (``flash_bwd_*``, ``FlashAttnBwd*``,
``FlashAttentionBackwardSm100``), cuDNN (``flash_bprop``, ``compute_dot_do_o``, ``convert_dq_to_16bits``),
xFormers (``fmha_cutlassB_``), ck_tile/aiter (``FmhaBwd…``, ``…OGradDotO…``, ``…ConvertQGrad…``), Triton (``_attn_bwd``)."""

MODULE_INSTANCE = re.compile(r"^(?:nn\.Module: )?(?P<cls>[A-Za-z_]\w*?)(?:_(?P<k>\d+))?$")
"""``nn.Module: RadixAttention_5`` → class ``RadixAttention``, instance 5 (torch.profiler numbers instances per class)."""

LAYER_MODULE = re.compile(r"(?:Layer|Block)_(\d+)$")
"""A module instance named like a repeated decoder block (``Qwen3DecoderLayer_5``, ``GPT2Block_3``): its layer index."""

ATTENTION_MODULE = re.compile(r"Attention_(\d+)$")


def _compiled(kind: str) -> list[tuple[re.Pattern, Signal]]:
    return [(re.compile(s.pattern), s) for s in SIGNALS if s.kind == kind]


_BY_KIND = {kind: _compiled(kind) for kind in ("operator", "module", "kernel", "companion", "prologue")}
PROLOGUE_REACH = 8
"""At most this many other kernels between a prologue kernel and the attention kernel it prepares."""


@lru_cache(maxsize=65536)
def match(kind: str, name: str) -> Signal | None:
    """The first row of ``kind`` whose pattern is found in ``name`` (for a
    module: its class name), or ``None`` (also for a missing name: a damaged recording's)."""
    if not isinstance(name, str):
        return None
    if kind == "module":
        m = MODULE_INSTANCE.match(name)
        if not m:
            return None
        name = m.group("cls")
    for pattern, signal in _BY_KIND[kind]:
        if pattern.search(name):
            return signal
    return None


def operator_name(name: str) -> str:
    """An operator's name as ``emit_nvtx`` ranges carry it: ``aten::bmm, seq = 4, op_id = 7, sizes = …`` → ``aten::bmm``."""
    return name.split(", ", 1)[0] if isinstance(name, str) else ""


SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
MATMUL_OPS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm"})
"""The operators of eager attention (scores = q·kᵀ, softmax, ·v) whose input dims give an eager call's shapes."""


def shaped_names(names) -> set[str]:
    """Of ``names`` (operator names), those whose recorded inputs a found call reads:
    attention operators and the softmax and batched-matmul operators of eager attention."""
    return {n for n in names if n in SOFTMAX_OPS or n in MATMUL_OPS or match("operator", operator_name(n)) is not None}


def kinds_in(values) -> list[str]:
    """The signal kinds named in a column of ``signal`` values (a layer row joins its calls'
    distinct kinds with ``, ``), sorted: ``["module", "operator"]``."""
    return sorted({kind for v in values if isinstance(v, str) for kind in v.split(", ")})
