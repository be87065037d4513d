"""NVIDIA's Nsight tools as headcount knows them: where they are, which version, and the ncu metrics it asks for.

One module for what ``headcount run`` (which drives the tools), ``headcount
parse`` (which exports ``.nsys-rep`` files with nsys and reads ncu results) and
``headcount doctor`` all need, so that none of them imports another's stage:
the lookup (``$HEADCOUNT_NSYS`` / ``$HEADCOUNT_NCU``, else PATH), the version
gate, and the one table of ncu metrics that the collector asks for and the
readers read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from headcount.common.errors import HeadcountError

# oldest releases whose options and report formats headcount uses
MIN_VERSION = {"ncu": (2022, 1), "nsys": (2023, 1)}

# The one table of ncu metrics: headcount column → (ncu metric names, first present wins;
# the details page's display name, where it uses one; collected by `headcount run --backend ncu`).
# What headcount collects and what it reads cannot drift apart: both come from here.
NCU_TABLE: dict[str, tuple[tuple[str, ...], str | None, bool]] = {
    "duration_ns": (("gpu__time_duration.sum",), "Duration", True),
    "dram_read_bytes": (("dram__bytes_read.sum",), None, True),
    "dram_write_bytes": (("dram__bytes_write.sum",), None, True),
    "dram_bytes": (("dram__bytes.sum",), None, False),
    # ncu's own DRAM figure under either name (reports of some ncu sets carry only the gpu__ one)
    "dram_throughput_pct": (("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                             "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"), "DRAM Throughput", True),
    # the Speed of Light section's two figures and its waves (headcount.derive.bound reads them as ncu's rule does)
    "sm_throughput_pct": (("sm__throughput.avg.pct_of_peak_sustained_elapsed",), "Compute (SM) Throughput", True),
    "memory_throughput_pct": (("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",), "Memory Throughput", True),
    "waves_per_sm": (("launch__waves_per_multiprocessor",), "Waves Per SM", True),
    "achieved_occupancy_pct": (("sm__warps_active.avg.pct_of_peak_sustained_active",), "Achieved Occupancy", True),
    "theoretical_occupancy_pct": (("sm__maximum_warps_per_active_cycle_pct",), "Theoretical Occupancy", True),
    "l2_bytes": (("lts__t_bytes.sum",), None, True),
    "l1_bytes": (("l1tex__t_bytes.sum",), None, False),
    "tensor_pipe_pct": (("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
                         "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"), None, False),
    "registers_per_thread": (("launch__registers_per_thread",), "Registers Per Thread", True),
    "shared_memory_static_bytes": (("launch__shared_mem_per_block_static",), "Static Shared Memory Per Block", True),
    "shared_memory_dynamic_bytes": (("launch__shared_mem_per_block_dynamic",), "Dynamic Shared Memory Per Block", True),
    "shared_memory_config_bytes": (("launch__shared_mem_config_size",), "Shared Memory Configuration Size", True),
    "block_threads": (("launch__block_size",), "Block Size", True),
    # the GPU the kernel ran on (the run's device, see run_device); device attributes cost no replay pass
    "device_cc_major": (("device__attribute_compute_capability_major",), None, True),
    "device_cc_minor": (("device__attribute_compute_capability_minor",), None, True),
    "device_sm_count": (("device__attribute_multiprocessor_count",), None, True),
}
DEVICE_NAME = "device__attribute_display_name"

METRICS: dict[str, tuple[str, ...]] = {column: names for column, (names, _, _) in NCU_TABLE.items()}
"""headcount column → ncu metric names (what the readers look for)."""

DISPLAY_NAMES: dict[str, str] = {display: names[0] for names, display, _ in NCU_TABLE.values() if display}
"""Details-page display name → metric name."""

COLLECTED: tuple[str, ...] = (*(names[0] for names, _, collect in NCU_TABLE.values() if collect), DEVICE_NAME)
"""What ``headcount run --backend ncu`` asks ncu for (one pass on Hopper)."""

# PM sampling (the cupti source samples them, derive/sampling gives them to kernels): metric → headcount column; .sum counters are
# totals over a sample's window, .pct metrics are averages over it
PM_COUNTERS = {"dram__bytes_read.sum": "dram_read_sampled_bytes", "dram__bytes_write.sum": "dram_write_sampled_bytes"}
PM_PERCENTS = {"sm__warps_active.avg.pct_of_peak_sustained_elapsed": "sm_warps_active_sampled_pct"}


def find(tool: str) -> str:
    """Path of ``nsys`` or ``ncu``: ``$HEADCOUNT_NSYS`` / ``$HEADCOUNT_NCU``, else PATH.

    Raises:
        HeadcountError: not found (exit code 3).
    """
    override = os.environ.get(f"HEADCOUNT_{tool.upper()}")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise HeadcountError(f"HEADCOUNT_{tool.upper()}={override}: not an executable", hint=f"point it at the {tool} binary", exit_code=3)
        return override
    path = shutil.which(tool)
    if path is None:
        name = "Nsight Systems" if tool == "nsys" else "Nsight Compute"
        raise HeadcountError(f"no {tool} on PATH", hint=f"install NVIDIA {name}, or set HEADCOUNT_{tool.upper()} to its {tool}", exit_code=3)
    return path


def version(path: str) -> tuple[str, tuple[int, ...]]:
    """(``--version`` text, (year, minor, …)) of a tool.

    Raises:
        HeadcountError: the tool does not run.
    """
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HeadcountError(f"{path} --version failed: {exc}", hint="check the installation", exit_code=3) from exc
    text = (done.stdout + done.stderr).strip()
    m = re.search(r"(20\d\d)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    numbers = tuple(int(g) for g in m.groups() if g is not None) if m else ()
    return (text.splitlines()[-1] if text else ""), numbers


def check_version(tool: str, numbers: tuple[int, ...], text: str) -> None:
    """Raises HeadcountError (exit 3) when ``tool`` is older than headcount needs."""
    need = MIN_VERSION[tool]
    if not numbers or numbers[:2] < need:
        raise HeadcountError(f"{tool} {'.'.join(map(str, numbers)) or text!s} is too old for headcount run (needs {need[0]}.{need[1]} or newer)",
                             hint=f"install a newer Nsight {'Systems' if tool == 'nsys' else 'Compute'}, or point HEADCOUNT_{tool.upper()} at one",
                             exit_code=3)
