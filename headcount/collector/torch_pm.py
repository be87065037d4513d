"""PM sampling through torch.profiler itself (torch ≥ 2.15's ``PerformanceMetricsConfig``): which route this torch
has, and the activities that ask for it — no second CUPTI subscriber beside torch's, and with Kineto's own route no
libcupti beyond torch's.

Two routes sit behind ``PerformanceMetricsConfig``:

- ``kineto``: Kineto's CUPTI PM-sampling child profiler. Whether a wheel has it compiled in is read from the
  library that links Kineto's CUPTI calls (``libtorch_cpu.so`` in the 2.15.0 wheels): it must import CUPTI's
  ``cuptiPmSampling*`` functions. torch 2.15.0's does not (it carries the ``PERFORMANCE_METRICS*`` config keys only).
- ``cuspy``: Cuspy (``torch.profiler.CuspyConfig``, ``torch/profiler/_cuspy``, experimental), a cupti-python
  collector; its PM sampling needs cupti-python and libcupti ≥ 13.3, above the 13.2.86 torch 2.15 pins.

Either writes the samples into the trace as counter events, which :mod:`headcount.parsers.kineto_counters` reads.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CUSPY_MIN = (13, 3)  # cupti-python and libcupti releases Cuspy's PM sampling needs
KINETO_PM_FUNCTION = "cuptiPmSamplingEnable"  # what a Kineto with the PM-sampling child profiler must import


@dataclass(frozen=True)
class Route:
    """How this torch would sample PM counters: ``name`` ``kineto``, ``cuspy`` or ``None`` (none works), and why."""

    name: str | None
    detail: str


def _release(package: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in metadata.version(package).split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return None


@functools.cache
def kineto_samples_pm(lib_dir: str | None = None) -> bool | None:
    """Whether this torch's Kineto has CUPTI PM sampling compiled in: a torch library importing
    :data:`KINETO_PM_FUNCTION` (read from its dynamic symbols, nothing loaded); ``None`` when no torch library
    imports CUPTI at all (a CPU build) or they cannot be read."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return None
    if lib_dir is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        lib_dir = str(Path(spec.origin).parent / "lib")
    seen_cupti = False
    for name in ("libtorch_cpu.so", "libtorch_cuda.so", "libkineto.so"):
        path = Path(lib_dir) / name
        if not path.exists():
            continue
        try:
            with path.open("rb") as fh:
                table = ELFFile(fh).get_section_by_name(".dynsym")
                names = {sym.name for sym in table.iter_symbols() if sym.name.startswith("cupti")} if table else set()
        except (OSError, ELFError):
            continue
        seen_cupti |= bool(names)
        if KINETO_PM_FUNCTION in names:
            return True
    return False if seen_cupti else None


def route(cuda: bool = True) -> Route:
    """The route torch.profiler would take for PM sampling here, or why none works (without a CUDA device:
    none, and what this torch would take on one)."""
    found = _route()
    if not cuda and found.name is not None:
        return Route(None, f"no CUDA device here; on one, {found.name}: {found.detail}")
    if not cuda and "no torch.profiler.PerformanceMetricsConfig" not in found.detail:
        return Route(None, f"no CUDA device here; on one, none: {found.detail}")
    return found


def _route() -> Route:
    import torch
    import torch.profiler as tp

    version = str(torch.__version__)
    if not hasattr(tp, "PerformanceMetricsConfig"):
        return Route(None, f"torch {version} has no torch.profiler.PerformanceMetricsConfig (torch 2.15+)")
    kineto = kineto_samples_pm()
    if kineto:
        return Route("kineto", f"torch {version}: Kineto's CUPTI PM sampling (no second CUPTI subscriber, torch's own libcupti)")
    why_not = (f"torch {version}'s Kineto has no CUPTI PM-sampling profiler compiled in (its libraries import no "
               f"{KINETO_PM_FUNCTION})" if kineto is False else f"torch {version}'s libraries do not say whether Kineto samples PM")
    if not hasattr(tp, "CuspyConfig") or importlib.util.find_spec("torch.profiler._cuspy") is None:
        return Route(None, why_not + "; and this torch has no Cuspy")
    bindings, library = _release("cupti-python"), _release("nvidia-cuda-cupti")
    need = ".".join(map(str, CUSPY_MIN))
    if bindings is None or bindings < CUSPY_MIN:
        return Route(None, why_not + f"; Cuspy's PM sampling needs cupti-python ≥ {need} (here: "
                     f"{'.'.join(map(str, bindings)) if bindings else 'none'})")
    if library is None or library < CUSPY_MIN:
        return Route(None, why_not + f"; Cuspy's PM sampling needs libcupti ≥ {need}, and this environment's is "
                     f"{'.'.join(map(str, library)) if library else 'not a wheel'} (torch pins its own)")
    return Route("cuspy", f"torch {version}: Cuspy (experimental), cupti-python {'.'.join(map(str, bindings))}, "
                 f"libcupti {'.'.join(map(str, library))}; " + why_not)


def activities(chosen: Route, metrics: list[str], interval_ms: float | None = None, lookback_ms: float | None = None) -> list:
    """torch.profiler ``activities`` that ask ``chosen``'s route for ``metrics`` every ``interval_ms``
    (torch's default, 1 ms, when ``None``), keeping ``lookback_ms`` of samples (torch's default 10 s), CPU
    activity included (Cuspy requires it).

    Raises:
        ValueError: ``chosen`` is no route.
    """
    if chosen.name is None:
        raise ValueError(f"no PM-sampling route: {chosen.detail}")
    from torch.profiler import PerformanceMetricsConfig, ProfilerActivity, ProfilerActivityConfig

    configs = [PerformanceMetricsConfig(list(metrics), sampling_interval_ms=interval_ms, lookback_window_ms=lookback_ms)]
    if chosen.name == "cuspy":
        from torch.profiler import CuspyConfig

        configs.insert(0, CuspyConfig())
    return [{ProfilerActivity.CUDA: ProfilerActivityConfig(profiler_configs=configs)}, ProfilerActivity.CPU]


def cupti_holder() -> str | None:
    """Who in this process already records with torch.profiler (and so holds CUPTI once it records CUDA activity):
    Cuspy's observer (torch 2.15+) or a torch.profiler session; ``None`` when neither. CUPTI takes one subscriber
    per process, so headcount's cupti source cannot start beside them."""
    import sys

    profiler = sys.modules.get("torch.autograd.profiler")
    if profiler is not None and getattr(profiler, "_active_cuspy_profiler_observer", None) is not None:
        return "Cuspy (torch.profiler's cupti-python collector)"
    torch = sys.modules.get("torch")
    if torch is not None and torch._C._autograd._profiler_enabled():
        return "a torch.profiler session"
    return None


def holder_error(holder: str):
    """The one line for headcount's cupti source started beside ``holder`` (:func:`cupti_holder`), with the route
    that works instead (:class:`~headcount.common.errors.HeadcountError`, exit 3)."""
    from headcount.common.errors import HeadcountError

    found = _route()
    instead = (f"--backend torch samples PM through torch.profiler here ({found.name})" if found.name else
               "--backend torch (torch.profiler's times; PM sampling through torch needs torch 2.15+ with a route: "
               "`headcount doctor`)")
    return HeadcountError(f"{holder} is recording in this process and holds CUPTI, which takes one subscriber: headcount's "
                          "cupti source cannot start beside it",
                          hint=f"use {instead}; or start headcount outside your torch.profiler block", exit_code=3)
