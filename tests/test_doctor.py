"""``headcount doctor`` on this machine (no GPU) and on the files it reads."""

from __future__ import annotations

import json

from headcount import doctor
from headcount.cli.main import main as cli_main


def test_doctor_on_this_machine_says_why_cupti_cannot_run(capsys):
    checks = {c.name: c for c in doctor.run_checks()}
    assert checks["gpu"].status == "fail" and checks["driver"].status == "fail"
    assert checks["cupti-python"].status == "ok"
    assert checks["cupti usable"].status == "fail" and "no NVIDIA driver" in checks["cupti usable"].detail
    assert doctor.usable(list(checks.values()), "torch") and not doctor.usable(list(checks.values()), "cupti")


def test_doctor_cli_exit_codes_and_json(capsys):
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "cupti usable" in out and "backends: torch usable, cupti NOT usable" in out
    assert cli_main(["doctor", "--backend", "cupti", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["usable"] == {"torch": True, "cupti": False}
    assert {"name", "status", "detail", "hint"} <= set(doc["checks"][0])
    assert cli_main(["doctor", "--backend", "torch"]) == 0


def test_counter_permission_is_read_from_the_driver_parameters(tmp_path):
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    check = doctor.check_counters(params, uid=1000)
    assert check.status == "fail" and "ERR_NVGPUCTRPERM" in check.detail and "NVreg_RestrictProfilingToAdminUsers=0" in check.hint
    assert doctor.check_counters(params, uid=0).status == "ok"
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert doctor.check_counters(params, uid=1000).status == "ok"
    assert doctor.check_counters(tmp_path / "missing").status == "info"


def test_another_profiler_in_the_environment_is_named():
    assert doctor.held_by_environment({}) is None
    assert "nsys" in doctor.held_by_environment({"NSYS_PROFILING_SESSION_ID": "1"})
    assert "ncu" in doctor.held_by_environment({"NV_COMPUTE_PROFILER_PERFWORKS_DIR": "/x"})


def test_nvtx_injection_check(tmp_path):
    assert doctor.check_nvtx_injection({}).status == "info"
    assert doctor.check_nvtx_injection({"NVTX_INJECTION64_PATH": str(tmp_path / "nope.so")}).status == "warn"
    lib = tmp_path / "libcupti.so"
    lib.write_bytes(b"")
    assert doctor.check_nvtx_injection({"NVTX_INJECTION64_PATH": str(lib)}).status == "ok"


def test_libcupti_older_than_cupti_python_is_judged_by_what_it_exports(monkeypatch):
    """Newer bindings over the libcupti torch pins (the README's route: cupti-python 13.4 over 13.0.85): fine where
    the library exports every function PM sampling calls (the real one installed here does); a warning naming each
    missing function where it does not (the C library stands in for a library that lacks them all)."""
    import ctypes.util

    from headcount.collector import cupti_source

    versions = {"cupti-python": "13.4.0", "nvidia-cuda-cupti": "13.0.85"}
    monkeypatch.setattr(doctor, "_version", lambda name: versions.get(name))
    checks = {c.name: c for c in doctor.check_cupti()}
    assert checks["libcupti"].status == "ok" and "exports every function PM sampling calls" in checks["libcupti"].detail
    monkeypatch.setattr(cupti_source, "libcupti_path", lambda: ctypes.util.find_library("c"))
    checks = {c.name: c for c in doctor.check_cupti()}
    assert checks["libcupti"].status == "warn" and "PM sampling needs cuptiProfilerInitialize" in checks["libcupti"].detail
    versions.pop("cupti-python")
    checks = {c.name: c for c in doctor.check_cupti()}
    assert checks["cupti-python"].status == "fail" and "headcount[cupti]" in checks["cupti-python"].hint


def test_subscriber_check_names_the_holder(monkeypatch):
    """``cupti.subscribe`` as it fails when nsys/ncu/DCGM holds CUPTI (the real
    cuptiError and status; the GPU-side call is stood in for)."""
    from cupti import cupti as real

    class Held:
        def subscribe(self, callback, userdata):
            raise real.cuptiError(int(real.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))

    class Free:
        def __init__(self):
            self.unsubscribed = False

        def subscribe(self, callback, userdata):
            return 7

        def unsubscribe(self, handle):
            self.unsubscribed = handle == 7

    monkeypatch.delenv("NSYS_PROFILING_SESSION_ID", raising=False)
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    check = doctor.check_subscriber(Held())
    assert check.status == "fail" and "already held by another profiler" in check.detail and "one CUPTI subscriber" in check.hint
    free = Free()
    assert doctor.check_subscriber(free).status == "ok" and free.unsubscribed
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "3")
    assert "nsys" in doctor.check_subscriber(free).detail
