"""``headcount profile``: profile a model across attention implementations.

Options are validated before anything heavy happens (model load, profiling);
each implementation gets one untimed warm-up step, then ``--steps`` profiled
steps, each inside a ``step.N`` range. All implementations of one invocation
share one run id and are written in one atomic report.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from headcount.build import sources
from headcount.cli.flags import add_pm_interval
from headcount.cli.models import (
    DTYPES,
    IMPLEMENTATIONS,
    check_options,
    choose_model,
    config_dict,
    load_model,
    make_inputs,
    set_implementation,
)
from headcount.common import env
from headcount.common.device import Device
from headcount.common.errors import HeadcountError
from headcount.reports import console as console_report
from headcount.reports import terminal
from headcount.store import dataset
from headcount.store.metadata import new_run_id, runs_row

DEFAULT_OUT = "headcount-report"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
UNCOMPILED = "none"  # in a --compile list: the model as is, for comparison

EXAMPLES = """\
examples:
  headcount profile                              embedded default model, eager vs sdpa, layer mode
  headcount profile --mode head --impl sdpa      measure every head on its own
  headcount profile --model ./my-llama --seq 512 --batch 4 -o out/ --append
  headcount profile --impl flex_attention --no-backward
  headcount profile --device cpu                 on the CPU even where a GPU is present
  headcount profile --compile                    the model under torch.compile (Inductor), warmed up first
  headcount profile --compile none,default       uncompiled and compiled, one run each in one report
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile",
        help="profile a model's attention per layer and head",
        description="Profile a model's attention (forward and backward) per layer and head across attention "
        "implementations, and write the Parquet report.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="local model directory (config.json, optional weights), a Hugging Face hub id (org/name; "
                   "through the hub cache, HF_HUB_OFFLINE=1 for the cache only), or an embedded model: bert-base, bert-tiny; default: an embedded small Llama")
    p.add_argument("--revision", default=None, help="with a hub id: branch, tag or commit (default: the repository's default branch)")
    p.add_argument("--impl", default="eager,sdpa", help=f"comma-separated attention implementations to compare ({', '.join(IMPLEMENTATIONS)}); default: eager,sdpa")
    p.add_argument("--mode", choices=("layer", "head"), default="layer", help="layer: run as in production (heads apportioned); head: one head at a time, each measured")
    p.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    p.add_argument("--seq", type=int, default=256, help="sequence length in tokens (default 256)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="parameter and activation dtype (default float32)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per implementation, after one warm-up step (default 3)")
    p.add_argument("--no-backward", action="store_true", help="forward only (inference)")
    p.add_argument("--no-layer-pair", action="store_true", help="head mode: skip the paired layer-mode profile of each "
                   "implementation (the same steps, fused) against which the report states the split's cost")
    p.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE[,MODE…]",
                   help="profile the model under torch.compile (Inductor) with this mode: "
                   f"{', '.join(COMPILE_MODES)} (default when given without a value); a comma-separated list "
                   f"profiles each mode as its own run in the report, '{UNCOMPILED}' the model uncompiled "
                   f"(e.g. {UNCOMPILED},default: compiled against uncompiled). The warm-up step compiles "
                   "(under the tags, so the compiled graph holds them) and is not measured")
    p.add_argument("--device", default="auto", help=f"where the model and inputs go: {env.CHOICES} "
                   "(auto: the current GPU when torch sees one, else cpu; default auto)")
    p.add_argument("--backend", choices=("auto", *sources.RECORDERS), default="auto",
                   help="where the numbers come from: cupti (in-process CUPTI on an NVIDIA GPU: kernels, launch latency, "
                   "occupancy, PM-sampled DRAM traffic), torch (torch.profiler, any machine), auto (cupti where usable, else torch; default)")
    p.add_argument("--no-pm-sampling", action="store_true", help="cupti: do not sample DRAM traffic and warps active (PM sampling)")
    add_pm_interval(p)
    p.add_argument("--trace-dir", default=None, help="also keep the raw recordings there (<dir>/<impl>/trace.json or cupti-records.jsonl.gz)")
    p.add_argument("-o", "--out", default=DEFAULT_OUT, help=f"output directory (default ./{DEFAULT_OUT})")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add this run to an existing report")
    group.add_argument("--force", action="store_true", help="replace an existing report")
    p.set_defaults(func=run)
    return p


