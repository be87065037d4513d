"""A torch 2.15 trace with PM-sample counter events, made from a real H100 run (issue 59).

Stands in for: a torch.profiler trace of a tagged model recorded on an H100 with
``activities={ProfilerActivity.CUDA: ProfilerActivityConfig(profiler_configs=[PerformanceMetricsConfig(
kineto_counters.RECOMMENDED, sampling_interval_ms=0.05)]), ProfilerActivity.CPU: ...}`` — a trace no GPU here
can record. How it is made, from ``tests/fixtures/gpu/h100-2026-12-05/records-layer/<impl>/cupti-records.jsonl.gz``
(headcount's cupti source on an H100, BERT-base-sized model, 50 µs PM samples; kernels, runtime/driver calls,
headcount's ranges and PM samples on one clock):

- the recorded events become Chrome-trace ``"ph": "X"`` events as Kineto writes them (categories
  ``user_annotation``, ``kernel``, ``gpu_memset``, ``cuda_runtime``/``cuda_driver``; a kernel's ``args``
  carry ``correlation``, ``device``, ``stream``, ``grid``, ``block``, ``registers per thread``, ``shared memory``),
  times in µs after ``baseTimeNanoseconds``; ``deviceProperties`` of the H100 80GB HBM3 (from a real Kineto
  trace of that GPU, ``../shared/fixtures/kineto/h100_bert-small_sdpa_kineto.json.gz``);
- the real PM samples become counter events stamped at each sample's start: either in Kineto's own format
  (:func:`kineto_counter_events`: ``cat`` ``hardware_counters``, pid ``GPU 0 Counters``, a ``tid``), or through
  torch 2.15's own Chrome writer (:func:`cuspy_counter_events`: ``torch.profiler._cuspy.trace._build_pm_counters``
  and ``_build_chrome_counters``, which needs torch 2.15 and cupti-python to import).

Nothing about the values is made up: each counter event is one real sample's value.

Head mode: no GPU has recorded head-mode PM samples for us yet, so :func:`head_mode_trace` takes the timeline of
a head-mode run on the replayed GPU (``tests/cupti_replay.py``: the stand-in for CUPTI's kernel records and PM
sampler, whose own sample values are a constant rate) and gives its samples, in order, the real H100 samples'
values (:func:`with_real_values`): real values, replayed times.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from headcount.parsers import cupti_records

GPU = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05"
H100_PROPERTIES = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936, "computeMajor": 9, "computeMinor": 0,
                   "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
                   "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
                   "sharedMemPerMultiprocessor": 233472}
_CAT = {"range": "user_annotation", "kernel": "kernel", "memset": "gpu_memset", "memcpy": "gpu_memcpy"}


def records(impl: str | Path = "sdpa") -> Path:
    """The records of the H100 run of ``impl`` (``sdpa``, ``eager``), or ``impl`` itself where it is a records file."""
    return Path(impl) if isinstance(impl, Path) else GPU / "records-layer" / impl / "cupti-records.jsonl.gz"


def samples(impl: str | Path = "sdpa"):
    """The run's PM samples (:func:`headcount.parsers.cupti_records.pm_samples_frame`): start_ns, end_ns, metrics."""
    _, recs = cupti_records.read_records(records(impl))
    return cupti_records.pm_samples_frame(recs)


def base_ns(impl: str | Path = "sdpa") -> int:
    """The trace's ``baseTimeNanoseconds``: the whole second before the run's first sample."""
    return int(samples(impl)["start_ns"].min()) // 10**9 * 10**9


def with_real_values(pm, impl: str = "sdpa"):
    """``pm`` (a replayed run's samples) with each sample's metric values those of the H100 run's busy samples in
    order, cycled where the replayed run has more; the metrics both have. Bytes (``….sum``) keep the real sample's
    rate over the replayed sample's window (the H100's are 50 µs long, the replay's may be shorter); percentages
    are taken as they are."""
    real = samples(impl)
    busy = real[real["dram__bytes_read.sum"] > 0].reset_index(drop=True)  # the samples taken while the GPU worked
    take = np.resize(np.arange(len(busy)), len(pm))
    scale = (pm["end_ns"] - pm["start_ns"]).to_numpy(np.float64) / (busy["end_ns"] - busy["start_ns"]).to_numpy(np.float64)[take]
    out = pm.copy()
    for column in [c for c in pm.columns if c not in ("start_ns", "end_ns") and c in busy.columns]:
        values = busy[column].to_numpy(np.float64)[take]
        out[column] = values * scale if column.endswith(".sum") else values
    return out


