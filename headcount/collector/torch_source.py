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

# what the torch backend asks torch.profiler for, where it can sample PM counters: 20-µs samples (a 50-µs interval
# resolved none of bert-base's ~60-µs forward layer calls on an H100), and a 1 s look-back (Cuspy keeps ~18 KiB of
# host memory per sample it can look back over: 50,000 samples, under 1 GB; torch's default 10 s at 20 µs is 9 GB)
PM_INTERVAL_MS = 0.02
PM_LOOKBACK_MS = 1000.0


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
        pm_sampling: on CUDA, ask torch.profiler for PM samples where this torch has a route.
        pm_interval_ns: their interval, GPU nanoseconds; 0: :data:`PM_INTERVAL_MS`.

    Raises:
        HeadcountError: ``trace_dir`` cannot be made.
    """

    name = "torch"
    writes = "kineto"
    correlates_ranges = False  # torch.profiler matches ranges and kernels by time
    range_log = None
    device_limits = None

    def __init__(self, trace_dir: str | Path | None = None, cuda: bool | None = None, pm_sampling: bool = True,
                 pm_interval_ns: int = 0):
        self.notices: list[str] = []
        self.pm_interval_ms = pm_interval_ns / 1e6 if pm_interval_ns else PM_INTERVAL_MS
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
        on_cuda = cuda_available() if cuda is None else cuda
        if on_cuda:
            activities = activities + [ProfilerActivity.CUDA]
            if pm_sampling:
                activities = self._with_pm(activities)
        self._profile = profile(activities=activities)

    def _with_pm(self, activities: list) -> list:
        """The activities, asking torch.profiler for PM samples where this torch has a route
        (:mod:`headcount.collector.torch_pm`); a notice says which route, or why there is none."""
        from headcount.collector import torch_pm
        from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

        chosen = torch_pm.route(cuda=True)
        if chosen.name is None:
            if "no torch.profiler.PerformanceMetricsConfig" not in chosen.detail:  # older torch: nothing to say
                self.notices.append(f"no PM samples through torch.profiler: {chosen.detail}; sampled DRAM bytes: "
                                    "--backend cupti (headcount cupti install), exact ones: --backend ncu")
            return activities
        self.notices.append(f"PM samples through torch.profiler: {chosen.detail}; every {self.pm_interval_ms * 1e3:g} µs")
        return torch_pm.activities(chosen, [*PM_COUNTERS, *PM_PERCENTS], self.pm_interval_ms, PM_LOOKBACK_MS)

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
