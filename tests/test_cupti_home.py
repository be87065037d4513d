"""The cupti source's own CUPTI beside the environment (headcount.collector.cupti_home, `headcount cupti`), with the
real cupti-python, libcupti and pip: what a fresh process loads, the notice for an older library, a second library
already loaded, a failed install."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from headcount.collector import cupti_home, cupti_load, pm_sampler
from headcount.common.errors import HeadcountError

pytestmark = pytest.mark.skipif(cupti_home.activate() is None,
                                reason=f"no folder from `headcount cupti install` ({cupti_home.note() or cupti_home.home()})")


def _fresh(code: str, env=None) -> dict:
    """Run ``code`` (which prints one JSON line last) in a new Python process of this environment."""
    import os

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_records_with_the_folders_bindings_and_library():
    """headcount, then torch (a CUDA torch then preloads the folder's libcupti: one library in the process), then the
    cupti source: cupti-python and libcupti come from the folder, PM sampling imports, and CUPTI stops only at the
    missing driver."""
    doc = _fresh("""
        import json
        import headcount
        import torch
        from headcount.collector import cupti_home, cupti_load, pm_sampler
        cupti = cupti_load.load_cupti()
        from cupti import pm_sampling
        lib = cupti_load.libcupti_path()
        try:
            cupti_load.require()
            error = None
        except Exception as exc:
            error = str(exc)
        print(json.dumps({"module": cupti.__file__, "lib": lib, "loaded": cupti_home.loaded_libraries(),
                          "release": cupti_home.library_release(lib), "gap": pm_sampler.pm_sampling_gap(lib), "error": error}))
    """)
    home = str(cupti_home.home())
    assert doc["module"].startswith(home) and doc["lib"].startswith(home) and doc["loaded"] == [doc["lib"]]
    assert doc["release"].startswith("13.4.") and doc["gap"] is None
    assert doc["error"].startswith("no NVIDIA driver")


def test_torch_imported_first_keeps_its_own_libcupti_and_the_notice_says_what_to_do():
    """A CUDA torch loads its libcupti at import (torch 2.15: 13.2.86): imported before headcount, that library stays
    the process's only one, and the folder is left unused with a note naming the order to change. A CPU torch loads
    none, and the folder is used."""
    doc = _fresh("""
        import json
        import torch
        from headcount.collector import cupti_home
        before = cupti_home.loaded_libraries()
        folder = cupti_home.activate()
        gap = None
        if before:
            from headcount.collector import pm_sampler
            gap = pm_sampler.pm_sampling_gap(before[0])
        print(json.dumps({"torch_loaded": before, "folder": str(folder), "note": cupti_home.note(),
                          "after": cupti_home.loaded_libraries(), "gap": gap}))
    """)
    if doc["torch_loaded"]:
        assert doc["folder"] == "None" and "import headcount before torch" in doc["note"]
        assert doc["after"] == doc["torch_loaded"]
        assert doc["gap"].startswith("PM sampling cannot run on libcupti") and "import headcount before torch" in doc["gap"]
    else:
        assert doc["folder"] == str(cupti_home.home()) and doc["after"] == [str(cupti_home.library())]


def test_the_cli_says_what_it_installed_and_what_loads(capsys):
    from headcount.cli.main import main

    assert main(["cupti", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["folder"] == str(cupti_home.home()) and doc["holds"]["cupti-python"].startswith("13.4")
    assert doc["pm_sampling_module"] and doc["libcupti"].startswith(str(cupti_home.home())) and doc["gap"] is None
    assert doc["cupti_answers"] is False and doc["driver"].startswith("no NVIDIA driver")


def test_an_older_libcupti_gets_a_notice_naming_release_and_remedy(tmp_path):
    """A real libcupti installed as nvidia-cuda-cupti 13.0.85 is (torch 2.14's pin, by its metadata): older than
    cupti-python 13.4 declares, so PM sampling is not tried on it (on an H100 CUPTI refused it,
    tests/fixtures/gpu/h100-2026-12-05) and the notice names both ways to DRAM."""
    site = tmp_path / "site"
    lib = site / "nvidia" / "cu13" / "lib" / "libcupti.so.13"
    lib.parent.mkdir(parents=True)
    shutil.copy(cupti_home.library(), lib)
    info = site / "nvidia_cuda_cupti-13.0.85.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cuda-cupti\nVersion: 13.0.85\n")
    (info / "RECORD").write_text("nvidia/cu13/lib/libcupti.so.13,,\n")
    sys.path.append(str(site))
    try:
        assert cupti_home.library_release(str(lib)) == "13.0.85"
        gap = pm_sampler.pm_sampling_gap(str(lib))
    finally:
        sys.path.remove(str(site))
    assert gap.startswith(f"libcupti 13.0.85 ({lib}) is older than cupti-python 13.4")
    assert "headcount cupti install" in gap and "--backend nsys --gpu-metrics on, or --backend ncu" in gap
    assert cupti_home.older_than_declared("13.2.86", "13.4") and not cupti_home.older_than_declared("13.4.92", "13.4")
    assert not cupti_home.older_than_declared(None, "13.4")


def test_a_libcupti_loaded_first_keeps_the_folder_unused(tmp_path):
    """Two libcupti in one process would split CUPTI: where another was loaded first (torch.profiler's, say), the
    folder is left alone and the reason is kept for the notices."""
    other = tmp_path / "libcupti.so.13"
    shutil.copy(cupti_home.library(), other)
    doc = _fresh(f"""
        import ctypes, json
        ctypes.CDLL({str(other)!r}, mode=ctypes.RTLD_GLOBAL)
        from headcount.collector import cupti_home
        print(json.dumps({{"folder": str(cupti_home.activate()), "note": cupti_home.note()}}))
    """)
    assert doc["folder"] == "None" and doc["note"].startswith(f"{other} was loaded before headcount could load")


def test_nvtx_injection_names_the_folders_library():
    """NVTX markers must reach the libcupti that records, so the launcher injects the folder's."""
    assert cupti_load.injection_library() == str(cupti_home.library())


def test_a_failed_install_is_one_error_naming_the_folder(tmp_path):
    with pytest.raises(HeadcountError) as raised:
        cupti_home.install(tmp_path / "folder", packages=("headcount-no-such-package==0.0.1",))
    assert str(tmp_path / "folder") in raised.value.message and "headcount cupti install" in raised.value.hint
