"""Run the profiled program for ``headcount run``: its environment (the
auto-tagging hook, the session's options) and the process itself.

The program's output is passed through line by line (nothing is swallowed)
while lines that NVIDIA's tools write (``==ERROR==``, ``==WARNING==``) are
kept for :mod:`headcount.collector.nvidia_tools` to read. Ctrl-C is passed to
the program, whose session then flushes what it recorded; a second Ctrl-C
stops it at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import headcount
from headcount.errors import notice
from headcount.wrap.child import ENV_PREFIX

AUTOTAG_DIR = Path(__file__).resolve().parent / "autotag"


def child_env(raw_dir: Path, backend: str, mode: str, steps: str = "", tag_sdpa: bool = False, capture: bool = False,
              pm_sampling: bool = True, pm_interval_ns: int | None = None, base: dict | None = None) -> dict:
    """The environment of the profiled program: headcount's hook first on
    ``PYTHONPATH`` (and headcount itself, should the program's Python not
    have it installed), the session's options in ``HEADCOUNT_RUN_*``."""
    env = dict(os.environ if base is None else base)
    package_root = str(Path(headcount.__file__).resolve().parent.parent)
    paths = [str(AUTOTAG_DIR), package_root]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update({
        ENV_PREFIX + "DIR": str(raw_dir), ENV_PREFIX + "BACKEND": backend, ENV_PREFIX + "MODE": mode,
        ENV_PREFIX + "STEPS": steps, ENV_PREFIX + "TAG_SDPA": "1" if tag_sdpa else "0",
        ENV_PREFIX + "CAPTURE": "1" if capture else "0", ENV_PREFIX + "PM": "1" if pm_sampling else "0",
    })
    if pm_interval_ns:
        env[ENV_PREFIX + "PM_INTERVAL_NS"] = str(int(pm_interval_ns))
    if backend == "cupti" and not env.get("NVTX_INJECTION64_PATH") and env.get("HEADCOUNT_NVTX_INJECTION") != "0":
        from headcount.collector.cupti_source import injection_library

        lib = injection_library()  # set before the program's first NVTX call: its NVTX ranges become marker records
        if lib:
            env["NVTX_INJECTION64_PATH"] = lib
    return env


def _pump(stream, sink, keep: list[str], route=None) -> None:
    for line in iter(stream.readline, ""):
        out = sink if route is None else route(line, sink)
        if out is not None:
            out.write(line)
            out.flush()
        if line.startswith("==") and len(keep) < 2000:
            keep.append(line.rstrip("\n"))
    stream.close()


def run(argv: list[str], env: dict, route=None) -> tuple[int, list[str]]:
    """Run ``argv``; returns (exit status, the tool lines it printed).

    Args:
        route: where each line of the command's stdout goes: ``route(line,
            sys.stdout)`` returns the stream to write it to, or ``None`` to
            drop it (a wrapper's tool writes its own lines to stdout among
            the program's; see :meth:`headcount.wrap.tools.Wrapper.stdout_route`).

    Raises:
        FileNotFoundError: ``argv[0]`` does not exist (the caller words it).
    """
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            errors="replace")
    kept: list[str] = []
    threads = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, kept, route), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, kept), daemon=True)]
    for t in threads:
        t.start()
    interrupts = []

    def forward(signum, frame):
        interrupts.append(signum)
        if len(interrupts) == 1:
            notice("interrupt passed to the program; it flushes what it recorded (Ctrl-C again to kill it)")
            proc.send_signal(signal.SIGINT)
        else:
            proc.kill()

    previous = signal.signal(signal.SIGINT, forward) if threading.current_thread() is threading.main_thread() else None
    try:
        status = proc.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        for t in threads:
            t.join(timeout=10)
    return status, kept