def _us(ns, base: int) -> float:
    return round((int(ns) - base) / 1e3, 3)


def recorded_events(impl: str | Path = "sdpa") -> list[dict]:
    """The run's recorded events as Kineto's ``"ph": "X"`` events (module docstring)."""
    header, recs = cupti_records.read_records(records(impl))
    events = cupti_records.events_frame(header, recs)
    base = base_ns(impl)
    driver = {r["correlation_id"] for r in recs if r["kind"] == "driver"}
    out = []
    for row in events.itertuples(index=False):
        ev = {"ph": "X", "name": row.name, "ts": _us(row.start_ns, base), "dur": round((int(row.end_ns) - int(row.start_ns)) / 1e3, 3)}
        if row.kind == "runtime":
            ev.update(cat="cuda_driver" if row.correlation_id in driver else "cuda_runtime", pid=int(row.pid), tid=int(row.tid),
                      args={"correlation": int(row.correlation_id)})
        elif row.kind == "range":
            ev.update(cat="user_annotation", pid=int(row.pid), tid=int(row.tid))
        else:
            args = {"correlation": int(row.correlation_id), "device": int(row.device), "stream": int(row.stream)}
            if row.kind == "kernel":
                args.update({"grid": [int(v) for v in row.grid.strip("()").split(",")],
                             "block": [int(v) for v in row.block.strip("()").split(",")],
                             "registers per thread": int(row.registers_per_thread), "shared memory": int(row.shared_memory_bytes)})
            ev.update(cat=_CAT[row.kind], pid=int(row.device), tid=int(row.stream), args=args)
        out.append(ev)
    return out


def kineto_counter_events(impl: str | Path = "sdpa", pm=None) -> list[dict]:
    """The run's PM samples (or ``pm``, on the run's clock) as Kineto's CUPTI PM-sampling child profiler writes
    them: one counter event per metric per sample, at the sample's start."""
    pm, base = samples(impl) if pm is None else pm, base_ns(impl)
    metrics = [c for c in pm.columns if c not in ("start_ns", "end_ns")]
    return [{"ph": "C", "cat": "hardware_counters", "name": metric, "pid": "GPU 0 Counters", "tid": 0,
             "ts": _us(start, base), "args": {"": float(value)}}
            for start, *values in pm[["start_ns", *metrics]].itertuples(index=False) for metric, value in zip(metrics, values)]


def cuspy_counter_events(impl: str = "sdpa") -> list[dict]:
    """The run's PM samples through torch 2.15's Cuspy Chrome writer (raises ImportError elsewhere)."""
    from torch.profiler._cuspy import trace as cuspy

    pm, base = samples(impl), base_ns(impl)
    columns = {"start_ns": pm["start_ns"].to_numpy(np.int64), "device_id": np.zeros(len(pm), dtype=np.int64)}
    columns.update({c: pm[c].to_numpy(np.float64) for c in pm.columns if c not in ("start_ns", "end_ns")})
    return cuspy._build_chrome_counters(cuspy._merge_counters(cuspy._build_pm_counters(columns, {0})), base)


def write(path: Path, counters: list[dict], impl: str | Path = "sdpa") -> Path:
    """The trace with the recorded events and ``counters`` (gzip JSON where ``path`` ends in ``.gz``)."""
    trace = {"schemaVersion": 1, "deviceProperties": [H100_PROPERTIES], "baseTimeNanoseconds": base_ns(impl),
             "traceEvents": recorded_events(impl) + counters}
    with (gzip.open(path, "wt") if path.suffix == ".gz" else path.open("w")) as fh:
        json.dump(trace, fh)
    return path


def head_mode_trace(path: Path, records_path: Path) -> Path:
    """The trace of a head-mode run on the replayed GPU (its records at ``records_path``) with the H100's sample
    values on its sample windows, in Kineto's counter format (module docstring)."""
    return write(path, kineto_counter_events(records_path, with_real_values(samples(records_path))), records_path)
