"""Kineto's ``USDT:``/``STAGE:`` lines kept out of headcount's output (issue 58), everything else on fd 2 kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECORD = """
import os, sys, torch
from headcount.collector.native_log import kineto_lines_dropped
from headcount.collector.torch_source import TorchRecorder
recorder = TorchRecorder(cuda=False)
recorder.start()
torch.ones(4) + 1
recorder.stop()
with kineto_lines_dropped():
    os.write(2, b"USDT:2026-12-07 06:30:57 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
    print("a warning of the program's", file=sys.stderr)
    os.write(2, b"a C++ line of the program's\\n")
print("after", file=sys.stderr)
"""


def test_torch_profiler_start_and_stop_print_no_kineto_lines_and_keep_the_rest():
    done = subprocess.run([sys.executable, "-c", RECORD], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "USDT:" not in done.stderr and "STAGE:" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == ["a warning of the program's", "a C++ line of the program's", "after"]


def test_without_the_filter_torch_prints_them():
    """The lines the filter drops are there without it: the test above checks something."""
    done = subprocess.run([sys.executable, "-c", "import torch\nwith torch.profiler.profile():\n    torch.ones(4) + 1\n"],
                          capture_output=True, text=True, timeout=300)
    assert "profiler_start" in done.stderr
