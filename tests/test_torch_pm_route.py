"""Which route torch.profiler's own PM sampling takes here (issue 59, route 4), read from the installed torch.

torch 2.15 tests run in the environment ``scripts/torch_215.sh`` makes (``HEADCOUNT_REQUIRE_TORCH215=1`` there: they
must not skip); on the CPU torch of ``make test`` they skip with that reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from headcount.collector import torch_pm
from headcount.common.nsight import PM_COUNTERS, PM_PERCENTS

HAS_215 = hasattr(torch.profiler, "PerformanceMetricsConfig")


def _need_215():
    if not HAS_215:
        if os.environ.get("HEADCOUNT_REQUIRE_TORCH215"):
            pytest.fail(f"torch {torch.__version__} has no PerformanceMetricsConfig in the torch 2.15 environment")
        pytest.skip(f"torch {torch.__version__} has no PerformanceMetricsConfig: scripts/torch_215.sh runs this test")


def test_an_older_torch_says_it_has_no_pm_route():
    if HAS_215:
        pytest.skip("this torch has PerformanceMetricsConfig")
    chosen = torch_pm.route(cuda=True)
    assert chosen.name is None and "has no torch.profiler.PerformanceMetricsConfig (torch 2.15+)" in chosen.detail


def test_torch_2_15_0s_kineto_has_no_pm_sampling_compiled_in_and_cuspy_needs_a_newer_libcupti():
    _need_215()
    assert torch_pm.kineto_samples_pm() is False  # its libtorch_cpu imports CUPTI's activity API, no cuptiPmSampling*
    chosen = torch_pm.route(cuda=True)
    assert chosen.name is None
    assert "Kineto has no CUPTI PM-sampling profiler compiled in" in chosen.detail
    assert "libcupti ≥ 13.3" in chosen.detail and "13.2" in chosen.detail  # the environment holds torch's pin, 13.2.86


def test_a_library_that_imports_cuptis_pm_sampling_is_read_as_kineto_having_it(tmp_path):
    """A real ELF that has cuptiPmSampling* in its dynamic symbols (the libcupti headcount installs) under the name
    of torch's library: the positive answer of the check, on a real file."""
    import headcount.collector.cupti_home as cupti_home

    found = sorted(Path(cupti_home.home()).glob("nvidia/cu13/lib/libcupti.so*"))
    if not found:
        pytest.skip("no libcupti in headcount's folder (headcount cupti install)")
    (tmp_path / "libtorch_cpu.so").symlink_to(found[0])
    torch_pm.kineto_samples_pm.cache_clear()
    try:
        assert torch_pm.kineto_samples_pm(str(tmp_path)) is True
        assert torch_pm.kineto_samples_pm(str(tmp_path / "nowhere")) is None  # no torch library: unknown, not "no"
    finally:
        torch_pm.kineto_samples_pm.cache_clear()


