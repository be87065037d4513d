"""`headcount parse` at scale, end to end: headcount vs nsys's own nvtx_gpu_proj_trace and nsys-ai.

Builds a large nsys SQLite export from the real H100×2 fixture, replicated
with shifted timestamps and fresh correlation ids (300 copies: 1,032,600
kernels, 5,034,600 NVTX ranges, 593 MB), then, one after the other on the
same machine:

- ``headcount parse FILE -o OUT`` as a subprocess: wall time and peak RSS of
  the whole process (what a user waits for and what must fit in memory);
  with ``--detail``, the read and attribute stages alone in a fresh process;
- nsys's ``nvtx_gpu_proj_trace`` report on the same file (``nsys-report``
  from install-nsight.sh), and whether headcount's ``ranges`` table (read
  back from the Parquet it wrote) agrees with it range for range;
- ``nsys-ai warm`` on the same file, when ``$NSYS_AI`` names it, it is on PATH, or
  ``benchmarks/peers.sh`` installed it in ``.venv-peers/`` (with the DuckDB sqlite extension it needs, offline);
- the floor (issue 60): a fresh process that only reads the three tables the parse
  needs (``NVTX_EVENTS``, ``CUPTI_ACTIVITY_KIND_KERNEL``, ``CUPTI_ACTIVITY_KIND_RUNTIME``,
  the columns its queries read) into Arrow through the same ADBC SQLite driver and batch size, one core:
  what any parse of the file costs at least.

``--ranks N`` instead copies a smaller export N times and times
``headcount parse rank*.sqlite --jobs 1`` against ``--jobs 2`` (``--ray``:
also ``--executor ray``), checking that the tables are identical.

Goals (issue 12, raised by issue 60): identical answers, ≥ 16× nsys's report, ≥ 2× nsys-ai,
within 2.5× of the read floor, ≤ 1 GB peak.

``--widen 4`` repeats the export's processes 4 times (20 M NVTX ranges,
2.4 GB, 8 processes): the peak must not grow with the file.

Run: python benchmarks/attribution.py [--copies N] [--keep DIR] [--nsys-timeout S] [--detail] [--ranks N [--ray]] [--widen N] [--repeat N]

Each headcount command and the read floor run --repeat times (default 3), alternating
with one another; the median wall time is reported with every run, and the largest peak.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

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


def widen(source: Path, path: Path, factor: int) -> dict:
    """``source`` with its processes repeated ``factor`` times as new processes
    (process ids shifted by 1000·k in ``globalTid``/``globalPid``): a recording
    of ``factor``× as many ranks, each the size of the original's."""
    shutil.copy(source, path)
    con = sqlite3.connect(path)
    shifted = {"NVTX_EVENTS": ("globalTid", "endGlobalTid"), "CUPTI_ACTIVITY_KIND_RUNTIME": ("globalTid",),
               "CUPTI_ACTIVITY_KIND_KERNEL": ("globalPid",), "CUPTI_ACTIVITY_KIND_MEMCPY": ("globalPid",),
               "CUPTI_ACTIVITY_KIND_MEMSET": ("globalPid",)}
    for table, columns in shifted.items():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        last = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
        for k in range(1, factor):
            offset = k * 1000 * (1 << 24)
            select = [f"{c} + {offset}" if c in columns else c for c in cols]
            con.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(select)} FROM {table} WHERE rowid <= {last}")
    con.commit()
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in shifted}
    con.close()
    return counts


def _stages(path: str, queue) -> None:
    from headcount.attribute.attribution import project_gpu
    from headcount.parsers.nsys_sqlite import read_export

    t0 = time.perf_counter()
    export = read_export(path)
    t1 = time.perf_counter()
    project_gpu(export.ranges, export.runtime, export.gpu, with_paths=False)
    queue.put((t1 - t0, time.perf_counter() - t1, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20))


