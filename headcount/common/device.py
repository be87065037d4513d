"""Where a run's work ran: one :class:`Device` type for every source, and the per-SM limits of GPUs.

Every source describes its device differently (torch's device properties, a
torch.profiler trace's ``deviceProperties``, ncu's device attributes, nsys's
``TARGET_INFO_GPU``); each is read into a :class:`Device` here, by one
constructor per source, and everything downstream reads that: the roofline
(its name and memory bandwidth), the occupancy calculator (:meth:`Device.limits`,
the one place the SM limits are worked out) and the run metadata
(:meth:`Device.as_dict`, the ``device`` object of ``run.json``).

Torch-free: :meth:`Device.from_torch` imports torch when it is called.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import asdict, dataclass, fields

import pandas as pd


@dataclass(frozen=True)
class SmLimits:
    """Per-SM resources of one compute capability (bytes, counts)."""

    max_warps: int
    max_blocks: int
    registers: int = 65536
    max_registers_per_block: int = 65536
    shared_memory: int = 0          # largest configurable shared memory per SM
    reserved_shared_memory: int = 0  # per block, taken by the system
    register_unit: int = 256
    shared_memory_unit: int = 128
    sub_partitions: int = 4


LIMITS: dict[str, SmLimits] = {
    "7.0": SmLimits(max_warps=64, max_blocks=32, shared_memory=96 * 1024),                                   # V100
    "7.5": SmLimits(max_warps=32, max_blocks=16, shared_memory=64 * 1024),                                   # T4
    "8.0": SmLimits(max_warps=64, max_blocks=32, shared_memory=164 * 1024, reserved_shared_memory=1024),     # A100
    "8.6": SmLimits(max_warps=48, max_blocks=16, shared_memory=100 * 1024, reserved_shared_memory=1024),     # A10, RTX 30
    "8.7": SmLimits(max_warps=48, max_blocks=16, shared_memory=164 * 1024, reserved_shared_memory=1024),     # Orin
    "8.9": SmLimits(max_warps=48, max_blocks=24, shared_memory=100 * 1024, reserved_shared_memory=1024),     # L4, L40S, RTX 4090
    "9.0": SmLimits(max_warps=64, max_blocks=32, shared_memory=228 * 1024, reserved_shared_memory=1024),     # H100, H200
    "10.0": SmLimits(max_warps=64, max_blocks=32, shared_memory=228 * 1024, reserved_shared_memory=1024),    # B200, GB200
    "10.3": SmLimits(max_warps=64, max_blocks=32, shared_memory=228 * 1024, reserved_shared_memory=1024),    # B300
    "11.0": SmLimits(max_warps=48, max_blocks=24, shared_memory=228 * 1024, reserved_shared_memory=1024),    # Thor
    "12.0": SmLimits(max_warps=48, max_blocks=24, shared_memory=100 * 1024, reserved_shared_memory=1024),    # RTX 50, RTX PRO
    "12.1": SmLimits(max_warps=48, max_blocks=24, shared_memory=100 * 1024, reserved_shared_memory=1024),    # GB10
}
"""Per compute capability: the CUDA C++ Programming Guide's "technical specifications per compute
capability" table, as NVIDIA's CCCL encodes it (libcudacxx ``cuda/__device/arch_traits.h``, commit
004ad19: max threads ÷ 32 = warps, max blocks, shared memory per SM, 1 KiB reserved per block from 8.0 on)."""


def limits_for(compute_capability: str | None) -> SmLimits | None:
    """The table's limits for ``"9.0"``-style compute capabilities, or ``None``."""
    return LIMITS.get(str(compute_capability)) if compute_capability else None


SM_FIELDS = ("cc_major", "cc_minor", "max_warps_per_sm", "max_blocks_per_sm", "registers_per_sm",
             "max_registers_per_block", "shared_memory_per_sm")
"""What a source may record of a GPU's SMs (counts; shared memory in bytes): :attr:`Device.sm`'s keys."""


