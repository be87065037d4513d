"""The GPU check's steps and its physics checks (driven by scripts/gpu_check.sh).

Subcommands (each writes JSON into the output folder):

  probe-cupti OUT/NAME.json   can the cupti source record here? activity kinds, PM sampling, NVTX markers, libcupti
  choose-cupti OUT NAME...    the first probe with PM samples, else the first that recorded kernels
  pack SRC DEST               SRC as DEST/gpu_check.tgz.NN, 15 MiB pieces, 60 MiB in all (what the device tool returns)
  bandwidth OUT               copy-bandwidth ceiling (device-to-device copy, CUDA events)
  occupancy OUT               headcount's occupancy calculator vs the driver's, on kernels of known resources
  overhead OUT ...            step time without and with the cupti collector (%)
  training OUT ...            a training loop untagged and under StepProfiler's background worker (training.json)
  workload ...                one tagged training step with NVTX ranges (run under ncu)
  check OUT                   read everything above and the reports, check against physics, write summary.json

``--dry-run`` (CPU): the same code paths on a tiny model, GPU-only figures skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import headcount  # noqa: E402, F401 - before torch: torch then loads the cupti folder's libcupti (cupti_home)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    print(json.dumps(doc, sort_keys=True, default=str)[:2000])


# ---------------------------------------------------------------- probe-cupti
def probe_cupti(out: Path, nvtx_markers: bool) -> int:
    """Record a few matmuls with the cupti source; keep the raw records."""
    import torch

    from headcount.collector import cupti_source
    from headcount.parsers import cupti_records

    doc = {"cupti_python": cupti_source.cupti_version(), "nvtx_injection": os.environ.get("NVTX_INJECTION64_PATH")}
    try:
        cupti_source.require()
        rec = cupti_source.CuptiRecorder(pm_sampling=True, record_dir=out.with_suffix(""))
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        _sync()
        rec.start()
        log = rec.range_log
        rid = log.open("headcount", "probe")
        if nvtx_markers:
            import nvtx

            with nvtx.annotate("probe-marker", domain="headcount"):
                for _ in range(20):
                    a = (a @ a).clamp_(-1, 1)
        else:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
        _sync()
        log.close(rid)
        path = rec.stop()
        header, records = cupti_records.read_records(path)
        kinds: dict[str, int] = {}
        for r in records:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        events = cupti_records.events_frame(header, records)
        kernels = events[events["kind"] == "kernel"]
        doc.update(_libcupti_release(header["stats"].get("libcupti")))
        doc.update(ok=bool(len(kernels)), records=str(path), kinds=kinds, stats=header["stats"], notices=header["notices"],
                   kernels_with_external_id=int(kernels["external_id"].notna().sum()), kernels=int(len(kernels)),
                   queued_known=int(kernels["queued_ns"].notna().sum()))
    except Exception as exc:  # noqa: BLE001 - the probe reports, the shell script decides
        from headcount.collector.cupti_errors import classify

        doc.update(ok=False, error=classify(exc).one_line(), exception=f"{type(exc).__name__}: {exc}")
    _write(out, doc)
    return 0 if doc.get("ok") else 1


def _libcupti_release(library: str | None) -> dict:
    """Which release the loaded libcupti is (issue 35): the wheel whose files hold it, and CUPTI's own API version."""
    import ctypes

    from headcount.collector import cupti_home

    release = cupti_home.library_release(library)
    doc: dict = {"libcupti": library, "libcupti_wheel": f"nvidia-cuda-cupti=={release}" if release else None}
    if library:
        try:
            version = ctypes.c_uint32()
            status = ctypes.CDLL(library).cuptiGetVersion(ctypes.byref(version))  # the library loaded already: no second copy
            doc["cupti_api_version"] = version.value if status == 0 else f"cuptiGetVersion returned {status}"
        except (OSError, AttributeError) as exc:
            doc["cupti_api_version"] = f"unknown ({exc})"
    return doc


def choose_cupti(out: Path, names: list[str]) -> int:
    """Print the first of ``names`` whose probe recorded PM samples, else the first whose probe recorded kernels
    (``none`` when no probe did): the cupti-python the profile then uses."""
    docs = {n: json.loads(p.read_text()) for n in names if (p := out / f"probe-cupti-{n}.json").exists()}
    sampled = [n for n, d in docs.items() if d.get("ok") and ((d.get("stats") or {}).get("pm_sampling") or {}).get("populated_samples")]
    working = [n for n, d in docs.items() if d.get("ok")]
    print((sampled or working or ["none"])[0])
    return 0


