"""Theoretical occupancy of a kernel launch: resident warps per SM allowed by
its block size, registers and shared memory, over the SM's maximum (docs/architecture.md §6).

The rule is CUDA's occupancy calculator (``cuda_occupancy.h``, the same one
behind ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``):

- warps per block = ⌈threads / 32⌉; limit ⌊max warps per SM / warps per block⌋;
- blocks per SM at most the architecture's maximum;
- registers are allocated per warp in units of 256 (⌈regs × 32 / 256⌉ × 256),
  from each of the SM's 4 sub-partitions separately:
  ⌊⌊(registers per SM / 4) / registers per warp⌋ × 4 / warps per block⌋; a
  block whose registers (its warps rounded up to a multiple of 4) exceed the
  per-block limit cannot launch;
- shared memory per block (static + dynamic + the 1 KiB the system reserves
  per block from compute capability 8.0 on) is allocated in 128-byte units
  from the shared memory the SM is configured with.

The per-SM limits are the device's (:meth:`headcount.common.device.Device.limits`:
what the device or its recording says, the table of
:data:`headcount.common.device.LIMITS` for the rest). The GPU check compares this module with the driver's own calculator.

Achieved occupancy is a measurement, not this: it comes from ncu
(``sm__warps_active``) or PM sampling.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common.device import LIMITS, Device, SmLimits  # noqa: F401 (LIMITS: the table, read by tests and the GPU check)


def device_occupancy(kernels: pd.DataFrame, devices: pd.DataFrame | None) -> pd.Series:
    """``theoretical_occupancy_pct`` of each kernel with the limits of the
    device it ran on (``device`` column = ``devices.device``); null where the
    device is not described."""
    out = pd.Series(np.nan, index=kernels.index, dtype="float64")
    if devices is None or not len(devices) or not len(kernels):
        return out
    for _, row in devices.iterrows():
        on = (kernels["device"] == row["device"]).fillna(False).to_numpy(dtype=bool)
        if on.any():
            out[on] = kernel_occupancy(kernels[on], Device.from_target_info(row).limits()).to_numpy()
    return out


def _round_up(x: np.ndarray, unit: int) -> np.ndarray:
    return -(-x // unit) * unit


def blocks_per_sm(threads, registers, shared_memory, limits: SmLimits, shared_memory_config=None) -> np.ndarray:
    """Resident blocks per SM (vectorized).

    Args:
        threads: threads per block.
        registers: registers per thread (0: not limited by registers).
        shared_memory: static + dynamic shared memory per block, bytes.
        limits: the SM's limits.
        shared_memory_config: shared memory per SM the driver configured for
            the launch (CUPTI's ``shared_memory_executed``), bytes; the
            largest carveout when null.

    Returns:
        int64 array; 0 where the block cannot run at all.
    """
    threads = np.asarray(threads, dtype=np.int64)
    registers = np.asarray(registers, dtype=np.int64)
    smem = np.asarray(shared_memory, dtype=np.int64)
    warps = -(-threads // 32)
    safe_warps = np.maximum(warps, 1)
    by_warps = limits.max_warps // safe_warps
    by_blocks = np.full_like(threads, limits.max_blocks)

    regs_per_warp = _round_up(registers * 32, limits.register_unit)
    per_partition = limits.registers // limits.sub_partitions
    warps_by_regs = np.where(regs_per_warp > 0, per_partition // np.maximum(regs_per_warp, 1), 1 << 30) * limits.sub_partitions
    by_regs = np.where(registers > 0, warps_by_regs // safe_warps, 1 << 30)
    # the hardware checks the per-block register limit as if the block's warps
    # were spread over all sub-partitions (cuda_occupancy.h, "hardware check")
    assumed = regs_per_warp * _round_up(warps, limits.sub_partitions)
    by_regs = np.where((assumed > limits.max_registers_per_block) | (regs_per_warp * warps > limits.max_registers_per_block), 0, by_regs)

    smem_block = _round_up(smem + limits.reserved_shared_memory, limits.shared_memory_unit)
    config = np.full_like(threads, limits.shared_memory)
    if shared_memory_config is not None:
        given = pd.array(shared_memory_config, dtype="Int64").to_numpy(dtype=np.float64, na_value=np.nan)
        config = np.where(np.isnan(given), config, given).astype(np.int64)
    by_smem = np.where(smem_block > 0, config // np.maximum(smem_block, 1), 1 << 30)

    result = np.minimum.reduce([by_warps, by_blocks, by_regs, by_smem])
    return np.where(warps > 0, result, 0)


def theoretical_occupancy_pct(threads, registers, shared_memory, limits: SmLimits, shared_memory_config=None) -> np.ndarray:
    """Resident warps over the SM's maximum, in percent (vectorized)."""
    threads = np.asarray(threads, dtype=np.int64)
    blocks = blocks_per_sm(threads, registers, shared_memory, limits, shared_memory_config)
    return 100.0 * blocks * (-(-threads // 32)) / limits.max_warps


def block_threads(block: pd.Series) -> pd.Series:
    """Threads per block from ``"(x, y, z)"`` strings (null where unknown)."""
    def one(text):
        if not isinstance(text, str):
            return None
        try:
            return int(np.prod([int(v) for v in text.strip("()").split(",")]))
        except ValueError:
            return None
    codes, distinct = pd.factorize(pd.Series(block, dtype=object), use_na_sentinel=True)  # a few launch shapes among many kernels
    per_shape = pd.array([one(b) for b in distinct] + [None], dtype="Int64")
    return per_shape[codes]


def _resources(kernels: pd.DataFrame):
    """``(rows, threads, registers, shared memory, carveout)`` of the kernel rows whose block size and
    registers are known (``rows`` a boolean mask; the arrays are of those rows), or ``None`` for none."""
    if not len(kernels) or "registers_per_thread" not in kernels:
        return None
    threads = pd.array(kernels["block_threads"] if "block_threads" in kernels else block_threads(kernels["block"]), dtype="Int64")
    regs = pd.array(kernels["registers_per_thread"], dtype="Int64")
    smem = pd.array(kernels.get("shared_memory_bytes", pd.Series(0, index=kernels.index)), dtype="Int64").fillna(0)
    ok = np.asarray(~(pd.isna(threads) | pd.isna(regs)), dtype=bool)
    if not ok.any():
        return None
    config = kernels["shared_memory_config_bytes"][ok] if "shared_memory_config_bytes" in kernels else None
    return (ok, np.asarray(threads[ok], dtype=np.int64), np.asarray(regs[ok], dtype=np.int64),
            np.asarray(smem[ok], dtype=np.int64), config)


def kernel_occupancy(kernels: pd.DataFrame, limits: SmLimits | None) -> pd.Series:
    """``theoretical_occupancy_pct`` for each kernel row with a block size and
    registers (null elsewhere, or without limits)."""
    out = pd.Series(np.nan, index=kernels.index, dtype="float64")
    known = _resources(kernels) if limits is not None else None
    if known is None:
        return out
    ok, threads, regs, smem, config = known
    out[ok] = theoretical_occupancy_pct(threads, regs, smem, limits, config)
    return out

def grid_blocks(grid: pd.Series) -> pd.arrays.IntegerArray:
    """CTAs per launch from ``"(x, y, z)"`` grid strings (null where unknown), once per distinct grid."""
    return block_threads(grid)  # the same product of a launch shape's three numbers


def kernel_waves(kernels: pd.DataFrame, limits: SmLimits | None, sm_count: int | None) -> pd.Series:
    """``waves_per_sm`` of each kernel row: its CTAs over what the GPU holds at once (SMs × resident
    blocks per SM, the occupancy calculator's); under 1, the grid leaves SMs idle. Null where the grid,
    the block's resources, the limits or the SM count are unknown."""
    out = pd.Series(np.nan, index=kernels.index, dtype="float64")
    known = _resources(kernels) if limits is not None and sm_count and "grid" in kernels else None
    if known is None:
        return out
    ok, threads, regs, smem, config = known
    ctas = pd.array(grid_blocks(kernels["grid"]), dtype="Int64")[ok].to_numpy(np.float64, na_value=np.nan)
    held = blocks_per_sm(threads, regs, smem, limits, config) * int(sm_count)
    out[ok] = np.where(held > 0, ctas / np.maximum(held, 1), np.nan)
    return out