def _validate(args):
    """Check every option before anything heavy: returns ``(implementations,
    model choice, device, compile modes)`` (``None`` for an uncompiled run).

    Raises:
        HeadcountError: a bad option (exit 2), or a device this machine lacks (exit 3).
    """
    for name in ("batch", "seq", "steps"):
        value = getattr(args, name)
        if value < 1:
            raise HeadcountError(f"--{name} {value}: must be at least 1", hint=f"pass a positive --{name}")
    if args.batch * args.seq > 1 << 22:
        raise HeadcountError(f"--batch {args.batch} × --seq {args.seq} is too large for a profile run", hint="use fewer tokens per step")
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    if not impls:
        raise HeadcountError("--impl is empty", hint="e.g. --impl eager,sdpa")
    if len(set(impls)) != len(impls):
        raise HeadcountError("--impl names an implementation twice", hint="list each once")
    modes = [m.strip() for m in (args.compile or UNCOMPILED).split(",") if m.strip()]
    unknown = [m for m in modes if m not in (UNCOMPILED, *COMPILE_MODES)]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise HeadcountError(f"--compile {args.compile}: " + (f"unknown mode {unknown[0]}" if unknown else "each mode once, at least one"),
                             hint=f"choose from {', '.join((UNCOMPILED, *COMPILE_MODES))}, e.g. --compile {UNCOMPILED},default")
    if args.backend == "cupti":  # the environment first (exit 3): no driver, no cupti-python
        from headcount.api import require_backend  # torch: imported only when a model is profiled

        try:
            require_backend(args.backend)
        except HeadcountError as exc:
            raise HeadcountError(f"--backend cupti cannot run here: {exc.message}", hint=exc.hint, exit_code=exc.exit_code) from exc
    device = env.resolve(args.device)
    if device.type == "cpu" and args.backend == "cupti":
        raise HeadcountError("--backend cupti records GPU work and --device is cpu", hint="use --device cuda, or --backend torch")
    choice = choose_model(args.model, args.revision)
    check_options(choice, impls, args.seq, device)
    dataset.check_output(args.out, append=args.append, force=args.force)
    return impls, choice, device, [None if m == UNCOMPILED else m for m in modes]


def _step(model, inputs, backward: bool) -> None:
    import torch

    if backward:
        out = model(**inputs)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            model(**inputs)