FLOOR = """
import sys
import adbc_driver_sqlite.dbapi as adbc
from headcount.parsers.nsys_export import BATCH_ROWS
WANTED = {  # the columns headcount's queries read (headcount/parsers/nsys_sqlite.py), where the table has them
    "NVTX_EVENTS": ["rowid", "start", "end", "globalTid", "eventType", "domainId", "textId", "endGlobalTid", "text"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["globalTid", "correlationId", "start", "end", "nameId"],
    "CUPTI_ACTIVITY_KIND_KERNEL": ["shortName", "demangledName", "globalPid", "deviceId", "streamId", "correlationId", "start",
                                   "end", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                                   "staticSharedMemory", "dynamicSharedMemory", "sharedMemoryExecuted", "graphNodeId"],
}
rows = 0
with adbc.connect("file:" + sys.argv[1] + "?mode=ro") as con, con.cursor() as cur:
    cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
    for table, wanted in WANTED.items():
        cur.execute("SELECT name FROM pragma_table_info('" + table + "')")
        have = {row[0] for row in cur.fetchall()} | {"rowid"}
        cur.execute("SELECT " + ", ".join('"' + c + '"' for c in wanted if c in have) + " FROM " + table)
        rows += cur.fetch_arrow_table().num_rows
print(rows)
"""


def floor(path: Path) -> "Measured":
    """The read floor (module docstring): the three tables into Arrow, nothing else, in a fresh process."""
    return timed([sys.executable, "-c", FLOOR, str(path)], inputs=(path,))


def _tree_memory(pid: int) -> tuple[int, int]:
    """``pid`` and all its descendants now (from /proc): (resident bytes summed,
    resident bytes of the largest process). The sum counts pages that forked
    workers share with their parent (the interpreter, numpy, pandas, pyarrow)
    once per process: an upper bound. (Proportional figures from smaps_rollup
    walk every page table and slowed the measured command by ~20 %.)"""
    rss = largest = 0
    todo = [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                mine = int(fh.read().split()[1]) * page
            rss, largest = rss + mine, max(largest, mine)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return rss, largest


@dataclass
class Measured:
    """One timed command: wall seconds and peaks in GiB (sampled every 20 ms from /proc)."""

    wall: float
    rss: float  # resident, summed over the process tree
    largest: float  # resident, the largest single process
    done: subprocess.CompletedProcess

    def memory(self) -> str:
        if self.rss <= self.largest * 1.001:  # one process
            return f"peak RSS {self.rss:.2f} GiB"
        return f"peak RSS {self.rss:.2f} GiB summed over its processes (largest process {self.largest:.2f} GiB)"


def warm(*paths: Path) -> None:
    """Read ``paths`` once, so that the command timed next finds them in the page cache as the others did: this
    machine gives back idle cache within minutes, and the first command of a run once paid a cold read of the
    589 MB export (18.1 s, where the same parse took 11–12 s warm)."""
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass


def timed(cmd: list[str], timeout: float | None = None, inputs: tuple = ()) -> Measured:
    """Run ``cmd`` in a fresh process, sampling the memory of its process tree every 20 ms; ``inputs`` are read
    first (:func:`warm`)."""
    warm(*inputs)
    with tempfile.TemporaryDirectory() as tmp:
        stdout, stderr = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with stdout.open("w") as out, stderr.open("w") as err:
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err)
            peaks, rc = [0, 0], None
            while rc is None:
                peaks = [max(a, b) for a, b in zip(peaks, _tree_memory(proc.pid))]
                waited, status, _ = os.wait4(proc.pid, os.WNOHANG)
                if waited:
                    rc = os.waitstatus_to_exitcode(status)
                    break
                if timeout and time.perf_counter() - t > timeout:
                    proc.kill()
                    os.wait4(proc.pid, 0)
                    rc = -9
                    break
                time.sleep(0.02)
            wall = time.perf_counter() - t
        proc.returncode = rc  # reaped above
        done = subprocess.CompletedProcess(cmd, rc, stdout.read_text(), stderr.read_text()[-4000:])
        return Measured(wall, *(v / 2**30 for v in peaks), done)


def headcount_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("headcount")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "headcount.cli.main"]