def pack(src: Path, dest: Path, limit: int = 60 << 20, piece: int = 15 << 20) -> int:
    """Pack ``src`` into ``dest/gpu_check.tgz.00``, ``.01``, … (pieces of ``piece`` bytes, ``limit`` in all): what
    the device tool brings back is 8 files of 16 MiB at most. The largest files are left out, and listed in
    ``left_out.txt`` inside the archive, until the archive fits. ``cat gpu_check.tgz.* | tar xz`` restores it."""
    import io
    import tarfile

    files = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    left: list[Path] = []
    while True:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
            for f in files:
                tar.add(f, arcname=str(Path(src.name) / f.relative_to(src)))
            note = "".join(f"{f.stat().st_size}\t{f.relative_to(src)}\n" for f in left).encode()
            info = tarfile.TarInfo(f"{src.name}/left_out.txt")
            info.size = len(note)
            tar.addfile(info, io.BytesIO(note))
        data = buf.getvalue()
        if len(data) <= limit or not files:
            break
        left.append(files.pop())  # the largest that is left
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(data), piece):
        (dest / f"gpu_check.tgz.{i // piece:02d}").write_bytes(data[i:i + piece])
    print(f"packed {len(files)} files into {len(data) / 2**20:.1f} MiB; left out {len(left)}: "
          + ", ".join(f"{f.relative_to(src)} ({f.stat().st_size / 2**20:.0f} MiB)" for f in left))
    return 0


# ---------------------------------------------------------------- bandwidth
def bandwidth(out: Path, dry_run: bool) -> int:
    """Device-to-device copy ceiling (headcount calibrate's measurement)."""
    from headcount.calibrate import copy_ceiling

    device = "cuda" if _cuda() and not dry_run else "cpu"
    _write(out / "bandwidth.json", copy_ceiling(device, (2 << 30) if device == "cuda" else (64 << 20)))
    return 0


# ---------------------------------------------------------------- occupancy
def occupancy_vs_driver(out: Path) -> int:
    """Blocks per SM from the driver (cuOccupancyMaxActiveBlocksPerMultiprocessor)
    vs :func:`headcount.derive.occupancy.blocks_per_sm`, for every kernel of
    scripts/occupancy/occupancy_kernels.fatbin × block sizes × dynamic shared memory."""
    import torch
    from cuda.bindings import driver as cu

    from headcount.derive import occupancy
    from headcount.device import Device

    torch.zeros(1, device="cuda")  # a current context (torch's primary one)

    def ok(result):
        err = result[0]
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return result[1] if len(result) == 2 else result[1:]

    image = (ROOT / "scripts" / "occupancy" / "occupancy_kernels.fatbin").read_bytes()
    module = ok(cu.cuModuleLoadData(image))
    limits = Device.from_torch("cuda").limits()
    attr = cu.CUfunction_attribute
    rows, mismatches = [], 0
    names = ["regs_4", "regs_24", "regs_48", "regs_96", "regs_160", "smem_4096", "smem_16384", "smem_40960", "dynamic_smem"]
    for name in names:
        func = ok(cu.cuModuleGetFunction(module, name.encode()))
        regs = ok(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, func))
        static = ok(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func))
        max_threads = ok(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func))
        dyn_sizes = [0, 8192, 32768, 65536, 100 * 1024] if name == "dynamic_smem" else [0]
        if name == "dynamic_smem":
            ok(cu.cuFuncSetAttribute(func, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 * 1024 + 1024))
        for threads in (32, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024):
            if threads > max_threads:
                continue
            for dyn in dyn_sizes:
                driver = ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(func, threads, dyn))
                ours = int(occupancy.blocks_per_sm([threads], [regs], [static + dyn], limits)[0])
                mismatches += driver != ours
                rows.append({"kernel": name, "registers": regs, "static_smem": static, "dynamic_smem": dyn,
                             "threads": threads, "driver_blocks": driver, "headcount_blocks": ours})
    doc = {"limits": limits.__dict__, "cases": len(rows), "mismatches": int(mismatches), "rows": rows}
    _write(out / "occupancy.json", doc)
    return 0


# ---------------------------------------------------------------- overhead / workload
def _model(args):
    import torch

    from headcount.models import load_model, make_inputs, set_implementation

    model, _ = load_model(args.model, args.dtype)
    if _cuda() and not args.dry_run:
        model = model.to("cuda")
    set_implementation(model, args.impl)
    inputs = make_inputs(model, args.batch, args.seq)
    return model, inputs, torch


def _train_step(model, inputs):
    out = model(**inputs)
    out.loss.backward()
    model.zero_grad(set_to_none=True)


def overhead(out: Path, args) -> int:
    """Median step time without a profiler, then inside the collector (layer mode)."""
    from headcount import AttentionProfiler

    model, inputs, _ = _model(args)
    for _ in range(3):
        _train_step(model, inputs)
    _sync()

    def timed(n, wrap=None):
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            if wrap is not None:
                with wrap.step(i):
                    _train_step(model, inputs)
            else:
                _train_step(model, inputs)
            _sync()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    base = timed(args.steps)
    prof = AttentionProfiler(model, backend="cupti" if not args.dry_run else "auto", strict=True)
    with prof:
        profiled = timed(args.steps, prof)
    base_after = timed(args.steps)
    reference = min(base, base_after)
    doc = {"backend": prof.backend, "model": args.model, "impl": args.impl, "batch": args.batch, "seq": args.seq,
           "dtype": args.dtype, "steps": args.steps, "median_step_s_without": reference, "median_step_s_with": profiled,
           "overhead_pct": 100.0 * (profiled - reference) / reference}
    _write(out / "overhead.json", doc)
    return 0


