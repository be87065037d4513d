"""Where the cupti source's CUPTI comes from: headcount's own folder beside the environment (issue 35).

Every CUDA torch pins its libcupti (torch 2.14: ``nvidia-cuda-cupti`` 13.0.85, torch 2.15: 13.2.86), while
cupti-python with PM sampling (13.3 and newer) declares a newer one (``nvidia-cuda-cupti~=13.4``). Asked for both,
pip replaces the user's torch. Forced over torch's library, PM sampling is refused: on an H100 (driver 580),
cupti-python 13.4 over libcupti 13.0.85 records activity but every PM sampling configuration fails with
``ERROR_INVALID_PARAMETER``, while libcupti 13.4.92 loaded beside torch 2.11 samples
(``tests/fixtures/gpu/h100-2026-12-05``).

So headcount keeps its CUPTI out of pip's view of the environment: ``headcount cupti install`` puts cupti-python
and the libcupti it declares into ``<sys.prefix>/share/headcount/cupti-cpXY`` (``$HEADCOUNT_CUPTI_HOME`` elsewhere)
with ``pip install --target``. torch, its pins and ``pip check`` stay as they were. ``import headcount`` puts the
folder first on ``sys.path`` (:func:`put_first`), so that a CUDA torch imported afterwards preloads the folder's
libcupti instead of its own (torch loads the first one on ``sys.path``; on an H100, torch 2.11 ran with libcupti
13.4.92 so); before the first ``import cupti``, :func:`activate` loads it (cupti-python's loader, cuda-pathfinder,
takes a libcupti the process has loaded already). One libcupti per process: where torch loaded its own first,
the folder is left unused and the notice says to import headcount first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from headcount.common.errors import HeadcountError

PACKAGES = ("cupti-python>=13.4,<14", "nvidia-cuda-cupti>=13.4,<13.5")
"""What ``headcount cupti install`` puts in the folder: the bindings with PM sampling and a libcupti they declare,
of the release seen sampling on a GPU with a CUDA 13.0 driver (13.4.92; widen once a newer one is seen there).
Their other needs (cuda-bindings, cuda-pathfinder, numpy, pyelftools) come with ``headcount[cupti]``."""

NEEDS = ("cuda.bindings", "cuda.pathfinder", "numpy", "elftools")
"""Modules cupti-python imports that the folder does not hold (``headcount[cupti]`` installs them)."""

_state: dict = {"activated": None, "note": None}


def home() -> Path:
    """The folder: ``$HEADCOUNT_CUPTI_HOME``, else ``<sys.prefix>/share/headcount/cupti-cp<major><minor>`` (one per
    environment and Python, since cupti-python's modules are built per Python release)."""
    override = os.environ.get("HEADCOUNT_CUPTI_HOME")
    if override:
        return Path(override)
    return Path(sys.prefix) / "share" / "headcount" / f"cupti-cp{sys.version_info.major}{sys.version_info.minor}"


def library(folder: Path | None = None) -> Path | None:
    """The libcupti of ``folder`` (default :func:`home`) when the folder holds both it and cupti-python (what
    ``headcount cupti install`` puts there), else None."""
    folder = home() if folder is None else folder
    hits = sorted(folder.glob("nvidia/cu*/lib/libcupti.so*"))
    return hits[0] if hits and (folder / "cupti").is_dir() else None


def installed(folder: Path | None = None) -> dict[str, str]:
    """Distribution name → version of what the folder holds (its ``*.dist-info``)."""
    from importlib import metadata

    folder = home() if folder is None else folder
    if not folder.is_dir():
        return {}
    return {(d.metadata["Name"] or "").lower(): d.version for d in metadata.distributions(path=[str(folder)])}


def install(folder: Path | None = None, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """``pip install --no-deps --upgrade --target FOLDER`` the packages; returns what the folder then holds.

    Raises:
        HeadcountError: pip failed (its last line), or a module cupti-python needs is missing from the environment.
    """
    import subprocess

    missing = [m for m in NEEDS if _no_module(m)]
    if missing:
        raise HeadcountError(f"cupti-python needs {', '.join(missing)}, which this environment lacks",
                             hint="pip install 'headcount[cupti]' first (it adds them without touching torch)")
    folder = home() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(folder), *packages]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise HeadcountError(f"pip could not install {' '.join(packages)} into {folder}: {lines[-1] if lines else done.returncode}",
                             hint="check that pip reaches PyPI (or your index), then run `headcount cupti install` again")
    return installed(folder)


def _no_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:
        return True


def loaded_libraries() -> list[str]:
    """Every libcupti this process has mapped (``/proc/self/maps``), in address order."""
    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.split()[-1] if line.strip() else ""
                if "/libcupti.so" in path and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def put_first() -> None:
    """Put the folder first on ``sys.path`` (cheap; nothing is loaded). Called when headcount is imported: a CUDA
    torch, imported after it, preloads the first ``nvidia/cu13/lib/libcupti.so*`` on ``sys.path`` (torch/__init__.py,
    ``_preload_cuda_deps``), so torch and the cupti source then share the folder's libcupti; imported before it, torch
    has loaded its own, and :func:`activate` leaves the folder unused."""
    folder = home()
    if str(folder) not in sys.path and library(folder) is not None:
        sys.path.insert(0, str(folder))


def activate() -> Path | None:
    """Make the next ``import cupti`` take the folder's cupti-python and libcupti; returns the folder, or None
    when it holds none or cannot be used here (:func:`note` says why). Idempotent."""
    if _state["activated"] is not None:
        return _state["activated"]
    folder = home()
    lib = library(folder)
    if lib is None:
        return None
    module = sys.modules.get("cupti")
    if module is not None and not str(getattr(module, "__file__", "")).startswith(str(folder)):
        _state["note"] = f"cupti-python was imported from {module.__file__} before headcount could use {folder}"
        return None
    others = [p for p in loaded_libraries() if os.path.realpath(p) != os.path.realpath(lib)]
    if others:  # a second libcupti in one process would split CUPTI in two
        _state["note"] = (f"{others[0]} was loaded before headcount could load {lib} (torch imported before headcount?): "
                          "import headcount before torch, or run the program under `headcount run --backend cupti`")
        return None
    import ctypes

    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        _state["note"] = f"{lib} does not load: {exc}"
        return None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    _state["activated"] = folder
    return folder


def note() -> str | None:
    """Why :func:`activate` left the folder unused, or None."""
    return _state["note"]


def library_release(path: str | None) -> str | None:
    """The ``nvidia-cuda-cupti`` release whose files hold ``path`` (the environment's or the folder's), or None
    (a libcupti from a CUDA toolkit, say)."""
    from importlib import metadata

    if not path:
        return None
    real = os.path.realpath(path)
    folders = [*sys.path, str(home())]
    for dist in metadata.distributions(path=folders):
        if (dist.metadata["Name"] or "").lower() != "nvidia-cuda-cupti":
            continue
        for f in dist.files or ():
            if f.name.startswith("libcupti.so") and os.path.realpath(str(dist.locate_file(f))) == real:
                return dist.version
    return None


def bindings_need() -> tuple[str, str | None]:
    """(cupti-python's version, the libcupti release it declares, e.g. ``13.4``) of the cupti-python imported."""
    import re
    from importlib import metadata

    activate()
    import cupti

    where = str(Path(cupti.__file__).resolve().parent.parent)
    for dist in metadata.distributions(path=[where]):
        if (dist.metadata["Name"] or "").lower() == "cupti-python":
            for req in dist.requires or ():
                m = re.match(r"nvidia-cuda-cupti\s*~=\s*(\d+\.\d+)", req)
                if m:
                    return dist.version, m.group(1)
            return dist.version, None
    return "unknown", None


def older_than_declared(release: str | None, declared: str | None) -> bool:
    """Whether libcupti ``release`` (``13.0.85``) is older than the ``declared`` ``major.minor`` (``13.4``)."""
    if not release or not declared:
        return False
    have = tuple(int(x) for x in release.split(".")[:2])
    need = tuple(int(x) for x in declared.split(".")[:2])
    return have < need
