"""A multi-rank trace set: ``headcount parse`` end to end beside Holistic Trace Analysis' load + analyses, in one run.

    python benchmarks/multi_rank_vs_hta.py [--rounds N] [--copies N] [--hta-python PATH] [FILE ...]

Default files: the two ranks (0 and 1 of 128) of HTA's own sampled trace pair (tests/fixtures/kineto), the one real
multi-rank set here. ``--copies N`` replicates each rank's trace N times in time first (benchmarks/kineto_scale.py's
builder: fresh ids and step numbers per copy), for a set the size of a real job's. Each round times, as subprocesses (wall clock and whole-process peak RSS, from
``resource.getrusage(RUSAGE_CHILDREN)`` of a fresh child each time):

- ``headcount parse FILES -o OUT`` (every table, the findings, the report on disk; its worker processes included:
  the peak RSS is the largest process's, ``ru_maxrss`` of the children);
- HTA 0.5.0 in its own virtual environment: ``TraceAnalysis`` over a folder of the same files, one process
  (``use_multiprocessing=False``), then ``get_comm_comp_overlap``, ``get_idle_time_breakdown``,
  ``get_potential_stragglers``, ``get_gpu_user_annotation_breakdown`` (each tried: HTA raises on some sets).

HTA's environment (``--hta-python``, default ``/tmp/hta-venv/bin/python``) is made as scripts/hta_numbers.py says;
without it the HTA side is skipped and the line says so. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT / "tests" / "fixtures" / "kineto"
FILES = ["unnamed-gpu_rank0of128_streams_nccl_kineto.json.gz", "unnamed-gpu_rank1of128_streams_nccl_kineto.json.gz"]

HTA = r'''
import sys, time
from hta.common.trace import Trace
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis.__new__(TraceAnalysis)
ta.t = Trace(None, sys.argv[1])
ta.t.load_traces(False, use_multiprocessing=False)
loaded = time.perf_counter() - t0
done = []
for name, call in (("get_comm_comp_overlap", lambda: ta.get_comm_comp_overlap(visualize=False)),
                   ("get_idle_time_breakdown", lambda: ta.get_idle_time_breakdown(visualize=False)),
                   ("get_potential_stragglers", lambda: ta.get_potential_stragglers(visualize=False)),
                   ("get_gpu_user_annotation_breakdown", lambda: ta.get_gpu_user_annotation_breakdown(visualize=False))):
    try:
        call(); done.append(name)
    except Exception as e:
        done.append(f"{name} raised {type(e).__name__}")
print(f"load {loaded:.2f} s; " + ", ".join(done))
'''


def _timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, last output line) of ``cmd`` run in a fresh child of a fresh Python (so that
    RUSAGE_CHILDREN holds that one command only)."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); w = time.perf_counter() - t; "
             "r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024; "
             "print(f'{w:.3f} {r:.1f} {p.returncode}'); out = (p.stdout.strip() or p.stderr.strip()).splitlines(); print(out[-1] if out else '')")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, env=env)
    head, *tail = out.stdout.splitlines() or ["nan nan 1"]
    wall, rss, code = head.split()
    if code != "0":
        return float("nan"), float(rss), f"exit {code}: {tail[0] if tail else ''}"
    return float(wall), float(rss), tail[0] if tail else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=[str(KINETO / f) for f in FILES])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=1, help="replicate each trace this many times in time first")
    parser.add_argument("--hta-python", default=os.environ.get("HEADCOUNT_HTA_PYTHON", "/tmp/hta-venv/bin/python"))
    args = parser.parse_args(argv)
    files = [Path(f) for f in args.files]
    made = tempfile.TemporaryDirectory() if args.copies > 1 else None
    if made is not None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import kineto_scale

        copies = []
        for f in files:
            kineto_scale.FIXTURE = f  # the builder replicates its FIXTURE
            out = Path(made.name) / f.name.replace(".json.gz", f"_x{args.copies}.json")
            figures = kineto_scale.build(out, args.copies)
            print(f"{out.name}: {figures['events']:,} events, {figures['kernels']:,} kernels, {figures['bytes'] / 2**20:.0f} MiB")
            copies.append(out)
        files = copies
    size = sum(f.stat().st_size for f in files) / 2**20
    print(f"{len(files)} traces, {size:.1f} MiB: {', '.join(f.name for f in files)}")
    headcount = shutil.which("headcount") or str(Path(sys.executable).with_name("headcount"))
    have_hta = Path(args.hta_python).exists()
    if not have_hta:
        print(f"HTA: skipped ({args.hta_python} not found: make it as scripts/hta_numbers.py says, or pass --hta-python)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ranks"
        folder.mkdir()
        for f in files:
            os.symlink(f.resolve(), folder / f.name)
        for round_ in range(args.rounds):
            out = Path(tmp) / f"out{round_}"
            wall, rss, last = _timed([headcount, "parse", *map(str, files), "-o", str(out)])
            print(f"round {round_ + 1}: headcount parse: {wall:.2f} s wall, {rss:.0f} MiB peak RSS ({last})", flush=True)
            if have_hta:
                env = dict(os.environ)
                env.pop("PYTHONPATH", None)
                wall, rss, last = _timed([args.hta_python, "-c", HTA, str(folder)], env=env)
                print(f"round {round_ + 1}: HTA 0.5.0 load + 4 analyses: {wall:.2f} s wall, {rss:.0f} MiB peak RSS ({last})",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
