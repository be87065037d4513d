"""Run metadata (docs/architecture.md §4): what ran, where, with which tools.

Stored in each Parquet file's key-value metadata (key ``headcount``, JSON) and
in ``run.json`` beside the tables.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import secrets
import sys
from pathlib import Path

import pandas as pd

from headcount._version import __version__
from headcount.common.device import Device
from headcount.common.env import package_version, program_versions
from headcount.common.errors import DAMAGED
from headcount.store import input_digest

SCHEMA_VERSION = "1.13"  # 1.13: issue 59 (kernels estimated_flop, estimated_min_bytes, estimate_provenance: Inductor's estimates); 1.12: issue 58 (steps attention_cpu_ns: a CPU run's attention time, attention_gpu_ns null there; pid and tid int64 in every table, ranges.lane for a graph replay's calls); 1.11: issue 58 (runs: path, size_bytes, sha256, damaged, program; model and rank filled by parse where the recording says); 1.10: issue 56 (steps: the device view — own_busy_ns, others_busy_ns, windows_overlap, idle_capture_ns, communication_overlapped_ns/exposed_ns, graph_launches/ops/busy_ns; ranges and layers: duration_ns is busy time (duration_basis gpu_busy), gpu_span_ns; torch.profiler annotations in ranges (domain torch.profiler); kernels: collective, msg_in_nelems, msg_out_nelems, group_size, comm_dtype; the collectives table); 1.9: issue 49 (steps queued_kernels_pct, launch_latency_p50_ns, launch_travel_ns: the launch-bound split's measured travel allowance); 1.8: issue 48 (steps idle_other_blocked_ns; untagged calls' model named, several models' layers named apart) and issue 49 (kernels queue_delay_ns, launch_latency_ns only on an idle stream; layers and heads queue_delay_p50/p99_ns, queued_kernels_pct); 1.7: issue 47 (layers: the head-mode split — heads_share_of_layer_pct, split_glue_ns, split_gaps_ns, heads_dram_bytes, heads_bytes_share_of_layer_pct, layer_mode_duration_per_call_ns, split_cost_x; sampled figures null where too few PM samples resolve a range); 1.6: issue 31 (kernels runs_on, bound and Speed of Light columns; layers and heads achieved fractions, waves, shares; heads rank test)


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A sortable, unique run id such as ``20261202T184500Z-3fa9c1`` (never numeric,
    so hive partitioning reads it back as text)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def device_info(device=None) -> Device:
    """The device the work ran on, as torch sees it (``None``: the CPU)."""
    return Device.from_torch(device if device is not None else "cpu")


def run_metadata(run_id: str, source: str, source_version: str | None, mode: str, extra: dict | None = None, *,
                 device: Device | None, program: dict | None = None) -> dict:
    """Everything a reader needs to know about a run besides its tables.

    Args:
        device: where the recorded work ran (:func:`device_info`, or what a
            recording says of its GPU); never guessed from this machine
            (``None``: the recording does not say).
        program: ``torch`` and ``transformers`` versions of the recorded
            program (``None``: this process, which is right for the API and
            ``headcount profile``); a parsed file passes what the recording
            says, else nulls. headcount's own version is ``tool_version``.
    """
    this_process = program is None
    program = program_versions() if program is None else program
    meta = {
        "schema_version": SCHEMA_VERSION,
        "tool": "headcount",
        "tool_version": __version__,
        "run_id": run_id,
        "source": source,
        "source_version": source_version,
        "mode": mode,
        "device": device.as_dict() if device is not None else {"kind": None, "name": None},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": program.get("torch"),
        "transformers": program.get("transformers"),
        "nvtx": package_version("nvtx"),
        "command_line": list(sys.argv),
        "start_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if this_process:  # the API, `headcount profile`, a training callback: the recorded program is this one
        meta["program_command"] = " ".join(sys.argv)
    if extra:
        meta.update(extra)
    return meta


def input_facts(path: str | Path) -> dict:
    """What names a parsed recording in its ``runs`` row: ``path`` (as given), ``size_bytes`` and ``sha256`` of
    its contents (:func:`headcount.store.input_digest.digest`: a directory, e.g. an nsys parquetdir export, by its
    files; hashed once per file and process, ahead of the parse where :func:`~headcount.store.input_digest.hash_ahead`
    was started).

    A file that cannot be read gives nulls (its parse says why)."""
    path = Path(path)
    try:
        size, sha256 = input_digest.digest(str(path), input_digest.stamp_of(path))
    except OSError:
        size, sha256 = None, None
    return {"path": str(path), "size_bytes": size, "sha256": sha256}


def runs_row(meta: dict) -> pd.DataFrame:
    """The ``runs`` table row of one run's metadata, column by column from the
    schema (:data:`headcount.common.tables.RUNS`): a column is the metadata key of
    its name, ``device_<x>`` is the device's ``<x>``. A new column is one edit
    of the schema (and the metadata that fills it)."""
    from headcount.common.tables import RUNS

    device = meta.get("device") or {}
    config = meta.get("model_config")
    special = {
        "model_config": json.dumps(config, sort_keys=True, default=str) if config is not None else None,
        "command_line": " ".join(meta.get("command_line") or []),
        "pid": str(meta["pid"]) if meta.get("pid") is not None else None,
        # the recorded program's command line, where known (the run's process report, the nsys capture, this process)
        "program": meta.get("program_command") or (" ".join(map(str, meta["argv"])) if meta.get("argv") else None),
        # what --salvage lost of a cut or partly unreadable recording (the notices that say so); null: read whole
        "damaged": "; ".join(n.removeprefix(DAMAGED) for n in meta.get("notices") or [] if str(n).startswith(DAMAGED)) or None,
    }
    row = {"run_id": meta["run_id"]}
    for field in RUNS:
        name = field.name
        if name in special:
            row[name] = special[name]
        elif name.startswith("device_"):
            row[name] = device.get(name.removeprefix("device_"))
        else:
            row[name] = meta.get(name)
    return pd.DataFrame([row])
