"""The fuzz harness at full size: ``--cases`` mutated files per format made
from the real fixtures (``tests/fuzz_cases.py``), each parsed by ``headcount
parse`` in this process, and the outcome table (issue 14's acceptance).

Formats: nsys SQLite, ncu CSV (raw and details pages, C and en_US), Kineto
JSON, .ncu-rep (read in a child process). Prints one row per format (error, accepted,
crash, hang, silent, touched) and every case that is not an error or an
accepted report, with its mutation, so that it can be replayed by seed.

Run: python benchmarks/fuzz.py [--cases 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import fuzz_cases  # noqa: E402

KINDS = ("error", "accepted", "crash", "hang", "silent", "touched")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="first seed (case k uses seed + k)")
    args = p.parse_args()
    rows, failures = [], []
    formats = (("nsys SQLite", fuzz_cases.run_sqlite_cases), ("ncu CSV", fuzz_cases.run_csv_cases),
               ("Kineto JSON", fuzz_cases.run_kineto_cases), (".ncu-rep", fuzz_cases.run_ncurep_cases))
    for name, run in formats:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            outcomes = run(Path(tmp), range(args.seed, args.seed + args.cases))
            wall = time.perf_counter() - t
        counts = Counter(o.kind for o in outcomes)
        rows.append((name, len(outcomes), *(counts.get(k, 0) for k in KINDS), wall))
        failures += [(name, o) for o in outcomes if o.kind not in ("error", "accepted")]
    print(f"| format | cases | {' | '.join(KINDS)} | wall s |")
    print("|---|" + "---|" * (len(KINDS) + 2))
    for row in rows:
        print("| " + " | ".join(str(v) if not isinstance(v, float) else f"{v:.0f}" for v in row) + " |")
    for name, o in failures:
        print(f"{name} {o.case} [{o.kind}] {o.mutation}: {o.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
