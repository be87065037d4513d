"""``headcount run``'s hook in the profiled program (see headcount/wrap/child.py).

The launcher puts this folder first on ``PYTHONPATH``. Python imports the
first ``sitecustomize`` it finds, so the one this file hides (a
distribution's, a virtual environment's) is run first, then headcount's
child session is installed. Nothing here may break the user's program.
"""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_headcount_hidden_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


def _notice(text: str) -> None:
    try:
        from headcount.common.errors import notice
    except Exception:  # noqa: BLE001 - headcount itself cannot be imported: say it plainly
        print(f"headcount: {text}", file=sys.stderr, flush=True)
        return
    notice(text)


try:
    _chain()
except Exception as exc:  # noqa: BLE001
    _notice(f"the sitecustomize that headcount's hides failed: {type(exc).__name__}: {exc}")

try:
    from headcount.wrap import child as _child

    _child.install()
except Exception as exc:  # noqa: BLE001
    _notice(f"auto-tagging not installed in process {os.getpid()}: {type(exc).__name__}: {exc}")
