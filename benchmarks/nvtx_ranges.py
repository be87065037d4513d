"""`headcount parse` of an nsys export that holds NVTX ranges and no GPU work, end to end.

A script that marks every step and layer with NVTX but was recorded without
CUDA tracing (or a CPU-only run) gives an export of ranges alone. Builds one
from the real H100×2 fixture (``benchmarks/attribution.py``'s replication,
``--copies`` times; 600 copies: about 10 M NVTX ranges), with every CUPTI
row deleted, and times ``headcount parse FILE -o OUT`` as a subprocess:
wall time and whole-process peak RSS, then checks that the report's
``ranges`` table holds every range.

Goal (issue 14): memory that does not grow without bound with the ranges.

Run: python benchmarks/nvtx_ranges.py [--copies N] [--keep DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from attribution import build, headcount_cmd, timed  # noqa: E402

GPU_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def ranges_only(path: Path, copies: int) -> int:
    """Build the export at ``path``; returns its number of NVTX ranges. The
    fixture's two processes become threads of one (headcount reads processes
    one at a time, so one process holding every range is the worst case)."""
    build(path, copies)
    with sqlite3.connect(path) as con:
        for table in GPU_TABLES:
            con.execute(f"DELETE FROM {table}")
        first = con.execute("SELECT min(globalTid >> 24) FROM NVTX_EVENTS").fetchone()[0]
        for col in ("globalTid", "endGlobalTid"):
            con.execute(f"UPDATE NVTX_EVENTS SET {col} = ({first} << 24) + ({col} & {(1 << 24) - 1}) WHERE {col} IS NOT NULL")
        ranges = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60)").fetchone()[0]
    with sqlite3.connect(path) as con:
        con.execute("VACUUM")
    return ranges


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=600)
    p.add_argument("--keep", default=None, help="keep (and reuse) the built export in this directory")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"ranges_only_one_process_{args.copies}.sqlite"
        if not path.exists():
            ranges = ranges_only(path, args.copies)
        else:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
                ranges = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60)").fetchone()[0]
        print(f"export: {ranges:,} NVTX ranges, no GPU work, {path.stat().st_size / 2**20:.0f} MiB")
        runs = []
        for _ in range(args.repeat):
            out = Path(tmp) / "out"
            m = timed([*headcount_cmd(), "parse", str(path), "-o", str(out), "--force"])
            if m.done.returncode != 0:
                print(m.done.stderr)
                return 1
            runs.append(m)
        walls = [m.wall for m in runs]
        print(f"headcount parse: {median(walls):.2f} s median of {len(walls)} ({', '.join(f'{w:.2f}' for w in walls)}), "
              f"{max(runs, key=lambda m: m.rss).memory()}")
        import pyarrow.dataset as ds

        written = ds.dataset(Path(tmp) / "out" / "ranges", partitioning="hive").count_rows()
        print(f"check: {written:,} ranges in the report (export: {ranges:,}): {'ok' if written == ranges else 'FAIL'}")
        return 0 if written == ranges else 1


if __name__ == "__main__":
    sys.exit(main())
