"""PM sampling for the cupti source (cupti-python ≥ 13.3): device-wide counters at a fixed GPU time interval.

:class:`PmSampler` configures, starts, stops and decodes CUPTI's PM sampling (any failure a notice, never an
error); the intervals and metric sets it tries and the decode budget are here. :func:`pm_sampling_gap` says, before
anything is enabled, why the loaded libcupti cannot run it (the functions it lacks, a release too old).
"""

from __future__ import annotations

import time

from headcount.collector import cupti_home
from headcount.collector.cupti_errors import classify
from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

# PM sampling intervals tried, finest first (GPU ns), when none is asked for (DEFAULT_PM_INTERVAL_NS = 0, "auto"):
# the first CUPTI accepts is used. 5 µs is nsys's finest GPU-metrics rate (200 kHz); the 50-µs interval of the first
# H100 run resolved none of bert-base's 40–60-µs sdpa forward layer calls (headcount.derive.sampling.MIN_WHOLE_SAMPLES)
PM_INTERVALS_NS = (5_000, 10_000, 20_000, 50_000)
DEFAULT_PM_INTERVAL_NS = 0
PM_HARDWARE_BUFFER_BYTES = 256 << 20
# the most samples decoded from one recording (host memory: each becomes a record); at 5 µs, 20 s of GPU time.
# A longer recording keeps its first samples, says so, and its later ranges get no sampled figure (null)
PM_MAX_DECODED_SAMPLES = 4_000_000
# tried in order until PM sampling accepts one set in a single pass
# what PM sampling asks for, largest set first, from the tables the sampling derivation reads (they cannot drift apart)
PM_METRIC_SETS = ((*PM_COUNTERS, *PM_PERCENTS), tuple(PM_COUNTERS))


PM_SAMPLING_FUNCTIONS = (
    "cuptiProfilerInitialize", "cuptiProfilerDeInitialize", "cuptiDeviceGetChipName",
    "cuptiProfilerHostGetSupportedChips", "cuptiProfilerHostInitialize", "cuptiProfilerHostDeinitialize",
    "cuptiProfilerHostConfigAddMetrics", "cuptiProfilerHostGetConfigImageSize", "cuptiProfilerHostGetConfigImage",
    "cuptiProfilerHostEvaluateToGpuValues",
    "cuptiPmSamplingSetConfig", "cuptiPmSamplingEnable", "cuptiPmSamplingDisable", "cuptiPmSamplingStart", "cuptiPmSamplingStop",
    "cuptiPmSamplingDecodeData", "cuptiPmSamplingGetCounterDataInfo", "cuptiPmSamplingGetCounterDataSize",
    "cuptiPmSamplingCounterDataImageInitialize", "cuptiPmSamplingCounterDataGetSampleInfo",
)
"""The libcupti functions cupti-python's PM sampling calls on headcount's path (a collector given a metric list, no
single-pass set name): all exported by libcupti 13.0.85 (torch 2.14's) and 13.4, read from cupti-python 13.4's
``pm_sampling`` and ``profiler_host`` modules."""


