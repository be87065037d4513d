"""Attribution speed at scale: headcount vs nsys's own nvtx_gpu_proj_trace.

Builds a large nsys SQLite export from the real H100×2 fixture, replicated
with shifted timestamps and fresh correlation ids until it holds ≥ 1M GPU
kernels and ≥ 5M NVTX ranges, then prints:

- headcount's read + attribute time (read_export + project_gpu) and peak RSS;
- the time of nsys's ``nvtx_gpu_proj_trace`` report on the same file (the
  ``nsys-report`` wrapper from install-nsight.sh), and the ratio;
- whether both answers agree range for range.

Goal: identical answers, ≥ 10× faster than nsys's report, ≤ 4 GB peak.

Run: python benchmarks/attribution.py [--copies N] [--keep DIR] [--nsys-timeout S]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"


def build(path: Path, copies: int) -> dict:
    """Replicate the fixture ``copies`` times into ``path`` (all in SQLite's C code)."""
    shutil.copy(FIXTURE, path)
    con = sqlite3.connect(path)
    lo, hi = con.execute("""SELECT min(t), max(t) FROM (
        SELECT start AS t FROM NVTX_EVENTS UNION ALL SELECT end FROM NVTX_EVENTS
        UNION ALL SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME UNION ALL SELECT end FROM CUPTI_ACTIVITY_KIND_KERNEL)""").fetchone()
    span = hi - lo + 1_000_000
    corr = con.execute("""SELECT max(c) FROM (SELECT max(correlationId) AS c FROM CUPTI_ACTIVITY_KIND_RUNTIME
        UNION ALL SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL)""").fetchone()[0] + 1
    tables = {
        "NVTX_EVENTS": ("start", "end", None),
        "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "correlationId"),
        "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId"),
        "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId"),
        "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId"),
    }
    con.execute("CREATE TEMP TABLE k (i INTEGER)")
    con.executemany("INSERT INTO k VALUES (?)", [(i,) for i in range(1, copies)])
    for table, (start, end, corr_col) in tables.items():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        select = []
        for c in cols:
            if c in (start, end):
                select.append(f"CASE WHEN t.{c} IS NULL THEN NULL ELSE t.{c} + k.i * {span} END")
            elif c == corr_col:
                select.append(f"t.{c} + k.i * {corr}")
            else:
                select.append(f"t.{c}")
        last = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
        where = f"t.rowid <= {last}" + (" AND t.eventType != 75" if table == "NVTX_EVENTS" else "")  # domains once
        con.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(select)} FROM k, {table} t WHERE {where}")
    con.commit()
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    con.close()
    return counts


def _headcount(path: str, queue) -> None:
    from headcount.attribute.attribution import project_gpu
    from headcount.parsers.nsys_sqlite import read_export

    t0 = time.perf_counter()
    export = read_export(path)
    t1 = time.perf_counter()
    # the projection nsys's report computes; headcount's tables add the path strings on top
    projected, _ = project_gpu(export.ranges, export.runtime, export.gpu, with_paths=False)
    t2 = time.perf_counter()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answer = projected.loc[projected["gpu_op_count"] > 0, ["range_id", "gpu_start_ns", "gpu_end_ns", "gpu_op_count", "parent_range_id", "depth"]]
    answer.to_pickle(path + ".headcount.pkl")
    queue.put((t1 - t0, t2 - t1, peak_kib / 2**20, len(export.ranges), len(export.gpu)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=300)
    parser.add_argument("--keep", default=None, help="keep the built export in this directory")
    parser.add_argument("--nsys-timeout", type=int, default=3600)
    args = parser.parse_args()
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="headcount-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"h100x2_x{args.copies}.sqlite"
    t = time.perf_counter()
    counts = build(path, args.copies)
    print(f"built {path.name} in {time.perf_counter() - t:.1f} s: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_headcount, args=(str(path), queue))
    proc.start()
    read_s, attribute_s, peak_gib, n_ranges, n_ops = queue.get()
    proc.join()
    ours = read_s + attribute_s
    print(f"headcount: read {read_s:.1f} s + attribute {attribute_s:.1f} s = {ours:.1f} s; peak RSS {peak_gib:.2f} GiB "
          f"({n_ranges:,} ranges, {n_ops:,} GPU operations)")

    report = shutil.which("nsys-report") or str(Path.home() / ".cache/headcount/nsight/bin/nsys-report")
    if not Path(report).exists():
        print("nsys-report not found (run ../shared/tools/install-nsight.sh): no comparison")
        return
    t = time.perf_counter()
    try:
        out = subprocess.run([report, "nvtx_gpu_proj_trace", str(path)], capture_output=True, text=True, timeout=args.nsys_timeout, check=True)
    except subprocess.TimeoutExpired:
        print(f"nsys's nvtx_gpu_proj_trace did not finish in {args.nsys_timeout} s: ratio ≥ {args.nsys_timeout / ours:.0f}×")
        return
    theirs = time.perf_counter() - t
    print(f"nsys nvtx_gpu_proj_trace: {theirs:.1f} s; headcount is {theirs / ours:.1f}× faster")
    reference = pd.read_csv(io.StringIO(out.stdout)).dropna(subset=["RangeId"]).astype({"RangeId": "int64"}).set_index("RangeId")
    answer = pd.read_pickle(str(path) + ".headcount.pkl").set_index("range_id")
    j = reference.join(answer, how="outer")
    same = (
        len(reference) == len(answer)
        and (j["Projected Start:ts_ns"] == j["gpu_start_ns"]).all()
        and (j["Projected Duration:dur_ns"] == j["gpu_end_ns"] - j["gpu_start_ns"]).all()
        and (j["NumGPUOps"] == j["gpu_op_count"]).all()
        and (j["ParentId"].fillna(-1).astype("int64") == j["parent_range_id"]).all()
    )
    print(f"answers identical for all {len(reference):,} projected ranges: {same}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
