"""The measured DRAM ceiling: the fastest large device-to-device copy.

Real kernels never reach a datasheet's bandwidth; the roofline and the
memory-bound test are fairer against what a plain copy achieves on the same
device (docs/architecture.md §6). Counted as 2 × bytes (each byte read once, written once).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
from pathlib import Path

from headcount.common.errors import HeadcountError

CALIBRATION_FILE = "calibration.json"


def copy_ceiling(device="cuda", n_bytes: int = 2 << 30, repeats: int = 20, warmup: int = 3) -> dict:
    """Best (read + written bytes) / time of ``repeats`` copies of ``n_bytes``.

    Args:
        device: a ``torch.device`` or its name (``cuda``, ``cuda:1``, ``cpu``).

    Returns:
        ``device`` (``cuda`` or ``cpu``: the kind), ``device_index``,
        ``device_name``, ``bytes``, ``best_seconds``, ``copy_ceiling_gbps``, ``rule``, ``measured_at``.

    Raises:
        HeadcountError: ``device`` is cuda and no GPU is usable.
    """
    import torch

    device = torch.device(device)
    from headcount.common.env import cuda_usable

    if device.type == "cuda" and not cuda_usable():
        raise HeadcountError("calibration needs a CUDA GPU and torch sees none", hint="run it on the GPU machine", exit_code=3)
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for i in range(warmup + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= warmup:
            best = min(best, seconds)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": device.type, "device_index": device.index, "device_name": name, "bytes": n_bytes, "best_seconds": best,
            "copy_ceiling_gbps": 2 * n_bytes / best / 1e9, "rule": f"2 × bytes / fastest of {repeats} copies after {warmup} warm-ups",
            "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def save(result: dict, report: str | Path) -> Path:
    """Store a calibration with a report (``REPORT/calibration.json``)."""
    path = Path(report) / CALIBRATION_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, path)
    return path


def load(report: str | Path, device_name: str | None = None) -> dict | None:
    """The report's calibration, if any (and measured on ``device_name`` when given)."""
    path = Path(report) / CALIBRATION_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if device_name and doc.get("device_name") != device_name:
        return None
    return doc
