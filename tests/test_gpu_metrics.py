"""nsys GPU-metrics samples apportioned to kernels (provenance: sampled).

No fixture holds GPU metrics (they need a GPU and --gpu-metrics-devices), so
this test adds the two tables to a copy of the real H100×2 export with the
column names nsys writes (GPU_METRICS: typeId, metricId, timestamp, value;
TARGET_INFO_GPU_METRICS: typeId, metricId, metricName — names read from the
nsys 2023.4.4 binary and from public analyses of nsys exports) and samples
whose values are known, then checks the apportioning rule by hand.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.build import tables_from_nsys
from headcount.parsers.nsys_sqlite import read_export

H100 = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
STEP = 100_000  # 10 kHz


def _with_metrics(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.sqlite"
    shutil.copy(H100, path)
    con = sqlite3.connect(path)
    lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0").fetchone()
    con.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER, typeName TEXT, "
                "metricId INTEGER NOT NULL, metricName TEXT NOT NULL)")
    con.execute("CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER NOT NULL, "
                "metricId INTEGER NOT NULL, value INTEGER NOT NULL)")
    type_id = 0x10000  # GPU 0 in the low byte
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GPU 0', ?, ?)",
                    [(type_id, 1, "DRAM Read Bandwidth"), (type_id, 2, "SMs Active")])
    times = np.arange(lo - STEP, hi + 2 * STEP, STEP)
    rows = [(int(t), int(t), type_id, 1, int(t // STEP) % 100) for t in times]  # value = sample index mod 100
    rows += [(int(t), int(t), type_id, 2, 50) for t in times]
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return path


def test_samples_are_apportioned_to_each_kernel_window(tmp_path):
    export = read_export(_with_metrics(tmp_path))
    samples = export.gpu_metrics
    assert set(samples["metric"]) == {"DRAM Read Bandwidth", "SMs Active"} and set(samples["device"]) == {0}
    kernels = tables_from_nsys(export, "r").tables["kernels"]
    gpu0 = kernels[(kernels["device"] == "cuda:0") & (kernels["kind"] == "kernel")]  # the samples span the kernels
    gpu1 = kernels[kernels["device"] == "cuda:1"]
    assert gpu1["dram_read_sampled_pct"].isna().all()  # no samples for that GPU: null, not 0
    assert (gpu0["sm_active_sampled_pct"] == 50).all() and (gpu0["sampling_interval_ns"] == STEP).all()
    t = samples[samples["metric"] == "DRAM Read Bandwidth"]["timestamp_ns"].to_numpy()
    v = samples[samples["metric"] == "DRAM Read Bandwidth"]["value"].to_numpy()
    for k in gpu0.sample(20, random_state=0).itertuples():
        window = (t >= k.start_ns) & (t < k.end_ns + STEP)
        assert np.isclose(k.dram_read_sampled_pct, v[window].mean())


def test_report_keeps_sampled_columns(tmp_path):
    from headcount.cli.main import main

    out = tmp_path / "r"
    assert main(["parse", str(_with_metrics(tmp_path)), "-o", str(out)]) == 0
    kernels = pd.read_parquet(out / "kernels")
    assert kernels["dram_read_sampled_pct"].notna().sum() > 0 and kernels["dram_write_sampled_pct"].isna().all()
