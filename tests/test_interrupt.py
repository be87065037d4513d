"""Ctrl-C keeps what was recorded (issue 33): ``headcount run`` under the real nsys 2023.4.4, interrupted the way a
terminal does it (SIGINT to the whole foreground process group), synchronised on the program's output, never on
wall-clock time; and reports that follow the user's umask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest
from nsight import nsight_bin

from headcount.wrap.launcher import group_alive, running, with_argument

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"
KINETO = Path(__file__).resolve().parent / "fixtures" / "kineto"


def _env() -> dict:
    tools = Path(nsight_bin("nsys")).parent
    return {**os.environ, "PATH": f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{WORKLOADS}{os.pathsep}{ROOT}"}


def _headcount(args: list[str]) -> subprocess.Popen:
    """``headcount …`` as a terminal starts it: the leader of its own foreground process group."""
    return subprocess.Popen([sys.executable, "-m", "headcount.cli.main", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=_env(), cwd=ROOT)


def _interrupt_when(proc: subprocess.Popen, seen) -> tuple[list[str], str]:
    """Read ``proc``'s output until a line satisfies ``seen``; then Ctrl-C (SIGINT to its process group); the rest."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if seen(line):
            os.killpg(proc.pid, signal.SIGINT)
            break
    else:
        pytest.fail("the line to interrupt at never came:\n" + "".join(lines[-40:]))
    return lines, proc.stdout.read()


def _nothing_left(sid: int) -> bool:
    """No process of the command's session is running: headcount (the session's leader, started as a terminal starts
    it), nor anything it started, whatever process group it put it in (nsys, its agent, the program, nsys export)."""
    assert not group_alive(sid)
    return not running(sid=sid)


def _agents() -> set[int]:
    """nsys agents running (``nsys --start-agent``): they leave the tool's session, and one outlived every killed nsys."""
    return set(with_argument(b"--start-agent"))


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    return {name: ds.dataset(out / name, partitioning="hive").to_table().to_pandas().drop(columns=["run_id"])
            for name in ("ranges", "kernels", "layers", "heads", "steps", "findings")}


def test_an_interrupted_nsys_run_keeps_its_recording(tmp_path):
    """The trial of issue 33: a training loop under ``headcount run --backend nsys``, Ctrl-C after it printed step 5.
    The report holds the run, marked incomplete, with the steps before the interrupt and a notice saying so; the exit
    status is 130; nothing headcount started is left running; and ``headcount parse`` of the kept raw report (with the
    call logs beside it) gives the same tables."""
    out = tmp_path / "out"
    proc = _headcount(["run", "--backend", "nsys", "-o", str(out), "--", sys.executable, str(WORKLOADS / "endless_cpu_training.py")])
    before, after = _interrupt_when(proc, lambda line: line.strip() == "step 5")
    assert proc.wait(timeout=300) == 130, "".join(before[-20:]) + after
    assert _nothing_left(proc.pid)
    assert "interrupt passed to the program" in after and "nsys wrote no report" not in after
    runs = pd.read_parquet(out / "runs")
    assert len(runs) == 1 and runs["complete"].tolist() == [False]
    manifest = json.loads(next((out / "manifests").glob("*/run.json")).read_text())
    notice = next(n for n in manifest["notices"] if n.startswith("interrupted: the recording covers"))
    recorded = int(notice.split("covers ")[1].split(" ")[0])
    steps = pd.read_parquet(out / "steps")
    assert recorded == steps["step"].nunique() >= 6  # steps 0-5 were printed before the interrupt
    layers = pd.read_parquet(out / "ranges").query("level == 'layer'")
    assert set(layers["step"].dropna().astype(int)) >= set(range(6)) and layers["flop"].gt(0).all()

    again = tmp_path / "again"
    raw = next((out / "raw").iterdir()) / "run.nsys-rep"
    parse = subprocess.run([sys.executable, "-m", "headcount.cli.main", "parse", str(raw), "-o", str(again)], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert parse.returncode == 0, parse.stderr
    a, b = _tables(out), _tables(again)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_dtype=False, check_categorical=False, obj=name)