def training_windows(out: Path, args) -> int:
    """A training loop untagged, then under ``StepProfiler`` (a window every ``--every`` steps, built and
    written by the background worker), then untagged again: the loop's time against the faster untagged
    loop, the windows written, the worker's CPU a window (training.json; the report in training/)."""
    from headcount.training import StepProfiler

    model, inputs, torch = _model(args)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    def one_step() -> None:
        model(**inputs).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def loop(sp=None) -> float:
        _sync()
        t0 = time.perf_counter()
        for i in range(args.steps):
            with sp.step(i) if sp is not None else nullcontext():
                one_step()
        _sync()
        return time.perf_counter() - t0

    for _ in range(3):
        one_step()
    before = loop()
    t0 = time.perf_counter()
    sp = StepProfiler(model, out / "training", every=args.every, backend="cupti" if not args.dry_run else "auto")
    made_s = time.perf_counter() - t0
    profiled = loop(sp)
    t0 = time.perf_counter()
    sp.close()
    close_s = time.perf_counter() - t0
    after = loop()
    plain = min(before, after)
    doc = {"backend": sp.backend, "model": args.model, "impl": args.impl, "batch": args.batch, "seq": args.seq,
           "dtype": args.dtype, "steps": args.steps, "every": args.every, "cpu_count": os.cpu_count(),
           "loop_s_untagged": [before, after], "loop_s_profiled": profiled, "ratio": profiled / plain,
           "profiler_made_s": made_s, "close_s": close_s, "profiled": sp.profiled, "skipped": sp.skipped,
           "written": sp.writer.written, "failed": sp.writer.failed, "written_by": {str(k): v for k, v in sp.writer.written_by.items()},
           "worker_cpu_s": {str(k): v for k, v in sp.writer.cpu_seconds.items()}}
    _write(out / "training.json", doc)
    return 0


def workload(args) -> int:
    """Warm up untagged, then one tagged training step (NVTX ranges for ncu's
    --nvtx-include). ``--plain``: two training steps and no tagging at all
    (for ``headcount run``, which tags by itself)."""
    from headcount.tagging.tagger import AttentionTagger

    model, inputs, _ = _model(args)
    _train_step(model, inputs)
    _sync()
    if args.plain and args.endless:  # until interrupted (issue 33's trial): a line per step to interrupt at
        for step in range(100_000):
            _train_step(model, inputs)
            _sync()
            print(f"step {step}", flush=True)
        return 0
    if args.plain:
        _train_step(model, inputs)
        _sync()
        print("workload: 2 untagged training steps")
        return 0
    tagger = AttentionTagger([model], mode=args.mode)
    tagger.activate()
    try:
        _train_step(model, inputs)
        _sync()
    finally:
        tagger.deactivate()
    print(f"workload: {len(tagger.calls)} tagged attention calls")
    return 0


def cuda_graph(out: Path, args) -> int:
    """A forward captured into a CUDA graph (``torch.cuda.graph``) while headcount
    tags it, then replayed once per step: with ``--tagger-only`` under an
    outside recorder (nsys), else under AttentionProfiler (cupti source) with
    the report in ``OUT/report-graphed``. Dry run (no CUDA): the same
    profile with the forward run eagerly, so the step and its check run."""
    from headcount import AttentionProfiler
    from headcount.tagging.tagger import AttentionTagger

    model, inputs, torch = _model(args)
    model.eval()
    graphed = _cuda() and not args.dry_run
    with torch.no_grad():
        if graphed:  # warm-up on a side stream, as torch.cuda.graph asks
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model(**inputs)
            torch.cuda.current_stream().wait_stream(side)
        else:
            model(**inputs)
        recorder = AttentionTagger([model], mode=args.mode) if args.tagger_only else \
            AttentionProfiler(model, mode=args.mode, backend="cupti" if graphed else "auto", strict=graphed)
        if args.tagger_only:
            recorder.activate()
        else:
            recorder.__enter__()
        try:
            graph = None
            if graphed:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(**inputs)
            for i in range(args.steps):
                with (nullcontext() if args.tagger_only else recorder.step(i)):
                    graph.replay() if graph is not None else model(**inputs)
                _sync()
        finally:
            if args.tagger_only:
                recorder.deactivate()
            else:
                recorder.__exit__(None, None, None)
    if not args.tagger_only:
        recorder.save(out / "report-graphed", force=True)
    _write(out / ("cuda-graph-tagged.json" if args.tagger_only else "cuda-graph.json"),
           {"graphed": graphed, "steps": args.steps, "model": args.model, "batch": args.batch, "seq": args.seq, "mode": args.mode})
    return 0


