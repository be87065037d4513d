"""The environment: package versions, and where the profiled work runs
(``--device`` resolved, the device described for the run metadata).

A run's ``device_kind``/``device_name`` must name the device its tensors were
on, never merely a GPU the machine happens to have: the roofline classifies
timings against that device's datasheet.
"""

from __future__ import annotations

import ctypes
import functools
import os
from importlib import metadata as _md

from headcount.common.errors import HeadcountError

CHOICES = "auto, cpu, cuda, cuda:N"


def cuda_usable() -> bool:
    """torch sees a CUDA GPU here: the one probe the rest of headcount asks
    (``--device auto``, the torch source's CUDA activity, the occupancy limits,
    calibration). CUPTI's own usability (driver version, cupti-python) is
    :func:`headcount.collector.cupti_load.probe`; a driver node for
    wrapped tools is :func:`driver_present`."""
    import torch

    return torch.cuda.is_available()


def driver_present() -> bool:
    """An NVIDIA driver and GPU device node on this machine, whatever torch is
    (for tools run around a program, such as nsys's GPU metrics)."""
    import shutil

    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidiactl")


def resolve(spec: str | None = "auto"):
    """The ``torch.device`` a ``--device`` value means on this machine.

    ``auto`` (or ``None``) is ``cuda`` (the current device) when torch sees a
    GPU, else ``cpu``.

    Raises:
        HeadcountError: an unknown value (exit 2); ``cuda``/``cuda:N`` where
            torch sees no such GPU (exit 3: the environment, not the command).
    """
    import torch

    text = (spec or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if cuda_usable() else torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise HeadcountError(f"--device {spec}: not a device", hint=f"choose one of {CHOICES}") from exc
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise HeadcountError(f"--device {spec}: headcount profiles on cpu or cuda only", hint=f"choose one of {CHOICES}")
    if not cuda_usable():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA GPU (driver or CUDA_VISIBLE_DEVICES?)"
        raise HeadcountError(f"--device {spec}: no CUDA GPU here ({why})", hint="use --device cpu, or run on a machine with a GPU",
                             exit_code=3)
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise HeadcountError(f"--device {spec}: this machine has {count} CUDA device{'s' if count != 1 else ''}",
                             hint=f"use cuda:0 … cuda:{count - 1}", exit_code=3)
    return torch.device("cuda", index)


def of_model(model):
    """The device of a model's parameters (its first one), or ``None`` without parameters."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None


@functools.lru_cache(maxsize=None)
def package_version(package: str) -> str | None:
    """The installed version of a Python distribution, or ``None`` (looked up once a process: reading
    the metadata takes milliseconds, and every profiled training window asks)."""
    try:
        return _md.version(package)
    except _md.PackageNotFoundError:
        return None


def program_versions() -> dict:
    """torch and transformers of this process (for a run recorded in this process)."""
    return {"torch": package_version("torch"), "transformers": package_version("transformers")}


def release_freed_memory() -> None:
    """Let Arrow allocate with the C library's allocator in this process, unless
    ``ARROW_DEFAULT_MEMORY_POOL`` names a pool: pyarrow's default (mimalloc)
    keeps freed pages for reuse, so a parse that builds and frees one process's
    tables after another held ~90 MiB more at its peak per worker. Only
    headcount's own processes call it (the CLI and its workers); idempotent.

    glibc itself is told to reuse the blocks freed (:func:`_reuse_heap_blocks`):
    fresh pages cost more than the memory they save. (``malloc_trim`` between
    processes, or a trim threshold without a fixed mmap threshold, cost 30 % of
    the time in page faults.)"""
    _reuse_heap_blocks()
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        import pyarrow as pa

        if pa.default_memory_pool().backend_name != "system":
            pa.set_memory_pool(pa.system_memory_pool())


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_BLOCK_BYTES = 32 << 20  # blocks up to this size come from the heap and are reused once freed (glibc's largest)
HEAP_KEPT_BYTES = 256 << 20  # freed at the heap's top and kept (1 GiB measured no faster on the ×300 export)


def _reuse_heap_blocks() -> None:
    """Let glibc serve blocks up to :data:`HEAP_BLOCK_BYTES` from its heap and keep up to :data:`HEAP_KEPT_BYTES`
    freed at its top, unless ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` says otherwise. By default
    every freed array of a few MiB went back to the kernel and the next one came as fresh pages, which the kernel
    zeroes: a fifth of a large nsys parse's CPU was the kernel clearing pages (``perf``: ``clear_page_erms``). On the
    ×300 export, alternating runs: 12.8 → 10.2 s median wall, a third fewer page faults, largest process 0.84 → 0.90 GiB.
    Both settings together: a trim threshold alone fixes the mmap threshold at 128 KiB (7× the page faults). A C
    library without ``mallopt``: nothing."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)
    except (OSError, AttributeError):
        pass
