"""Stopped at any point (issue 58): SIGTERM (``kill``, ``timeout``, a batch scheduler), SIGINT (Ctrl-C, to the whole
foreground process group as a terminal sends it) and SIGHUP (a closed terminal, to the whole group) at ten points of a
multi-file ``headcount parse`` with worker processes, and of ``headcount run``. Each point is a line of the command's
own output (never a wall-clock delay). After each: the exit status is 128 + the signal (or 0 where the command had
finished), no process of the command's session runs, and the report folder holds exactly what it held before, or the
finished report, with no staging folder, lock or journal beside it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from headcount.wrap.launcher import running

ROOT = Path(__file__).resolve().parent.parent
KINETO = Path(__file__).resolve().parent / "fixtures" / "kineto"
WORKLOADS = Path(__file__).resolve().parent / "workloads"
TRACES = [KINETO / name for name in (
    "h100_bert-small_sdpa_kineto.json.gz", "a100_event_sync_3streams_kineto.json.gz", "h100_qwen1.5-0.5b_kineto.json.gz",
    "mi300x_vllm_piecewise_kineto.json.gz", "a100_ddp_rank0of2_nccl_annotations_kineto.json.gz",
    "b200_vllm_gpt-oss_kineto.json.gz")]
BEFORE = KINETO / "mi300x_vllm_decode_full_graph_kineto.json.gz"  # what an appended-to report held before
STATUS = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGHUP: 129}


def _send(proc: subprocess.Popen, sig: int) -> None:
    """As each signal comes in life: SIGTERM to headcount alone (``kill``, ``timeout``), SIGINT and SIGHUP to its
    whole process group (a terminal's Ctrl-C; a closed terminal's hangup, which the shell passes to its jobs)."""
    if sig == signal.SIGTERM:
        os.kill(proc.pid, sig)
    else:
        os.killpg(proc.pid, sig)


def _stop_at(args: list[str], line_no: int, sig: int, env: dict | None = None, after: str | None = None) -> tuple[int, str]:
    """Start ``headcount args`` as a terminal does (leader of its own session and process group), send ``sig`` once
    it has printed ``line_no`` lines (or a line starting with ``after``); its exit status and output. Fails if it
    never printed that many (that line)."""
    proc = subprocess.Popen([sys.executable, "-m", "headcount.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=ROOT, env=env)
    lines, sent = [], False
    for line in proc.stdout:
        lines.append(line)
        if len(lines) == line_no or (after is not None and line.startswith(after)):
            _send(proc, sig)
            sent = True
            break
    rest = proc.stdout.read()
    status = proc.wait(timeout=300)
    assert sent, f"the point never came ({len(lines)} lines):\n" + "".join(lines)
    _assert_nothing_left(proc.pid)
    return status, "".join(lines) + rest


def _assert_nothing_left(sid: int) -> None:
    """No process of the command's session runs (its workers, the program ``run`` started, their helpers). A process
    the kernel is still tearing down may show for a moment: looked at until it is gone, at most a minute."""
    for _ in range(600):
        left = running(sid=sid)
        if not left:
            return
        time.sleep(0.1)
    pytest.fail(f"processes of headcount's session still running: {left}")


def _files(out: Path) -> dict[str, str]:
    """Every file under ``out`` (hidden ones too) → the hash of its bytes."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}


def _assert_finished_or_as_before(out: Path, before: dict[str, str] | None, runs: int) -> bool:
    """``out`` holds what it held before (nothing: it does not exist), or the finished report: every run listed, every
    file it held before unchanged, nothing of a writer's own left beside it. True: the finished report."""
    if not out.exists() or _files(out) == (before or {}):
        assert before is None or _files(out) == before
        return False
    hidden = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    assert not hidden, f"left in the report: {hidden}"
    marker = json.loads((out / "headcount.json").read_text())
    assert len(marker["runs"]) == runs and len(pd.read_parquet(out / "runs")) == runs
    now = _files(out)
    assert all(now.get(name) == digest for name, digest in (before or {}).items() if name != "headcount.json")
    return True


# (lines printed before the signal, the signal, whether the parse appends to a report made before)
PARSE_POINTS = [(1, signal.SIGTERM, False), (3, signal.SIGINT, True), (5, signal.SIGHUP, False), (7, signal.SIGTERM, True),
                (9, signal.SIGINT, False), (11, signal.SIGHUP, True), (13, signal.SIGTERM, False), (16, signal.SIGINT, True),
                (21, signal.SIGHUP, False), (22, signal.SIGTERM, True)]


