"""`headcount parse` of a large torch.profiler trace, end to end, against Holistic Trace Analysis (issue 30).

Builds a large Kineto trace from the real H100 fixture
(``tests/fixtures/kineto/h100_qwen1.5-0.5b_kineto.json.gz``: one Qwen1.5-0.5B
step, 18,221 events, 1,465 kernels) replicated in time: each copy shifted
past the previous one, with fresh correlation, external, flow and Python
ids and its own ``ProfilerStep#`` number (100 copies: 499 MB of compact JSON,
1.8 M events, 146,500 kernels). Then, one after the other on the same
machine, each in a fresh process:

- ``headcount parse FILE -o OUT`` as a subprocess: wall time and peak RSS of
  the whole process tree (sampled every 20 ms from /proc: what a user waits
  for and what must fit in memory);
- Holistic Trace Analysis on the same file (``TraceAnalysis(trace_dir=…)``
  and ``get_gpu_kernel_breakdown(visualize=False)``), when installed; its
  default keeps only the kernels launched in the trace within the steps
  before the last, so its kernel count is lower by design.

- the floor (issue 60): a fresh process that only reads the file and decodes every event with msgspec into the
  typed structs headcount decodes into (:class:`headcount.parsers.kineto_events.Event`), one core: what any
  parse of the file costs at least. It runs in each of the ``--repeat`` rounds beside headcount (the median of
  each reported, with every run): one run of it alone varied 2.6–6.6 s on this 2-core machine.

And checks the answers: headcount's kernel count (its ``kernels`` table read
back) and HTA's equal the copies × the fixture's, and every layer's calls in
``layers`` are the copies × the fixture's.

Goals (issue 30, raised by issue 60): ≥ 20× HTA at 100 copies, within 2.5× of the decode floor, ≤ 1 GB peak RSS
(largest process) at 100 and 400 copies, every kernel kept.

Run: python benchmarks/kineto_scale.py [--copies 100 [--copies 400]] [--gzip] [--repeat N] [--keep DIR] [--no-hta] [--jobs N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
import tempfile
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution import headcount_cmd, timed  # noqa: E402 - the same runner and memory sampling as the nsys benchmark

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto" / "h100_qwen1.5-0.5b_kineto.json.gz"
ID_ARGS = ("External id", "correlation", "Python id", "Python parent id", "Ev Idx")  # made fresh in every copy
STEP = re.compile(r"^ProfilerStep#(\d+)$")

HTA = """
import json, sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
analyzer.get_gpu_kernel_breakdown(visualize=False)
trace = analyzer.t.get_trace(0)
kernel = analyzer.t.symbol_table.get_sym_id_map()["kernel"]
print(json.dumps({"kernels": int((trace["cat"] == kernel).sum())}))
"""

FLOOR = """
import gzip, sys
import msgspec
from headcount.parsers.kineto_events import Event

class Trace(msgspec.Struct):
    traceEvents: list[Event]

path = sys.argv[1]
with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
    text = fh.read()
print(len(msgspec.json.decode(text, type=Trace).traceEvents))
"""


def _strides(events: list[dict]) -> tuple[float, dict[str, int], int]:
    """The fixture's time span (µs, rounded up, plus 1 ms), each id's stride (its largest value + 1) and
    the step numbers' stride."""
    ends = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))]
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    period = math.ceil(max(ends) - min(starts)) + 1000.0
    strides = {name: 1 for name in (*ID_ARGS, "flow")}
    steps = [1]
    for e in events:
        args = e.get("args") or {}
        for name in ID_ARGS:
            if isinstance(args.get(name), int):
                strides[name] = max(strides[name], args[name] + 1)
        if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
            strides["flow"] = max(strides["flow"], e["id"] + 1)
        if (m := STEP.match(str(e.get("name", "")))) is not None:
            steps.append(int(m.group(1)) + 1)
    return period, strides, max(steps)


def build(path: Path, copies: int) -> dict:
    """Write the fixture replicated ``copies`` times in time to ``path`` (gzip when it ends in .gz), one
    event at a time (the builder holds one copy, never the whole file); returns its figures."""
    with gzip.open(FIXTURE, "rb") as file:
        trace = json.load(file)
    events = trace.pop("traceEvents")
    period, strides, step_stride = _strides(events)
    encode = msgspec.json.Encoder().encode
    opener = gzip.open if path.suffix == ".gz" else open
    kernels = written = 0
    with opener(path, "wb") as out:
        out.write(encode(trace)[:-1] + b', "traceEvents": [\n')
        first = True
        for k in range(copies):
            for e in events:
                if k and (e.get("ph") == "M" or e.get("cat") == "Trace"):
                    continue  # process and thread names, the profiler's own span: once
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + k * period
                if e.get("cat") == "Trace" and "dur" in e:
                    e["dur"] = e["dur"] + (copies - 1) * period
                if k and e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
                    e["id"] = e["id"] + k * strides["flow"]
                if k and e.get("args"):
                    args = e["args"] = dict(e["args"])
                    for name in ID_ARGS:
                        if isinstance(args.get(name), int):
                            args[name] = args[name] + k * strides[name]
                if k and (m := STEP.match(str(e.get("name", "")))) is not None:
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
                kernels += e.get("cat") == "kernel"
                written += 1
                out.write((b"" if first else b",\n") + encode(e))
                first = False
        out.write(b"\n]}\n")
    return {"events": written, "kernels": kernels, "bytes": path.stat().st_size}


