"""Holistic Trace Analysis 0.5.0's numbers on the kineto fixtures, for comparison with scripts/hand_counts.py.

Independent of headcount (never imports it).  Needs HTA in a venv of its own, e.g.

    python3 -m venv /tmp/hta-venv
    /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 --no-deps
    /tmp/hta-venv/bin/pip install "pandas<3" "numpy<2.3" plotly networkx pydot psutil pyyaml
    /tmp/hta-venv/bin/python scripts/hta_numbers.py

Each trace set is linked into a folder of its own (the two sampled ranks together), loaded the way
``TraceAnalysis(trace_dir=...)`` loads it, but with ``use_multiprocessing=False`` (one process), once as
HTA does by default (the last ProfilerStep dropped), once with ``include_last_profiler_step=True``, and
once more so with ``HTA_DISABLE_NS_ROUNDING=1`` (by default HTA rounds a float-µs trace's op start up and
end down to whole µs, trace_parser.round_down_time_stamps).
Outputs: tests/fixtures/kineto/hta_0.5.0/<set>/{default,include_last_step}/*.csv and timing.json
(wall clock of load + all analyses, default run).
"""

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pandas as pd
from hta.common.trace import Trace
from hta.trace_analysis import TraceAnalysis

KINETO = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto"
OUT = KINETO / "hta_0.5.0"
SETS = {
    "a100_ddp_rank0of2_nccl_annotations": ["a100_ddp_rank0of2_nccl_annotations_kineto.json.gz"],
    "unnamed-gpu_rank0-1of128_streams_nccl": ["unnamed-gpu_rank0of128_streams_nccl_kineto.json.gz",
                                              "unnamed-gpu_rank1of128_streams_nccl_kineto.json.gz"],
    "a100-80gb_rank0of16_cudagraph_nccl": ["a100-80gb_rank0of16_cudagraph_nccl_kineto.json.gz"],
    "v100_rank1of2_cudagraph_nccl": ["v100_rank1of2_cudagraph_nccl_kineto.json.gz"],
    "a100_event_sync_3streams": ["a100_event_sync_3streams_kineto.json.gz"],
    "mi250_minitoy_steps_gpu_annotation": ["mi250_minitoy_steps_gpu_annotation_kineto.json.gz"],
}

VARIANTS = (("default", False, False),  # as TraceAnalysis(trace_dir=...) does
            ("include_last_step", True, False),
            ("include_last_step_no_ns_rounding", True, True))  # HTA_DISABLE_NS_ROUNDING=1

FAILED = object()


def load(trace_dir, include_last):
    ta = TraceAnalysis.__new__(TraceAnalysis)  # what __init__ does, in one process
    ta.t = Trace(None, trace_dir)
    ta.t.load_traces(include_last, use_multiprocessing=False)
    return ta


def save(obj, path):
    if obj is FAILED:
        return  # <name>.error.txt says why
    if obj is None:
        path.with_suffix(".txt").write_text("None\n")
    elif isinstance(obj, pd.DataFrame):
        obj.to_csv(path.with_suffix(".csv"), index=False)
    else:
        path.with_suffix(".txt").write_text(repr(obj) + "\n")


def analyses(ta, out):
    out.mkdir(parents=True, exist_ok=True)
    ranks = ta.t.get_ranks()
    results = {"ranks": ranks, "profiler_steps": None}
    steps = {}

    def run(name, fn):
        try:
            r = fn()
            results[name] = "ok"
            return r
        except Exception as e:  # noqa: BLE001 -- HTA refusing a trace is a result too
            results[name] = f"{type(e).__name__}: {e}"
            (out / f"{name}.error.txt").write_text(traceback.format_exc())
            return FAILED

    steps = run("profiler_steps", ta.get_profiler_steps)
    save(steps, out / "profiler_steps")
    save(run("comm_comp_overlap", lambda: ta.get_comm_comp_overlap(visualize=False)), out / "comm_comp_overlap")
    idle = run("idle_time_breakdown", lambda: ta.get_idle_time_breakdown(
        ranks=ranks, visualize=False, show_idle_interval_stats=True))
    if idle is not FAILED:
        save(idle[0], out / "idle_time_breakdown")
        save(idle[1], out / "idle_interval_stats")
    save(run("potential_stragglers", lambda: ta.get_potential_stragglers(visualize=False)),
         out / "potential_stragglers")
    save(run("gpu_user_annotation_breakdown", lambda: ta.get_gpu_user_annotation_breakdown(visualize=False)),
         out / "gpu_user_annotation_breakdown")
    save(run("cpu_user_annotation_breakdown", lambda: ta.get_gpu_user_annotation_breakdown(
        use_gpu_annotation=False, visualize=False)), out / "cpu_user_annotation_breakdown")
    save(run("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False)), out / "temporal_breakdown")
    return results


def main():
    timing = {}
    for name, files in SETS.items():
        with tempfile.TemporaryDirectory() as d:
            for f in files:
                os.symlink(KINETO / f, Path(d) / f)
            for variant, include_last, exact in VARIANTS:
                if exact:
                    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
                else:
                    os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
                t0 = time.perf_counter()
                try:
                    ta = load(d, include_last)
                    res = analyses(ta, OUT / name / variant)
                except Exception as e:  # noqa: BLE001 -- a load HTA refuses is recorded
                    (OUT / name / variant).mkdir(parents=True, exist_ok=True)
                    (OUT / name / variant / "load.error.txt").write_text(traceback.format_exc())
                    res = {"load": f"{type(e).__name__}: {e}"}
                res["wall_s_load_and_analyses"] = round(time.perf_counter() - t0, 2)
                timing.setdefault(name, {})[variant] = res
                print(name, variant, res, flush=True)
    (OUT / "timing.json").write_text(json.dumps(timing, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
