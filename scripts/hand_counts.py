"""Hand counts of multi-stream / NCCL / annotated torch.profiler traces: independent of headcount.

Plain Python (json, gzip, decimal, re) only; it never imports the headcount package, so its numbers
can be set beside headcount's and Holistic Trace Analysis' on the same files
(tests/fixtures/kineto/, listed in tests/fixtures/PROVENANCE.md).

Definitions (all times from the raw Kineto JSON events, ``ph == "X"``):

- GPU op: an event of ``cat`` ``kernel``, ``gpu_memcpy`` or ``gpu_memset``; its device is
  ``args.device`` (else its pid), its stream ``args.stream`` (else its tid).
- NCCL kernel: a ``kernel`` whose name matches ``nccl|rccl`` (case-insensitive).
- Launch: the runtime / driver event (``cat`` ``cuda_runtime`` or ``cuda_driver``) with the same
  ``args.correlation`` as the GPU op (checked against the ``ac2g`` flow events where a file has them).
- Step: a CPU range named ``ProfilerStep#N`` (``cat`` ``cpu_op`` or ``user_annotation``; the
  ``gpu_user_annotation`` copy of it is not a step).  A GPU op belongs to step N when its launch
  started in [step.ts, step.ts + step.dur) on the step's pid.
- Step window (per device): earliest start to latest end of the step's own GPU ops.
- busy: length of the union of ALL GPU op intervals of the device (any stream, any step, launched
  or not) clipped to the window; busy % = busy / window.  own busy: union of the step's own ops.
- NCCL: union of the step's NCCL kernels; exposed NCCL: the part of it not covered by the union of
  the device's non-NCCL *kernels* of any step (``exposed_vs_kernels``), and, as a second figure,
  not covered by any non-NCCL GPU op, memcpy/memset included (``exposed_vs_all_ops``).
- whole trace, per device: the same figures, and again over only the GPU ops that have a launch
  record (``launched_only``, where some have none).
- gpu_user_annotation name: count, summed duration, and the union of the device's GPU ops
  (all streams, and the annotation's own stream) clipped to the annotation's interval.
- user_annotation name (CPU record_function, ProfilerStep# included): count, summed duration, and
  the union of the GPU op intervals whose launch started inside the annotation on the same pid and tid.

Times are read exactly (``parse_float=Decimal``) and scaled to integers (nanoseconds when the file
has 3 decimals), so every union is exact.  Each union is computed twice, by merging sorted intervals
and by an independent sweep over sorted endpoints (+1/-1 counter); the script stops if any pair
differs.  Results are in microseconds (floats) in the output.

Run: python scripts/hand_counts.py [FILE ...]   (default: the files named in FILES below)
Prints JSON and writes tests/fixtures/hand_counts/kineto_hand_counts.json (only with the default files).
"""

import gzip
import json
import re
import sys
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kineto"
FILES = [
    "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz",
    "unnamed-gpu_rank0of128_streams_nccl_kineto.json.gz",
    "unnamed-gpu_rank1of128_streams_nccl_kineto.json.gz",
    "a100-80gb_rank0of16_cudagraph_nccl_kineto.json.gz",
    "v100_rank1of2_cudagraph_nccl_kineto.json.gz",
    "a100_event_sync_3streams_kineto.json.gz",
    "mi250_minitoy_steps_gpu_annotation_kineto.json.gz",
]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL = re.compile("nccl|rccl", re.I)
CHECKS = {"pairs": 0}