def test_an_interrupt_while_nsys_writes_its_report_is_held_and_the_report_kept(tmp_path):
    """Ctrl-C once the program has ended, while nsys writes its report: headcount lets nsys finish (a SIGINT would
    make it drop the report), writes no report of its own, keeps the raw files and prints the one command that makes
    the report from them; that command works; exit 130, nothing left running."""
    out = tmp_path / "out"
    proc = _headcount(["run", "--backend", "nsys", "-o", str(out), "--", sys.executable, str(WORKLOADS / "tiny_cpu_training.py"),
                       "--steps", "2"])
    before, after = _interrupt_when(proc, lambda line: line.startswith("Generating '"))
    assert proc.wait(timeout=300) == 130, after
    assert _nothing_left(proc.pid)
    assert "left to finish" in after and "no report was written" in after
    raw = next((out / "raw").iterdir())
    assert (raw / "run.nsys-rep").exists() and not (out / "headcount.json").exists()
    command = after.split("make the report from them later with: ")[1].split("\n")[0].split()
    assert command[:2] == ["headcount", "parse"] and command[2] == str(raw / "run.nsys-rep")
    parse = subprocess.run([sys.executable, "-m", "headcount.cli.main", *command[1:]], env=_env(), cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert parse.returncode == 0, parse.stderr
    ranges = pd.read_parquet(out / "ranges")
    assert sorted(ranges.query("level == 'layer'")["step"].unique()) == [0, 1]


def test_an_interrupt_while_headcount_reads_the_recording_writes_nothing_and_keeps_it(tmp_path):
    """Ctrl-C while headcount exports and reads the nsys report (after the program and nsys ended): no report and
    nothing staged left, the raw files kept with the command that makes the report, exit 130, no process left (the
    `nsys export` headcount started included)."""
    out = tmp_path / "out"
    proc = _headcount(["run", "--backend", "nsys", "-o", str(out), "--", sys.executable, str(WORKLOADS / "tiny_cpu_training.py"),
                       "--steps", "2"])
    _, after = _interrupt_when(proc, lambda line: line.startswith("reading ") and "exported to SQLite by nsys" in line)
    assert proc.wait(timeout=300) == 130, after
    assert _nothing_left(proc.pid)
    assert "interrupted; no report was written" in after and "make the report from them later with: headcount parse" in after
    assert sorted(p.name for p in out.iterdir()) == ["raw"]
    assert (next((out / "raw").iterdir()) / "run.nsys-rep").exists()


def test_a_second_interrupt_kills_at_once_and_keeps_the_raw_files(tmp_path):
    """A program that ignores Ctrl-C: the first interrupt is passed on (and ignored), the second kills it and its
    recorder at once; no report, the raw folder kept and named, exit 130, nothing left running."""
    out = tmp_path / "out"
    agents = _agents()
    proc = _headcount(["run", "--backend", "nsys", "-o", str(out), "--", sys.executable, str(WORKLOADS / "endless_cpu_training.py"),
                       "--ignore-sigint"])
    before, _ = [], None
    for line in proc.stdout:
        before.append(line)
        if line.strip() == "step 2":
            os.killpg(proc.pid, signal.SIGINT)
        if "interrupt passed to the program" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=300) == 130, rest
    assert _nothing_left(proc.pid)
    assert "killed; no report was written; the raw files are kept in" in rest
    assert not (out / "headcount.json").exists() and list((out / "raw").iterdir())
    assert _agents() <= agents  # the agent of the killed nsys, in a session of its own, was killed too