def _int(value) -> int | None:
    """A recorded count: an integer, else unknown (``None``, NaN, text, a bool)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


@dataclass(frozen=True)
class Device:
    """One device as a recording (or torch) describes it; ``None``: not said.

    Attributes:
        kind: ``cuda`` (any GPU: ROCm traces describe theirs in the same fields) or ``cpu``.
        name: the device's name (several GPUs of one export: joined with `` + ``).
        index: the device id of the (first) GPU that ran work.
        count: how many distinct GPUs ran work.
        compute_capability: ``"9.0"``-style.
        sm_count: streaming multiprocessors.
        memory_bytes: device memory (bytes).
        memory_bandwidth_gbps: DRAM bandwidth the recording reports (GB/s).
        clock_hz: SM clock (Hz).
        cuda: the CUDA version torch was built with.
        cpu_count, torch_threads: a CPU's cores and torch's threads.
        source: where the description came from (``trace deviceProperties``, ``TARGET_INFO_GPU`` …).
        sm: what the source recorded of the SMs (keys of :data:`SM_FIELDS`).
    """

    kind: str
    name: str | None = None
    index: int | None = None
    count: int | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    memory_bandwidth_gbps: float | None = None
    clock_hz: int | None = None
    cuda: str | None = None
    cpu_count: int | None = None
    torch_threads: int | None = None
    source: str | None = None
    sm: dict | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def limits(self) -> SmLimits | None:
        """The per-SM limits the occupancy calculator needs: what the source recorded,
        the table's values (:data:`LIMITS`) for the rest; ``None`` when neither the
        SMs nor the compute capability are known (a CPU)."""
        sm = self.sm or {}
        major, minor = _int(sm.get("cc_major")), _int(sm.get("cc_minor"))
        if (major is None or minor is None) and self.compute_capability:
            major, minor = (int(p) for p in self.compute_capability.split(".")[:2])
        base = limits_for(f"{major}.{minor}") if major is not None and minor is not None else None
        warps, blocks = _int(sm.get("max_warps_per_sm")), _int(sm.get("max_blocks_per_sm"))
        if base is None and (warps is None or blocks is None):
            return None
        base = base or SmLimits(max_warps=warps, max_blocks=blocks, reserved_shared_memory=1024 if (major or 0) >= 8 else 0)
        return SmLimits(max_warps=warps or base.max_warps, max_blocks=blocks or base.max_blocks,
                        registers=_int(sm.get("registers_per_sm")) or base.registers,
                        max_registers_per_block=_int(sm.get("max_registers_per_block")) or base.max_registers_per_block,
                        shared_memory=_int(sm.get("shared_memory_per_sm")) or base.shared_memory,
                        reserved_shared_memory=base.reserved_shared_memory)

    def as_dict(self) -> dict:
        """The run metadata's ``device`` object: the fields said (``kind`` and ``name`` always;
        the SMs' record as ``limits``)."""
        out = {k: v for k, v in asdict(self).items() if v is not None or k in ("kind", "name")}
        if "sm" in out:
            out["limits"] = out.pop("sm")
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> Device | None:
        """A :meth:`as_dict` object read back (a child process's report); ``None`` for none."""
        if not d:
            return None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        if "limits" in d:
            values["sm"] = d["limits"]
        return cls(**values)

    # ------------------------------------------------------------ one constructor per source
    @classmethod
    def from_torch(cls, device) -> Device:
        """The device torch sees (``"cuda:0"``, a ``torch.device``, ``"cpu"``)."""
        import torch

        device = torch.device(device)
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            threads = getattr(props, "max_threads_per_multi_processor", 0)
            sm = {"cc_major": props.major, "cc_minor": props.minor, "max_warps_per_sm": threads // 32 or None,
                  "registers_per_sm": getattr(props, "regs_per_multiprocessor", None),
                  "shared_memory_per_sm": getattr(props, "shared_memory_per_multiprocessor", None),
                  # torch does not say; a compute capability the table lacks keeps the calculator's common maximum
                  "max_blocks_per_sm": None if limits_for(f"{props.major}.{props.minor}") else 32}
            return cls("cuda", props.name, index=index, compute_capability=f"{props.major}.{props.minor}",
                       sm_count=props.multi_processor_count, memory_bytes=props.total_memory, cuda=torch.version.cuda,
                       sm=sm)
        return cls("cpu", platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                   torch_threads=torch.get_num_threads())

    @classmethod
    def from_kineto(cls, devices: list[dict]) -> Device | None:
        """A torch.profiler trace's ``deviceProperties`` (the first GPU; NVIDIA or AMD);
        ``None`` for a CPU trace. An empty name (some ROCm traces) is unknown."""
        if not devices:
            return None
        d = devices[0]
        major, minor = _int(d.get("computeMajor")), _int(d.get("computeMinor"))
        threads = _int(d.get("maxThreadsPerMultiprocessor"))
        return cls("cuda", d.get("name") or None, index=_int(d.get("id")), count=len(devices),
                   compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
                   sm_count=_int(d.get("numSms")), memory_bytes=_int(d.get("totalGlobalMem")), source="trace deviceProperties",
                   sm={"cc_major": major, "cc_minor": minor, "max_warps_per_sm": threads // 32 if threads else None,
                       "registers_per_sm": _int(d.get("regsPerMultiprocessor")),
                       "shared_memory_per_sm": _int(d.get("sharedMemPerMultiprocessor"))})

    @classmethod
    def from_ncu(cls, name: str, cc_major: int | None, cc_minor: int | None, sm_count: int | None) -> Device:
        """What an ncu result's device attributes say of the GPU."""
        cc = f"{cc_major}.{cc_minor}" if cc_major is not None and cc_minor is not None else None
        return cls("cuda", name, compute_capability=cc, sm_count=sm_count, source="ncu device attributes")

    @classmethod
    def from_target_info(cls, row, count: int | None = None, name: str | None = None) -> Device:
        """One GPU of an nsys export's ``TARGET_INFO_GPU`` (a row as
        :func:`headcount.parsers.nsys_sqlite.read_export` names its columns)."""
        def value(col):
            v = row.get(col)
            return None if v is None or pd.isna(v) else v

        major, minor = _int(value("cc_major")), _int(value("cc_minor"))
        bandwidth = value("memory_bandwidth_bytes_per_s")
        return cls("cuda", name if name is not None else value("name"), index=_int(value("device")), count=count,
                   compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
                   sm_count=_int(value("sm_count")), memory_bytes=_int(value("memory_bytes")),
                   memory_bandwidth_gbps=float(bandwidth) / 1e9 if bandwidth else None, clock_hz=_int(value("clock_hz")),
                   source="TARGET_INFO_GPU", sm={k: _int(value(k)) for k in SM_FIELDS})
