"""Recordings from a real H100 (tests/fixtures/gpu/h100-2026-12-05, scripts/gpu_check.sh) through headcount's
own paths: the cupti source's records become tables with sampled DRAM, an interrupted ncu run's report parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from headcount.build import tables_from_cupti
from headcount.device import limits_for

GPU = Path(__file__).parent / "fixtures" / "gpu" / "h100-2026-12-05"


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_h100_records_give_sampled_dram_for_every_layer(impl):
    built = tables_from_cupti(GPU / "records-layer" / impl / "cupti-records.jsonl.gz", [], "h100", impl, limits_for("9.0"))
    layers = built.tables["layers"]
    assert sorted(set(layers["phase"])) == ["bwd", "fwd"] and layers["layer"].nunique() == 12
    assert (layers["calls"] == 3).all()  # 3 steps
    assert (layers["dram_bytes_provenance"] == "sampled").all()
    assert (layers["dram_bytes_sampled"] > 0).all()
    # the sampled bandwidth stays under the copy ceiling measured in the same run
    ceiling = json.loads((GPU / "bandwidth.json").read_text())["copy_ceiling_gbps"]
    assert 0 < layers["bandwidth_gbps"].max() <= 1.05 * ceiling


def test_h100_probes_name_the_library_they_loaded():
    """What settled issue 35's route: 13.4 bindings sample over libcupti 13.4, not over torch's 13.0.85."""
    over_torch = json.loads((GPU / "probe-cupti-13.4-torchlib.json").read_text())
    own = json.loads((GPU / "probe-cupti-13.4.json").read_text())
    assert over_torch["libcupti_wheel"] == "nvidia-cuda-cupti==13.0.85" and own["libcupti_wheel"] == "nvidia-cuda-cupti==13.4.92"
    assert not over_torch["stats"]["pm_sampling"]["enabled"] and "ERROR_INVALID_PARAMETER" in over_torch["stats"]["pm_sampling"]["notice"]
    assert own["stats"]["pm_sampling"]["populated_samples"] > 1000
    assert own["kinds"]["pm_sample"] == own["stats"]["pm_sampling"]["populated_samples"]


def test_interrupted_ncu_run_parses(tmp_path):
    pytest.importorskip("ncu_report")
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(GPU / "interrupt-ncu" / "run.ncu-rep"), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    layers = pd.read_parquet(out / "layers")
    assert set(layers["layer"]) == {0} and (layers["dram_bytes_provenance"] == "measured").all()
    assert (layers["dram_bytes_measured"] > 0).all()
    assert len(pd.read_parquet(out / "kernels")) == 5
    assert pd.read_parquet(out / "runs")["device_name"].tolist() == ["NVIDIA H100 80GB HBM3"]
