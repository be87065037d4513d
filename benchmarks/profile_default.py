"""Wall time of the default ``headcount profile`` (goal: well under 60 s on 2 cores),
and the post-processing share at scale.

Runs the installed ``headcount`` command exactly as a newcomer does (embedded
default model, eager vs sdpa, layer mode), then once in head mode, each into
a fresh temporary directory, and prints the wall times. Then
``headcount profile --model bert-base --mode head``: the time from the end of
the last profiled step to the finished tables (stop the recorder, read its
trace, attribute), against the profiled steps' own wall time (goal < 10 %),
as the run's metadata records them.

Run: python benchmarks/profile_default.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args: list[str], timing: dict | None = None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "headcount.cli.main", "profile", "-o", str(Path(tmp) / "r"), *args]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        if timing is not None:
            run = next((Path(tmp) / "r" / "manifests").glob("*/run.json"))
            timing.update(json.loads(run.read_text())["timing"])
        return wall


def main() -> None:
    print(f"machine: {os.cpu_count()} CPUs")
    print(f"headcount profile (default: eager,sdpa, layer mode, 3 steps): {timed([]):.1f} s wall (goal < 60 s)")
    print(f"headcount profile --mode head (default model, eager,sdpa): {timed(['--mode', 'head']):.1f} s wall")
    timing: dict = {}
    wall = timed(["--model", "bert-base", "--mode", "head", "--impl", "eager,sdpa", "--seq", "128"], timing)
    print(f"headcount profile --model bert-base --mode head --seq 128: {wall:.1f} s wall")
    for impl, t in timing.items():
        share = 100 * t["postprocess_s"] / t["profiled_steps_s"]
        ours = 100 * t["read_attribute_s"] / t["profiled_steps_s"]
        print(f"  {impl}: profiled steps {t['profiled_steps_s']:.2f} s, stop + read + attribute {t['postprocess_s']:.2f} s "
              f"= {share:.1f} % of the steps (goal < 10 %); of which the recorder's stop (torch.profiler stops and writes "
              f"its trace) {t['recorder_stop_s']:.2f} s, headcount's read + attribute {t['read_attribute_s']:.2f} s = {ours:.1f} %")


if __name__ == "__main__":
    main()