def fixture_layer_calls() -> dict[tuple[str, str], int]:
    """Calls per (layer, phase) in the fixture's own report (``headcount parse`` of the original)."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        done = timed([*headcount_cmd(), "parse", str(FIXTURE), "-o", f"{tmp}/out"]).done
        if done.returncode != 0:
            sys.exit(f"headcount parse of the fixture failed: {done.stderr.strip()[-2000:]}")
        layers = pd.read_parquet(f"{tmp}/out/layers", columns=["layer_name", "phase", "calls"])
    return {(r.layer_name, r.phase): int(r.calls) for r in layers.itertuples(index=False)}


def headcount_answers(out: Path) -> tuple[int, dict[tuple[str, str], int]]:
    """Kernels in the report's ``kernels`` table, and calls per (layer, phase) in ``layers``."""
    import pyarrow.dataset as ds

    kernels = ds.dataset(out / "kernels", format="parquet", partitioning="hive").count_rows(filter=ds.field("kind") == "kernel")
    layers = ds.dataset(out / "layers", format="parquet", partitioning="hive").to_table(
        columns=["layer_name", "phase", "calls"]).to_pandas()
    return kernels, {(r.layer_name, r.phase): int(r.calls) for r in layers.itertuples(index=False)}


def hta_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("hta") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, action="append", help="copies of the fixture (repeatable; default 100)")
    parser.add_argument("--gzip", action="store_true", help="write the trace gzip-compressed (.json.gz)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command, alternating (median reported)")
    parser.add_argument("--keep", default=None, help="build the traces in this folder and keep them")
    parser.add_argument("--no-hta", action="store_true", help="time headcount only")
    parser.add_argument("--jobs", type=int, default=None, help="headcount parse --jobs (default: its own, one per core)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a command is killed")
    args = parser.parse_args()
    use_hta = not args.no_hta and hta_available()
    if not args.no_hta and not use_hta:
        print("Holistic Trace Analysis is not installed (pip install HolisticTraceAnalysis==0.5.0 --no-deps): "
              "headcount only")
    expected_calls = fixture_layer_calls()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)  # --keep: the traces and reports stay there
        for copies in args.copies or [100]:
            trace_dir = work / f"trace-{copies}x"
            trace_dir.mkdir(parents=True, exist_ok=True)
            path = trace_dir / f"qwen-{copies}x.json{'.gz' if args.gzip else ''}"
            figures = build(path, copies)
            print(f"{copies} copies: {path.name}, {figures['bytes'] / 1e6:.0f} MB, {figures['events']:,} events, "
                  f"{figures['kernels']:,} kernels")
            runs: dict[str, list] = {"headcount": [], "hta": [], "floor": []}
            for _ in range(args.repeat):
                out = work / f"out-{copies}x"
                if out.exists():
                    import shutil

                    shutil.rmtree(out)
                jobs = ["--jobs", str(args.jobs)] if args.jobs else []
                m = timed([*headcount_cmd(), "parse", str(path), "-o", str(out), *jobs], timeout=args.timeout, inputs=(path,))
                if m.done.returncode != 0:
                    sys.exit(f"headcount parse failed ({m.done.returncode}): {m.done.stderr.strip()[-2000:]}")
                runs["headcount"].append(m)
                # the floor in the same rounds: one run of it swung from 2.6 to 6.6 s on this machine (its ratio with it)
                runs["floor"].append(timed([sys.executable, "-c", FLOOR, str(path)], timeout=args.timeout, inputs=(path,)))
                if use_hta:
                    h = timed([sys.executable, "-c", HTA, str(trace_dir)], timeout=args.timeout, inputs=(path,))
                    if h.done.returncode != 0:
                        sys.exit(f"HTA failed ({h.done.returncode}): {h.done.stderr.strip()[-2000:]}")
                    runs["hta"].append(h)
            kernels, calls = headcount_answers(work / f"out-{copies}x")
            want = {key: n * copies for key, n in expected_calls.items()}
            mine = statistics.median(m.wall for m in runs["headcount"])
            walls = ", ".join(f"{m.wall:.1f}" for m in runs["headcount"])
            largest = max(m.largest for m in runs["headcount"])
            print(f"  headcount parse: {mine:.1f} s (median of {walls}), {runs['headcount'][-1].memory()}; largest process "
                  f"{largest:.2f} GiB (goal ≤ 1 GB); kernels {kernels:,} "
                  f"({'all' if kernels == figures['kernels'] else 'NOT all'} of {figures['kernels']:,}); layer calls "
                  f"{'= ' if calls == want else '≠ '}{copies} × the fixture's")
            failed = [low for low in runs["floor"] if low.done.returncode != 0]
            if not failed:
                low, floor_s = runs["floor"][-1], statistics.median(low.wall for low in runs["floor"])
                print(f"  decode floor (read + msgspec into typed events, {int(low.done.stdout.split()[-1]):,} events, one core): "
                      f"{floor_s:.1f} s (median of {', '.join(f'{f.wall:.1f}' for f in runs['floor'])}), {low.memory()}; "
                      f"headcount takes {mine / floor_s:.2f}× it (goal ≤ 2.5×)")
            else:
                print(f"  decode floor failed (exit {failed[0].done.returncode}): {failed[0].done.stderr.strip()[-300:]}")
            if runs["hta"]:
                theirs = statistics.median(h.wall for h in runs["hta"])
                hta_kernels = json.loads(runs["hta"][-1].done.stdout.strip().splitlines()[-1])["kernels"]
                print(f"  Holistic Trace Analysis: {theirs:.1f} s, {runs['hta'][-1].memory()}; kernels {hta_kernels:,} "
                      "(its default keeps those launched in the trace, in the steps before the last)")
                print(f"  headcount is {theirs / mine:.2f}× HTA's speed (goal ≥ 20×)")


if __name__ == "__main__":
    main()