@pytest.mark.parametrize("name", ["kineto", "cuspy"])
def test_the_activities_ask_torch_for_headcounts_metrics_through_the_route(name):
    _need_215()
    from torch.profiler import CuspyConfig, PerformanceMetricsConfig, ProfilerActivity, profile

    metrics = [*PM_COUNTERS, *PM_PERCENTS]
    activities = torch_pm.activities(torch_pm.Route(name, "test"), metrics, 0.02, 1000.0)
    prof = profile(activities=activities)  # torch's own parsing of them (no GPU needed to build one)
    assert prof.activities == {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    configs = prof.activity_configs[ProfilerActivity.CUDA].profiler_configs
    pm = next(c for c in configs if isinstance(c, PerformanceMetricsConfig))
    assert pm.metric_names == metrics and pm.sampling_interval_ms == 0.02 and pm.lookback_window_ms == 1000.0
    assert pm._to_config_entries()["PERFORMANCE_METRICS"] == ",".join(metrics)
    assert any(isinstance(c, CuspyConfig) for c in configs) == (name == "cuspy")
    assert prof._use_cuspy == (name == "cuspy")


def test_no_route_is_no_activities():
    with pytest.raises(ValueError, match="no PM-sampling route"):
        torch_pm.activities(torch_pm.Route(None, "none here"), list(PM_COUNTERS))


def test_the_torch_recorder_on_cuda_says_why_torch_samples_no_pm_here(tmp_path):
    _need_215()
    from headcount.collector.torch_source import TorchRecorder

    recorder = TorchRecorder(tmp_path, cuda=True)
    assert any(n.startswith("no PM samples through torch.profiler: ") and "libcupti ≥ 13.3" in n for n in recorder.notices)
    recorder.cleanup()


def test_the_torch_recorder_asks_for_the_interval_given_and_for_nothing_without_pm_sampling(tmp_path, monkeypatch):
    """``--pm-interval-us 50`` and ``--no-pm-sampling`` (run and profile, through the child's and the API's
    TorchRecorder) reach torch's own config objects. The route is the one thing stood in for: a wheel whose Kineto
    has PM sampling compiled in (torch_pm.route reads that from the installed library, which 2.15.0's lacks)."""
    _need_215()
    from torch.profiler import PerformanceMetricsConfig, ProfilerActivity

    from headcount.collector.torch_source import TorchRecorder

    monkeypatch.setattr(torch_pm, "route", lambda cuda=True: torch_pm.Route("kineto", "Kineto's CUPTI PM sampling (stood in)"))
    recorder = TorchRecorder(tmp_path / "a", cuda=True, pm_interval_ns=50_000)
    configs = recorder._profile.activity_configs[ProfilerActivity.CUDA].profiler_configs
    pm = next(c for c in configs if isinstance(c, PerformanceMetricsConfig))
    assert pm.sampling_interval_ms == 0.05 and any("every 50 µs" in n for n in recorder.notices)
    off = TorchRecorder(tmp_path / "b", cuda=True, pm_sampling=False)
    assert ProfilerActivity.CUDA in off._profile.activities and not off.notices
    assert not (off._profile.activity_configs or {}).get(ProfilerActivity.CUDA)


def test_doctor_names_the_routes_this_environment_has_and_recommends_one(capsys):
    import json

    from headcount.cli.main import main

    assert main(["doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["routes"]) == {"torch (Kineto PM)", "torch (Cuspy PM)", "cupti", "ncu", "nsys", "torch"}
    assert doc["routes"]["torch"] and not doc["routes"]["cupti"]  # this machine: no GPU
    check = next(c for c in doc["checks"] if c["name"] == "torch PM sampling")
    assert check["status"] == "info"
    if HAS_215:
        assert check["detail"].startswith("no CUDA device here; on one, none: ") and "Kineto has no CUPTI PM-sampling" in check["detail"]
    else:
        assert "no torch.profiler.PerformanceMetricsConfig" in check["detail"]
    assert doc["recommended"].startswith("--backend torch: operator (and, on a GPU, kernel) times only")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "routes here: torch (Kineto PM) no" in out and "recommended: --backend torch" in out


@pytest.mark.parametrize("have, starts", [
    ({"torch (Kineto PM)", "cupti", "ncu", "nsys"}, "--backend torch: torch.profiler samples DRAM and warps itself"),
    ({"cupti", "torch (Cuspy PM)", "ncu"}, "--backend cupti:"),
    ({"torch (Cuspy PM)", "ncu"}, "--backend torch: PM samples through Cuspy"),
    ({"ncu", "nsys"}, "headcount run --backend ncu:"),
    ({"nsys"}, "headcount run --backend nsys:"),
    (set(), "--backend torch: operator"),
])
def test_the_recommendation_prefers_one_cupti_client_then_headcounts_sampler_then_exact_counters(have, starts):
    from headcount.machine import doctor

    names = ("torch (Kineto PM)", "torch (Cuspy PM)", "cupti", "ncu", "nsys", "torch")
    assert doctor.recommended({name: name in have or name == "torch" for name in names}).startswith(starts)


def test_the_cupti_source_started_inside_a_torch_profiler_session_says_so_in_one_line_and_offers_the_torch_route():
    """A real torch.profiler session (CPU here; with CUDA activity it holds CUPTI); the CUPTI the source would
    enable stands in for the GPU (:class:`cupti_replay.ReplayCupti`)."""
    from cupti_replay import ReplayCupti
    from torch.profiler import ProfilerActivity, profile

    from headcount.collector.cupti_source import CuptiRecorder
    from headcount.common.errors import HeadcountError

    replay = ReplayCupti()
    recorder = CuptiRecorder(cupti=replay, pm_sampling=False)
    assert torch_pm.cupti_holder() is None
    with profile(activities=[ProfilerActivity.CPU]):
        assert torch_pm.cupti_holder() == "a torch.profiler session"
        with pytest.raises(HeadcountError) as caught:
            recorder.start()
    error = caught.value
    assert str(error).startswith("a torch.profiler session is recording in this process and holds CUPTI")
    assert "\n" not in str(error) and "ERROR_MULTIPLE_SUBSCRIBERS" not in str(error) and error.exit_code == 3
    assert "--backend torch" in error.hint
    assert not replay.enabled  # nothing of CUPTI was touched
    recorder.start()  # outside the session it starts
    recorder.stop()