def _graph_check(record, summary, name: str, report_dir: Path, steps: int) -> None:
    """Every attention kernel a graph replayed lands in its layer, and every
    (fwd, layer) is one call per replay, in its step."""
    import pandas as pd

    kernels, layers = pd.read_parquet(report_dir / "kernels"), pd.read_parquet(report_dir / "layers")
    attn = kernels[kernels["name"].str.contains("flash|fmha|attention|scaled_dot_product", case=False, regex=True)]
    replayed = attn[attn["graph_node_id"].notna()] if "graph_node_id" in attn else attn.iloc[:0]
    fwd = layers[layers["phase"] == "fwd"]
    calls_ok = len(fwd) and (fwd["calls"] == steps).all() and (fwd["steps"] == steps).all()
    if not len(replayed):
        status = "skip" if not _cuda() else "FAIL"
        record(name, status if calls_ok else "FAIL", f"no replayed attention kernel (CPU: no CUDA graph); "
               f"{len(fwd)} fwd layer rows, calls {sorted(set(fwd['calls']))}")
        return
    inside = replayed["layer"].notna()
    record(name, "ok" if inside.all() and calls_ok else "FAIL",
           f"{int(inside.sum())} of {len(replayed)} replayed attention kernels in their layer; fwd calls per layer "
           f"{sorted(set(fwd['calls']))} (expected {steps})")
    summary[name] = {"replayed_attention_kernels": len(replayed), "attributed": int(inside.sum()), "layers": len(fwd)}


# ---------------------------------------------------------------- checks
class _Checked:
    """What the named checks share: the output folder, the results so far and the summary written at the end."""

    def __init__(self, out: Path):
        self.out = out
        self.results: list[dict] = []
        self.summary: dict = {"checks": self.results}
        self.env = self.load("environment.json") or {}
        self.summary["environment"] = self.env
        self.ceiling = None  # the copy-bandwidth ceiling (GB/s), once measured
        self.report = out / "report"

    def record(self, name: str, status: str, detail: str) -> None:
        self.results.append({"check": name, "status": status, "detail": detail})
        print(f"{status:4s} {name}: {detail}")

    def load(self, name: str):
        path = self.out / name
        return json.loads(path.read_text()) if path.exists() else None

    def table(self, name: str, report: Path | None = None):
        import pandas as pd

        path = (report or self.report) / name
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()

    @property
    def on_gpu(self) -> bool:
        runs = self.table("runs")
        return bool(len(runs)) and (runs["device_kind"] == "cuda").all()


class _NoReport(Exception):
    """The profile report is missing: the checks that read it cannot run."""


def check_copy_ceiling(c: _Checked) -> None:
    bw = c.load("bandwidth.json")
    c.ceiling = bw["copy_ceiling_gbps"] if bw and bw.get("device") == "cuda" else None
    c.summary["copy_ceiling_gbps"] = c.ceiling
    c.record("copy-bandwidth ceiling", "info" if c.ceiling else "skip", f"{c.ceiling:,.0f} GB/s" if c.ceiling else "no GPU")


def check_cupti_probes(c: _Checked) -> None:
    for probe in sorted(c.out.glob("probe-*.json")):
        doc = json.loads(probe.read_text())
        pm = (doc.get("stats") or {}).get("pm_sampling", {})
        samples = (pm.get("samples") or {}) if isinstance(pm.get("samples"), dict) else {}
        detail = (f"kernels {doc.get('kernels')}, kinds {doc.get('kinds')}, libcupti {(doc.get('stats') or {}).get('libcupti')}, "
                  f"PM sampling {'on ' + str(pm.get('metrics')) if pm.get('enabled') else 'off: ' + str(pm.get('notice'))}"
                  f"{', ' + str(pm.get('populated_samples', samples.get('count'))) + ' samples' if pm.get('enabled') else ''}"
                  if doc.get("ok") else doc.get("error"))
        c.record(f"cupti probe {probe.stem}", "ok" if doc.get("ok") else "info", detail)
        c.summary[probe.stem] = doc


def check_occupancy_vs_driver(c: _Checked) -> None:
    occ = c.load("occupancy.json")
    if occ:
        c.record("occupancy calculator = driver", "ok" if occ["mismatches"] == 0 else "FAIL",
                 f"{occ['cases'] - occ['mismatches']} of {occ['cases']} launch configurations agree")
    else:
        c.record("occupancy calculator = driver", "skip", "not run (no GPU or no cuda-bindings)")


