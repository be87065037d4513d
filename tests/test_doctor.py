"""``headcount doctor`` on this machine (no GPU) and on the files it reads."""

from __future__ import annotations

import json

import pytest

from headcount.cli.main import main as cli_main
from headcount.machine import doctor


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


def test_doctor_names_the_folder_the_bindings_and_the_library_the_cupti_source_loads(monkeypatch, tmp_path):
    """With `headcount cupti install` done (make setup), doctor says the folder, that cupti-python comes from it, the
    libcupti and its release, and that PM sampling can run; with no folder and no cupti-python, what to run."""
    from headcount.collector import cupti_home

    if cupti_home.activate() is None:
        pytest.skip(f"no folder from `headcount cupti install` here ({cupti_home.note() or cupti_home.home()})")
    checks = {c.name: c for c in doctor.check_cupti()}
    assert checks["cupti folder"].status == "ok" and str(cupti_home.home()) in checks["cupti folder"].detail
    assert checks["cupti-python"].detail.endswith("(headcount folder)")
    assert checks["libcupti"].status == "ok" and str(cupti_home.home()) in checks["libcupti"].detail
    assert checks["PM sampling (DRAM per head)"].status == "ok"
    monkeypatch.setattr(cupti_home, "activate", lambda: None)
    monkeypatch.setattr(doctor, "_version", lambda name: None)
    checks = {c.name: c for c in doctor.check_cupti()}
    assert checks["cupti-python"].status == "fail" and "headcount cupti install" in checks["cupti-python"].hint


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