@pytest.mark.parametrize("line_no, sig, append", PARSE_POINTS)
def test_a_multi_file_parse_stopped_at_any_point_leaves_nothing_running_or_behind(tmp_path, line_no, sig, append):
    """Six real torch.profiler traces parsed by two worker processes, stopped after the ``line_no``-th line of its
    output: 22 lines in all, "reading …" first, the last file's "staged" 21st (the commit follows), "Report: …" last
    (the report is written: the command stops with it, or has ended)."""
    out = tmp_path / "report"
    before = None
    if append:
        assert subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(BEFORE), "-o", str(out)], cwd=ROOT,
                              capture_output=True).returncode == 0
        before = _files(out)
    args = ["parse", *map(str, TRACES), "-o", str(out), "--jobs", "2", *(["--append"] if append else [])]
    status, output = _stop_at(args, line_no, sig)
    finished = _assert_finished_or_as_before(out, before, len(TRACES) + (1 if append else 0))
    assert status in (STATUS[sig], 0) if finished else status == STATUS[sig], output
    assert "Traceback" not in output and "Process ForkProcess" not in output, output
    if status == STATUS[sig]:
        said = output.strip().splitlines()[-1]
        assert said.startswith("headcount: interrupted" if sig == signal.SIGINT else
                               f"headcount: stopped by {signal.Signals(sig).name}"), output
        assert ("the report was written first" in said) == finished, output


def test_a_stale_staging_folder_of_a_killed_parse_is_removed_by_the_next_command(tmp_path):
    """A parse killed outright (SIGKILL: no handler runs) leaves its staging folder; its workers die with it (the
    kernel ends them: ``PR_SET_PDEATHSIG``). The next command on the report removes the folder, says so, and writes."""
    out = tmp_path / "report"
    assert subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(BEFORE), "-o", str(out)], cwd=ROOT,
                          capture_output=True).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "headcount.cli.main", "parse", *map(str, TRACES), "-o", str(out),
                             "--jobs", "2", "--append"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=ROOT)
    for line in proc.stdout:
        if "staged" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.stdout.read()
    assert proc.wait(timeout=300) == -signal.SIGKILL
    _assert_nothing_left(proc.pid)  # the workers died with their parent
    assert list(out.glob(".staging-*"))
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(TRACES[0]), "-o", str(out), "--append"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "staging folder" in done.stderr and "a stopped headcount left" in done.stderr
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert len(json.loads((out / "headcount.json").read_text())["runs"]) == 2


# (the program's step after which the signal comes, the signal)
RUN_POINTS = [(0, signal.SIGTERM), (1, signal.SIGHUP), (2, signal.SIGINT), (3, signal.SIGTERM), (4, signal.SIGHUP),
              (5, signal.SIGINT), (6, signal.SIGTERM), (7, signal.SIGHUP), (8, signal.SIGINT), (9, signal.SIGTERM)]


