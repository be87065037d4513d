"""``headcount doctor``: what works on this machine, before anything runs."""

from __future__ import annotations

import json

from rich.table import Table
from rich.text import Text

from headcount.build import sources
from headcount.machine import doctor
from headcount.reports import terminal

_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "info": "cyan"}


def add_parser(subparsers):
    p = subparsers.add_parser(
        "doctor",
        help="check GPU, driver, CUPTI, counters permission and Nsight tools",
        description="Report what each backend needs and whether this machine has it: GPU and driver (CUDA 13.0+ for "
        "cupti-python), cupti-python and libcupti versions, CUPTI already held by another profiler, performance "
        "counters permission (ERR_NVGPUCTRPERM), NVTX injection, torch.profiler's own PM sampling (torch 2.15+: Kineto's or "
        "Cuspy's), nsys and ncu versions; then the recording routes this environment has and the one to use.",
    )
    p.add_argument("--backend", choices=tuple(sources.RECORDERS), default=None,
                   help="exit with status 1 when this backend cannot run here")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    checks = doctor.run_checks()
    verdict = {b: doctor.usable(checks, b) for b in ("torch", "cupti")}
    available = doctor.routes(checks)
    advice = doctor.recommended(available)
    if args.json:
        print(json.dumps({"checks": [c.as_dict() for c in checks], "usable": verdict, "routes": available,
                          "recommended": advice}, indent=2))
    else:
        table = Table(show_header=True, header_style="bold")
        for col in ("check", "status", "detail", "what to do"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.name, Text(c.status, style=_STYLE[c.status]), c.detail, c.hint or "")
        console = terminal.console()
        console.print(table)
        console.print("backends: " + ", ".join(f"{b} {'usable' if ok else 'NOT usable'}" for b, ok in verdict.items()))
        console.print("routes here: " + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in available.items()))
        console.print(f"recommended: {advice}")
    if args.backend and not verdict[args.backend]:
        return 1
    return 0