def same_as_nsys(reference_csv: str, out: Path) -> tuple[bool, int]:
    """headcount's written ranges vs nsys's projection: every projected range, same start, duration, count, parent."""
    import pyarrow.dataset as ds

    reference = pd.read_csv(io.StringIO(reference_csv)).dropna(subset=["RangeId"]).astype({"RangeId": "int64"}).set_index("RangeId")
    ranges = ds.dataset(out / "ranges", partitioning="hive").to_table(
        columns=["range_id", "gpu_start_ns", "gpu_end_ns", "gpu_op_count", "parent_range_id"]).to_pandas()
    answer = ranges[ranges["gpu_op_count"] > 0].set_index("range_id")
    j = reference.join(answer, how="outer")
    same = (
        len(reference) == len(answer)
        and (j["Projected Start:ts_ns"] == j["gpu_start_ns"]).all()
        and (j["Projected Duration:dur_ns"] == j["gpu_end_ns"] - j["gpu_start_ns"]).all()
        and (j["NumGPUOps"] == j["gpu_op_count"]).all()
        and (j["ParentId"].fillna(-1).astype("int64") == j["parent_range_id"]).all()
    )
    return bool(same), len(reference)


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def ranks(args, workdir: Path) -> None:
    """N rank files: --jobs 1 vs --jobs 2 (vs --executor ray), identical tables."""
    import pyarrow.dataset as ds

    one = workdir / "rank0.sqlite"
    if not one.exists():
        build(one, args.copies)
    files = [one]
    for i in range(1, args.ranks):
        files.append(workdir / f"rank{i}.sqlite")
        if not files[-1].exists():
            shutil.copy(one, files[-1])
    print(f"{args.ranks} exports of {one.stat().st_size / 1e6:.0f} MB each; {load()}")
    tables, walls, runs = {}, {}, [("--jobs 1", ["--jobs", "1"]), ("--jobs 2", ["--jobs", "2"]),
                                    *([("--executor ray", ["--executor", "ray"])] if args.ray else [])]
    measured: dict[str, list[Measured]] = {}
    for _ in range(args.repeat):  # rounds alternate the commands: a slow spell of the machine hits them alike
        for label, extra in runs:
            out = workdir / f"out-{label.replace(' ', '').replace('-', '')}"
            shutil.rmtree(out, ignore_errors=True)
            m = timed([*headcount_cmd(), "parse", *map(str, files), "-o", str(out), *extra], inputs=tuple(files))
            if m.done.returncode != 0:
                print(f"{label}: failed ({m.done.stderr.strip().splitlines()[-1] if m.done.stderr.strip() else m.done.returncode})")
                continue
            measured.setdefault(label, []).append(m)
            tables[label] = {name: ds.dataset(out / name, partitioning="hive").to_table().drop_columns(["run_id"]).to_pandas()
                             .sort_values(["start_ns"] if name in ("ranges", "kernels") else list(ds.dataset(out / name).schema.names)[:3])
                             .reset_index(drop=True) for name in ("ranges", "kernels", "layers", "heads")}
    for label, ms in measured.items():
        walls[label] = median(m.wall for m in ms)
        print(f"headcount parse {args.ranks} files {label}: {walls[label]:.1f} s wall (median of "
              f"{', '.join(f'{m.wall:.1f}' for m in ms)}), {max(ms, key=lambda m: m.rss).memory()}")
    labels = list(tables)
    for label in labels[1:]:
        same = all(tables[labels[0]][n].equals(tables[label][n]) for n in tables[label])
        print(f"tables of {label} identical to {labels[0]}: {same}; {walls[labels[0]] / walls[label]:.2f}× the speed of {labels[0]} (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=300)
    parser.add_argument("--keep", default=None, help="keep (and reuse) the built exports in this directory")
    parser.add_argument("--nsys-timeout", type=int, default=3600)
    parser.add_argument("--detail", action="store_true", help="also time read and attribute alone")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each headcount command (alternating; the median is reported)")
    parser.add_argument("--ranks", type=int, default=0, help="time N copies with --jobs 1 and 2 instead")
    parser.add_argument("--ray", action="store_true", help="with --ranks: also --executor ray")
    parser.add_argument("--widen", type=int, default=1,
                        help="repeat the built export's processes N times as new processes (N× the file, same size per process)")
    args = parser.parse_args()
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="headcount-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.ranks:
            ranks(args, workdir)
            return
        path = workdir / f"h100x2_x{args.copies}.sqlite"
        if not path.exists():
            t = time.perf_counter()
            counts = build(path, args.copies)
            print(f"built {path.name} in {time.perf_counter() - t:.1f} s: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
        if args.widen > 1:
            wide = workdir / f"h100x2_x{args.copies}_w{args.widen}.sqlite"
            if not wide.exists():
                t = time.perf_counter()
                counts = widen(path, wide, args.widen)
                print(f"built {wide.name} in {time.perf_counter() - t:.1f} s: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
            path = wide
        print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB; {load()}")
        out = workdir / "out"
        shutil.rmtree(out, ignore_errors=True)
        one = workdir / "out-jobs1"
        default, single, floors = [], [], []
        for _ in range(args.repeat):  # alternating, so that a slow spell of the machine hits both alike
            shutil.rmtree(out, ignore_errors=True)
            m = timed([*headcount_cmd(), "parse", str(path), "-o", str(out)], inputs=(path,))
            if m.done.returncode != 0:
                sys.exit(f"headcount parse failed: {m.done.stderr.strip()}")
            default.append(m)
            shutil.rmtree(one, ignore_errors=True)
            single.append(timed([*headcount_cmd(), "parse", str(path), "-o", str(one), "--jobs", "1"], inputs=(path,)))
            shutil.rmtree(one, ignore_errors=True)
            floors.append(floor(path))  # in the same rounds: a single run of it is at the mercy of the machine's spells
        ours = median(m.wall for m in default)
        walls = ", ".join(f"{m.wall:.1f}" for m in default)
        print(f"headcount parse: {ours:.1f} s wall (median of {walls}), {max(default, key=lambda m: m.rss).memory()}")
        failed = [m.done.returncode for m in single if m.done.returncode != 0]
        print(f"headcount parse --jobs 1 (one process): {median(m.wall for m in single):.1f} s wall (median of "
              f"{', '.join(f'{m.wall:.1f}' for m in single)}), {max(single, key=lambda m: m.rss).memory()}"
              + (f" (failed: exit {failed[0]})" if failed else ""))
        if args.detail:
            queue = mp.get_context("spawn").Queue()
            proc = mp.get_context("spawn").Process(target=_stages, args=(str(path), queue))
            proc.start()
            read_s, attribute_s, stage_peak = queue.get()
            proc.join()
            print(f"  detail: read {read_s:.1f} s + attribute {attribute_s:.1f} s (peak {stage_peak:.2f} GiB)")

        failed = [low for low in floors if low.done.returncode != 0]
        if not failed:
            low, floor_s = floors[-1], median(low.wall for low in floors)
            print(f"read floor (the columns headcount reads of the 3 tables, into Arrow through ADBC, {int(low.done.stdout.split()[-1]):,} rows, one core): "
                  f"{floor_s:.1f} s (median of {', '.join(f'{f.wall:.1f}' for f in floors)}), {low.memory()}; "
                  f"headcount takes {ours / floor_s:.2f}× it (goal ≤ 2.5×)")
        else:
            print(f"read floor failed (exit {failed[0].done.returncode}): {failed[0].done.stderr.strip()[-300:]}")
        report = shutil.which("nsys-report") or str(Path.home() / ".cache/headcount/nsight/bin/nsys-report")
        if Path(report).exists():
            m = timed([report, "nvtx_gpu_proj_trace", str(path)], timeout=args.nsys_timeout, inputs=(path,))
            theirs, done = m.wall, m.done
            if done.returncode == -9:
                print(f"nsys nvtx_gpu_proj_trace did not finish in {args.nsys_timeout} s: ratio ≥ {args.nsys_timeout / ours:.0f}×")
            else:
                same, n = same_as_nsys(done.stdout, out)
                print(f"nsys nvtx_gpu_proj_trace: {theirs:.1f} s, {m.memory()}; headcount is {theirs / ours:.1f}× faster (goal ≥ 16×) "
                      f"(median run; {theirs / max(d.wall for d in default):.1f}× its slowest)")
                print(f"answers identical for all {n:,} projected ranges: {same}")
        else:
            print("nsys-report not found (run ../shared/tools/install-nsight.sh): no comparison with nsys")
        peers = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "nsys-ai"  # benchmarks/peers.sh
        nsys_ai = os.environ.get("NSYS_AI") or shutil.which("nsys-ai") or (str(peers) if peers.exists() else None)
        if nsys_ai:
            # warm builds its cache beside the file (<stem>.nsys-cache/): time a cold build
            shutil.rmtree(path.with_suffix(".nsys-cache"), ignore_errors=True)
            path.with_suffix(".nsys-cache.build.lock").unlink(missing_ok=True)
            m = timed([nsys_ai, "warm", str(path)], inputs=(path,))
            state = "" if m.done.returncode == 0 else f" (exit {m.done.returncode}: {m.done.stderr.strip()[-200:]})"
            print(f"nsys-ai warm: {m.wall:.1f} s, {m.memory()}{state}; headcount is {m.wall / ours:.2f}× faster (goal ≥ 2×)")
        else:
            print("nsys-ai not found (bash benchmarks/peers.sh, or NSYS_AI=path): no comparison with nsys-ai")
        print(load())
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
