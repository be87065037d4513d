"""``headcount doctor``'s checks: can each source run here, and if not, why.

Each check returns a :class:`Check` (``ok``, ``warn``, ``fail`` or ``info``)
with one line of detail and, where something is wrong, what to do. Nothing
here starts a profiler; the CUPTI subscriber check subscribes and
unsubscribes at once.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from headcount.collector import cupti_home, cupti_load, pm_sampler
from headcount.collector.cupti_errors import HOLDER_HINT, PERMISSION_HINT, classify
from headcount.common import nsight
from headcount.common.env import package_version as _version
from headcount.common.errors import HeadcountError

# environment variables that mean another CUPTI client is injected into this process
INJECTED_TOOLS = {
    "NSYS_PROFILING_SESSION_ID": "nsys",
    "NV_NSIGHT_INJECTION_TRANSPORT_TYPE": "an Nsight tool",
    "NV_COMPUTE_PROFILER_PERFWORKS_DIR": "ncu",
    "CUDA_INJECTION64_PATH": "a CUDA injection library (nsys, ncu or another tool)",
}
PROFILING_PARAMS = Path("/proc/driver/nvidia/params")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | info
    detail: str
    hint: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def check_packages() -> list[Check]:
    """headcount's Python side: torch, transformers, nvtx."""
    import torch

    out = [Check("torch", "ok", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no, CPU only'})")]
    tf = _version("transformers")
    out.append(Check("transformers", "ok" if tf else "fail", tf or "not installed", None if tf else "pip install 'transformers>=5,<6'"))
    nv = _version("nvtx")
    out.append(Check("nvtx", "ok" if nv else "warn", nv or "not installed: no NVTX ranges for nsys/ncu",
                     None if nv else "pip install nvtx (0.2.11 or older for nsys 2023.x)"))
    return out


def check_gpu() -> list[Check]:
    """GPU and driver as torch and the driver see them."""
    import torch

    out = []
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.append(Check("gpu", "ok", f"{props.name}, compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs"))
    else:
        reason = "torch is a CPU build" if not torch.version.cuda else "torch sees no CUDA device"
        out.append(Check("gpu", "fail", f"no usable NVIDIA GPU ({reason})", "the cupti and ncu backends need an NVIDIA GPU; torch works anywhere"))
    driver = driver_version()
    if driver is None:
        out.append(Check("driver", "fail", "no NVIDIA driver (libcuda.so.1 not found)", "install the NVIDIA driver"))
    else:
        cuda = f"{driver // 1000}.{driver % 1000 // 10}"
        ok = driver >= 13000
        out.append(Check("driver", "ok" if ok else "fail", f"CUDA driver API {cuda}",
                         None if ok else "cupti-python 13.x needs a CUDA 13.0+ driver (580 or newer)"))
    return out


def driver_version() -> int | None:
    """The driver's CUDA version (``cuDriverGetVersion``, e.g. 13000), or ``None`` without a driver."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(value)) != 0:
        return None
    return value.value


def check_cupti() -> list[Check]:
    """cupti-python and libcupti as the cupti source will load them (headcount's folder first,
    :mod:`~headcount.collector.cupti_home`): installed, able to PM-sample, usable, not held."""
    folder = cupti_home.activate()
    held = cupti_home.installed(cupti_home.home())
    out = [Check("cupti folder", "ok" if folder else "info",
                 f"{cupti_home.home()}: " + ", ".join(f"{k} {v}" for k, v in sorted(held.items())) if folder else
                 (cupti_home.note() or f"{cupti_home.home()} holds nothing: the environment's cupti-python is used, if any"),
                 None if folder else "headcount cupti install: the CUPTI that samples DRAM, beside your torch (never replacing it)")]
    cp = _version("cupti-python") if folder is None else held.get("cupti-python")
    if cp is None:
        out.append(Check("cupti-python", "fail", "not installed",
                         "pip install 'headcount[cupti]' && headcount cupti install (needs a CUDA 13.0+ driver)"))
        return out
    out.append(Check("cupti-python", "ok", f"{cp} ({'headcount folder' if folder else 'environment'})"))
    library = cupti_load.libcupti_path()
    release = cupti_home.library_release(library)
    gap = pm_sampler.pm_sampling_gap(library)
    if library is None:
        out.append(Check("libcupti", "warn", "none found: cupti-python looks for libcupti elsewhere (a CUDA toolkit)",
                         "headcount cupti install"))
    else:
        out.append(Check("libcupti", "warn" if gap else "ok", f"nvidia-cuda-cupti {release or '(release unknown)'}: {library}"
                         + (f"; {gap}" if gap else ""), "headcount cupti install" if gap else None))
    try:
        import cupti.pm_sampling  # noqa: F401 - whether PM sampling can be tried at all
        pm_ok = True
    except ImportError:
        pm_ok = False
    out.append(Check("PM sampling (DRAM per head)", "ok" if pm_ok and not gap else "warn",
                     f"cupti-python {cp} has it" + (", over a libcupti that cannot run it" if gap else "") if pm_ok else
                     f"cupti-python {cp} has no pm_sampling (13.3 or newer has)",
                     None if pm_ok and not gap else "headcount cupti install keeps your torch and its libcupti"))
    torch_pin = _torch_cupti_pin()
    if torch_pin and release and not release.startswith(torch_pin.rstrip(".*")):
        out.append(Check("torch's libcupti", "info", f"torch pins nvidia-cuda-cupti=={torch_pin}; the cupti source loads {release}",
                         "torch, imported after headcount, loads the cupti source's too (one libcupti per process)"))
    try:
        from cupti import cupti

        cupti.get_timestamp()
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
        err = classify(exc, "calling CUPTI")
        out.append(Check("cupti usable", "fail", err.message, err.hint))
        return out
    out.append(Check("cupti usable", "ok", "CUPTI answers"))
    out.append(check_subscriber(cupti))
    return out


def _torch_cupti_pin() -> str | None:
    try:
        reqs = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for req in reqs:
        m = re.match(r"nvidia-cuda-cupti\S*\s*==\s*([\d.*]+)", req)
        if m:
            return m.group(1)
    return None


def check_subscriber(cupti) -> Check:
    held = held_by_environment()
    if held:
        return Check("cupti subscriber", "fail", f"CUPTI is taken by {held} in this process", HOLDER_HINT)
    try:
        handle = cupti.subscribe(lambda *a: None, None)
        cupti.unsubscribe(handle)
    except Exception as exc:  # noqa: BLE001
        err = classify(exc, "subscribing to CUPTI")
        return Check("cupti subscriber", "fail", err.message, err.hint)
    return Check("cupti subscriber", "ok", "free")


def held_by_environment(environ=os.environ) -> str | None:
    """The tool whose injection variables are set in this process, if any."""
    for var, tool in INJECTED_TOOLS.items():
        if environ.get(var):
            return f"{tool} ({var} is set)"
    return None


def check_counters(params_path: Path = PROFILING_PARAMS, uid: int | None = None) -> Check:
    """Whether this user may read GPU performance counters (ncu, PM sampling):
    ``RmProfilingAdminOnly`` in the driver's parameters."""
    uid = os.geteuid() if uid is None else uid
    try:
        text = params_path.read_text()
    except OSError:
        return Check("performance counters", "info", f"{params_path} not readable: no NVIDIA driver loaded, or restricted")
    m = re.search(r"RmProfilingAdminOnly:\s*(\d+)", text)
    if not m:
        return Check("performance counters", "info", "the driver does not say who may profile")
    admin_only = m.group(1) == "1"
    if admin_only and uid != 0:
        return Check("performance counters", "fail", "restricted to admin users (ERR_NVGPUCTRPERM for ncu and PM sampling)", PERMISSION_HINT)
    return Check("performance counters", "ok", "admin only, and running as root" if admin_only else "open to all users")


def check_nvtx_injection(environ=os.environ) -> Check:
    """NVTX marker records need ``NVTX_INJECTION64_PATH`` set before the first NVTX call."""
    path = environ.get("NVTX_INJECTION64_PATH")
    if not path:
        return Check("NVTX injection", "info", "NVTX_INJECTION64_PATH not set: the cupti backend records its own ranges "
                     "but not NVTX markers of your code",
                     "export NVTX_INJECTION64_PATH=<path to libcupti.so> before starting Python to record them too")
    if not Path(path).exists():
        return Check("NVTX injection", "warn", f"NVTX_INJECTION64_PATH={path} does not exist", "point it at libcupti.so")
    return Check("NVTX injection", "ok", path)


def _tool_version(tool: str) -> str | None:
    try:
        exe = nsight.find(tool)  # the same lookup as headcount run and parse ($HEADCOUNT_<TOOL>, else PATH)
    except HeadcountError:
        return None
    try:
        text, _ = nsight.version(exe)
    except HeadcountError:
        return f"{exe} (version unknown)"
    return f"{text or 'version unknown'} ({exe})"


def check_tools() -> list[Check]:
    out = []
    for tool in ("nsys", "ncu"):
        version = _tool_version(tool)
        out.append(Check(tool, "ok" if version else "info", version or "not on PATH",
                         None if version else f"install Nsight {'Systems' if tool == 'nsys' else 'Compute'} to use --backend {tool}"))
    return out


def check_torch_pm(gpu: bool) -> Check:
    """Whether torch.profiler samples PM counters itself here (:func:`headcount.collector.torch_pm.route`)."""
    from headcount.collector import torch_pm

    chosen = torch_pm.route(cuda=gpu)
    if chosen.name:
        return Check("torch PM sampling", "ok", f"{chosen.name}: {chosen.detail}")
    return Check("torch PM sampling", "info", chosen.detail,
                 "sampled DRAM per layer and head: --backend cupti (headcount cupti install); exact: --backend ncu")


def run_checks() -> list[Check]:
    """All checks, in the order ``headcount doctor`` prints them."""
    gpu = check_gpu()
    has_gpu = not any(c.status == "fail" for c in gpu)
    return [*check_packages(), *gpu, *check_cupti(), check_counters(), check_nvtx_injection(), check_torch_pm(has_gpu),
            *check_tools()]


def routes(checks: list[Check]) -> dict[str, bool]:
    """Which recording routes this environment has, from the checks: torch.profiler's own PM sampling (``torch
    (Kineto PM)``, ``torch (Cuspy PM)``), headcount's cupti source, ncu, nsys; ``torch`` (timings) everywhere."""
    by_name = {c.name: c for c in checks}
    pm = by_name.get("torch PM sampling")
    gpu = not {c.name for c in checks if c.status == "fail"} & {"gpu", "driver"}
    return {"torch (Kineto PM)": bool(pm and pm.status == "ok" and pm.detail.startswith("kineto:")),
            "torch (Cuspy PM)": bool(pm and pm.status == "ok" and pm.detail.startswith("cuspy:")),
            "cupti": usable(checks, "cupti"),
            "ncu": gpu and by_name.get("ncu") is not None and by_name["ncu"].status == "ok",
            "nsys": by_name.get("nsys") is not None and by_name["nsys"].status == "ok",
            "torch": usable(checks, "torch")}


def recommended(available: dict[str, bool]) -> str:
    """The route to use here, and why, from :func:`routes`: per-layer and per-head DRAM first, with as few CUPTI
    clients and libraries as give it."""
    if available["torch (Kineto PM)"]:
        return ("--backend torch: torch.profiler samples DRAM and warps itself (Kineto's CUPTI PM sampling: one CUPTI "
                "subscriber, torch's own libcupti), per layer and head where the samples resolve them")
    if available["cupti"]:
        return "--backend cupti: kernels, launch latency, occupancy and PM-sampled DRAM per layer and head"
    if available["torch (Cuspy PM)"]:
        return "--backend torch: PM samples through Cuspy (experimental), per layer and head where they resolve them"
    if available["ncu"]:
        return "headcount run --backend ncu: exact counters per kernel, layer and head (kernels serialized: no concurrency)"
    if available["nsys"]:
        return "headcount run --backend nsys: timeline, kernels and device-wide GPU metrics"
    return ("--backend torch: operator (and, on a GPU, kernel) times only; for counters, record on a GPU machine and "
            "`headcount parse` the recording here")


def usable(checks: list[Check], backend: str) -> bool:
    """Whether ``backend`` can run, judged from the checks."""
    failed = {c.name for c in checks if c.status == "fail"}
    if backend == "torch":
        return "transformers" not in failed
    if backend == "cupti":
        return not failed & {"gpu", "driver", "cupti-python", "libcupti", "cupti usable", "cupti subscriber", "transformers"}
    raise ValueError(backend)


# ---------------------------------------------------------------- headcount cupti
CUPTI_PACKAGES = cupti_home.PACKAGES

# run in a fresh process: what `import cupti` takes there, as the cupti source will (headcount before torch)
_CUPTI_STATE = """
import json
import headcount
from headcount.collector import cupti_home, cupti_load, pm_sampler
doc = {"note": None}
try:
    cupti = cupti_load.load_cupti()
    import cupti.pm_sampling  # noqa: F401
    doc["bindings"] = cupti_home.bindings_need()[0]
    doc["pm_sampling_module"] = True
except Exception as exc:
    doc["error"] = f"{type(exc).__name__}: {exc}"
doc["active"] = str(cupti_home.activate() or "")
doc["note"] = cupti_home.note()
lib = cupti_load.libcupti_path()
doc.update(libcupti=lib, libcupti_release=cupti_home.library_release(lib), gap=pm_sampler.pm_sampling_gap(lib))
try:
    cupti_load.require()
    doc["cupti_answers"] = True
except Exception as exc:
    doc["cupti_answers"] = False
    doc["driver"] = str(exc).splitlines()[0]
print(json.dumps(doc))
"""


def cupti_folder():
    """Where ``headcount cupti install`` puts the cupti source's CUPTI (:func:`cupti_home.home`)."""
    return cupti_home.home()


def install_cupti() -> dict[str, str]:
    """``headcount cupti install`` (:func:`cupti_home.install`); raises HeadcountError as it does."""
    return cupti_home.install()


def cupti_state() -> dict:
    """What a fresh Python process of this environment loads for the cupti source: the folder and what it holds,
    the bindings, the libcupti and its release, whether PM sampling can run on it, whether CUPTI answers."""
    import subprocess
    import sys

    folder = cupti_home.home()
    doc = {"folder": str(folder), "holds": cupti_home.installed(folder)}
    done = subprocess.run([sys.executable, "-c", _CUPTI_STATE], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {**doc, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return {**doc, **json.loads(lines[-1])}
