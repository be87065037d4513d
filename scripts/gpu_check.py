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
  counters-workload ...       two training steps per shape (SEQxBATCH), untagged, for headcount run (cupti, ncu)
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

    from headcount.collector import cupti_load, cupti_source
    from headcount.parsers import cupti_records

    doc = {"cupti_python": cupti_load.cupti_version(), "nvtx_injection": os.environ.get("NVTX_INJECTION64_PATH")}
    try:
        cupti_load.require()
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
    from headcount.machine.calibrate import copy_ceiling

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

    from headcount.common.device import Device
    from headcount.derive import occupancy

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

    from headcount.cli.models import load_model, make_inputs, set_implementation

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


OVERHEAD_ROWS = (
    # (config, what the collector does; issue 49's breakdown, each row adding one part to the one before)
    ("activity only", "CUPTI kernel, copy and memset records and the chosen launch/sync calls; no range, no tagging"),
    ("+ ranges", "+ headcount's layer ranges (tagging, NVTX, the range log's timestamps); no external correlation"),
    ("+ external correlation", "+ each attention range's id pushed as external correlation id: layer mode, no PM sampling"),
    ("+ PM sampling", "+ PM sampling: layer mode as `headcount profile` runs it"),
    ("head mode", "head mode with PM sampling"),
)
OVERHEAD_GOALS = {"+ external correlation": 5.0, "+ PM sampling": 10.0}
"""Issue 49's goals (% over the untagged step): layer mode without PM sampling ≤ 5 %, with it ≤ 10 %."""


def _collector_facts(stats: dict | None) -> dict:
    """What one configuration's recorder kept and what its start and stop cost (its stats, less the bulky parts)."""
    stats = dict(stats or {})
    return {key: stats.get(key) for key in ("records_by_kind", "api_calls", "correlation", "correlation_pushes",
                                            "dropped_records", "buffers", "timings_ms", "nvtx_markers_enabled")} | {
        "pm_sampling": {k: v for k, v in (stats.get("pm_sampling") or {}).items() if k in ("enabled", "interval_ns", "notice")}}


