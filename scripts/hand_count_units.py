"""Hand count of a repeated unit (``layers.N``) in nsys SQLite exports: independent of headcount.

Plain Python (sqlite3, statistics, re, json) only; it never imports the headcount package, so its
numbers can be set beside ``headcount diff`` on the same files (tests/fixtures/nsys/cpu_layers_*,
recorded by scripts/record_cpu_pair.py, listed in tests/fixtures/PROVENANCE.md).

Rule:

- A unit range: an NVTX push/pop range (``NVTX_EVENTS.eventType`` 59) whose name, ``text`` or else
  ``StringIds.value`` of its ``textId``, is exactly ``layers.N`` (N an integer).  Other names and
  event types (e.g. 76, NvtxDomainDestroy) are left out.
- Per thread (``globalTid``), the unit ranges sorted by start (then by end).  For each one and the
  next in that order: when the next one's index is this one's + 1, the period of this instance is
  next.start - this.start.  Any other pair (the last layer of a pass followed by ``layers.0`` of
  the next pass, or a gap in the indices) gives no period.
- Per file: count of periods, median, p10, p90 (linear interpolation between closest ranks, as
  ``numpy.percentile``'s default), mean; and the range durations (end - start) of all unit ranges
  (every layer, the last of each pass included): count, mean, median.
- Pairs: every file against each file named after it (the earlier one is the base): the change of
  the median period in %, 100 * (median_new / median_base - 1), and likewise of the mean range
  duration.

Run: python scripts/hand_count_units.py [--json OUT] FILE.sqlite ...
Prints a table; with --json writes the numbers (nanoseconds; ms in the table).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import statistics
import sys

NAME = re.compile(r"^layers\.(\d+)$")
PUSH_POP = 59

# How tests/fixtures/nsys/cpu_layers_*_nsys2023.4.sqlite were made (written into the JSON for them).
RECORDING = {
    "nsys": "NVIDIA Nsight Systems 2023.4.4.54 (bash ../shared/tools/install-nsight.sh /tmp/nsight), CPU only, nvtx==0.2.11",
    "profile": "env -i PATH=/usr/bin:/bin HOME=/tmp /tmp/nsight/bin/nsys profile -t nvtx --sample=none "
               "--cpuctxsw=none --force-overwrite=true -o /tmp/cpu_layers_NAME "
               ".venv/bin/python scripts/record_cpu_pair.py --iters 30 [--extra-work 0.25]",
    "runs": {"base": "--iters 30", "base2": "--iters 30 (same configuration again: the noise pair)",
             "slower": "--iters 30 --extra-work 0.25"},
    "export": "env -i PATH=/usr/bin:/bin HOME=/tmp /tmp/nsight/bin/nsys export --type sqlite "
              "--force-overwrite=true -o tests/fixtures/nsys/cpu_layers_NAME_nsys2023.4.sqlite "
              "/tmp/cpu_layers_NAME.nsys-rep",
    "order": "base, base2, slower, one after another on the same machine",
}


def percentile(sorted_xs: list[float], p: float) -> float:
    """numpy.percentile(x, p), method 'linear': position (n - 1) * p / 100 between closest ranks."""
    n = len(sorted_xs)
    pos = (n - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def unit_ranges(path: str) -> dict[int, list[tuple[int, int, int]]]:
    """{globalTid: [(start, end, N), ...] sorted by start, end}."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    has_strings = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'StringIds'").fetchone()
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if has_strings else ""
    name = "COALESCE(e.text, s.value)" if has_strings else "e.text"
    rows = con.execute(
        f"SELECT e.globalTid, e.start, e.end, {name} FROM NVTX_EVENTS e {join} WHERE e.eventType = ?",
        (PUSH_POP,),
    ).fetchall()
    con.close()
    out: dict[int, list[tuple[int, int, int]]] = {}
    for tid, start, end, text in rows:
        m = NAME.match(text or "")
        if m and end is not None:
            out.setdefault(tid, []).append((start, end, int(m.group(1))))
    for xs in out.values():
        xs.sort()
    return out


def count(path: str) -> dict:
    per_tid = unit_ranges(path)
    periods: list[int] = []
    durations: list[int] = []
    threads = {}
    for tid, xs in sorted(per_tid.items()):
        n_before = len(periods)
        for (s0, e0, i0), (s1, _e1, i1) in zip(xs, xs[1:]):
            if i1 == i0 + 1:
                periods.append(s1 - s0)
        durations.extend(e - s for s, e, _ in xs)
        threads[str(tid)] = {"unit_ranges": len(xs), "periods": len(periods) - n_before,
                             "indices": sorted({i for _, _, i in xs})}
    ps = sorted(periods)
    return {
        "threads": threads,
        "unit_ranges": len(durations),
        "periods": len(ps),
        "period_median_ns": statistics.median(ps),
        "period_p10_ns": percentile(ps, 10),
        "period_p90_ns": percentile(ps, 90),
        "period_mean_ns": statistics.fmean(ps),
        "duration_mean_ns": statistics.fmean(durations),
        "duration_median_ns": statistics.median(durations),
    }


def change_pct(new: float, base: float) -> float:
    return 100.0 * (new / base - 1.0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="nsys SQLite exports; the first is the base")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)

    files = {p.rsplit("/", 1)[-1]: count(p) for p in args.files}
    names = list(files)
    pairs = {}
    for k, base in enumerate(names):
        for other in names[k + 1:]:
            b, o = files[base], files[other]
            pairs[f"{base} -> {other}"] = {
                "period_median_change_pct": change_pct(o["period_median_ns"], b["period_median_ns"]),
                "duration_mean_change_pct": change_pct(o["duration_mean_ns"], b["duration_mean_ns"]),
            }

    print(f"{'file':40s} {'tids':>4s} {'ranges':>6s} {'periods':>7s} {'median':>8s} {'p10':>8s} "
          f"{'p90':>8s} {'dur mean':>8s}  (ms)")
    for name, c in files.items():
        print(f"{name:40s} {len(c['threads']):4d} {c['unit_ranges']:6d} {c['periods']:7d} "
              f"{c['period_median_ns'] / 1e6:8.3f} {c['period_p10_ns'] / 1e6:8.3f} "
              f"{c['period_p90_ns'] / 1e6:8.3f} {c['duration_mean_ns'] / 1e6:8.3f}")
    for pair, d in pairs.items():
        print(f"{pair}: median period {d['period_median_change_pct']:+.2f} %, "
              f"mean range duration {d['duration_mean_change_pct']:+.2f} %")
    out = {
        "rule": __doc__.split("Rule:", 1)[1].split("Run:", 1)[0].strip(),
        "command": "python scripts/hand_count_units.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "files": files,
        "pairs": pairs,
    }
    if all(n.startswith("cpu_layers_") for n in names):
        out["recording"] = RECORDING
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
