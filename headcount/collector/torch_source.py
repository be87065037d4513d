"""The ``torch`` source: record with torch.profiler (Kineto), keep its trace.

Recording only: start and stop the profiler, write the Chrome trace. Turning
the trace into tables is :mod:`headcount.parsers.kineto_json`'s job.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from headcount.collector.native_log import kineto_lines_dropped
from headcount.common.errors import HeadcountError


def cuda_available() -> bool:
    """True when torch sees a CUDA device (:func:`headcount.common.env.cuda_usable`)."""
    from headcount.common.env import cuda_usable

    return cuda_usable()


class TorchRecorder:
    """Records CPU operators (and CUDA kernels and runtime calls when a GPU is
    present) with torch.profiler; :meth:`stop` writes the trace file.

    Args:
        trace_dir: where to write ``trace.json`` (a temporary directory by default).
        cuda: also record CUDA kernels and runtime calls (default: when torch
            sees a GPU; ``False`` for a model that runs on the CPU).
    """

    name = "torch"
    writes = "kineto"
    correlates_ranges = False  # torch.profiler matches ranges and kernels by time
    range_log = None
    device_limits = None

    def __init__(self, trace_dir: str | Path | None = None, cuda: bool | None = None):
        self.notices: list[str] = []
        self._tmp = None
        if trace_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="headcount-trace-")
            trace_dir = self._tmp.name
        try:  # torch.profiler only logs a failed write; a missing directory would surface later as "no such file"
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HeadcountError(f"trace directory {trace_dir}: {exc.strerror or exc}", hint="pass a directory you can write to") from exc
        self.trace_path = Path(trace_dir) / "trace.json"
        activities = [ProfilerActivity.CPU]
        if cuda_available() if cuda is None else cuda:
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities)

    @property
    def version(self) -> str:
        return str(torch.__version__)  # torch.__version__ is a TorchVersion: unpickling one imports torch

    def start(self) -> None:
        """Start recording.

        Raises:
            HeadcountError: a torch.profiler session of the program is already recording.
        """
        if torch._C._autograd._profiler_enabled():
            raise HeadcountError(
                "a torch.profiler session of yours is already recording in this process, and torch runs one at a time "
                "(headcount's torch backend is one)",
                hint="start headcount outside your torch.profiler block; or keep your profiler, tag the model with "
                     "headcount.tag(model) inside it, export its trace (prof.export_chrome_trace('trace.json')) and run "
                     "`headcount parse trace.json`",
            )
        with kineto_lines_dropped():
            self._profile.__enter__()

    def stop(self) -> Path:
        """Stop recording and write the Chrome trace; returns its path."""
        with kineto_lines_dropped():
            self._profile.__exit__(None, None, None)
        self._profile.export_chrome_trace(str(self.trace_path))
        return self.trace_path

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
