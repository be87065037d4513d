"""A benchmark run on two versions of headcount, rounds alternating, in one run on one machine.

    python benchmarks/before_after.py BASE [--rounds N] -- BENCHMARK.py [ITS ARGUMENTS…]

BASE is a commit (e.g. the one before a restructuring), checked out as a git
worktree under ``--tree`` (``scripts/same_tables.py`` makes the same one).
Each round runs the benchmark once with the base tree (its own copy of the
benchmark, its code first on ``PYTHONPATH``) and once with this checkout,
the order swapped every round so that neither side always runs on a cooler
machine. Every output line is printed with ``[base]`` or ``[head]`` before
it: the benchmarks time ``headcount`` end to end as subprocesses, so the
figures are what a user waits for with each version. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree(base: str, where: Path) -> Path:
    if not where.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), base], check=True, capture_output=True)
    return where


def _run(label: str, tree: Path, benchmark: list[str]) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, str(tree / benchmark[0]), *benchmark[1:]], cwd=tree, env=env,
                          capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        print(f"[{label}] {line}", flush=True)
    return done.returncode


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("usage: before_after.py BASE [--rounds N] [--tree DIR] -- BENCHMARK.py [ARGS…]")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", default="/tmp/headcount-same-tables/base", help="where the base worktree is (or goes)")
    args = parser.parse_args(argv[:cut])
    benchmark = argv[cut + 1:]
    sides = [("base", _tree(args.base, Path(args.tree))), ("head", ROOT)]
    failed = 0
    for round_ in range(args.rounds):
        for label, tree in sides if round_ % 2 == 0 else sides[::-1]:
            print(f"== round {round_ + 1}, {label}: {' '.join(benchmark)}", flush=True)
            failed |= _run(label, tree, benchmark) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