def test_an_interrupted_cupti_run_keeps_its_records(tmp_path):
    """``--backend cupti`` as far as it runs on a CPU: the program records on tests/cupti_replay.py's stand-in for the
    GPU. Ctrl-C after step 3: the child's session flushes its records at the signal, and the report holds the steps
    recorded before it, marked incomplete, with the notice; exit 130; nothing left running."""
    out = tmp_path / "out"
    env = {"HEADCOUNT_CUPTI_FACTORY": "cupti_replay:factory"}
    proc = subprocess.Popen([sys.executable, "-m", "headcount.cli.main", "run", "--backend", "cupti", "-o", str(out), "--",
                             sys.executable, str(WORKLOADS / "replayed_gpu_training.py"), "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=ROOT,
                            env={**_env(), **env, "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{WORKLOADS}{os.pathsep}{ROOT}"})
    before, after = _interrupt_when(proc, lambda line: line.strip() == "step 3")
    assert proc.wait(timeout=300) == 130, "".join(before[-20:]) + after
    assert _nothing_left(proc.pid)
    runs = pd.read_parquet(out / "runs")
    assert runs["complete"].tolist() == [False]
    kernels = pd.read_parquet(out / "kernels")
    assert set(kernels["step"].dropna().astype(int)) >= {0, 1, 2, 3}
    manifest = json.loads(next((out / "manifests").glob("*/run.json")).read_text())
    assert any(n.startswith("interrupted: the recording covers") for n in manifest["notices"])


def test_an_interrupted_torch_run_keeps_its_trace(tmp_path):
    """``--backend torch``: Ctrl-C after step 3; the KeyboardInterrupt unwinds the program, its session stops
    torch.profiler and writes the trace at exit, and the report holds the steps before the interrupt, marked
    incomplete, with the notice; exit 130; nothing left running."""
    out = tmp_path / "out"
    proc = _headcount(["run", "--backend", "torch", "-o", str(out), "--", sys.executable, str(WORKLOADS / "endless_cpu_training.py")])
    before, after = _interrupt_when(proc, lambda line: line.strip() == "step 3")
    assert proc.wait(timeout=300) == 130, "".join(before[-20:]) + after
    assert _nothing_left(proc.pid)
    runs = pd.read_parquet(out / "runs")
    assert runs["complete"].tolist() == [False] and runs["source"].tolist() == ["torch"]
    layers = pd.read_parquet(out / "ranges").query("level == 'layer'")
    assert set(layers["step"].dropna().astype(int)) >= {0, 1, 2, 3} and layers["flop"].gt(0).all()
    manifest = json.loads(next((out / "manifests").glob("*/run.json")).read_text())
    assert any(n.startswith("interrupted: the recording covers") for n in manifest["notices"])
    assert list(next((out / "raw").iterdir()).glob("torch-*/trace.json"))


@pytest.mark.parametrize("mask, files, dirs", [(0o027, 0o640, 0o750), (0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_report_files_follow_the_umask(tmp_path, mask, files, dirs):
    """Every file of a report (the marker, manifests, Parquet parts, the page, the trace export, the lock) and every
    directory has the mode the user's umask gives: under 027 a colleague in the group reads it and nobody else does;
    under 022 everyone reads it. The atomic renames stay."""
    out = tmp_path / "r"
    previous = os.umask(mask)
    try:
        for args in (["parse", str(KINETO / "h100_bert-small_sdpa_kineto.json.gz"), "-o", str(out)],
                     ["parse", str(KINETO / "h100_qwen1.5-0.5b_kineto.json.gz"), "-o", str(out), "--append"],
                     ["report", str(out)], ["export", str(out)]):
            assert subprocess.run([sys.executable, "-m", "headcount.cli.main", *args], cwd=ROOT, capture_output=True,
                                  timeout=300).returncode == 0
    finally:
        os.umask(previous)
    entries = [out, *out.rglob("*")]
    assert any(p.name == "headcount.json" for p in entries) and any(p.suffix == ".html" for p in entries)
    assert any(p.parent.name == "traces" for p in entries)  # the trace export, written through a temporary file too
    wrong = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in entries
             if (p.stat().st_mode & 0o777) != (dirs if p.is_dir() else files)}
    assert not wrong