def check_profile_report(c: _Checked) -> None:
    if not (c.report / "layers").exists():
        c.record("cupti profile report", "FAIL", f"{c.report} missing")
        raise _NoReport
    runs = c.table("runs")
    source = ",".join(sorted(set(runs["source"])))
    c.summary["source"] = source
    c.record("profile source", "info", f"{source} on {runs['device_name'].iloc[0]}")
    if _cuda():  # headcount profile --device cuda: the runs must say the GPU, never the CPU
        c.record("profile ran on the GPU", "ok" if c.on_gpu else "FAIL", ", ".join(sorted(set(runs["device_kind"].astype(str)))))
    manifests = [json.loads(p.read_text()) for p in (c.report / "manifests").glob("*/run.json")]
    dropped = [m.get("collector", {}).get("dropped_records") for m in manifests if m.get("collector")]
    if dropped:
        c.record("no CUPTI record dropped", "ok" if all(d == 0 for d in dropped) else "FAIL", f"dropped per run: {dropped}")
        c.summary["collector"] = [m.get("collector") for m in manifests]


def check_steps(c: _Checked) -> None:
    """Issue 25: busy within the window, idle split without remainder, attention a share of busy."""
    steps = c.table("steps")
    gpu_steps = steps[steps["basis"] == "gpu_window"] if len(steps) else steps
    if c.on_gpu and len(gpu_steps):
        parts = gpu_steps[["idle_launch_bound_ns", "idle_sync_ns", "idle_host_ns", "idle_other_ns", "idle_unknown_ns"]].sum(axis=1)
        sound = (gpu_steps["gpu_busy_pct"].between(0, 100) & ((parts - gpu_steps["idle_ns"]).abs() <= 1)
                 & (gpu_steps["attention_gpu_ns"].fillna(0) <= gpu_steps["gpu_busy_ns"] + 1))
        c.record("steps: busy, idle split and attention share consistent", "ok" if sound.all() else "FAIL",
                 f"busy {gpu_steps['gpu_busy_pct'].min():.1f}–{gpu_steps['gpu_busy_pct'].max():.1f} % over {len(gpu_steps)} rows; "
                 f"idle launch-bound {gpu_steps['idle_launch_bound_ns'].sum() / 1e6:.2f} ms, sync {gpu_steps['idle_sync_ns'].sum() / 1e6:.2f} ms, "
                 f"host {gpu_steps['idle_host_ns'].sum() / 1e6:.2f} ms, other {gpu_steps['idle_other_ns'].sum() / 1e6:.2f} ms")
        c.summary["steps"] = gpu_steps.drop(columns=["note"], errors="ignore").to_dict("records")
    elif c.on_gpu:
        c.record("steps: busy, idle split and attention share consistent", "FAIL", "no gpu_window rows in the steps table")


def check_attention_ranges(c: _Checked) -> None:
    ranges = c.table("ranges")
    attention = ranges[ranges["level"].isin(["layer", "head"])]
    if c.on_gpu:
        empty = attention[attention["gpu_op_count"].fillna(0) == 0]
        c.record("every layer/head range launched kernels", "ok" if empty.empty else "FAIL", f"{len(empty)} of {len(attention)} without kernels")


def check_bandwidth(c: _Checked) -> None:
    layers, heads = c.table("layers"), c.table("heads")
    measured_bw = layers[layers["dram_bytes_provenance"].isin(["sampled", "measured"])]
    if c.ceiling is not None and len(measured_bw):
        peak = float(measured_bw["bandwidth_gbps"].max())
        c.record("layer bandwidth ≤ copy ceiling", "ok" if peak <= 1.05 * c.ceiling else "FAIL", f"max {peak:,.0f} of {c.ceiling:,.0f} GB/s")
        hb = heads[heads["provenance"] == "measured"]["bandwidth_gbps"].dropna()
        if len(hb):
            c.record("head bandwidth ≤ copy ceiling", "ok" if hb.max() <= 1.05 * c.ceiling else "FAIL", f"max {hb.max():,.0f} GB/s")
    else:
        c.record("bandwidth ≤ copy ceiling", "skip", "no sampled or measured DRAM bytes (PM sampling off or no GPU)")


