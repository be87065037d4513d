"""``headcount diff`` on real before/after pairs, as users run it: verdict, whole-work change, wall time, peak RSS.

Each diff is a subprocess (``headcount diff BASE NEW --json - --fail-on-regression 10``) launched by a fresh
``python -c`` probe, so that its peak RSS (``ru_maxrss`` of the probe's children) is the diff's whole process:

- the two-rank FSDP training on 2×H100 before and after a change (nsys 2026.2 exports, GindaChen/nsys-ai), and
  the before file against itself;
- the CPU program with ``layers.N`` ranges recorded here with nsys 2023.4.4 (scripts/record_cpu_pair.py): +25 %
  extra work per layer against two runs without, and the two runs without against each other.

Prints one line per pair: verdict, basis, change per rank, exit status, wall seconds, peak RSS (MiB). Asserts
nothing: tests/test_diff_whole_work.py checks the figures against hand counts. Run: python benchmarks/diff_real_pairs.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NSYS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nsys"
PAIRS = [("h100x2_fsdp_before_nsys2026.2.sqlite", "h100x2_fsdp_after_nsys2026.2.sqlite"),
         ("h100x2_fsdp_before_nsys2026.2.sqlite", "h100x2_fsdp_before_nsys2026.2.sqlite"),
         ("cpu_layers_base_nsys2023.4.sqlite", "cpu_layers_slower_nsys2023.4.sqlite"),
         ("cpu_layers_base2_nsys2023.4.sqlite", "cpu_layers_slower_nsys2023.4.sqlite"),
         ("cpu_layers_base_nsys2023.4.sqlite", "cpu_layers_base2_nsys2023.4.sqlite")]

PROBE = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
         "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
         "print(json.dumps({'rc': p.returncode, 'wall_s': time.perf_counter() - t, "
         "'rss_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 'out': p.stdout, 'err': p.stderr[-400:]}))")


def main() -> None:
    for base, new in PAIRS:
        cmd = [sys.executable, "-m", "headcount", "diff", str(NSYS / base), str(NSYS / new), "--json", "-",
               "--fail-on-regression", "10"]
        r = json.loads(subprocess.run([sys.executable, "-c", PROBE, *cmd], capture_output=True, text=True, check=True).stdout)
        if not r["out"].strip():
            print(f"{base} → {new}: exit {r['rc']}: {r['err'].strip().splitlines()[-1]}")
            continue
        doc = json.loads(r["out"])
        changes = ", ".join(f"{o['change_pct']:+.2f} % ({o['rank']})" for o in doc["overall"] if o["change_pct"] is not None)
        print(f"{base} → {new}: {doc['verdict']} on {doc['overall'][0]['basis']}: {changes}; exit {r['rc']}; "
              f"{r['wall_s']:.2f} s, peak RSS {r['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
