"""`headcount parse` of an nsys export with CUDA graph replays, end to end.

Records the tests' tagged tiny Llama (head mode, 2 steps) with the real nsys
on this CPU, exports SQLite, and adds the CUDA rows of a CUDA-graphed forward
as nsys writes them with ``--cuda-graph-trace=node`` (the stand-in of
``tests/test_nsys.py``: step 0's forward captured, one node per head range
plus one outside, cloned, then ``--replays`` graph launches after the run).
Then, as subprocesses on the same machine, one after the other:

- ``headcount parse`` of that export (every replayed kernel through its
  node's capturing range, one range instance per head, layer and phase per
  replay);
- ``headcount parse`` of the same export with its graph node table dropped
  (the plain rule: the kernels fall outside every range), for the cost of
  the replay attribution itself.

Prints wall time and peak RSS of each, and checks the first report: every
replayed attention kernel in a head range, one head instance per replay.

Run: python benchmarks/graph_replays.py [--replays N] [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from attribution import headcount_cmd, timed  # noqa: E402
from nsight import nsight_bin  # noqa: E402
from test_nsys import _graphed_export  # noqa: E402


def record(tmp: Path) -> Path:
    nsys = nsight_bin("nsys")
    rep = tmp / "tagged"
    subprocess.run([nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(rep), "--force-overwrite", "true",
                    sys.executable, str(ROOT / "tests" / "workloads" / "tagged_llama.py"), "2"], check=True, capture_output=True)
    sqlite_path = tmp / "tagged.sqlite"
    subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(sqlite_path), "--force-overwrite", "true", str(rep) + ".nsys-rep"],
                   check=True, capture_output=True)
    return sqlite_path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replays", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graphed = tmp / "graphed.sqlite"
        captured, _ = _graphed_export(record(tmp), graphed, replays=args.replays, after_the_run=True)
        plain = tmp / "plain.sqlite"
        shutil.copy(graphed, plain)
        with sqlite3.connect(plain) as con:
            con.execute("DROP TABLE CUDA_GRAPH_NODE_EVENTS")
        with sqlite3.connect(graphed) as con:
            kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        print(f"export: {args.replays} graph launches, {kernels} replayed kernels, {len(captured)} captured head ranges")
        runs: dict[str, list] = {"graphed": [], "plain": []}
        for _ in range(args.repeat):
            for name, path in (("graphed", graphed), ("plain", plain)):
                out = tmp / f"out-{name}"
                m = timed([*headcount_cmd(), "parse", str(path), "-o", str(out), "--force"])
                if m.done.returncode != 0:
                    print(m.done.stderr)
                    return 1
                runs[name].append(m)
        for name, label in (("graphed", "with graph node events"), ("plain", "graph node table dropped")):
            walls = [m.wall for m in runs[name]]
            largest = max(runs[name], key=lambda m: m.rss)
            print(f"headcount parse, {label}: {median(walls):.2f} s median of {len(walls)} "
                  f"({', '.join(f'{w:.2f}' for w in walls)}), {largest.memory()}")
        ranges = pd.read_parquet(tmp / "out-graphed" / "ranges")
        heads = ranges[(ranges["level"] == "head") & ranges["replay_of"].notna()]
        kernels_table = pd.read_parquet(tmp / "out-graphed" / "kernels")
        attention = kernels_table[kernels_table["name"].str.startswith("attention_node_")]
        ok = len(heads) == args.replays * len(captured) and attention["head"].notna().all()
        print(f"check: {len(heads)} head replay instances (expected {args.replays * len(captured)}), "
              f"{int(attention['head'].notna().sum())} of {len(attention)} attention kernels in a head: {'ok' if ok else 'FAIL'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