def _run_env() -> dict:
    return {**os.environ, "HEADCOUNT_CUPTI_FACTORY": "cupti_replay:factory",
            "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{WORKLOADS}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize("step, sig", RUN_POINTS)
def test_a_run_stopped_at_any_step_keeps_what_was_recorded_and_leaves_nothing_running(tmp_path, step, sig):
    """``headcount run --backend cupti`` of a training loop (on tests/cupti_replay.py's stand-in for the GPU), stopped
    after the program printed ``step N``: the program is stopped as by Ctrl-C, its records are flushed, the report holds
    the steps recorded before the signal, marked incomplete; exit 128 + the signal; nothing left running."""
    out = tmp_path / "out"
    args = ["run", "--backend", "cupti", "-o", str(out), "--", sys.executable, str(WORKLOADS / "replayed_gpu_training.py"),
            "100000"]
    proc = subprocess.Popen([sys.executable, "-m", "headcount.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=ROOT, env=_run_env())
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == f"step {step}":
            _send(proc, sig)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=300) == STATUS[sig], "".join(seen[-20:]) + rest
    _assert_nothing_left(proc.pid)
    assert "Process ForkProcess" not in rest, rest  # the program's own KeyboardInterrupt traceback is its own to print
    runs = pd.read_parquet(out / "runs")
    assert runs["complete"].tolist() == [False]
    assert set(pd.read_parquet(out / "kernels")["step"].dropna().astype(int)) >= set(range(step + 1))
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_a_lock_left_by_a_killed_writer_is_removed_by_the_next_command(tmp_path):
    """A writer SIGKILLed while it held the report's lock leaves the lock file (it could not remove it); the next
    command that opens the report (a query) finds it unheld, removes it and says so. A lock held by a live process is
    left alone, and the query does not wait for it."""
    from headcount.store.dataset import LOCK

    out = tmp_path / "out"
    raw = ROOT / "tests" / "fixtures" / "ncu" / "rtx2080ti_two_kernels.raw.C.csv"
    assert subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(raw), "-o", str(out)], cwd=ROOT,
                          capture_output=True).returncode == 0
    hold = ("import fcntl, os, signal, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, f'{os.getpid()}\\n'.encode())\nprint('held', flush=True)\n")
    query = [sys.executable, "-m", "headcount.cli.main", "query", str(out), "SELECT count(*) AS n FROM runs"]
    live = subprocess.Popen([sys.executable, "-c", hold + "sys.stdin.read()\n", str(out / LOCK)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline() == "held\n"
        done = subprocess.run(query, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "removed the lock" not in done.stderr, done.stderr
        assert (out / LOCK).exists()  # a live writer's
    finally:
        live.communicate("", timeout=60)
    (out / LOCK).unlink()
    killed = subprocess.Popen([sys.executable, "-c", hold + "os.kill(os.getpid(), signal.SIGKILL)\n", str(out / LOCK)],
                              stdout=subprocess.PIPE, text=True)
    assert killed.wait(timeout=60) == -signal.SIGKILL and (out / LOCK).exists()
    done = subprocess.run(query, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{out}: removed the lock a stopped headcount left (PID {killed.pid}, no longer holding it)" in done.stderr
    assert not (out / LOCK).exists()


@pytest.fixture(scope="module")
def big_report(tmp_path_factory) -> Path:
    """A report of a 50 MB trace (ten copies of the real H100 step, ``benchmarks/kineto_scale.build``): 60,000
    rows of ranges and kernels, an export long enough to show its progress lines (the signal points)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kineto_scale

    folder = tmp_path_factory.mktemp("big")
    kineto_scale.build(folder / "trace.json", 10)
    done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(folder / "trace.json"), "-o",
                           str(folder / "report")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_an_export_stopped_mid_write_leaves_no_trace(tmp_path, big_report, sig):
    """``headcount export`` stopped after its third progress line (a fifth of the rows written): exit 128 + the
    signal, the one line, and no trace (nor its temporary file, nor its folder) in the output directory."""
    traces = tmp_path / "traces"
    status, output = _stop_at(["export", str(big_report / "report"), "-o", str(traces)], 3, sig)
    assert status == STATUS[sig], output
    assert f"stopped by {signal.Signals(sig).name}" in output or "interrupted" in output, output
    assert "Traceback" not in output
    assert not traces.exists() or not list(traces.rglob("*")), sorted(map(str, traces.rglob("*")))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_diff_of_recordings_stopped_while_reading_leaves_no_temporary_report(tmp_path, big_report, sig):
    """``headcount diff A B`` of two recordings, stopped after its third progress line while it reads A: exit
    128 + the signal and its temporary report removed (TMPDIR empty afterwards)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    trace = str(big_report / "trace.json")
    status, output = _stop_at(["diff", trace, trace], 3, sig, env={**os.environ, "TMPDIR": str(tmp)})
    assert status == STATUS[sig], output
    assert "Traceback" not in output
    assert not list(tmp.iterdir()), sorted(p.name for p in tmp.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_parse_on_ray_stopped_cancels_its_tasks_and_writes_nothing(tmp_path, sig):
    """``--executor ray`` (a real local Ray, started by the command) stopped by SIGTERM (to headcount) or Ctrl-C (to
    the group, Ray's processes too) once the first file is staged: the tasks left are cancelled, Ray is shut down,
    exit 128 + the signal, nothing written, no process of the session left (Ray's own processes included). Ray
    installs its own SIGTERM handler, which ended the command at once (exit 15) before headcount put its own back."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    status, output = _stop_at(["parse", *map(str, TRACES), "-o", str(out), "--executor", "ray"], 0, sig, env=env,
                              after="[1/6]")
    assert status == STATUS[sig], output
    assert "no report was written" in output and "Traceback" not in output, output
    assert not out.exists() or not list(out.iterdir()), sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_profile_stopped_while_it_profiles_writes_nothing(tmp_path, sig):
    """``headcount profile`` (the embedded default on CPU) stopped once it has said which model it profiles: exit
    128 + the signal, the one line, no report folder, nothing of headcount's left running."""
    out = tmp_path / "out"
    status, output = _stop_at(["profile", "--steps", "50", "-o", str(out)], 0, sig, after="model: default")
    assert status == STATUS[sig], output
    assert "no report was written" in output and "Traceback" not in output, output
    assert not out.exists() or not list(out.iterdir())


def _blocked_in(thread) -> set[int]:
    """The signals ``thread`` blocks, from the kernel's own account of it (Linux ``/proc``)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_a_signal_waits_out_a_deferred_block_while_helper_threads_run(tmp_path, monkeypatch):
    """A signal the kernel gives a helper thread runs its handler in the main thread at once, inside a deferred block
    (a claim or commit) too: the threads of the parse (the inputs' hashing ahead, the progress meter) start with the
    stopping signals blocked, so the main thread takes them, once the block is done (in a process of its own: no
    other thread there)."""
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (8 << 20))
    script = f"""
import os, signal, threading, time
from headcount.common import stopping
from headcount.reports.progress_view import Meter
from headcount.store import input_digest

class Console:
    is_terminal = False
    def print(self, *args, **kwargs):
        pass

input_digest.AHEAD_CHUNK_BYTES = 16  # 8 MiB in 16-byte chunks: still running whatever the machine
ahead = input_digest.hash_ahead([{str(big)!r}])
meter = Meter(Console(), [200 << 20], "big.json")
meter._start()
helpers = [t for t in threading.enumerate() if t.name in ("headcount-hash-ahead", "headcount-progress")]
for thread in helpers:
    status = open(f"/proc/self/task/{{thread.native_id}}/status").read()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    print(thread.name, all(mask >> (n - 1) & 1 for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)))
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(threading.current_thread().name))
with stopping.deferred():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    print("inside", got)
print("after", got)
ahead.stop()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:2]) == ["headcount-hash-ahead True", "headcount-progress True"]
    assert lines[2:] == ["inside []", "after ['MainThread']"]
