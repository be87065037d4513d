"""``headcount cupti``: the cupti source's own CUPTI beside the environment (:mod:`headcount.collector.cupti_home`)."""

from __future__ import annotations

import json
import subprocess
import sys

from headcount.collector import cupti_home
from headcount.reports import terminal

# run in a fresh process after an install: what `import cupti` now takes, as the cupti source will
_CONFIRM = """
import json
from headcount.collector import cupti_home, cupti_source
doc = {"folder": str(cupti_home.activate() or ""), "note": cupti_home.note()}
try:
    cupti = cupti_source.load_cupti()
    import cupti.pm_sampling  # noqa: F401
    doc["bindings"] = cupti_home.bindings_need()[0]
    doc["pm_sampling_module"] = True
except Exception as exc:
    doc["error"] = f"{type(exc).__name__}: {exc}"
lib = cupti_source.libcupti_path()
doc.update(libcupti=lib, libcupti_release=cupti_home.library_release(lib), gap=cupti_source.pm_sampling_gap(lib))
try:
    cupti_source.require()
    doc["cupti_answers"] = True
except Exception as exc:
    doc["cupti_answers"] = False
    doc["driver"] = str(exc).splitlines()[0]
print(json.dumps(doc))
"""


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


def confirm() -> dict:
    """What a fresh Python process of this environment loads for the cupti source (see ``_CONFIRM``)."""
    done = subprocess.run([sys.executable, "-c", _CONFIRM], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def run(args) -> int:
    console = terminal.console()
    folder = cupti_home.home()
    if args.action == "install":
        console.print(f"installing {' '.join(cupti_home.PACKAGES)} into {folder} (pip install --no-deps --target) …")
        cupti_home.install(folder)
    doc = {"folder": str(folder), "holds": cupti_home.installed(folder), **confirm()}
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