def _warm_up(model, inputs, backward: bool, impl: str, tags=None) -> None:
    """One untimed step; with ``tags`` (a compiled model) under a tagger of the
    profiled mode, so that what compiles holds the ranges and the profiled
    steps reuse it."""
    try:
        if tags is None:
            _step(model, inputs, backward)
        else:
            with tags:
                _step(model, inputs, backward)
    except (NotImplementedError, RuntimeError, ImportError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        hint = "add --no-backward" if backward and "backward" in first.lower() else "choose another --impl"
        if tags is not None:
            hint += ", or profile without --compile"
        raise HeadcountError(f"{impl} cannot run this model here: {first}", hint=hint) from exc


def run(args) -> int:
    from headcount.api import prepare_process, resolve_backend  # torch: imported only when a model is profiled

    console = terminal.console(stderr=True)
    impls, choice, device, modes = _validate(args)
    if device.type == "cpu" and args.backend == "auto":  # CUPTI would see no work of a model on the CPU
        backend, why = "torch", "backend auto: torch (--device cpu)"
    else:
        backend, why = resolve_backend(args.backend)
    if why:
        console.print(why)
    if backend == "cupti":
        # before the first NVTX call of this process, so that NVTX ranges also become CUPTI marker records
        injected = prepare_process(backend)
        if injected:
            console.print(f"NVTX marker records: injecting {injected}")
    backward = not args.no_backward
    with console.status("loading model…"):
        model, description = load_model(choice, args.dtype, device=device)
    inputs = make_inputs(model, args.batch, args.seq)
    console.print(f"model: {description}; on {Device.from_torch(device).name} ({device}); batch {args.batch} × seq {args.seq}, {args.dtype}, "
                  f"{'forward+backward' if backward else 'forward only'}, {args.mode} mode")
    for n, mode in enumerate(modes):  # one run each: the report holds them side by side
        out = _profile_run(args, console, model, description, inputs, impls, backend, backward, mode, several=len(modes) > 1,
                           append=args.append or n > 0, force=args.force and n == 0)
    if len(modes) > 1:
        console.print(f"compare them: headcount compare {out}", highlight=False)
    return 0


def _profile_run(args, console, model, description, inputs, impls, backend, backward, compile_mode, several: bool,
                 append: bool, force: bool):
    """Profile every implementation once (``compile_mode``: under ``torch.compile``
    with that mode, else as is) as one run of the report; prints its summary.
    ``several``: one of several runs of this command (their trace folders are
    named by compile mode too).

    Returns:
        The report directory.
    """
    from headcount.build.shared import with_findings
    from headcount.derive.aggregate import with_split_cost

    run_id = new_run_id()
    runner = model
    if compile_mode:
        import torch

        from headcount.api import AttentionTagger  # the tagger, through the API (cli never imports tagging)

        runner = torch.compile(model, mode=compile_mode)
        console.print(f"torch.compile(mode={compile_mode!r}): each implementation's warm-up step compiles, unmeasured")
    elif args.compile:
        console.print("uncompiled (for comparison)")
    collected: dict[str, list[pd.DataFrame]] = {}
    metadata, timing = None, {}
    label = f" [{compile_mode or 'uncompiled'}]" if args.compile else ""
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        for impl in impls:
            task = progress.add_task(f"{impl}{label}: warm-up", total=args.steps)
            set_implementation(model, impl)
            _warm_up(runner, inputs, backward, impl, AttentionTagger([model], mode=args.mode) if compile_mode else None)
            extra = {"model": description, "model_config": config_dict(model), "batch": args.batch, "seq": args.seq,
                     "dtype": args.dtype, "steps": args.steps, "backward": backward, "compile_mode": compile_mode}
            trace_dir = None
            if args.trace_dir:
                trace_dir = Path(args.trace_dir) / (f"{impl}-{compile_mode or UNCOMPILED}" if several else impl)
                trace_dir.mkdir(parents=True, exist_ok=True)
            prof = _profiler(args, model, backend, args.mode, run_id=run_id, metadata=extra, trace_dir=trace_dir)
            progress.update(task, description=f"{impl}{label}: profiling")
            with prof:
                steps_s = _run_steps(prof, runner, inputs, backward, args.steps, advance=lambda: progress.advance(task))
                after_steps = time.perf_counter()
            stopped = time.perf_counter()  # the recorder's own stop (torch.profiler: stop and write its trace)
            progress.update(task, description=f"{impl}{label}: attributing")
            stats = prof.get_stats()
            # what the user waits for beyond the steps: stopping the recorder, reading and attributing its trace
            post_s = time.perf_counter() - after_steps
            timing[impl] = {"profiled_steps_s": round(steps_s, 4), "postprocess_s": round(post_s, 4),
                            "recorder_stop_s": round(stopped - after_steps, 4), "read_attribute_s": round(post_s - (stopped - after_steps), 4)}
            console.print(f"{impl}{label}: {args.steps} profiled steps {steps_s:.2f} s; stop {stopped - after_steps:.2f} s, "
                          f"read and attribute {post_s - (stopped - after_steps):.2f} s ({100 * post_s / steps_s:.0f} % of the steps)",
                          highlight=False, soft_wrap=True)
            if args.mode == "head" and not args.no_layer_pair:
                progress.update(task, description=f"{impl}{label}: paired layer mode")
                stats["layers"] = with_split_cost(stats["layers"], _paired_layer_mode(args, model, runner, inputs, backward, backend,
                                                                                      compile_mode, impl, extra))
            for name in ("kernels", "ranges", "layers", "heads", "steps"):
                collected.setdefault(name, []).append(stats[name])
            meta = prof.run_metadata()
            collected.setdefault("runs", []).append(runs_row(meta))
            metadata = metadata or meta
            progress.update(task, description=f"{impl}{label}: done")
    tables = {name: pd.concat(frames, ignore_index=True) for name, frames in collected.items()}
    with_findings(tables)  # over every implementation of the run: a slower one is named against a faster one
    metadata = {**metadata, "implementations": impls, "timing": timing}
    metadata.pop("implementation", None)
    out = dataset.write_run(args.out, run_id, tables, metadata, append=append, force=force)
    console_report.print_summary(tables["layers"], tables["heads"], out, console=terminal.console(), kernels=tables["kernels"],
                                 steps=tables["steps"], findings=tables["findings"], collectives=tables.get("collectives"))
    return out



def _profiler(args, model, backend: str, mode: str, **kw):
    """The AttentionProfiler of a profiled run (and of head mode's layer-mode pair): strict, PM sampling as asked."""
    from headcount.api import AttentionProfiler  # torch: imported only when a model is profiled

    return AttentionProfiler(model, mode=mode, backend=backend, strict=True, pm_sampling=not args.no_pm_sampling,
                             pm_interval_ns=args.pm_interval_ns, **kw)


def _run_steps(prof, runner, inputs, backward: bool, steps: int, advance=None) -> float:
    """``steps`` numbered steps inside ``prof`` (entered by the caller); returns the seconds they took."""
    total = 0.0
    for i in range(steps):
        t = time.perf_counter()
        with prof.step(i):
            _step(runner, inputs, backward)
        total += time.perf_counter() - t
        if advance is not None:
            advance()
    return total


def _paired_layer_mode(args, model, runner, inputs, backward: bool, backend: str, compile_mode, impl: str, extra: dict):
    """Head mode's reference: the same steps of the same model and inputs in layer mode (fused), profiled
    the same way but kept out of the report; returns its ``layers`` table, which
    :func:`headcount.derive.aggregate.with_split_cost` sets the head-mode layers against."""
    from headcount.api import AttentionTagger  # the tagger, through the API (cli never imports tagging)

    _warm_up(runner, inputs, backward, impl, AttentionTagger([model], mode="layer") if compile_mode else None)
    prof = _profiler(args, model, backend, "layer", metadata=extra)
    with prof:
        _run_steps(prof, runner, inputs, backward, args.steps)
    return prof.get_stats()["layers"]
