"""What the cupti source costs on the CPU side, measured without a GPU:

- copying CUPTI records into dicts in the buffer-completed callback (per
  record; this runs inside the profiled process), on real cupti-python record
  objects;
- writing and reading the records file, and records → events table (per record).

Prints its figures; asserts nothing. Usage: python benchmarks/cupti_records.py [N]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from headcount.collector import cupti_home  # noqa: E402

cupti_home.activate()  # headcount's own cupti-python (`headcount cupti install`), as the product loads it
from cupti import cupti  # noqa: E402
from cupti_replay import ReplayCupti  # noqa: E402

from headcount.collector.cupti_source import CuptiRecorder, record_of  # noqa: E402
from headcount.parsers import cupti_records  # noqa: E402


def main(n: int = 100_000) -> None:
    replay = ReplayCupti(launch_cost_ns=1, latency_ns=1, kernel_ns=1)
    rec = CuptiRecorder(cupti=replay, pm_sampling=False, record_dir=tempfile.mkdtemp(prefix="hc-bench-"))
    rec.start()
    log = rec.range_log
    t0 = time.perf_counter()
    for i in range(n // 10):
        rid = log.open("headcount", f"layer.{i % 12}")
        for _ in range(10):
            replay.launch("kernel")
        log.close(rid)
    launch_s = time.perf_counter() - t0
    pending = list(replay._pending)
    t0 = time.perf_counter()
    for activity in pending:
        record_of(cupti, activity)
    copy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    path = rec.stop()
    stop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    header, records = cupti_records.read_records(path)
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    events = cupti_records.events_frame(header, records)
    frame_s = time.perf_counter() - t0
    print(f"records: {len(pending):,} CUPTI records ({n:,} kernels with their launch calls and external correlations), "
          f"{len(log.ranges):,} ranges; file {path.stat().st_size / 1e6:.1f} MB")
    print(f"copy in the buffer callback: {copy_s / len(pending) * 1e6:.2f} µs per record")
    print(f"stop (flush + copy + write gzip): {stop_s:.2f} s = {stop_s / len(pending) * 1e6:.2f} µs per record")
    print(f"read: {read_s:.2f} s; events table: {frame_s:.2f} s ({len(events):,} rows) = "
          f"{(read_s + frame_s) / len(pending) * 1e6:.2f} µs per record")
    print(f"(replay's own launch simulation: {launch_s:.2f} s, not headcount's cost)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
