"""``headcount cupti``: the cupti source's own CUPTI beside the environment (:mod:`headcount.collector.cupti_home`,
through :mod:`headcount.machine.doctor`)."""

from __future__ import annotations

import json

from headcount.machine import doctor
from headcount.reports import terminal


def add_parser(subparsers):
    p = subparsers.add_parser(
        "cupti",
        help="install the cupti source's CUPTI beside your torch (PM-sampled DRAM), or show it",
        description="`headcount cupti install` puts cupti-python with PM sampling and the libcupti it declares into "
        "a folder of this environment (pip install --target), never into its packages: your torch and the libcupti it "
        "pins stay, and pip check stays clean. The cupti source then records with them. `headcount cupti` shows "
        "the folder and what this process would load.",
    )
    p.add_argument("action", nargs="?", choices=("install", "show"), default="show")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    console = terminal.console()
    if args.action == "install":
        console.print(f"installing {' '.join(doctor.CUPTI_PACKAGES)} into {doctor.cupti_folder()} (pip install --no-deps --target) …")
        doctor.install_cupti()
    doc = doctor.cupti_state()
    folder = doc["folder"]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        holds = ", ".join(f"{k} {v}" for k, v in sorted(doc["holds"].items())) or "nothing (run `headcount cupti install`)"
        console.print(f"folder: {folder}: {holds}")
        console.print(f"cupti-python loaded: {doc.get('bindings', doc.get('error'))}; PM sampling module: "
                      f"{'yes' if doc.get('pm_sampling_module') else 'no'}")
        console.print(f"libcupti: {doc.get('libcupti')} (nvidia-cuda-cupti {doc.get('libcupti_release') or 'release unknown'})")
        if doc.get("gap"):
            console.print(f"[yellow]PM sampling: {doc['gap']}[/yellow]")
        console.print("CUPTI answers" if doc.get("cupti_answers") else f"CUPTI does not answer here: {doc.get('driver', doc.get('error'))}")
    ok = doc.get("pm_sampling_module") and not doc.get("gap")
    return 0 if ok or args.action == "show" else 1
