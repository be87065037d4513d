"""Find (or unpack) the real Nsight tools for tests.

``../shared/tools/install-nsight.sh`` unpacks nsys 2023.4.4 and ncu 2024.1.1
into ``~/.cache/headcount/nsight``. Tests that need them skip when they cannot
be had, unless ``HEADCOUNT_REQUIRE_NSIGHT=1`` (set by ``.ci/run``), where a
missing tool is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PREFIX = Path(os.environ.get("HEADCOUNT_NSIGHT_PREFIX", Path.home() / ".cache" / "headcount" / "nsight"))
INSTALLER = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "install-nsight.sh"


def nsight_bin(tool: str) -> str:
    """Path of ``tool`` (``nsys``, ``ncu``, ``nsys-report``); installs once if needed."""
    found = shutil.which(tool) or (str(PREFIX / "bin" / tool) if (PREFIX / "bin" / tool).exists() else None)
    if found is None and INSTALLER.exists():
        subprocess.run(["bash", str(INSTALLER), str(PREFIX)], check=False, capture_output=True, timeout=600)
        if (PREFIX / "bin" / tool).exists():
            found = str(PREFIX / "bin" / tool)
    if found is None:
        message = f"{tool} not available (run {INSTALLER} {PREFIX})"
        if os.environ.get("HEADCOUNT_REQUIRE_NSIGHT") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found
