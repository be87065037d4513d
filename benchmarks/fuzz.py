"""The fuzz harness at full size: ``--cases`` mutated files per format made
from the real fixtures (``tests/fuzz_cases.py``), each parsed by ``headcount
parse`` in this process, and the outcome table (issue 14's acceptance).

Formats: nsys SQLite, ncu CSV (raw and details pages, C and en_US), Kineto
JSON, .ncu-rep (read in a child process). Prints one row per format (error, accepted,
crash, hang, silent, touched) and every case that is not an error or an
accepted report, with its mutation, so that it can be replayed by seed.

Then truncation (issue 58): a real recording of every format headcount parses
(``fuzz_cases.TRUNCATION_BASES``: nsys SQLite and .nsys-rep, ncu CSV raw and
details, .ncu-rep, Kineto JSON plain and gzip, cupti records) cut at
``--points`` evenly spaced points, each parsed without and with ``--salvage``.
Without it a cut file must be refused; with it refused, or read with a
``damaged:`` notice of what was lost. A report read from a cut file without
that is counted ``silent``. ``.nsys-rep`` needs nsys ($HEADCOUNT_NSYS or PATH).

Run: python benchmarks/fuzz.py [--cases 1000] [--seed 0] [--points 20]
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
    p.add_argument("--points", type=int, default=20, help="cuts per format in the truncation table (0: none)")
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
    _print_table(["format", "cases"], rows, [(f"{name} {o.case}", o) for name, o in failures])
    return 1 if failures + truncation(args.points) else 0


def truncation(points: int) -> list:
    """The truncation table (module docstring); returns the cases that were neither refused nor said."""
    if points <= 0:
        return []
    rows, failures = [], []
    for name in fuzz_cases.TRUNCATION_BASES:
        for salvage in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                outcomes = fuzz_cases.run_truncation_cases(Path(tmp), name, points, salvage=salvage)
                wall = time.perf_counter() - t
            counts = Counter(o.kind for o in outcomes)
            rows.append((name, "--salvage" if salvage else "plain", len(outcomes), *(counts.get(k, 0) for k in KINDS), wall))
            failures += [(name, o) for o in outcomes if o.kind not in ("error", "accepted")]
    print()
    _print_table(["truncated format", "parse", "cuts"], rows, [(f"{name} truncated", o) for name, o in failures])
    return failures


def _print_table(first: list[str], rows: list[tuple], failures: list[tuple]) -> None:
    """A Markdown table: the ``first`` columns, then one per outcome kind and the wall time; then each failure."""
    print(f"| {' | '.join(first)} | {' | '.join(KINDS)} | wall s |")
    print("|" + "---|" * (len(first) + len(KINDS) + 1))
    for row in rows:
        print("| " + " | ".join(str(v) if not isinstance(v, float) else f"{v:.0f}" for v in row) + " |")
    for label, o in failures:
        print(f"{label} [{o.kind}] {o.mutation}: {o.detail}")


if __name__ == "__main__":
    sys.exit(main())
