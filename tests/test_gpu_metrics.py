"""nsys GPU-metrics samples apportioned to kernels (provenance: sampled).

No fixture holds GPU metrics (they need a GPU and --gpu-metrics-devices), so
this test adds the two tables to a copy of the real H100×2 export with the
column names nsys writes (GPU_METRICS: typeId, metricId, timestamp, value;
TARGET_INFO_GPU_METRICS: typeId, metricId, metricName — names read from the
nsys 2023.4.4 binary and from public analyses of nsys exports) and samples
whose values are known, then checks the apportioning rule by hand, and that a
kernel the samples do not resolve (fewer than 4 whole sample intervals inside it)
gets null and a notice, not the reading of a sample that held other work.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.build.nsys import tables_from_nsys
from headcount.parsers.nsys_sqlite import read_export

H100 = Path(__file__).parent / "fixtures" / "nsys" / "h100x2_pytorch_nsys2026.2.sqlite"
STEP = 100_000  # 10 kHz


def _with_metrics(tmp_path: Path, step: int = STEP) -> Path:
    path = tmp_path / f"metrics-{step}.sqlite"
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
    times = np.arange(lo - step, hi + 2 * step, step)
    rows = [(int(t), int(t), type_id, 1, int(t // step) % 100) for t in times]  # value = sample index mod 100
    rows += [(int(t), int(t), type_id, 2, 50) for t in times]
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return path


def test_samples_are_apportioned_to_each_kernel_window(tmp_path):
    from headcount.derive import sampling

    export = read_export(_with_metrics(tmp_path))
    samples = export.gpu_metrics
    assert set(samples["metric"]) == {"DRAM Read Bandwidth", "SMs Active"} and set(samples["device"]) == {0}
    built = tables_from_nsys(export, "r")
    kernels = built.tables["kernels"]
    gpu0 = kernels[(kernels["device"] == "cuda:0") & (kernels["kind"] == "kernel")]  # the samples span the kernels
    gpu1 = kernels[kernels["device"] == "cuda:1"]
    assert gpu1["dram_read_sampled_pct"].isna().all()  # no samples for that GPU: null, not 0
    # no kernel of this export lasts 4 samples of 100 µs (the longest: 306 µs): none is resolved, and the run says so
    assert gpu0["dram_read_sampled_pct"].isna().all() and gpu0["sm_active_sampled_pct"].isna().all()
    assert (gpu0["sampling_interval_ns"] == STEP).all()
    on_gpu0 = kernels[kernels["sampling_interval_ns"].notna()]  # kernels, copies and memsets of GPU 0
    short = int(on_gpu0["sm_active_sampled_pct"].isna().sum())
    assert short >= len(gpu0) and any(f"do not resolve {short} of {len(on_gpu0)} GPU operations" in n for n in built.notices)
    # the arithmetic of the rule, without the resolution limit: the mean of the samples overlapping each window
    loose = sampling.apportion(gpu0.drop(columns=[*sampling.SAMPLED, "sampling_interval_ns"]), samples, min_whole=0)
    assert (loose["sm_active_sampled_pct"] == 50).all()
    t = samples[samples["metric"] == "DRAM Read Bandwidth"]["timestamp_ns"].to_numpy()
    v = samples[samples["metric"] == "DRAM Read Bandwidth"]["value"].to_numpy()
    for k in loose.sample(20, random_state=0).itertuples():
        window = (t >= k.start_ns) & (t < k.end_ns + STEP)
        assert np.isclose(k.dram_read_sampled_pct, v[window].mean())


def test_finer_samples_resolve_the_longer_kernels(tmp_path):
    step = 10_000  # 100 kHz: a kernel of 40 µs or more holds 4 whole samples
    kernels = tables_from_nsys(read_export(_with_metrics(tmp_path, step)), "r").tables["kernels"]
    gpu0 = kernels[(kernels["device"] == "cuda:0") & (kernels["kind"] == "kernel")]
    resolved = gpu0["sm_active_sampled_pct"].notna()
    duration = gpu0["end_ns"] - gpu0["start_ns"]
    assert resolved.any() and (~resolved).any()
    assert (duration[resolved] >= 4 * step).all() and (duration[~resolved] < 5 * step).all()
    assert (gpu0.loc[resolved, "sm_active_sampled_pct"] == 50).all()


def test_report_keeps_sampled_columns(tmp_path):
    from headcount.cli.main import main

    out = tmp_path / "r"
    assert main(["parse", str(_with_metrics(tmp_path, 10_000)), "-o", str(out)]) == 0
    kernels = pd.read_parquet(out / "kernels")
    assert kernels["dram_read_sampled_pct"].notna().sum() > 0 and kernels["dram_write_sampled_pct"].isna().all()
