"""Driving NVIDIA's tools for ``headcount run``: build their command lines, read their complaints.

Where the tools are and which version they are is :mod:`headcount.common.nsight`
(``parse`` and ``doctor`` look them up too).

Command building and log reading are pure functions (tested without a GPU);
running is :mod:`headcount.wrap.launcher`'s job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from headcount.collector.cupti_errors import PERMISSION_HINT
from headcount.common import nsight
from headcount.common.errors import HeadcountError
from headcount.common.naming import DOMAIN

# one pass on recent GPUs: time, DRAM bytes and throughput, achieved occupancy,
# L2 bytes; the launch__* and theoretical-occupancy values cost no pass
NCU_METRICS = nsight.COLLECTED  # the one table the ncu readers read too
NCU_DEFAULT_INCLUDES = tuple(f"{DOMAIN}@{phase}/" for phase in ("fwd", "bwd", "recompute"))


@dataclass
class NcuOptions:
    """What ``headcount run --backend ncu`` asks ncu for (all recorded in the run metadata)."""

    nvtx_includes: tuple[str, ...] = NCU_DEFAULT_INCLUDES
    metrics: tuple[str, ...] = NCU_METRICS
    section_set: str | None = None
    clock_control: str = "none"
    cache_control: str = "all"
    launch_count: int | None = 5000
    capture: bool = False
    extra: list[str] = field(default_factory=list)


def ncu_argv(ncu: str, out_base: str, command: list[str], opt: NcuOptions, log_file: str | None = None) -> list[str]:
    """The ncu command line: only kernels under headcount's ranges (``--nvtx``
    with one include per phase, or the user's), every process of the tree,
    realistic clocks, a kernel-count guard, the report written to ``out_base``."""
    argv = [ncu, "--nvtx"]
    for include in opt.nvtx_includes:
        argv += ["--nvtx-include", include]
    argv += ["--target-processes", "all", "--clock-control", opt.clock_control, "--cache-control", opt.cache_control]
    if opt.section_set:
        argv += ["--set", opt.section_set]
    if opt.metrics:
        argv += ["--metrics", ",".join(opt.metrics)]
    if opt.launch_count:
        argv += ["--launch-count", str(opt.launch_count)]
    if opt.capture:
        argv += ["--profile-from-start", "off"]
    if log_file:
        argv += ["--log-file", log_file]
    argv += [*opt.extra, "--force-overwrite", "--export", out_base, *command]
    return argv


def nsys_gpu_metrics_flag(help_text: str) -> str | None:
    """The GPU-metrics option this nsys knows (``--gpu-metrics-devices`` from
    2024.x, ``--gpu-metrics-device`` before), from ``nsys profile --help``."""
    if "--gpu-metrics-devices" in help_text:
        return "--gpu-metrics-devices"
    if "--gpu-metrics-device" in help_text:
        return "--gpu-metrics-device"
    return None


def nsys_argv(nsys: str, out_base: str, command: list[str], trace: str = "cuda,nvtx", gpu_metrics_flag: str | None = None,
              capture: bool = False, extra: list[str] | None = None) -> list[str]:
    """The nsys command line: CUDA and NVTX traced (``osrt`` on request), no
    CPU sampling, GPU metrics of every device when asked and supported,
    optional cudaProfilerApi capture range, the report written to ``out_base``.

    With CUDA traced, CUDA graphs are traced per node (``--cuda-graph-trace=node``):
    nsys's default traces a graph launch as one whole, without its kernels,
    and the node events tell which range captured each replayed kernel
    (:mod:`headcount.attribute.graphs`)."""
    argv = [nsys, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none", "-o", out_base, "--force-overwrite", "true"]
    if "cuda" in trace.split(","):
        argv.append("--cuda-graph-trace=node")
    if gpu_metrics_flag:
        argv.append(f"{gpu_metrics_flag}=all")
    if capture:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    return [*argv, *(extra or []), *command]


_NCU_CAUSES = [
    (re.compile(r"ERR_NVGPUCTRPERM"), "GPU performance counters are not permitted for this user (ERR_NVGPUCTRPERM)", PERMISSION_HINT),
    (re.compile(r"failed to connect to the CUDA driver|libcuda\.so", re.I), "ncu could not reach an NVIDIA driver (no GPU here?)",
     "run headcount run --backend ncu on a machine with an NVIDIA GPU; --backend nsys records NVTX ranges anywhere"),
    (re.compile(r"Profiling is not supported on this device|not supported on this device", re.I), "ncu cannot profile this GPU",
     "see ncu's supported-GPU list; --backend nsys or cupti may still work"),
    (re.compile(r"already.*(profil|instrument)|another profiler", re.I), "another profiler holds the GPU counters",
     "stop nsys, DCGM profiling or other ncu sessions first"),
]


def read_ncu_log(lines: list[str]) -> tuple[HeadcountError | None, list[str]]:
    """ncu's ``==ERROR==``/``==WARNING==`` lines → (the error that stopped it, notices).

    The first known cause wins; an unknown ``==ERROR==`` line is passed on as it is.
    """
    errors = [ln.strip() for ln in lines if ln.startswith("==ERROR==")]
    warnings = [ln.strip().removeprefix("==WARNING==").strip() for ln in lines if ln.startswith("==WARNING==")]
    for pattern, message, hint in _NCU_CAUSES:
        hit = next((e for e in errors if pattern.search(e)), None)
        if hit:
            return HeadcountError(f"{message}: {hit.removeprefix('==ERROR==').strip()}", hint=hint, exit_code=3), warnings
    meaningful = [e for e in errors if "application returned an error code" not in e]
    if meaningful:
        return HeadcountError(f"ncu failed: {meaningful[0].removeprefix('==ERROR==').strip()}", hint="see ncu's messages above",
                              exit_code=3), warnings
    return None, warnings


_NCU_PASSES = re.compile(r'^==PROF== Profiling ".*" - \d+ \(\d+/\d+\): .* - (\d+) passes?\s*$')


def ncu_passes(lines: list[str]) -> dict:
    """What ncu's kernel replay cost, from its log's ``==PROF== Profiling "k" - 0 (1/5000): … - 10 passes``
    lines: ``kernels`` profiled, ``passes`` in all, ``passes_per_kernel`` (median; ``None`` without a line)."""
    passes = [int(m.group(1)) for m in map(_NCU_PASSES.match, (ln.rstrip() for ln in lines)) if m]
    ordered = sorted(passes)
    return {"kernels": len(passes), "passes": sum(passes),
            "passes_per_kernel": ordered[len(ordered) // 2] if ordered else None}


def ncu_cost_notice(cost: dict, wall_s: float | None) -> str | None:
    """One line on what ncu's exact counters cost (:func:`ncu_passes`, the program's wall time under ncu)."""
    if not cost.get("kernels"):
        return None
    wall = f"; the program ran {wall_s:,.1f} s under ncu" if wall_s else ""
    return (f"ncu measured {cost['kernels']:,} kernels by replaying each {cost['passes_per_kernel']} times (median; "
            f"{cost['passes']:,} passes in all{wall}): exact DRAM bytes per kernel, layer and head, at that cost")