def check_per_implementation(c: _Checked) -> None:
    """Not a pass/fail: each implementation's figures, printed and kept in the summary."""
    per_impl = []
    for (impl, phase), g in c.table("layers").groupby(["implementation", "phase"]):
        row = {"implementation": impl, "phase": phase, "layer_calls": int(g["calls"].sum()),
               "us_per_layer_call": float(g["duration_ns"].sum() / g["calls"].sum() / 1e3),
               "bandwidth_gbps_mean": float(g["bandwidth_gbps"].mean()), "bandwidth_provenance": g["bandwidth_provenance"].iloc[0],
               "kernels_per_call": float(g["kernels_per_call"].mean()) if "kernels_per_call" in g else None,
               "cpu_launch_cost_us_per_call": float(g["cpu_launch_cost_per_call_ns"].mean() / 1e3) if "cpu_launch_cost_per_call_ns" in g else None,
               "kernel_gap_us_per_call": float(g["kernel_gap_per_call_ns"].mean() / 1e3) if "kernel_gap_per_call_ns" in g else None,
               "launch_latency_p50_us": float(g["launch_latency_p50_ns"].median() / 1e3) if "launch_latency_p50_ns" in g else None,
               "launch_latency_p99_us": float(g["launch_latency_p99_ns"].median() / 1e3) if "launch_latency_p99_ns" in g else None,
               "theoretical_occupancy_pct": float(g["theoretical_occupancy_pct"].mean()) if "theoretical_occupancy_pct" in g else None,
               "achieved_occupancy_pct": float(g["achieved_occupancy_pct"].mean()) if "achieved_occupancy_pct" in g else None}
        per_impl.append(row)
        print("     " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    c.summary["per_implementation"] = per_impl


def check_heads_explain_layers(c: _Checked) -> None:
    layers = c.table("layers")
    head_layers = layers.dropna(subset=["heads_duration_ns"]) if "heads_duration_ns" in layers else layers.iloc[0:0]
    if len(head_layers):
        ratio = head_layers["heads_duration_ns"] / head_layers["duration_ns"]
        c.record("heads explain their layer", "ok" if (ratio <= 1.0001).all() else "FAIL",
                 f"sum(heads)/layer {ratio.min():.3f}–{ratio.max():.3f} (mean {ratio.mean():.3f}); "
                 f"split overhead {head_layers['split_overhead_ns'].sum() / head_layers['calls'].sum() / 1e3:.1f} µs per layer call")
        c.summary["heads_over_layer"] = {"min": float(ratio.min()), "mean": float(ratio.mean()), "max": float(ratio.max())}


def check_ncu_slice(c: _Checked) -> None:
    import numpy as np
    import pandas as pd

    from headcount.derive import occupancy
    from headcount.device import limits_for

    ncu_dir = c.out / "ncu-report"
    if not (ncu_dir / "layers").exists():
        c.record("ncu slice", "skip", "not run (no GPU or no ncu)")
        return
    layers = c.table("layers")
    ncu_layers, ncu_kernels = c.table("layers", ncu_dir), c.table("kernels", ncu_dir)
    ref = layers[(layers["implementation"] == "sdpa") & layers["heads_duration_ns"].isna()] if "heads_duration_ns" in layers else layers
    ref = ref.assign(min_per_call=ref["analytic_min_bytes"] / ref["calls"],
                     sampled_per_call=ref.get("dram_bytes_sampled", pd.Series(np.nan, index=ref.index)) / ref["calls"])
    merged = ncu_layers.merge(ref[["phase", "layer", "min_per_call", "sampled_per_call"]], on=["phase", "layer"], how="inner")
    if len(merged):
        excess = merged["dram_bytes_measured"] / merged["min_per_call"]
        c.record("ncu bytes ≥ 0.9 × analytic minimum", "ok" if (excess >= 0.9).all() else "FAIL",
                 f"measured/analytic {excess.min():.2f}–{excess.max():.2f} over {len(merged)} layer×phase rows")
        if merged["sampled_per_call"].notna().any():
            r = merged["sampled_per_call"] / merged["dram_bytes_measured"]
            c.record("cupti-sampled vs ncu-measured DRAM bytes per layer", "ok" if r.between(0.25, 4).all() else "FAIL",
                     f"sampled/measured {r.min():.2f}–{r.max():.2f} (median {r.median():.2f})")
        c.summary["ncu_vs_cupti"] = merged.to_dict("records")
    with_launch = ncu_kernels.dropna(subset=["registers_per_thread", "theoretical_occupancy_pct"])
    limits = limits_for(c.env.get("compute_capability"))
    if len(with_launch) and limits is not None:
        smem = with_launch["shared_memory_bytes"].fillna(0).round().astype("int64")
        ours = occupancy.kernel_occupancy(with_launch.assign(shared_memory_bytes=smem), limits)
        diff = (ours - with_launch["theoretical_occupancy_pct"]).abs()
        c.record("occupancy calculator = ncu's theoretical occupancy", "ok" if (diff <= 0.5).all() else "FAIL",
                 f"{int((diff <= 0.5).sum())} of {len(diff)} kernels within 0.5 points (max diff {diff.max():.2f})")


def check_wrapped_runs(c: _Checked) -> None:
    for backend in ("nsys", "ncu", "cupti"):
        report_dir = c.out / f"run-{backend}"
        if (report_dir / "layers").exists():
            run_layers, run_runs = c.table("layers", report_dir), c.table("runs", report_dir)
            provenance = ",".join(sorted(set(run_layers["dram_bytes_provenance"].dropna())))
            c.record(f"headcount run --backend {backend}", "ok" if len(run_layers) and (run_runs["source"] == backend).all() else "FAIL",
                     f"{len(run_layers)} layer rows, bytes {provenance}, complete {run_runs['complete'].tolist()}")
        elif (c.out / f"run-{backend}.log").exists():
            c.record(f"headcount run --backend {backend}", "FAIL", (c.out / f"run-{backend}.log").read_text().strip().splitlines()[-1][:300])


def interrupt(out: Path, args) -> int:
    """``headcount run --backend B`` of an endless training loop, interrupted as a terminal does (SIGINT to the
    command's process group) after it printed step 3; writes ``interrupt-B.json``: the exit status, whether the
    report holds the run with the interrupt's notice, its recorded steps, and any process of the command's session
    still running afterwards (issue 33: for ncu this is the first check on a GPU)."""
    import signal
    import subprocess

    report = out / f"interrupt-{args.backend}"
    workload = [sys.executable, str(Path(__file__).resolve()), "workload", "--plain", "--endless", "--model", args.model,
                "--impl", args.impl, "--batch", str(args.batch), "--seq", str(args.seq), "--dtype", args.dtype,
                *(["--dry-run"] if args.dry_run else [])]
    extra = ["--nvtx-include", "headcount@fwd/layer.0/", "--cache-control", "none"] if args.backend == "ncu" else []
    proc = subprocess.Popen([sys.executable, "-m", "headcount.cli.main", "run", "--backend", args.backend, *extra, "-o", str(report),
                             "--force", "--", *workload], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, sent = [], False
    for line in proc.stdout:
        lines.append(line)
        if line.strip() == "step 3" and not sent:
            os.killpg(proc.pid, signal.SIGINT)
            sent = True
    rc = proc.wait()
    from headcount.wrap.launcher import running

    left = running(sid=proc.pid)
    doc = {"backend": args.backend, "interrupted": sent, "exit_status": rc, "processes_left": left, "tail": "".join(lines[-15:])}
    manifests = sorted(report.glob("manifests/*/run.json"))
    if manifests:
        meta = json.loads(manifests[0].read_text())
        doc.update(report=True, notices=meta.get("notices", []), complete=meta.get("complete"))
        steps = report / "steps"
        if steps.exists():
            import pandas as pd

            doc["steps_recorded"] = int(pd.read_parquet(steps)["step"].dropna().nunique())
    else:
        doc["report"] = False
    (out / f"interrupt-{args.backend}.json").write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps({k: v for k, v in doc.items() if k != "tail"}, default=str))
    return 0


def check_interrupts(c: _Checked) -> None:
    for backend in ("nsys", "cupti", "ncu"):
        doc = c.load(f"interrupt-{backend}.json")
        if doc is None:
            continue
        noticed = any(str(n).startswith("interrupted: the recording covers") for n in doc.get("notices", []))
        ok = doc["interrupted"] and doc["exit_status"] == 130 and doc.get("report") and noticed and not doc["processes_left"]
        c.record(f"Ctrl-C keeps the recording ({backend})", "ok" if ok else "FAIL",
                 f"exit {doc['exit_status']}, report {doc.get('report')}, {doc.get('steps_recorded')} steps recorded, "
                 f"notice {noticed}, processes left {doc['processes_left']}")


def check_compiled(c: _Checked) -> None:
    compiled_dir = c.out / "report-compiled"
    if (compiled_dir / "kernels").exists():
        c_kernels, c_heads, c_runs = (c.table(name, compiled_dir) for name in ("kernels", "heads", "runs"))
        # SDPA's kernels by name on any device: flash / memory-efficient / math, forward and backward
        attn = c_kernels[c_kernels["name"].str.contains("flash|fmha|attention|scaled_dot_product", case=False, regex=True)]
        inside = attn["head"].notna()
        measured = c_heads[c_heads["provenance"] == "measured"]
        grid = measured.groupby(["phase", "layer", "head"]).size()
        c.record("torch.compile: every attention kernel inside its head's range", "ok" if len(attn) and inside.all() else "FAIL",
                 f"{int(inside.sum())} of {len(attn)} attention kernels attributed; {len(grid)} (phase, layer, head) cells; "
                 f"compile mode {','.join(map(str, set(c_runs['compile_mode'])))}")
        c.summary["compiled"] = {"attention_kernels": len(attn), "attributed": int(inside.sum()), "cells": len(grid)}
    elif (c.out / "profile-compiled.log").exists():
        c.record("torch.compile profile", "FAIL", (c.out / "profile-compiled.log").read_text().strip().splitlines()[-1][:300])


def check_cuda_graphs(c: _Checked) -> None:
    out = c.out
    graph_doc = c.load("cuda-graph.json")
    if (out / "report-graphed" / "layers").exists() and graph_doc:
        _graph_check(c.record, c.summary, "CUDA graph replays in their layers (cupti)", out / "report-graphed", graph_doc["steps"])
    elif (out / "cuda-graph.log").exists():
        c.record("CUDA graph profile", "FAIL", (out / "cuda-graph.log").read_text().strip().splitlines()[-1][:300])
    tagged_doc = c.load("cuda-graph-tagged.json")
    if (out / "report-graph-nsys" / "layers").exists() and tagged_doc:
        _graph_check(c.record, c.summary, "CUDA graph replays in their layers (nsys --cuda-graph-trace=node)", out / "report-graph-nsys",
                     tagged_doc["steps"])
    elif (out / "graph-nsys-parse.log").exists() or (out / "graph-nsys.log").exists():
        log = out / ("graph-nsys-parse.log" if (out / "graph-nsys-parse.log").exists() else "graph-nsys.log")
        c.record("CUDA graph under nsys", "FAIL", (log.read_text().strip().splitlines() or ["(empty log)"])[-1][:300])


def check_collector_overhead(c: _Checked) -> None:
    ov = c.load("overhead.json")
    if ov:
        c.record("collector overhead", "info", f"{ov['overhead_pct']:+.1f}% on a {ov['model']} training step "
                 f"({ov['median_step_s_without'] * 1e3:.1f} → {ov['median_step_s_with'] * 1e3:.1f} ms, {ov['backend']})")
        c.summary["overhead"] = ov


def check_training_windows(c: _Checked) -> None:
    tr = c.load("training.json")
    if not tr:
        return
    cpu = sorted(tr["worker_cpu_s"].values())
    said = (f"loop {tr['ratio']:.3f}× untagged ({tr['steps']} steps, a window every {tr['every']}, {tr['cpu_count']} cores); "
            f"{len(tr['written'])} of {len(tr['profiled'])} windows written, {len(tr['skipped'])} skipped; worker "
            f"{cpu[len(cpu) // 2] * 1e3:.0f} ms CPU a window" if cpu else "no window answered")
    ok = not tr["failed"] and sorted(tr["written"]) == sorted(tr["profiled"])
    c.record("training windows (background worker)", "ok" if ok else "FAIL", said if ok else f"{said}; failed: {tr['failed']}")
    c.summary["training"] = tr


CHECKS = (check_copy_ceiling, check_cupti_probes, check_occupancy_vs_driver, check_profile_report, check_steps,
          check_attention_ranges, check_bandwidth, check_per_implementation, check_heads_explain_layers, check_ncu_slice,
          check_wrapped_runs, check_interrupts, check_compiled, check_cuda_graphs, check_collector_overhead, check_training_windows)
"""The checks, in the order they run and print; each reads what the GPU steps left in OUT."""


def check(out: Path) -> int:
    """Run :data:`CHECKS` over OUT, write ``summary.json``; 1 when any failed (or the profile report is missing)."""
    c = _Checked(out)
    try:
        for one in CHECKS:
            one(c)
    except _NoReport:
        _write(out / "summary.json", c.summary)
        return 1
    failed = [r for r in c.results if r["status"] == "FAIL"]
    c.summary["failed"] = len(failed)
    (out / "summary.json").write_text(json.dumps(c.summary, indent=2, sort_keys=True, default=str))
    print(f"gpu check: {len([r for r in c.results if r['status'] == 'ok'])} ok, {len(failed)} failed, "
          f"{len([r for r in c.results if r['status'] == 'skip'])} skipped")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe-cupti")
    pr.add_argument("out")
    pr.add_argument("--nvtx-markers", action="store_true")
    pk = sub.add_parser("pack")
    pk.add_argument("src")
    pk.add_argument("dest")
    ch = sub.add_parser("choose-cupti")
    ch.add_argument("out")
    ch.add_argument("names", nargs="+")
    for name in ("bandwidth", "occupancy", "check"):
        s = sub.add_parser(name)
        s.add_argument("out")
        s.add_argument("--dry-run", action="store_true")
    for name in ("overhead", "workload", "cuda-graph", "training", "interrupt"):
        s = sub.add_parser(name)
        if name in ("overhead", "cuda-graph", "training", "interrupt"):
            s.add_argument("out")
        s.add_argument("--backend", default="nsys")
        s.add_argument("--endless", action="store_true")
        s.add_argument("--every", type=int, default=10)
        s.add_argument("--tagger-only", action="store_true")
        s.add_argument("--model", default="bert-base")
        s.add_argument("--impl", default="sdpa")
        s.add_argument("--batch", type=int, default=16)
        s.add_argument("--seq", type=int, default=512)
        s.add_argument("--dtype", default="bfloat16")
        s.add_argument("--steps", type=int, default=10)
        s.add_argument("--mode", default="layer")
        s.add_argument("--dry-run", action="store_true")
        s.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "probe-cupti":
        return probe_cupti(Path(args.out), args.nvtx_markers)
    if args.cmd == "pack":
        return pack(Path(args.src), Path(args.dest))
    if args.cmd == "choose-cupti":
        return choose_cupti(Path(args.out), args.names)
    if args.cmd == "bandwidth":
        return bandwidth(Path(args.out), args.dry_run)
    if args.cmd == "occupancy":
        return occupancy_vs_driver(Path(args.out))
    if args.cmd == "overhead":
        return overhead(Path(args.out), args)
    if args.cmd == "workload":
        return workload(args)
    if args.cmd == "training":
        return training_windows(Path(args.out), args)
    if args.cmd == "cuda-graph":
        return cuda_graph(Path(args.out), args)
    if args.cmd == "interrupt":
        return interrupt(Path(args.out), args)
    return check(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