def overhead(out: Path, args) -> int:
    """Median step time untagged, then under each row of :data:`OVERHEAD_ROWS`, rounds alternating with the
    untagged step (the GPU's and the machine's drift fall on every row alike). A round is ``--steps`` training
    steps synchronized once at the end, as a training loop runs (the CPU may run ahead of the GPU), so a row's
    figure is the loop's time per step; each step synchronized alone (what the first GPU run measured, the
    CPU's cost in full) is kept beside it. NVTX is set up as ``headcount profile`` sets it (injected into
    libcupti when the probe allowed it): the same set-up as the profile."""
    from headcount import AttentionProfiler
    from headcount.collector.cupti_source import CuptiRecorder

    model, inputs, _ = _model(args)
    for _ in range(3):
        _train_step(model, inputs)
    _sync()

    def loop(steps, prof=None) -> tuple[float, float]:
        """(seconds per step over the loop, synchronized at its end; median seconds of a step synchronized alone)."""
        t0 = time.perf_counter()
        for i in range(steps):
            with prof.step(i) if prof is not None else nullcontext():
                _train_step(model, inputs)
        _sync()
        looped = (time.perf_counter() - t0) / steps
        alone = []
        for i in range(steps):
            t1 = time.perf_counter()
            with prof.step(steps + i) if prof is not None else nullcontext():
                _train_step(model, inputs)
            _sync()
            alone.append(time.perf_counter() - t1)
        return looped, sorted(alone)[len(alone) // 2]

    def run(config):
        """One round of ``config``: (per-step loop s, per-step alone s, the recorder's facts or a skip reason)."""
        if config is None:
            return (*loop(args.steps), None)
        if args.dry_run and config in ("activity only", "+ ranges"):
            return None, None, "skipped: the dry run has no CUPTI"
        backend = "cupti" if not args.dry_run else "auto"
        if config == "activity only":
            recorder = CuptiRecorder(pm_sampling=False)
            recorder.start()
            try:
                timed = loop(args.steps)
            finally:
                recorder.stop()
                facts = _collector_facts(recorder.stats)
                recorder.cleanup()
            return (*timed, facts)
        recorder = CuptiRecorder(pm_sampling=False, correlate=False) if config == "+ ranges" else None
        prof = AttentionProfiler(model, backend=backend, strict=True, recorder=recorder, mode="head" if config == "head mode" else "layer",
                                 pm_sampling=config in ("+ PM sampling", "head mode"))
        with prof:
            timed = loop(args.steps, prof)
        facts = _collector_facts(prof.collector_stats) if prof.backend == "cupti" else {"backend": prof.backend}
        prof.discard_recording()
        return (*timed, facts)

    rounds = max(1, args.rounds)
    untagged, rows = [], {config: [] for config, _ in OVERHEAD_ROWS}
    for _ in range(rounds):
        for config, _ in OVERHEAD_ROWS:
            untagged.append(run(None))
            rows[config].append(run(config))
    untagged.append(run(None))
    reference = sorted(u[0] for u in untagged)[len(untagged) // 2]
    reference_alone = sorted(u[1] for u in untagged)[len(untagged) // 2]
    breakdown = []
    for config, what in OVERHEAD_ROWS:
        measured = [r for r in rows[config] if r[0] is not None]
        if not measured:
            breakdown.append({"config": config, "what": what, "skipped": rows[config][0][2]})
            continue
        looped = sorted(r[0] for r in measured)[len(measured) // 2]
        alone = sorted(r[1] for r in measured)[len(measured) // 2]
        breakdown.append({"config": config, "what": what, "backend": "cupti" if not args.dry_run else "auto",
                          "median_step_s": looped, "overhead_pct": 100.0 * (looped - reference) / reference,
                          "median_step_s_synchronized": alone,
                          "overhead_pct_synchronized": 100.0 * (alone - reference_alone) / reference_alone,
                          "goal_pct": OVERHEAD_GOALS.get(config), "collector": measured[-1][2]})
    for row, before in zip(breakdown[1:], breakdown):  # what each part adds to the row before it
        if "median_step_s" in row and "median_step_s" in before:
            row["adds_pct"] = 100.0 * (row["median_step_s"] - before["median_step_s"]) / reference
    default = next(r for r in breakdown if r["config"] == "+ PM sampling")
    doc = {"backend": default.get("backend"), "model": args.model, "impl": args.impl, "batch": args.batch, "seq": args.seq,
           "dtype": args.dtype, "steps": args.steps, "rounds": rounds,
           "nvtx_injection": os.environ.get("NVTX_INJECTION64_PATH"),
           "median_step_s_without": reference, "median_step_s_with": default.get("median_step_s"),
           "overhead_pct": default.get("overhead_pct"),
           "median_step_s_untagged_synchronized": reference_alone,
           "untagged_rounds_s": [u[0] for u in untagged], "breakdown": breakdown}
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
           "window_ms": {str(k): v for k, v in sp.window_ms.items()},
           "loop_ms_beyond_untagged_per_window": 1e3 * (profiled - plain) / max(1, len(sp.profiled)),
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


# ---------------------------------------------------------------- counters: cupti-sampled vs ncu-measured (issue 47)
def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"128x64,512x16"`` → [(seq 128, batch 64), (seq 512, batch 16)]."""
    shapes = []
    for part in text.split(","):
        seq, _, batch = part.strip().partition("x")
        shapes.append((int(seq), int(batch)))
    return shapes


def _counters_model(args, longest: int):
    """bert-base's shape (bert-tiny's in a dry run) with positions for the longest sequence: random weights, as the
    embedded presets; the attention is bert-base's whatever the positions."""
    import torch
    from transformers import BertForMaskedLM

    from headcount.cli.models import DTYPES, bert_config, set_implementation

    config = bert_config("tiny" if args.dry_run else "base")
    config.max_position_embeddings = max(config.max_position_embeddings, longest)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(getattr(torch, DTYPES[args.dtype]))
    if _cuda() and not args.dry_run:
        model = model.to("cuda")
    set_implementation(model, args.impl)
    return model


def counters_workload(args) -> int:
    """For each shape of ``--shapes`` (SEQxBATCH,…), two training steps (the first warms up), untagged: run under
    ``headcount run``, which tags it and numbers its steps (a step per outermost forward). ``--plan`` gets which
    step ran which shape and which step is the one compared."""
    from headcount.cli.models import make_inputs

    shapes = parse_shapes(args.shapes)
    model = _counters_model(args, max(seq for seq, _ in shapes))
    plan, step = [], 0
    for seq, batch in shapes:
        inputs = make_inputs(model, batch, seq)
        for i in range(2):
            _train_step(model, inputs)
            _sync()
            plan.append({"step": step, "seq": seq, "batch": batch, "measured": i == 1})
            step += 1
    if args.plan:
        _write(Path(args.plan), {"impl": args.impl, "dtype": args.dtype, "shapes": shapes, "steps": plan})
    print(f"counters workload: {len(shapes)} shapes, {step} training steps")
    return 0


def _ncu_step(path) -> int | None:
    """The innermost ``step.N`` of an ncu kernel's NVTX stack (``headcount.step@step.3;headcount@fwd/layer.0``)."""
    import re

    if not isinstance(path, str):
        return None
    found = re.findall(r"step\.(\d+)", next((part for part in path.split(";") if part.startswith("headcount.step@")), ""))
    return int(found[-1]) if found else None


def counter_rows(ranges, kernels, plan: dict, level: str = "layer"):
    """cupti-sampled vs ncu-measured DRAM bytes, one row per (shape, phase, layer[, head]) of the compared step of
    each shape: ``sampled_bytes`` (the cupti range's sampled read + write; null where the samples do not resolve it),
    ``pm_whole_samples``, ``measured_bytes`` (ncu: the summed bytes of that range's kernels in that step),
    ``measured_kernels`` and ``ratio`` (sampled / measured).

    Args:
        ranges: the cupti report's ``ranges`` (one row per range instance, with ``step``).
        kernels: the ncu report's ``kernels`` (``nvtx_path`` with the step domain, ``phase``, ``layer``, ``head``).
        plan: :func:`counters_workload`'s plan.
        level: ``layer`` or ``head``.
    """
    import pandas as pd

    measured = {p["step"]: (p["seq"], p["batch"]) for p in plan["steps"] if p["measured"]}
    keys = ["phase", "layer"] + (["head"] if level == "head" else [])
    r = ranges[(ranges["level"] == level) & ranges["step"].isin(list(measured))].copy()
    r["sampled_bytes"] = r["dram_read_sampled_bytes"] + r["dram_write_sampled_bytes"]
    k = kernels.assign(step=[_ncu_step(x) for x in kernels["nvtx_path"]])
    k = k[k["step"].isin(list(measured)) & k["layer"].notna()]
    if level == "head":
        k = k[k["head"].notna()]
    ncu = k.groupby(["step", *keys], dropna=False).agg(measured_bytes=("dram_bytes", "sum"), measured_kernels=("name", "size")).reset_index()
    for frame in (r, ncu):
        for key in ("step", *keys[1:]):
            frame[key] = pd.to_numeric(frame[key]).astype("Int64")
    rows = r[["step", *keys, "sampled_bytes", "pm_whole_samples"]].merge(ncu, on=["step", *keys], how="inner")
    rows.insert(0, "seq", [measured[s][0] for s in rows["step"]])
    rows.insert(1, "batch", [measured[s][1] for s in rows["step"]])
    rows["ratio"] = rows["sampled_bytes"] / rows["measured_bytes"]
    return rows.sort_values(["seq", *keys]).reset_index(drop=True)


COUNTER_BOUNDS = (0.8, 1.25)  # sampled / measured, per layer call and per head call (issue 47)
COUNTER_MIN_ROWS = 24


def _bounded(rows, what: str, min_rows: int) -> tuple[str, str]:
    resolved = rows[rows["sampled_bytes"].notna()]
    lo, hi = COUNTER_BOUNDS
    inside = resolved["ratio"].between(lo, hi)
    detail = (f"{len(resolved)} of {len(rows)} {what} resolved by the PM samples"
              + (f": sampled/measured {resolved['ratio'].min():.3f}–{resolved['ratio'].max():.3f} "
                 f"(median {resolved['ratio'].median():.3f}), {int(inside.sum())} within {lo}–{hi}" if len(resolved) else ""))
    if len(resolved) < min_rows:
        return "FAIL", f"{detail}; fewer than {min_rows} rows to compare"
    return ("ok" if inside.all() else "FAIL"), detail


def check_counters(c: _Checked) -> None:
    """cupti-sampled DRAM bytes against ncu's measured bytes of the same calls (issue 47, item 5): per layer over
    three shapes (fwd and bwd, 24 rows or more), per head where the samples resolve one; the heads' share of
    their layer's kernels and bytes; single samples above the measured copy ceiling."""
    import pandas as pd

    from headcount.derive.sampling import above_ceiling
    from headcount.parsers.cupti_records import pm_samples_frame, read_records

    root = c.out / "counters"
    plan = c.load("counters/plan-layer.json")
    if plan is None or not any((root / f"ncu-{impl}" / "kernels").exists() for impl in ("sdpa", "eager")):
        c.record("cupti-sampled vs ncu-measured DRAM bytes per layer", "skip", "not run (no GPU, no ncu, or out of time)")
        return
    layer_rows = []
    for impl in ("sdpa", "eager"):
        cupti, ncu = root / f"cupti-{impl}", root / f"ncu-{impl}"
        if (cupti / "ranges").exists() and (ncu / "kernels").exists():
            rows = counter_rows(c.table("ranges", cupti), c.table("kernels", ncu), plan).assign(implementation=impl)
            layer_rows.append(rows)
    rows = pd.concat(layer_rows, ignore_index=True) if layer_rows else pd.DataFrame()
    status, detail = _bounded(rows, "layer×phase×shape rows", COUNTER_MIN_ROWS) if len(rows) else ("FAIL", "no row in both reports")
    c.record("cupti-sampled vs ncu-measured DRAM bytes per layer", status, detail)
    c.summary["counters_per_layer"] = rows.to_dict("records")
    head_plan = c.load("counters/plan-head.json")
    cupti, ncu = root / "cupti-head", root / "ncu-head"
    if head_plan and (cupti / "ranges").exists() and (ncu / "kernels").exists():
        ranges, kernels = c.table("ranges", cupti), c.table("kernels", ncu)
        heads = counter_rows(ranges, kernels, head_plan, level="head")
        status, detail = _bounded(heads, "head×phase rows", 1) if len(heads) else ("FAIL", "no head row in both reports")
        c.record("cupti-sampled vs ncu-measured DRAM bytes per head (where resolved)", status, detail)
        c.summary["counters_per_head"] = heads.to_dict("records")
        # the heads hold their layer: ncu's bytes of the head ranges over all the layer range's kernels (glue included),
        # and cupti's kernel busy time of the heads over the layer's (the split's glue kernels outside every head)
        compared = [p["step"] for p in head_plan["steps"] if p["measured"]]
        k = kernels.assign(step=[_ncu_step(x) for x in kernels["nvtx_path"]])
        k = k[k["layer"].notna() & k["step"].isin(compared)]
        by_layer = k.groupby(["phase", "layer"]).apply(lambda g: g.loc[g["head"].notna(), "dram_bytes"].sum() / g["dram_bytes"].sum())
        r = ranges[ranges["step"].isin(compared)]
        layer_r, head_r = r[r["level"] == "layer"], r[r["level"] == "head"]
        busy = head_r.groupby("parent_range_id")["kernel_busy_ns"].sum()
        busy_share = (busy / layer_r.set_index("range_id")["kernel_busy_ns"].reindex(busy.index)).dropna()
        low = min(by_layer.min() if len(by_layer) else 0.0, busy_share.min() if len(busy_share) else 0.0)
        c.record("heads hold their layer's work (lower bound 0.8)", "ok" if len(by_layer) and len(busy_share) and low >= 0.8 else "FAIL",
                 f"ncu bytes in heads / layer {by_layer.min():.3f}–{by_layer.max():.3f}; cupti kernel busy in heads / layer "
                 f"{busy_share.min():.3f}–{busy_share.max():.3f} over {len(busy_share)} layer calls" if len(by_layer) and len(busy_share)
                 else "no head or layer range with kernels")
    else:
        c.record("cupti-sampled vs ncu-measured DRAM bytes per head (where resolved)", "skip", "head-mode counters not run")
    chosen = []  # the PM interval each cupti run took (auto: the finest CUPTI accepted) and what it resolved
    for manifest in sorted(root.glob("cupti-*/manifests/*/run.json")):
        pm = (json.loads(manifest.read_text()).get("collector") or {}).get("pm_sampling") or {}
        if pm.get("enabled"):
            chosen.append({"run": manifest.parent.parent.parent.name, "interval_ns": pm.get("interval_ns"),
                           "refused_intervals_ns": pm.get("refused_intervals_ns"), "resolution": pm.get("resolution")})
    if chosen:
        c.record("PM sampling interval (auto: the finest CUPTI accepts)", "info",
                 "; ".join(f"{x['run']}: {x['interval_ns']} ns (refused {x['refused_intervals_ns']}), "
                           f"{(x['resolution'] or {}).get('attention_ranges_unresolved')} of "
                           f"{(x['resolution'] or {}).get('attention_ranges')} attention ranges unresolved" for x in chosen))
        c.summary["pm_interval"] = chosen
    counted = []
    for records in sorted(root.glob("cupti-*/raw/*/**/cupti-records.jsonl.gz")):
        _, recs = read_records(records)
        counted.append(above_ceiling(pm_samples_frame(recs), c.ceiling))
    if counted and c.ceiling:
        n, total = sum(x["count"] for x in counted), sum(x["samples"] for x in counted)
        top = max((x["max_gbps"] or 0.0) for x in counted)
        c.record("single PM samples above the copy ceiling", "info",
                 f"{n} of {total} samples above {c.ceiling:,.0f} GB/s (the highest {top:,.0f} GB/s); windows of several samples: "
                 "see the per-layer rows")
        c.summary["samples_above_ceiling"] = {"count": n, "samples": total, "max_gbps": top, "ceiling_gbps": c.ceiling}


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
            AttentionProfiler(model, mode=args.mode, backend="cupti" if graphed else "auto", strict=graphed,
                              trace_dir=out / "records-graphed")
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


def torch_routes(out: Path, args) -> int:
    """Issue 59's routes on this device's torch (torch-routes.json): whether torch.profiler samples PM itself
    (:func:`headcount.collector.torch_pm.route`) and whether it can label captured kernels
    (``torch.cuda.graph_annotations.is_available()``); where it can, a run of each, each skipped with its reason where
    not: route 4 (and 1) — the model's training steps under ``AttentionProfiler(backend="torch")``, the report in
    ``OUT/torch-pm``, to compare with headcount's own PM samples (``report/``); route 2 — the tagged forward captured
    with annotations, replayed under torch.profiler, exported with them and parsed (``OUT/torch-graph``)."""
    from headcount import AttentionProfiler
    from headcount.collector import torch_pm

    model, inputs, torch = _model(args)
    cuda = _cuda() and not args.dry_run
    chosen = torch_pm.route(cuda=cuda)
    doc: dict = {"torch": str(torch.__version__), "cuda": cuda, "pm_route": {"name": chosen.name, "detail": chosen.detail}}
    try:
        from torch.cuda import graph_annotations

        doc["graph_annotations"] = {"available": bool(graph_annotations.is_available())}
    except Exception as exc:  # noqa: BLE001 - any failure to probe is "not available", said
        graph_annotations = None
        doc["graph_annotations"] = {"available": False, "detail": f"{type(exc).__name__}: {exc}"}
    if chosen.name is not None:
        prof = AttentionProfiler(model, backend="torch", trace_dir=out / "torch-pm-trace")
        with prof:
            for i in range(args.steps):
                with prof.step(i):
                    _train_step(model, inputs)
                _sync()
        prof.save(out / "torch-pm", force=True)
        doc["pm_run"] = {"report": "torch-pm", "steps": args.steps, "notices": list(getattr(prof, "notices", []) or [])}
    if doc["graph_annotations"]["available"] and cuda:
        from torch.profiler import ProfilerActivity, profile

        from headcount.tagging.tagger import AttentionTagger

        model.eval()
        with torch.no_grad(), AttentionTagger([model], mode="layer") as tagger:
            doc["graph_annotations"]["tagger_marks"] = bool(tagger.graph_marks)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(**inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, enable_annotations=True):
                model(**inputs)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as traced:
                for _ in range(3):
                    graph.replay()
                _sync()
        (out / "torch-graph").mkdir(exist_ok=True)
        traced.export_chrome_trace(str(out / "torch-graph" / "trace.json"),
                                   cuda_graph_annotations=graph_annotations.get_kernel_annotations())
        doc["graph_run"] = {"trace": "torch-graph/trace.json", "replays": 3}
    _write(out / "torch-routes.json", doc)
    return 0


def check_torch_routes(c: _Checked) -> None:
    """Issue 59's routes where the device's torch has them (:func:`torch_routes`): torch-native PM samples per layer
    against headcount's own (the profile's report, same model and shape) within :data:`COUNTER_BOUNDS`; a labelled
    capture's replayed attention kernels all in their layers. Skipped with the reason where torch has no route."""
    import pandas as pd

    doc = c.load("torch-routes.json")
    if doc is None:
        c.record("torch.profiler's own PM samples vs headcount's (issue 59)", "skip", "torch-routes not run")
        return
    c.summary["torch_routes"] = doc
    if not doc.get("pm_run"):
        c.record("torch.profiler's own PM samples vs headcount's (issue 59)", "skip", doc["pm_route"]["detail"])
    elif (c.out / "torch-pm" / "layers").exists() and (c.out / "report" / "layers").exists():
        key = ["implementation", "phase", "layer_name"]
        theirs = c.table("layers", c.out / "torch-pm")
        ours = c.table("layers", c.out / "report")
        ours = ours[ours["implementation"].isin(set(theirs["implementation"]))]
        both = theirs.set_index(key)[["dram_bytes_sampled", "calls"]].join(ours.set_index(key)[["dram_bytes_sampled", "calls"]],
                                                                         lsuffix="_torch", rsuffix="_cupti", how="inner")
        per_call = (both["dram_bytes_sampled_torch"] / both["calls_torch"]) / (both["dram_bytes_sampled_cupti"] / both["calls_cupti"])
        per_call = per_call.dropna()
        lo, hi = COUNTER_BOUNDS
        status = "ok" if len(per_call) and per_call.between(lo, hi).all() else "FAIL"
        c.record("torch.profiler's own PM samples vs headcount's (issue 59)", status,
                 f"{len(per_call)} layer×phase rows resolved by both: torch/cupti per call "
                 + (f"{per_call.min():.3f}–{per_call.max():.3f} (bounds {lo}–{hi})" if len(per_call) else "none"))
    else:
        c.record("torch.profiler's own PM samples vs headcount's (issue 59)", "FAIL", "torch-pm or report missing")
    if not doc.get("graph_run"):
        detail = doc["graph_annotations"].get("detail") or "torch.cuda.graph_annotations.is_available() is False (needs torch 2.15+, cuda-bindings, CUDA 13.1+)"
        c.record("a labelled CUDA-graph replay's kernels in their layers (issue 59)", "skip", detail)
        return
    from headcount.cli.main import main as headcount_main

    report = c.out / "torch-graph" / "report"
    rc = headcount_main(["parse", str(c.out / "torch-graph" / "trace.json"), "-o", str(report), "--force"])
    kernels = c.table("kernels", report) if rc == 0 else pd.DataFrame()
    attention = kernels[kernels["name"].astype(str).str.contains("flash|fmha|attention", case=False)] if len(kernels) else kernels
    placed = int(attention["layer_name"].notna().sum()) if len(attention) else 0
    c.record("a labelled CUDA-graph replay's kernels in their layers (issue 59)",
             "ok" if rc == 0 and len(attention) and placed == len(attention) else "FAIL",
             f"{placed} of {len(attention)} replayed attention kernels in a layer (parse exit {rc})")


def _graph_check(record, summary, name: str, report_dir: Path, steps: int, graphed: bool = True) -> None:
    """The kernels a graph replayed (those with a graph node id, whatever their names) land in the layer ranges
    that captured them: every replayed kernel launched inside a layer's capture is attributed to that layer, and
    each fwd layer has one call per replay, in its step. Fails with the reason (no node ids, kernels outside
    their layer, replays not counted as calls)."""
    import pandas as pd

    kernels, layers = pd.read_parquet(report_dir / "kernels"), pd.read_parquet(report_dir / "layers")
    fwd = layers[layers["phase"] == "fwd"]
    calls = sorted(set(fwd["calls"])) if len(fwd) else []
    calls_ok = bool(len(fwd)) and (fwd["calls"] == steps).all() and (fwd["steps"] == steps).all()
    gpu = kernels[kernels["kind"] == "kernel"] if "kind" in kernels else kernels.iloc[:0]
    replayed = gpu[gpu["graph_node_id"].notna()] if "graph_node_id" in gpu else gpu.iloc[:0]
    if not graphed:  # a CPU dry run: the eager stand-in's calls only
        record(name, "skip" if calls_ok else "FAIL", f"no CUDA graph on a CPU; {len(fwd)} fwd layer rows, calls {calls}")
        return
    if not len(replayed):
        record(name, "FAIL", f"no kernel carries a graph node id: the replays were not recorded node by node "
               f"({len(gpu)} kernels); {len(fwd)} fwd layer rows, calls {calls}")
        return
    in_layer = replayed["layer"].notna()
    per_step = replayed[in_layer].groupby(["step", "layer"], dropna=False).size()
    reasons = []
    if not in_layer.any():
        reasons.append("no replayed kernel in a layer range")
    if not calls_ok:
        reasons.append(f"fwd calls per layer {calls}, expected {steps} (one per replay)")
    if len(per_step) and per_step.groupby(level="layer").nunique().max() > 1:
        reasons.append("a layer's replayed kernels differ from step to step")
    record(name, "FAIL" if reasons else "ok",
           f"{int(in_layer.sum())} of {len(replayed)} replayed kernels in a layer range ({int(replayed['layer'].nunique())} layers); "
           f"fwd calls per layer {calls} (expected {steps})" + (f": {'; '.join(reasons)}" if reasons else ""))
    summary[name] = {"replayed_kernels": len(replayed), "in_layers": int(in_layer.sum()), "layers": len(fwd), "calls": calls}


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
    """Head mode: the heads never hold more than their layer, and the report says where the rest went (glue
    kernels, gaps between heads) and what the split costs against the paired layer-mode profile."""
    layers = c.table("layers")
    head_layers = layers.dropna(subset=["heads_duration_ns"]) if "heads_duration_ns" in layers else layers.iloc[0:0]
    if len(head_layers):
        ratio = head_layers["heads_duration_ns"] / head_layers["duration_ns"]
        calls = head_layers["calls"].sum()
        glue = head_layers["split_glue_ns"].sum() / calls / 1e3 if "split_glue_ns" in head_layers else float("nan")
        cost = head_layers["split_cost_x"] if "split_cost_x" in head_layers else None
        said = "" if cost is None or cost.isna().all() else f"; split cost {cost.min():.2f}–{cost.max():.2f}× layer mode"
        c.record("heads explain their layer", "ok" if (ratio <= 1.0001).all() else "FAIL",
                 f"sum(heads)/layer {ratio.min():.3f}–{ratio.max():.3f} (mean {ratio.mean():.3f}); "
                 f"split overhead {head_layers['split_overhead_ns'].sum() / calls / 1e3:.1f} µs per layer call "
                 f"(glue {glue:.1f} µs){said}")
        c.summary["heads_over_layer"] = {"min": float(ratio.min()), "mean": float(ratio.mean()), "max": float(ratio.max()),
                                         "split_cost_x": None if cost is None else cost.dropna().tolist()}


def check_ncu_slice(c: _Checked) -> None:
    import numpy as np
    import pandas as pd

    from headcount.common.device import limits_for
    from headcount.derive import occupancy

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
    for backend in ("nsys", "cupti", "ncu", "torch"):
        doc = c.load(f"interrupt-{backend}.json")
        if doc is None:
            continue
        noticed = any(str(n).startswith("interrupted: the recording covers") for n in doc.get("notices", []))
        ok = doc["interrupted"] and doc["exit_status"] == 130 and doc.get("report") and noticed and not doc["processes_left"]
        c.record(f"Ctrl-C keeps the recording ({backend})", "ok" if ok else "FAIL",
                 f"exit {doc['exit_status']}, report {doc.get('report')}, {doc.get('steps_recorded')} steps recorded, "
                 f"notice {noticed}, processes left {doc['processes_left']}")


FP32_GEMM = r"sgemm|f32f32|_s1688gemm|_s16816gemm"  # cuBLAS/CUTLASS single-precision GEMM kernels


def check_compiled(c: _Checked) -> None:
    """torch.compile in head mode: the kernels are selected by their ranges, not by names — every head range of the
    compiled steps launched kernels, every kernel inside a layer is in one of its heads or counted as glue, and in a
    half-precision run no single-precision GEMM runs inside a head (the first H100 run saw sgemm kernels there: SDPA's
    math fallback computes in fp32)."""
    compiled_dir = c.out / "report-compiled"
    if (compiled_dir / "kernels").exists():
        kernels, ranges, runs = (c.table(name, compiled_dir) for name in ("kernels", "ranges", "runs"))
        gpu = kernels[kernels["kind"] == "kernel"] if "kind" in kernels else kernels
        count = "gpu_op_count"
        if not len(gpu) and not c.on_gpu:  # a CPU dry run: the operators stand for the kernels
            gpu, count = kernels[kernels["kind"] == "op"], "op_count"
        heads = ranges[ranges["level"] == "head"]
        empty = heads[heads[count].fillna(0) == 0] if count in heads else heads
        in_heads = gpu[gpu["head"].notna()]
        glue = gpu[gpu["layer"].notna() & gpu["head"].isna()]
        half = set(runs["dtype"].dropna()) & {"bfloat16", "float16", "bf16", "fp16"} if "dtype" in runs else set()
        fp32 = in_heads[in_heads["name"].str.contains(FP32_GEMM, case=False, regex=True)] if half else in_heads.iloc[:0]
        reasons = []
        if not len(heads):
            reasons.append("no head range")
        if len(empty):
            reasons.append(f"{len(empty)} head ranges launched no kernel")
        if len(fp32):
            reasons.append(f"{len(fp32)} single-precision GEMMs inside heads of a {','.join(sorted(half))} run "
                           f"({', '.join(fp32['name'].str[:60].value_counts().index[:3])})")
        names = in_heads["name"].str[:70].value_counts().head(8).to_dict()
        c.record("torch.compile: head ranges hold their kernels, in the dtype asked", "FAIL" if reasons else "ok",
                 f"{len(in_heads)} kernels in {len(heads)} head ranges, {len(glue)} glue kernels in layers outside every head; "
                 f"compile mode {','.join(map(str, set(runs['compile_mode'])))}" + (f": {'; '.join(reasons)}" if reasons else ""))
        c.summary["compiled"] = {"head_ranges": len(heads), "empty_head_ranges": len(empty), "kernels_in_heads": len(in_heads),
                                 "glue_kernels": len(glue), "fp32_gemms_in_heads": len(fp32), "kernel_names_in_heads": names}
    elif (c.out / "profile-compiled.log").exists():
        c.record("torch.compile profile", "FAIL", (c.out / "profile-compiled.log").read_text().strip().splitlines()[-1][:300])


def check_cuda_graphs(c: _Checked) -> None:
    out = c.out
    graph_doc = c.load("cuda-graph.json")
    if (out / "report-graphed" / "layers").exists() and graph_doc:
        _graph_check(c.record, c.summary, "CUDA graph replays in their layers (cupti)", out / "report-graphed", graph_doc["steps"],
                     graphed=bool(graph_doc.get("graphed")))
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
    """Issue 49's breakdown: each row's step time over the untagged step (the loop synchronized at its end, and each
    step synchronized alone), what it adds to the row before, what the collector kept, against the goals."""
    ov = c.load("overhead.json")
    if not ov:
        return
    if ov.get("overhead_pct") is not None:
        c.record("collector overhead", "info", f"{ov['overhead_pct']:+.1f}% on a {ov['model']} training step "
                 f"({ov['median_step_s_without'] * 1e3:.1f} → {ov['median_step_s_with'] * 1e3:.1f} ms a step, {ov['backend']}, "
                 f"NVTX injection {'on' if ov.get('nvtx_injection') else 'off'})")
    for row in ov.get("breakdown", []):
        if "skipped" in row:
            c.record(f"collector overhead: {row['config']}", "info", row["skipped"])
            continue
        goal = row.get("goal_pct")
        verdict = "info" if goal is None or row["backend"] != "cupti" else ("PASS" if row["overhead_pct"] <= goal else "FAIL")
        kept = (row.get("collector") or {}).get("records_by_kind") or {}
        timings = (row.get("collector") or {}).get("timings_ms") or {}
        c.record(f"collector overhead: {row['config']}", verdict,
                 f"{row['overhead_pct']:+.1f}% ({row['median_step_s'] * 1e3:.2f} ms a step in the loop"
                 + (f", adds {row['adds_pct']:+.1f}%" if "adds_pct" in row else "")
                 + f"; {row['overhead_pct_synchronized']:+.1f}% each step synchronized alone"
                 + (f"; goal ≤ {goal:.0f} %" if goal else "")
                 + (f"; records {', '.join(f'{k} {v:,}' for k, v in sorted(kept.items()))}" if kept else "")
                 + (f"; start/stop ms {', '.join(f'{k} {v:g}' for k, v in timings.items())}" if timings else "") + ")")
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
    if tr.get("backend") == "cupti":  # issue 49's goal: a loop profiled every 10 steps at most 1.10× the untagged loop
        c.record("training windows: loop time (goal ≤ 1.10×)", "PASS" if tr["ratio"] <= 1.10 else "FAIL", f"{tr['ratio']:.3f}×")
    windows = list((tr.get("window_ms") or {}).values())
    if windows:
        def median(key):
            values = sorted(w.get(key, 0.0) for w in windows)
            return values[len(values) // 2]
        parts = sorted({k for w in windows for k in (w.get("collector") or {})})
        collector = {k: sorted((w.get("collector") or {}).get(k, 0.0) for w in windows)[len(windows) // 2] for k in parts}
        c.record("training windows: cost per window", "info",
                 f"{tr.get('loop_ms_beyond_untagged_per_window', float('nan')):.0f} ms beyond the untagged loop; start "
                 f"{median('start'):.0f} ms, stop {median('stop'):.0f} ms (" + ", ".join(f"{k} {v:.1f}" for k, v in collector.items())
                 + f"), handed over {median('handed_over'):.0f} ms (medians)")
    c.summary["training"] = tr


CHECKS = (check_copy_ceiling, check_cupti_probes, check_occupancy_vs_driver, check_counters, check_profile_report, check_steps,
          check_attention_ranges, check_bandwidth, check_per_implementation, check_heads_explain_layers, check_ncu_slice,
          check_wrapped_runs, check_interrupts, check_compiled, check_cuda_graphs, check_collector_overhead, check_training_windows,
          check_torch_routes)
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
    for name in ("overhead", "workload", "counters-workload", "cuda-graph", "training", "interrupt", "torch-routes"):
        s = sub.add_parser(name)
        if name in ("overhead", "cuda-graph", "training", "interrupt", "torch-routes"):
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
        s.add_argument("--rounds", type=int, default=3, help="overhead: rounds of every row, alternating with untagged ones")
        s.add_argument("--mode", default="layer")
        s.add_argument("--dry-run", action="store_true")
        s.add_argument("--plain", action="store_true")
        s.add_argument("--shapes", default="128x64,512x16,2048x4", help="counters-workload: SEQxBATCH,…")
        s.add_argument("--plan", default=None, help="counters-workload: where to write which step ran which shape")
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
    if args.cmd in ("overhead", "training") and not args.dry_run:
        from headcount.api import prepare_process

        prepare_process("cupti")  # NVTX set up as `headcount profile` sets it, before the first NVTX call
    if args.cmd == "overhead":
        return overhead(Path(args.out), args)
    if args.cmd == "workload":
        return workload(args)
    if args.cmd == "counters-workload":
        return counters_workload(args)
    if args.cmd == "training":
        return training_windows(Path(args.out), args)
    if args.cmd == "cuda-graph":
        return cuda_graph(Path(args.out), args)
    if args.cmd == "interrupt":
        return interrupt(Path(args.out), args)
    if args.cmd == "torch-routes":
        return torch_routes(Path(args.out), args)
    return check(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
