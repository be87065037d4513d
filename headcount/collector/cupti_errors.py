"""What can stop the in-process CUPTI source, as one line each (docs/architecture.md §7).

:func:`classify` turns whatever ``import cupti`` or a CUPTI call raised into a
:class:`~headcount.common.errors.HeadcountError` that names the cause and says what to
do. It reads the exception's type name, its CUPTI status (``cuptiError.status``)
and its text, so it works on the exceptions cupti-python really raises without
importing cupti-python itself (it may be missing: that is one of the causes).
"""

from __future__ import annotations

from headcount.common.errors import HeadcountError

PERMISSION_HINT = (
    "GPU performance counters are restricted to admin users (ERR_NVGPUCTRPERM): run as root, or load the driver "
    "with `options nvidia NVreg_RestrictProfilingToAdminUsers=0` (see NVIDIA's ERR_NVGPUCTRPERM page); activity "
    "tracing still works without them"
)
HOLDER_HINT = (
    "only one CUPTI subscriber per process: do not run headcount's cupti backend under nsys, ncu, DCGM profiling "
    "or inside torch.profiler; use `headcount run --backend nsys|ncu` for those tools, or --backend torch (torch 2.15+ "
    "can sample PM itself: `headcount doctor` names the route)"
)

# CUPTI status names (cupti.cupti.Result) → (message, hint)
_BY_STATUS = {
    "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED": ("CUPTI is already held by another profiler in this process", HOLDER_HINT),
    "ERROR_INSUFFICIENT_PRIVILEGES": ("GPU performance counters are not permitted for this user (ERR_NVGPUCTRPERM)", PERMISSION_HINT),
    "ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES": ("GPU performance counters are not permitted on this virtual GPU", PERMISSION_HINT),
    "ERROR_NOT_COMPATIBLE": ("libcupti does not match this driver or this cupti-python",
                             "install the cupti-python and nvidia-cuda-cupti releases made for your driver's CUDA version (`headcount doctor` shows them)"),
    "ERROR_CUDA_COMPILER_NOT_COMPATIBLE": ("libcupti does not match this CUDA toolkit", "install matching CUDA and CUPTI releases"),
    "ERROR_LEGACY_PROFILER_NOT_SUPPORTED": ("a legacy profiler (nvprof / CUDA_PROFILE) is active", "unset CUDA_PROFILE and COMPUTE_PROFILE"),
    "ERROR_OLD_PROFILER_API_INITIALIZED": ("an older CUPTI profiling API is already initialized in this process", HOLDER_HINT),
    "ERROR_MIG_DEVICE_NOT_SUPPORTED": ("CUPTI cannot profile this MIG slice", "profile on a full GPU"),
    "ERROR_CMP_DEVICE_NOT_SUPPORTED": ("CUPTI does not support this CMP device", "profile on a supported GPU"),
    "ERROR_WSL_DEVICE_NOT_SUPPORTED": ("CUPTI does not support this feature under WSL", "profile on native Linux"),
    "ERROR_NOT_INITIALIZED": ("CUPTI could not be initialized (libcupti or its nvperf libraries did not load)",
                              "check that nvidia-cuda-cupti is installed next to cupti-python (`headcount doctor`)"),
}


def status_name(exc: BaseException) -> str | None:
    """The CUPTI status name of a ``cuptiError`` (e.g. ``ERROR_INSUFFICIENT_PRIVILEGES``), else ``None``."""
    status = getattr(exc, "status", None)
    if status is None:
        return None
    name = getattr(status, "name", None)
    if name:
        return name
    try:
        from cupti import cupti as _cupti

        return _cupti.Result(int(status)).name
    except Exception:  # noqa: BLE001 - an unknown status keeps its number
        return f"status {status}"


def classify(exc: BaseException, doing: str = "starting the cupti source") -> HeadcountError:
    """One clear line for a failure of ``import cupti`` or of a CUPTI call.

    Args:
        exc: what was raised.
        doing: what headcount was doing, for the message.

    Returns:
        The :class:`HeadcountError` to raise or to print (exit code 3: the
        environment, not the user's input, is at fault).
    """
    if isinstance(exc, HeadcountError):
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kind = type(exc).__name__
    lower = text.lower()
    if isinstance(exc, ImportError):
        if getattr(exc, "name", None) in ("cupti", "cupti.cupti") or "cupti" in lower and "no module" in lower:
            return HeadcountError("cupti-python is not installed",
                                  hint="pip install 'headcount[cupti]' && headcount cupti install (needs a CUDA 13.0+ driver), "
                                       "or use --backend torch", exit_code=3)
        return HeadcountError(f"cupti-python cannot be imported: {text}",
                              hint="headcount cupti install (`headcount doctor` shows what is installed)", exit_code=3)
    if kind == "NotSupportedError" or "driver" in lower and ("not found" in lower or "libcuda" in lower):
        if "libcuda" in lower or "not found" in lower:
            return HeadcountError("no NVIDIA driver on this machine (libcuda.so.1 not found)",
                                  hint="the cupti backend needs an NVIDIA GPU; use --backend torch (or auto) here", exit_code=3)
        if "version" in lower or "older" in lower or "too old" in lower:
            return HeadcountError(f"the NVIDIA driver is too old for cupti-python ({text})",
                                  hint="cupti-python 13.x needs a CUDA 13.0+ driver (580 or newer); update the driver or use --backend torch", exit_code=3)
        return HeadcountError(f"CUPTI is not supported here: {text}", hint="use --backend torch", exit_code=3)
    if isinstance(exc, PermissionError):
        return HeadcountError("GPU performance counters are not permitted for this user (ERR_NVGPUCTRPERM)", hint=PERMISSION_HINT, exit_code=3)
    name = status_name(exc)
    if name in _BY_STATUS:
        message, hint = _BY_STATUS[name]
        return HeadcountError(f"{message} ({name}, while {doing})", hint=hint, exit_code=3)
    if name is not None:
        return HeadcountError(f"CUPTI failed while {doing}: {name}", hint="run `headcount doctor` to see what is missing", exit_code=3)
    if "already enabled" in lower or "already started" in lower:
        return HeadcountError(f"CUPTI is already in use in this process ({text})", hint=HOLDER_HINT, exit_code=3)
    return HeadcountError(f"CUPTI failed while {doing}: {kind}: {text}", hint="run `headcount doctor` to see what is missing", exit_code=3)
