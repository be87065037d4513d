"""Run metadata (DESIGN §4): what ran, where, with which tools.

Stored in each Parquet file's key-value metadata (key ``headcount``, JSON) and
in ``run.json`` beside the tables.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import secrets
import sys
from importlib import metadata as _md

from headcount import __version__

SCHEMA_VERSION = "1.1"


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A sortable, unique run id such as ``20261202T184500Z-3fa9c1`` (never numeric,
    so hive partitioning reads it back as text)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def package_version(package: str) -> str | None:
    """The installed version of a Python distribution, or ``None``."""
    try:
        return _md.version(package)
    except _md.PackageNotFoundError:
        return None


def device_info() -> dict:
    """The device the run used: the GPU torch sees, else the CPU."""
    import torch

    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return {
            "kind": "cuda",
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
        }
    return {
        "kind": "cpu",
        "name": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def run_metadata(run_id: str, source: str, source_version: str | None, mode: str, extra: dict | None = None) -> dict:
    """Everything a reader needs to know about a run besides its tables."""
    meta = {
        "schema_version": SCHEMA_VERSION,
        "tool": "headcount",
        "tool_version": __version__,
        "run_id": run_id,
        "source": source,
        "source_version": source_version,
        "mode": mode,
        "device": device_info(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "nvtx": package_version("nvtx"),
        "command_line": list(sys.argv),
        "start_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if extra:
        meta.update(extra)
    return meta