# ---------------------------------------------------------------- unions, two ways
def union_merge(intervals):
    """Merge sorted intervals; return [(s, e)] disjoint, sorted."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_sweep(intervals):
    """Independent method: sweep sorted endpoints, +1 at a start, -1 at an end."""
    points = []
    for s, e in intervals:
        if e > s:
            points.append((s, 1))
            points.append((e, -1))
    points.sort(key=lambda p: (p[0], -p[1]))  # starts before ends at one instant: touching intervals join
    out, depth, start = [], 0, None
    for t, d in points:
        if depth == 0 and d == 1:
            start = t
        depth += d
        if depth == 0:
            out.append((start, t))
    return out


def length(u):
    return sum(e - s for s, e in u)


def union(intervals):
    a, b = union_merge(intervals), union_sweep(intervals)
    if a != b:
        raise SystemExit(f"union methods disagree: {len(a)} vs {len(b)} pieces")
    CHECKS["pairs"] += 1
    return a


def intersect(u, v):
    """Both disjoint sorted: their intersection."""
    out, i, j = [], 0, 0
    while i < len(u) and j < len(v):
        s, e = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        if s < e:
            out.append((s, e))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(u, v):
    """Length of u not covered by v (both disjoint sorted)."""
    return length(u) - length(intersect(u, v))


def clip(u, s, e):
    return intersect(u, [(s, e)]) if e > s else []


# ---------------------------------------------------------------- reading
def decimals(x):
    if isinstance(x, Decimal):
        exp = x.as_tuple().exponent
        return -exp if exp < 0 else 0
    return 0


def load(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    places = max([decimals(e["ts"]) for e in xs] + [decimals(e.get("dur", 0)) for e in xs] + [0])
    scale = 10 ** places

    def to_int(x):
        v = Decimal(x) * scale
        if v != v.to_integral_value():
            raise SystemExit(f"{path}: time {x} not a multiple of 1/{scale} us")
        return int(v)

    for e in xs:
        e["_s"] = to_int(e["ts"])
        e["_e"] = e["_s"] + to_int(e.get("dur", 0))
    return doc, events, xs, scale


def us(v, scale):
    return float(Decimal(v) / scale)


def analyse(path):
    doc, events, xs, scale = load(path)
    U = lambda v: us(v, scale)  # noqa: E731
    props = doc.get("deviceProperties") or [] if isinstance(doc, dict) else []
    gpu = [e for e in xs if e.get("cat") in GPU_CATS]
    for g in gpu:
        a = g.get("args", {})
        g["_dev"] = a.get("device", g["pid"])
        g["_stream"] = a.get("stream", g["tid"])
        g["_nccl"] = g["cat"] == "kernel" and bool(NCCL.search(g["name"]))
    runtime = {}
    for e in xs:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            c = e.get("args", {}).get("correlation")
            if c is not None:
                runtime.setdefault(c, []).append(e)
    launch = {}
    for i, g in enumerate(gpu):
        r = runtime.get(g.get("args", {}).get("correlation"))
        if r:
            launch[i] = r[0]
    # ac2g flow check: a flow start at the runtime event, with id = correlation
    flow_starts = {(e.get("id"), e.get("pid"), e.get("tid")): e for e in events
                   if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    flows_checked = flows_agree = 0
    if flow_starts:
        for i, g in enumerate(gpu):
            r = launch.get(i)
            if r is None:
                continue
            f = flow_starts.get((g["args"]["correlation"], r["pid"], r["tid"]))
            if f is not None:
                flows_checked += 1
                flows_agree += Decimal(f["ts"]) == Decimal(r["ts"])

    devices = sorted({g["_dev"] for g in gpu}, key=str)
    all_by_dev = {d: union([(g["_s"], g["_e"]) for g in gpu if g["_dev"] == d]) for d in devices}
    nonnccl_k = {d: union([(g["_s"], g["_e"]) for g in gpu if g["_dev"] == d and g["cat"] == "kernel"
                           and not g["_nccl"]]) for d in devices}
    nonnccl_all = {d: union([(g["_s"], g["_e"]) for g in gpu if g["_dev"] == d and not g["_nccl"]])
                   for d in devices}

    def dev_name(d):
        try:
            return props[int(d)].get("name") if props else None
        except (ValueError, IndexError, TypeError):
            return None

    def nccl_figures(ops, d):
        nu = union([(g["_s"], g["_e"]) for g in ops if g["_nccl"]])
        return {"nccl_kernels": sum(1 for g in ops if g["_nccl"]), "nccl_union_us": U(length(nu)),
                "exposed_nccl_vs_kernels_us": U(subtract(nu, nonnccl_k[d])),
                "exposed_nccl_vs_all_ops_us": U(subtract(nu, nonnccl_all[d]))}

    # --- meta
    cnt = lambda cat: sum(1 for e in xs if e.get("cat") == cat)  # noqa: E731
    streams = {}
    for g in gpu:
        key = f"{g['_dev']}:{g['_stream']}"
        streams[key] = streams.get(key, 0) + 1
    steps = [e for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") in ("cpu_op", "user_annotation")]
    comm_ops = [e for e in xs if e.get("cat") in ("cpu_op", "user_annotation")
                and (e["name"] == "record_param_comms" or e["name"].startswith("nccl:"))]
    argkeys = ("In msg nelems", "Out msg nelems", "dtype", "Group size")
    names = lambda cat: sorted({e["name"] for e in xs if e.get("cat") == cat})  # noqa: E731
    meta = {
        "devices": {str(d): dev_name(d) for d in devices},
        "distributedInfo": doc.get("distributedInfo") if isinstance(doc, dict) else None,
        "kernels": cnt("kernel"), "gpu_memcpy": cnt("gpu_memcpy"), "gpu_memset": cnt("gpu_memset"),
        "streams": streams, "profiler_steps": [e["name"] for e in steps],
        "nccl_kernels": sum(1 for g in gpu if g["_nccl"]),
        "nccl_kernel_names": sorted({g["name"] for g in gpu if g["_nccl"]}),
        "graph_launch_calls": sum(1 for e in xs if e.get("name") in ("cudaGraphLaunch", "hipGraphLaunch")),
        "gpu_ops_launched_by_graph_launch": sum(1 for i in launch if launch[i]["name"] in
                                                ("cudaGraphLaunch", "hipGraphLaunch")),
        "gpu_ops_without_launch_record": len(gpu) - len(launch),
        "ac2g_flows_checked": flows_checked, "ac2g_flows_same_ts_as_launch": flows_agree,
        "user_annotation_names": names("user_annotation"),
        "gpu_user_annotation_names": names("gpu_user_annotation"),
        "comm_cpu_ops": len(comm_ops),
        "comm_cpu_ops_with_all_of_" + "|".join(argkeys): sum(1 for e in comm_ops
                                                              if all(k in e.get("args", {}) for k in argkeys)),
    }

    # --- whole trace per device
    whole = {}
    for d in devices:
        ops = [g for g in gpu if g["_dev"] == d]
        first, last = min(g["_s"] for g in ops), max(g["_e"] for g in ops)
        busy = length(all_by_dev[d])
        per_stream = {}
        for s in sorted({g["_stream"] for g in ops}, key=str):
            per_stream[str(s)] = length(union([(g["_s"], g["_e"]) for g in ops if g["_stream"] == s]))
        whole[str(d)] = {"span_us": U(last - first), "busy_us": U(busy),
                         "busy_pct": round(100 * busy / (last - first), 4) if last > first else None,
                         "sum_of_per_stream_busy_us": U(sum(per_stream.values())),
                         "per_stream_busy_us": {k: U(v) for k, v in per_stream.items()}, **nccl_figures(ops, d)}
        # the same over the GPU ops that have a launch record only (what a launch-joined view keeps)
        lops = [g for i, g in enumerate(gpu) if i in launch and g["_dev"] == d]
        if lops and len(lops) < len(ops):
            lu = union([(g["_s"], g["_e"]) for g in lops])
            lk = union([(g["_s"], g["_e"]) for g in lops if g["cat"] == "kernel" and not g["_nccl"]])
            ln = union([(g["_s"], g["_e"]) for g in lops if g["_nccl"]])
            ls_, le_ = min(g["_s"] for g in lops), max(g["_e"] for g in lops)
            whole[str(d)]["launched_only"] = {
                "gpu_ops": len(lops), "span_us": U(le_ - ls_), "busy_us": U(length(lu)),
                "nccl_union_us": U(length(ln)), "exposed_nccl_vs_kernels_us": U(subtract(ln, lk))}

    # --- per step, per device
    per_step = []
    for st in steps:
        mine = [g for i, g in enumerate(gpu) if i in launch and launch[i]["pid"] == st["pid"]
                and st["_s"] <= launch[i]["_s"] < st["_e"]]
        for d in sorted({g["_dev"] for g in mine}, key=str):
            ops = [g for g in mine if g["_dev"] == d]
            ws, we = min(g["_s"] for g in ops), max(g["_e"] for g in ops)
            busy = length(clip(all_by_dev[d], ws, we))
            own = length(union([(g["_s"], g["_e"]) for g in ops]))
            per_step.append({"step": st["name"], "device": str(d), "cpu_range_us": U(st["_e"] - st["_s"]),
                             "gpu_ops": len(ops), "window_us": U(we - ws), "busy_us": U(busy),
                             "busy_pct": round(100 * busy / (we - ws), 4) if we > ws else None,
                             "own_busy_us": U(own), **nccl_figures(ops, d)})

    # --- gpu_user_annotation
    gua = {}
    for a in (e for e in xs if e.get("cat") == "gpu_user_annotation"):
        d = a.get("args", {}).get("device", a["pid"])
        r = gua.setdefault(a["name"], {"count": 0, "sum_dur_us": 0, "_all": [], "_same": []})
        r["count"] += 1
        r["sum_dur_us"] += a["_e"] - a["_s"]
        if d in all_by_dev:
            r["_all"] += clip(all_by_dev[d], a["_s"], a["_e"])
        same = union([(g["_s"], g["_e"]) for g in gpu if g["_dev"] == d and g["_stream"] == a["tid"]])
        r["_same"] += clip(same, a["_s"], a["_e"])
    for r in gua.values():
        r["sum_dur_us"] = U(r["sum_dur_us"])
        r["gpu_ops_union_us_all_streams"] = U(length(union(r.pop("_all"))))
        r["gpu_ops_union_us_same_stream"] = U(length(union(r.pop("_same"))))

    # --- user_annotation (CPU record_function): GPU ops launched inside, same pid+tid
    ua = {}
    launched = [(launch[i], g) for i, g in enumerate(gpu) if i in launch]
    by_thread = {}
    for r_, g in launched:
        by_thread.setdefault((r_["pid"], r_["tid"]), []).append((r_["_s"], g))
    for a in (e for e in xs if e.get("cat") == "user_annotation"):
        r = ua.setdefault(a["name"], {"count": 0, "sum_dur_us": 0, "gpu_ops": 0, "_iv": []})
        r["count"] += 1
        r["sum_dur_us"] += a["_e"] - a["_s"]
        for t, g in by_thread.get((a["pid"], a["tid"]), []):
            if a["_s"] <= t < a["_e"]:
                r["gpu_ops"] += 1
                r["_iv"].append((g["_s"], g["_e"]))
    for r in ua.values():
        r["sum_dur_us"] = U(r["sum_dur_us"])
        r["gpu_ops_union_us"] = U(length(union(r.pop("_iv"))))

    return {"meta": meta, "whole_trace": whole, "per_step": per_step,
            "gpu_user_annotation": gua, "user_annotation": ua, "time_unit_divisor": scale}


def self_test():
    """Random integer intervals (touching, nested, empty ones included): both methods, and a
    brute-force count of covered unit cells, must agree."""
    import random
    rng = random.Random(7)
    for _ in range(300):
        iv = []
        for _ in range(rng.randint(0, 25)):
            s = rng.randint(0, 200)
            iv.append((s, s + rng.randint(0, 30)))
        a, b = union_merge(iv), union_sweep(iv)
        cells = len({t for s, e in iv for t in range(s, e)})
        if a != b or length(a) != cells:
            raise SystemExit(f"self-test failed on {iv}")
    return 300


def main(argv):
    tested = self_test()
    paths = [Path(p) for p in argv] or [HERE / f for f in FILES]
    out = {p.name: analyse(p) for p in paths}
    out["_checks"] = {"union_pairs_compared": CHECKS["pairs"],
                      "merge_and_sweep_agree": True,
                      "random_self_test_cases": tested,  # union() stops the script on any disagreement
                      "note": "independent of headcount: plain json/gzip/decimal"}
    text = json.dumps(out, indent=1, sort_keys=False)
    print(text)
    if not argv:
        (HERE.parent / "hand_counts" / "kineto_hand_counts.json").write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
