"""``headcount diff`` on real profiles of this machine: does it find what changed, and only that?

Everything runs as users run it, as subprocesses (``headcount profile``, ``headcount diff --json -``):

1. sdpa (base) against eager (new), the embedded default model on the CPU: the
   overall verdict, every layer's verdict, and the exit status under
   ``--fail-on-regression 10``; then the sdpa report against itself.
2. False alarms: ``--pairs`` pairs of profiles of the same configuration
   (``--steps`` steps each): how many attention rows (layers, heads) each
   diff calls a regression or an improvement (the goal is none), and the
   overall verdicts.
3. One layer deliberately slowed: a registered attention function (transformers'
   ``AttentionInterface``) that runs SDPA and, in layer 1 only, extra matmuls
   inside the attention call; profiled through the Python API without and with
   the extra work: which attention rows the diff flags (the goal: layer 1 fwd only).

Prints the figures; asserts nothing (tests/test_diff.py tests the rule on
recorded data). Run: python benchmarks/diff_noise.py [--pairs 10] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADCOUNT = [sys.executable, "-m", "headcount"]
ATTENTION = ("layer", "head")

SLOWED = '''
import sys, torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from headcount import AttentionProfiler
from headcount.cli.models import load_model, make_inputs

SLOW = sys.argv[2] == "slow"

def bench_attention(module, query, key, value, attention_mask, **kwargs):
    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if SLOW and getattr(module, "layer_idx", None) == 1:  # extra work inside layer 1's attention call only
        with torch.no_grad():  # forward work only: nothing for the backward pass to redo
            for _ in range(8):
                torch.matmul(query, query.transpose(-1, -2))
    return out

AttentionInterface.register("bench_attention", bench_attention)
model, _ = load_model(None)
model.set_attn_implementation("bench_attention")
inputs = make_inputs(model, 2, 256)
model(**inputs).loss.backward()  # warm-up, unmeasured
with AttentionProfiler(model) as prof:
    for i in range(int(sys.argv[3])):
        with prof.step(i):
            model(**inputs).loss.backward()
prof.save(sys.argv[1])
'''


def _run(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _profile(out: Path, impl: str, steps: int) -> None:
    r = _run([*HEADCOUNT, "profile", "--impl", impl, "--steps", str(steps), "--device", "cpu", "-o", str(out)])
    if r.returncode:
        raise SystemExit(f"profile failed: {r.stderr[-500:]}")


def _diff(base: Path, new: Path, gate: float | None = None, min_change: float | None = None) -> tuple[int, dict]:
    cmd = [*HEADCOUNT, "diff", str(base), str(new), "--json", "-"]
    if min_change is not None:
        cmd += ["--min-change", str(min_change)]
    if gate is not None:
        cmd += ["--fail-on-regression", str(gate)]
    r = _run(cmd)
    if r.returncode not in (0, 1):
        raise SystemExit(f"diff failed ({r.returncode}): {r.stderr[-500:]}")
    return r.returncode, json.loads(r.stdout)


def _flagged(doc: dict) -> list[str]:
    return [f"{c['level']} {c['phase']} {c['name']}{'' if c.get('head') is None else ' head ' + str(c['head'])}: "
            f"{c['verdict']} {c['change_pct']:+.1f} %" for c in doc["changes"]
            if c["level"] in ATTENTION and c["verdict"] in ("regression", "improvement")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="headcount-diff-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        print("## 1. sdpa (base) against eager (new), default model, CPU")
        _profile(work / "sdpa", "sdpa", args.steps)
        _profile(work / "eager", "eager", args.steps)
        rc, doc = _diff(work / "sdpa", work / "eager", gate=10)
        o = doc["overall"][0]
        print(f"overall: {doc['verdict']} on {o['basis']}, {o['change_pct']:+.1f} %; exit status under --fail-on-regression 10: {rc}")
        for c in doc["changes"]:
            if c["level"] == "layer":
                print(f"  {c['phase']} {c['name']}: {c['verdict']} {c['change_pct']:+.1f} % ({c['base_calls']} vs {c['new_calls']} calls)")
        rc, doc = _diff(work / "sdpa", work / "sdpa", gate=10)
        print(f"sdpa against itself: {doc['verdict']}, exit status {rc}")

        print(f"\n## 2. false alarms: {args.pairs} pairs of sdpa profiles, {args.steps} steps each")
        rows_flagged, rows_compared, verdicts = 0, 0, []
        disjoint = []  # |median change| of every attention row whose spreads do not overlap (the rule without its floor)
        for i in range(args.pairs):
            a, b = work / f"a{i}", work / f"b{i}"
            _profile(a, "sdpa", args.steps)
            _profile(b, "sdpa", args.steps)
            rc, doc = _diff(a, b, gate=10)
            _, bare = _diff(a, b, min_change=0)
            disjoint += [abs(c["change_pct"]) for c in bare["changes"]
                         if c["level"] in ATTENTION and c["verdict"] in ("regression", "improvement")]
            flagged = _flagged(doc)
            compared = [c for c in doc["changes"] if c["level"] in ATTENTION and c["verdict"] in ("regression", "improvement", "unchanged")]
            rows_flagged += len(flagged)
            rows_compared += len(compared)
            verdicts.append(doc["verdict"])
            o = doc["overall"][0]
            print(f"  pair {i}: overall {doc['verdict']} ({o['change_pct']:+.1f} % per step), exit {rc}; "
                  f"attention rows flagged: {len(flagged)} of {len(compared)}" + (f" — {'; '.join(flagged)}" if flagged else ""))
        print(f"attention rows called a regression or improvement (default --min-change): {rows_flagged} of {rows_compared}; "
              f"overall verdicts: " + ", ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts))))
        print("the same pairs at other --min-change: " + ", ".join(
            f"{floor:g} %: {sum(1 for d in disjoint if d > floor)}" for floor in (0, 2, 5, 10, 15, 20, 25)) + f" of {rows_compared}")

        print("\n## 3. one layer slowed (registered attention function, extra matmuls in layer 1 only)")
        script = work / "slowed.py"
        script.write_text(SLOWED)
        for which in ("plain", "slow"):
            r = _run([sys.executable, str(script), str(work / which), which, str(args.steps)])
            if r.returncode:
                raise SystemExit(f"slowed-layer profile failed: {r.stderr[-800:]}")
        rc, doc = _diff(work / "plain", work / "slow", gate=10)
        o = doc["overall"][0]
        print(f"overall: {doc['verdict']} on {o['basis']} ({o['change_pct']:+.1f} %), exit status under the gate {rc}")
        print("attention rows flagged: " + ("; ".join(_flagged(doc)) or "none"))
        print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
