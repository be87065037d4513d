"""How long the ``headcount`` command takes to start, as users run it (subprocesses).

Times, alternating, ``headcount --version``, ``headcount query REPORT "SELECT 1"``
(on a small report made first) and ``python -c "import torch"`` (what a
command that imports torch pays before doing anything), and prints the
medians. Goal (issue 15): ``--version`` at least 4× faster than importing
torch on the same machine in the same run.

Run: python benchmarks/cli_start.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution import headcount_cmd  # noqa: E402


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r"
        subprocess.run([*headcount_cmd(), "profile", "--impl", "sdpa", "--steps", "1", "--seq", "16", "--batch", "1",
                        "--no-backward", "-o", str(report)], check=True, capture_output=True)
        commands = {"headcount --version": [*headcount_cmd(), "--version"],
                    "headcount query REPORT 'SELECT 1'": [*headcount_cmd(), "query", str(report), "SELECT 1"],
                    "python -c 'import torch'": [sys.executable, "-c", "import torch"]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, cmd in commands.items():
                times[name].append(wall(cmd))
    torch_s = median(times["python -c 'import torch'"])
    for name, values in times.items():
        print(f"{name}: {median(values):.3f} s median of {len(values)} ({', '.join(f'{v:.3f}' for v in values)})")
    version_s = median(times["headcount --version"])
    print(f"--version is {torch_s / version_s:.1f}× faster than importing torch (goal ≥ 4×): "
          f"{'ok' if torch_s / version_s >= 4 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