def missing_functions(library: str, names: tuple[str, ...] = PM_SAMPLING_FUNCTIONS) -> list[str]:
    """Those of ``names`` that ``library`` does not export, read from its dynamic symbol table (pyelftools, which
    cupti-python needs too): nothing is loaded into the process, where a second libcupti would split CUPTI in two.
    All of them where the file cannot be read as a shared library."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return list(names)
    try:
        with open(library, "rb") as fh:
            table = ELFFile(fh).get_section_by_name(".dynsym")
            exported = {sym.name for sym in table.iter_symbols() if sym["st_shndx"] != "SHN_UNDEF"} if table else set()
    except (OSError, ELFError):
        return list(names)
    return [name for name in names if name not in exported]


DRAM_ELSEWHERE = "DRAM meanwhile from --backend nsys --gpu-metrics on, or --backend ncu"


def pm_sampling_gap(library: str | None) -> str | None:
    """Why PM sampling cannot run on ``library``: the functions it lacks, named, or a release older than the
    cupti-python in use declares (CUPTI then refuses every configuration); None when nothing is known against it."""
    if library is None:
        return None
    missing = missing_functions(library)
    if missing:
        return (f"PM sampling needs {', '.join(missing)}, which {library} does not export: DRAM is not sampled here "
                f"(`headcount cupti install` brings a libcupti that has them; {DRAM_ELSEWHERE})")
    release = cupti_home.library_release(library)
    version, declared = cupti_home.bindings_need()
    if cupti_home.older_than_declared(release, declared) and cupti_home.note():
        # the folder holds the right library, but another was loaded first: say that, not "install"
        return f"PM sampling cannot run on libcupti {release} ({library}): {cupti_home.note()} ({DRAM_ELSEWHERE})"
    if cupti_home.older_than_declared(release, declared):
        return (f"libcupti {release} ({library}) is older than cupti-python {version} declares ({declared}): CUPTI refuses "
                "its PM sampling there (ERROR_INVALID_PARAMETER on an H100), so DRAM is not sampled "
                f"(`headcount cupti install` puts libcupti {declared} beside your torch; {DRAM_ELSEWHERE})")
    return None


class PmSampler:
    """PM sampling (cupti-python ≥ 13.3): device-wide counters at a fixed GPU
    time interval. Any failure turns into a notice; activity tracing goes on.

    Args:
        pm_sampling: the ``cupti.pm_sampling`` module.
        device_index: CUDA device.
        interval_ns: sampling interval in GPU nanoseconds; 0 (auto): the finest of :data:`PM_INTERVALS_NS`
            that CUPTI accepts (``interval_ns`` afterwards, the ones refused in ``refused_intervals``).
    """

    def __init__(self, pm_sampling, device_index: int = 0, interval_ns: int = DEFAULT_PM_INTERVAL_NS):
        self._pm = pm_sampling
        self.device_index = device_index
        self.intervals = tuple(PM_INTERVALS_NS) if not interval_ns else (int(interval_ns),)
        self.interval_ns = self.intervals[0]
        self.refused_intervals: list[int] = []
        self.metrics: list[str] = []
        self.notice: str | None = None
        self._collector = None
        self._t0 = 0.0

    def start(self) -> bool:
        try:
            collector = self._pm.Collector(device_index=self.device_index)
            collector.enable()
        except Exception as exc:  # noqa: BLE001 - PM sampling is optional by design
            self.notice = f"PM sampling unavailable: {classify(exc, 'enabling PM sampling').one_line()}"
            return False
        errors = []
        for metrics in PM_METRIC_SETS:
            refused = []  # the intervals refused for the set finally used: what refused_intervals_ns reports
            for interval in self.intervals:  # finest first: the largest metric set at the finest interval it takes
                try:
                    collector.configure(metrics=list(metrics), sampling_interval=interval,
                                        hardware_buffer_size=PM_HARDWARE_BUFFER_BYTES)
                    self.metrics, self.interval_ns, self.refused_intervals = list(metrics), interval, refused
                    break
                except Exception as exc:  # noqa: BLE001 - try a coarser interval, then the next, smaller set
                    errors.append(f"{','.join(metrics)} every {interval} ns: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                    refused.append(interval)
            if self.metrics:
                break
        if not self.metrics:
            collector.disable()
            self.notice = "PM sampling unavailable: no metric set accepted (" + "; ".join(errors) + ")"
            return False
        try:
            collector.start()
        except Exception as exc:  # noqa: BLE001
            collector.disable()
            self.notice = f"PM sampling unavailable: {classify(exc, 'starting PM sampling').one_line()}"
            return False
        self._collector = collector
        self._t0 = time.perf_counter()
        return True

    def stop(self) -> tuple[list[dict], dict]:
        """Stop, decode and evaluate; returns (samples, info)."""
        if self._collector is None:
            return [], {"enabled": False, "notice": self.notice or (
                "PM sampling never started: CUDA was not initialized while headcount's ranges opened (DRAM is not "
                f"sampled; {DRAM_ELSEWHERE})")}
        collector, self._collector = self._collector, None
        elapsed_ns = (time.perf_counter() - self._t0) * 1e9
        info = {"enabled": True, "metrics": self.metrics, "interval_ns": self.interval_ns,
                "interval_choice": "auto" if len(self.intervals) > 1 else "asked", "refused_intervals_ns": self.refused_intervals}
        samples = []
        try:
            collector.stop()
            wanted = int(elapsed_ns / self.interval_ns * 1.5) + 1000
            budget = min(wanted, PM_MAX_DECODED_SAMPLES)
            data = collector.decode(max_samples=budget)
            info.update(total_samples=data.num_total_samples, populated_samples=data.num_populated_samples,
                        completed_samples=data.num_completed_samples, decode_budget=budget)
            if budget < wanted and data.num_populated_samples >= budget:
                info["notice"] = self.notice = (
                    f"PM sampling: the recording outlasted {budget:,} samples at {self.interval_ns / 1e3:g} µs (the decode "
                    "budget): the samples cover its first part only, later ranges get no sampled figure; a coarser "
                    "--pm-interval-us covers longer, or profile fewer steps")
            for sample in data:
                samples.append({"kind": "pm_sample", "start": sample.start_timestamp, "end": sample.end_timestamp,
                                "values": dict(zip(data.metrics, (float(v) for v in sample.metric_values)))})
        except Exception as exc:  # noqa: BLE001 - keep the activity records whatever happens here
            info["notice"] = self.notice = f"PM sampling failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        finally:
            collector.disable()
        return samples, info
