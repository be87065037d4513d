"""The GPU check's counter comparison (scripts/gpu_check.py counter_rows, issue 47 item 5): cupti-sampled bytes
of each range instance against ncu's measured bytes of the same calls, matched by step, phase, layer and head.

The frames stand in for the two reports a GPU run writes (a cupti report's ``ranges``, an ncu report's
``kernels``, their columns as headcount writes them; the ncu NVTX stacks as the H100's ncu report spells them);
no GPU runs here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

PLAN = {"steps": [{"step": 0, "seq": 128, "batch": 64, "measured": False}, {"step": 1, "seq": 128, "batch": 64, "measured": True},
                  {"step": 2, "seq": 2048, "batch": 4, "measured": False}, {"step": 3, "seq": 2048, "batch": 4, "measured": True}]}


def _ranges(sampled: dict) -> pd.DataFrame:
    rows = []
    for step in range(4):
        for phase in ("fwd", "bwd"):
            for layer in (0, 1):
                total = sampled.get((step, phase, layer), np.nan)
                rows.append({"level": "layer", "step": step, "phase": phase, "layer": layer, "head": None,
                             "dram_read_sampled_bytes": total * 0.75, "dram_write_sampled_bytes": total * 0.25,
                             "pm_whole_samples": 9.0 if not np.isnan(total) else 2.0})
    return pd.DataFrame(rows)


def _kernels(bytes_per_range: float) -> pd.DataFrame:
    rows = []
    for step in range(4):
        for phase in ("fwd", "bwd"):
            for layer in (0, 1):
                for part in (0.25, 0.75):  # two kernels per range
                    rows.append({"name": f"k{part}", "nvtx_path": f"headcount.step@step.{step};headcount@{phase}/layer.{layer}",
                                 "phase": phase, "layer": layer, "head": None, "dram_bytes": part * bytes_per_range * (step + 1)})
    rows.append({"name": "outside", "nvtx_path": "headcount.step@step.1", "phase": None, "layer": None, "head": None, "dram_bytes": 1e12})
    return pd.DataFrame(rows)


def test_ncu_step_is_the_innermost_step_range():
    assert gpu_check._ncu_step("headcount.step@step.0/step.1/step.2;headcount@fwd/layer.0") == 2  # nested, as before the fix
    assert gpu_check._ncu_step("headcount.step@step.7;headcount@bwd/layer.3/head.1") == 7
    assert gpu_check._ncu_step("headcount@fwd/layer.0") is None and gpu_check._ncu_step(None) is None


def test_counter_rows_match_the_compared_step_of_each_shape():
    # ncu measured 1e6 bytes per range in step 1 and 4e6 in step 3; cupti sampled 1.1e6 and 3.6e6, one range unresolved
    sampled = {(1, p, layer): 1.1e6 for p in ("fwd", "bwd") for layer in (0, 1)}
    sampled.update({(3, p, layer): 3.6e6 for p in ("fwd", "bwd") for layer in (0, 1)})
    del sampled[(3, "bwd", 1)]
    rows = gpu_check.counter_rows(_ranges(sampled), _kernels(1e6), PLAN)
    assert len(rows) == 8 and set(rows["step"]) == {1, 3}  # warm-up steps left out, the kernel outside every layer too
    assert set(zip(rows["seq"], rows["batch"])) == {(128, 64), (2048, 4)}
    assert (rows["measured_kernels"] == 2).all()
    first = rows[rows["step"] == 1]
    assert np.allclose(first["measured_bytes"], 2e6) and np.allclose(first["ratio"], 0.55)
    last = rows[(rows["step"] == 3) & rows["sampled_bytes"].notna()]
    assert np.allclose(last["ratio"], 3.6e6 / 4e6)
    assert rows["sampled_bytes"].isna().sum() == 1
    status, detail = gpu_check._bounded(rows, "rows", 4)
    assert status == "FAIL" and "7 of 8 rows resolved" in detail and "3 within 0.8–1.25" in detail
    status, detail = gpu_check._bounded(rows[rows["step"] == 3], "rows", 4)
    assert status == "FAIL" and "fewer than 4 rows" in detail  # 3 resolved: too few to stand for the shape
    status, _ = gpu_check._bounded(rows[rows["step"] == 3], "rows", 3)
    assert status == "ok"
