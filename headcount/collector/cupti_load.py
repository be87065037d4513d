"""Loading and probing the cupti source's CUPTI: cupti-python, and the libcupti it records with.

:func:`load_cupti` imports ``cupti.cupti`` (headcount's own folder first, :mod:`~headcount.collector.cupti_home`);
:func:`require` and :func:`probe` say whether the cupti source can run here; :func:`injection_library`,
:func:`enable_nvtx_injection` and :func:`libcupti_path` find the libcupti that NVTX injects and the one loaded.
"""

from __future__ import annotations

import os

from headcount.collector import cupti_home
from headcount.collector.cupti_errors import classify
from headcount.common.env import cuda_usable, package_version
from headcount.common.errors import HeadcountError


def load_cupti():
    """Import ``cupti.cupti``.

    Raises:
        HeadcountError: cupti-python is missing or cannot be imported.
    """
    cupti_home.activate()  # headcount's own cupti-python and libcupti, where `headcount cupti install` put them
    try:
        from cupti import cupti
    except ImportError as exc:
        err = classify(exc, "importing cupti-python")
        if cupti_home.note():  # the folder is there but could not be used: that is the cause to name
            err = HeadcountError(f"{err.message}: {cupti_home.note()}", hint=err.hint, exit_code=err.exit_code)
        raise err from exc
    return cupti


def cupti_version() -> str | None:
    """Installed cupti-python version, or ``None``."""
    return package_version("cupti-python")


def injection_library() -> str | None:
    """The libcupti that NVTX can inject: headcount's own (:mod:`~headcount.collector.cupti_home`), else
    ``nvidia/cu13/lib/libcupti.so*`` on ``sys.path`` (as the nvidia-cuda-cupti wheel installs it), else ``None``."""
    import glob
    import sys

    own = cupti_home.library()
    if own is not None:
        return str(own)  # the library headcount's cupti-python records with: markers must reach that one
    for base in sys.path:
        for pattern in ("nvidia/cu13/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*"):
            hits = sorted(glob.glob(os.path.join(base or ".", pattern)))
            if hits:
                return hits[0]
    return None


def enable_nvtx_injection() -> str | None:
    """Point ``NVTX_INJECTION64_PATH`` at libcupti so that NVTX ranges become
    CUPTI marker records. Works only before the process's first NVTX call
    (a launcher such as ``headcount profile`` calls it first thing); a no-op
    when the variable is set already or ``HEADCOUNT_NVTX_INJECTION=0``.

    Returns:
        The library now injected, or ``None``.
    """
    if os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("HEADCOUNT_NVTX_INJECTION") == "0":
        return None
    lib = injection_library()
    if lib:
        os.environ["NVTX_INJECTION64_PATH"] = lib
    return lib


def libcupti_path() -> str | None:
    """The libcupti this process has loaded (``/proc/self/maps``), else the one cupti-python would load
    (headcount's folder, then the nvidia-cuda-cupti wheel), else None."""
    loaded = cupti_home.loaded_libraries()
    return loaded[0] if loaded else injection_library()


def require() -> None:
    """Check that the cupti source can run here: cupti-python imports, a CUPTI
    call succeeds (driver present and recent enough), torch sees a GPU.
    Cheap; enables nothing.

    Raises:
        HeadcountError: the first thing missing, in one line.
    """
    cupti = load_cupti()
    try:
        cupti.get_timestamp()  # raises the precise reason (no driver, too old) when there is one
    except Exception as exc:  # noqa: BLE001
        raise classify(exc, "probing CUPTI") from exc
    if not cuda_usable():
        raise HeadcountError("torch sees no CUDA GPU although the driver answers",
                             hint="install a CUDA build of torch, or use --backend torch", exit_code=3)


def probe() -> tuple[bool, str]:
    """Whether the cupti source can run here, and why not (see :func:`require`)."""
    try:
        require()
    except HeadcountError as exc:
        return False, exc.message
    return True, "cupti-python " + str(cupti_version())
