"""Wall time of the default ``headcount profile`` (goal: well under 60 s on 2 cores).

Runs the installed ``headcount`` command exactly as a newcomer does (embedded
default model, eager vs sdpa, layer mode), then once in head mode, each into
a fresh temporary directory, and prints the wall times.

Run: python benchmarks/profile_default.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "headcount.cli.main", "profile", "-o", str(Path(tmp) / "r"), *args]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t0


def main() -> None:
    print(f"machine: {os.cpu_count()} CPUs")
    print(f"headcount profile (default: eager,sdpa, layer mode, 3 steps): {timed([]):.1f} s wall (goal < 60 s)")
    print(f"headcount profile --mode head (default model, eager,sdpa): {timed(['--mode', 'head']):.1f} s wall")


if __name__ == "__main__":
    main()
