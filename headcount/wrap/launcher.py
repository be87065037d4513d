"""Run the profiled program for ``headcount run``: its environment (the
auto-tagging hook, the session's options) and the process itself.

The program's output is passed through line by line (nothing is swallowed)
while lines that NVIDIA's tools write (``==ERROR==``, ``==WARNING==``) are
kept for :mod:`headcount.wrap.nvidia_tools` to read. The program runs in
its own process group: Ctrl-C is passed to that group once, as a terminal
would, so the recording tool writes what it recorded and the program's
session flushes its call log; a second Ctrl-C kills the group at once
(:func:`run`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from headcount.common.errors import notice
from headcount.wrap.child import ENV_PREFIX

AUTOTAG_DIR = Path(__file__).resolve().parent / "autotag"


def child_env(raw_dir: Path, backend: str, mode: str, steps: str = "", tag_sdpa: bool = False, capture: bool = False,
              pm_sampling: bool = True, pm_interval_ns: int | None = None, base: dict | None = None) -> dict:
    """The environment of the profiled program: headcount's hook first on
    ``PYTHONPATH`` (and headcount itself, should the program's Python not
    have it installed), the session's options in ``HEADCOUNT_RUN_*``."""
    env = dict(os.environ if base is None else base)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds the headcount package
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
        from headcount.collector.cupti_load import injection_library

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


@dataclass
class Ran:
    """How the program ended (:func:`run`).

    Attributes:
        status: its exit status (the recording tool's, where one wraps it).
        tool_lines: the lines NVIDIA's tools printed (``==ERROR==``, ``==WARNING==``).
        interrupted: a Ctrl-C (or SIGTERM, SIGHUP) reached headcount while it ran (passed on once, as a terminal would).
        killed: a second Ctrl-C killed it and its tool at once: whatever the tool had not written is lost.
        held: the Ctrl-C came once the program had ended, while its tool wrote its report: it was held
            until the tool finished (the report is whole; the user asked headcount to stop there).
    """

    status: int
    tool_lines: list[str]
    interrupted: bool = False
    killed: bool = False
    held: bool = False
    signum: int = 0

    @property
    def stopped_status(self) -> int:
        """The exit status of a command this run's first signal stopped: 128 + its number (130 for Ctrl-C)."""
        return 128 + (self.signum or signal.SIGINT)


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each passed to the program as one interrupt
GROUP_WAIT_S = 30.0  # after the tool exits, how long its helpers (nsys's agent) may take to end before they are killed


def run(argv: list[str], env: dict, route=None) -> Ran:
    """Run ``argv`` in its own process group and wait for the whole group to end.

    Ctrl-C (SIGINT) then reaches headcount alone, which passes one SIGINT to the
    program's whole group, exactly as a terminal does to a command run on its
    own: nsys then stops the program and writes its report, the program's
    session flushes what it recorded. The interrupt is held while the tool
    writes its report after the program ended (``route.program_ended()``):
    a SIGINT there would make nsys drop it. A second Ctrl-C kills the group at
    once. Helpers that outlive the tool (nsys's agent) are waited for, at most
    :data:`GROUP_WAIT_S`, then killed: no process headcount started outlives it.

    Args:
        route: where each line of the command's stdout goes: ``route(line,
            sys.stdout)`` returns the stream to write it to, or ``None`` to
            drop it (a wrapper's tool writes its own lines to stdout among
            the program's; see :meth:`headcount.wrap.wrappers.Wrapper.stdout_route`).

    Raises:
        FileNotFoundError: ``argv[0]`` does not exist (the caller words it).
    """
    # a process group that is not the terminal's foreground one would be stopped (SIGTTIN) by a read of the terminal:
    # the program reads no terminal (a pipe or a file given as stdin is passed on)
    stdin = subprocess.DEVNULL if _is_terminal(sys.stdin) else None
    proc = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            errors="replace", process_group=0)
    kept: list[str] = []
    threads = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, kept, route), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, kept), daemon=True)]
    for t in threads:
        t.start()
    ran = Ran(0, kept)
    ended = getattr(route, "program_ended", lambda: False)

    def forward(signum, frame):
        ran.signum = ran.signum or signum
        if ran.interrupted and not ran.killed:
            ran.killed = True
            notice("second interrupt: the program and its recorder are killed")
            _signal_group(proc.pid, signal.SIGKILL)  # its detached helpers are killed once it is gone (_wait_group)
            return
        ran.interrupted = True
        if ended():
            ran.held = True
            notice("the program has ended and its recorder is writing its report: it is left to finish "
                   "(Ctrl-C again to kill it; the report is then lost)")
            return
        notice("interrupt passed to the program: it stops, and what it recorded is written (Ctrl-C again to kill it at once)")
        _signal_group(proc.pid, signal.SIGINT)

    # SIGTERM (kill, timeout, a scheduler) and SIGHUP (a closed terminal) stop the program as Ctrl-C does: what
    # it recorded is written, marked incomplete; one ignored already (SIGHUP under nohup) stays ignored
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in STOPPING if signal.getsignal(sig) is not signal.SIG_IGN} if main else {}
    try:
        ran.status = proc.wait()
        _wait_group(proc.pid, 0.0 if ran.killed else GROUP_WAIT_S)
    except BaseException:
        _signal_group(proc.pid, signal.SIGKILL)  # headcount itself is going: nothing it started stays behind
        proc.wait()
        _wait_group(proc.pid, 0.0)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for t in threads:
            t.join(timeout=10)
    return ran


def _is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def running(pgid: int | None = None, sid: int | None = None) -> list[int]:
    """The processes (not zombies awaiting their parent) of process group ``pgid`` and/or session ``sid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _, group, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if state != "Z" and (pgid is None or int(group) == pgid) and (sid is None or int(session) == sid):
            found.append(int(entry.name))
    return found


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still running (zombies awaiting their parent excepted)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(running(pgid=pgid))  # killpg also reaches zombies


def with_argument(argument: bytes) -> list[int]:
    """The processes one of whose command-line arguments is ``argument``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if argument in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def detached_helpers(tool_pid: int) -> list[int]:
    """Processes a tool started in sessions of their own: nsys's agent (``nsys --start-agent
    --session-name=profile-<nsys's pid>``) leaves the tool's process group, and outlives an nsys that was killed."""
    return with_argument(f"--session-name=profile-{tool_pid}".encode())


def _wait_group(pgid: int, timeout_s: float) -> None:
    """Wait until no process of group ``pgid`` runs, nor a helper the tool detached (:func:`detached_helpers`), at
    most ``timeout_s``; then kill what is left."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) or detached_helpers(pgid):
        if time.monotonic() > deadline:
            _signal_group(pgid, signal.SIGKILL)
            for pid in detached_helpers(pgid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        time.sleep(0.05)
