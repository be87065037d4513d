"""Kineto's own log lines kept out of headcount's output.

torch.profiler's C++ side (Kineto) writes ``USDT:… profiler_start`` and ``STAGE:… Completed Stage: …`` lines
to file descriptor 2 when a session starts and stops, whatever ``KINETO_LOG_LEVEL`` says (2026-12, torch
2.13): under ``headcount profile`` they land between headcount's own lines. :func:`kineto_lines_dropped`
sends fd 2 to a temporary file around those calls and passes on every other line, in order.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager

# e.g. "USDT:2026-12-07 06:30:57 24931:24931 SyncActivityProfilerHandler.cpp:52] profiler_start"
KINETO_LINE = re.compile(rb"^(?:USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextmanager
def kineto_lines_dropped():
    """Run the body with fd 2 in a temporary file; then write what it got back to fd 2, Kineto's lines left out.
    Where fd 2 cannot be redirected (closed, no temporary directory) the body runs as it is."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        capture = tempfile.TemporaryFile()
    except OSError:
        os.close(saved)
        yield
        return
    with capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except ValueError:
                pass
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = b"".join(line for line in capture if not KINETO_LINE.match(line))
            if kept:
                os.write(2, kept)
