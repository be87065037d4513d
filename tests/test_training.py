"""Profiling during training: a real transformers.Trainer on a tiny model on CPU,
and the plain-loop helper; drift of the heads' attention statistics."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch
from conftest import llama_model

from headcount.training import HeadcountCallback, HeadDriftWarning, StepProfiler, drift_table


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=64, seq=16):
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, seq), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_callback_profiles_every_n_steps(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = llama_model("sdpa")
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=24, per_device_train_batch_size=4, learning_rate=5e-3,
                             report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = HeadcountCallback(tmp_path / "out", every=8, drift_threshold=0.0)  # the default queue holds 2 besides the one in hand
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model=model, args=args, train_dataset=_Data(), callbacks=[callback]).train()
    assert callback.profiler.profiled == [0, 8, 16] and not callback.profiler.skipped
    out = tmp_path / "out"
    runs = pd.read_parquet(out / "runs")
    assert len(runs) == 3 and runs["run_id"].str.endswith(("step0000000", "step0000008", "step0000016")).all()
    stats = pd.read_parquet(out / "attention_stats")
    assert sorted(stats["step"].unique()) == [0, 8, 16]
    assert len(stats) == 3 * 2 * 4  # steps × layers × heads
    layers = pd.read_parquet(out / "layers")
    assert set(layers["phase"]) == {"fwd", "bwd"} and layers.groupby("run_id").size().tolist() == [4, 4, 4]
    drift = pd.read_parquet(out / "drift.parquet")
    assert (drift["step"] == 16).all() and (drift["baseline_step"] == 0).all() and len(drift) == 8
    assert drift["change"].abs().gt(0).all()  # training moved every head a little
    alerts = [w for w in caught if issubclass(w.category, HeadDriftWarning)]
    assert len(alerts) == drift["alert"].sum() == 8  # threshold 0: every head, warned once


def test_plain_loop_helper_and_no_alert_under_the_threshold(tmp_path):
    model = llama_model("eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 128, (2, 16))
    sp = StepProfiler(model, tmp_path / "out", every=5, drift_threshold=0.5, queue=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadDriftWarning)
        for step in range(11):
            with sp.step(step):
                model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        sp.close()
    assert sp.profiled == [0, 5, 10]
    assert not sp.drift()["alert"].any()
    # what each window cost the loop, part by part (the GPU check's training.json reports it)
    assert sorted(sp.window_ms) == [0, 5, 10]
    assert all(w["start"] >= 0 and w["stop"] >= 0 and w["handed_over"] >= 0 and w["collector"] == {} for w in sp.window_ms.values())


def test_drift_table_arithmetic():
    history = pd.DataFrame({"step": [0, 0, 10, 10], "layer_name": ["layer.0"] * 4, "layer": [0] * 4, "head": [0, 1, 0, 1],
                            "normalized_entropy": [0.9, 0.5, 0.95, 0.1]})
    table = drift_table(history, threshold=0.2)
    assert table["change"].round(6).tolist() == [0.05, -0.4] and table["alert"].tolist() == [False, True]
    with pytest.raises(ValueError):
        StepProfiler(None, "x", every=0)


def test_a_torch_profiler_schedule_picks_the_profiled_steps(tmp_path):
    model = llama_model("sdpa")
    ids = torch.randint(0, 128, (2, 16))
    sp = StepProfiler(model, tmp_path / "out", attention_stats=False, queue=2,
                      schedule=torch.profiler.schedule(wait=2, warmup=1, active=2, repeat=1))
    for step in range(8):
        with sp.step(step):
            model(input_ids=ids, labels=ids).loss.backward()
    sp.close()
    assert sp.profiled == [3, 4]
    assert pd.read_parquet(tmp_path / "out" / "runs")["run_id"].nunique() == 2


# ---------------------------------------------------------------- windows written off the loop (issue 29)
def _loop(sp, model, steps):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        with sp.step(step):
            model(input_ids=ids, labels=ids).loss.backward()


def test_a_window_whose_worker_fails_or_dies_is_named_and_the_others_are_written(tmp_path, capsys):
    """One window's job raises, at another's the worker process exits: the loop finishes, close() names
    both windows and their causes, and the windows before and after (a fresh worker) are in the report."""
    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, queue=4)
    sp.writer.target = "window_faults:fail_at_2_die_at_4"
    _loop(sp, sp.model, 7)
    sp.close()
    assert sp.profiled == [0, 2, 4, 6] and sorted(sp.writer.written) == [0, 6]
    assert dict(sp.writer.failed) == {2: "RuntimeError: disk full (made up)", 4: "its worker process died (exit code 3)"}
    err = capsys.readouterr().err
    assert "the window of step 2 was not written: RuntimeError: disk full (made up)" in err
    assert "the window of step 4 was not written: its worker process died (exit code 3)" in err
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert sorted(runs["run_id"].str[-7:]) == ["0000000", "0000006"]


def test_the_loop_never_waits_a_full_queue_skips_the_window(tmp_path, capsys):
    """The workers hold their windows until the loop is over (a flag file): with room for one window
    waiting, the idle-priority worker holds the first, the next waits, the one due after it sends the
    waiting one to the worker at low priority (the queue was full) and waits in turn; those due
    after it are skipped with a notice. All three are written at close()."""
    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, queue=1)
    sp.writer.target = "window_faults:wait_for_go"
    _loop(sp, sp.model, 9)
    assert sp.profiled == [0, 2, 4] and sp.skipped == [6, 8]
    if hasattr(__import__("os"), "SCHED_IDLE"):
        assert sp.writer.in_hand == {"idle": 0, "low": 2} and sp.writer.waiting == 1
    assert ("step 6 not profiled: 1 earlier windows are waiting to be written (the loop does not wait for them; "
            "queue= gives more room") in capsys.readouterr().err
    (tmp_path / "go").touch()
    sp.close()
    assert sorted(sp.writer.written) == [0, 2, 4] and not sp.writer.failed
    assert len(pd.read_parquet(tmp_path / "out" / "runs")) == 3
    assert "window of step 4 written" in capsys.readouterr().err


def test_with_writer_priority_normal_one_worker_writes_and_a_full_queue_skips(tmp_path):
    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, queue=1, writer_priority="normal")
    sp.writer.target = "window_faults:wait_for_go"
    assert list(sp.writer.processes) == ["normal"]
    _loop(sp, sp.model, 7)
    assert sp.profiled == [0, 2] and sp.skipped == [4, 6]
    (tmp_path / "go").touch()
    sp.close()
    assert sp.writer.written == [0, 2] and not sp.writer.failed


def _threads_policy(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice value) of each thread of a process."""
    import os

    return {(os.sched_getscheduler(int(t)), os.getpriority(os.PRIO_PROCESS, int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_IDLE"), reason="Linux's idle priority class")
@pytest.mark.parametrize("target", ["hold_while_lowered", "commit_then_hold_while_lowered"])
def test_the_workers_run_at_lowered_priority_and_close_hands_what_they_cannot_write_to_a_normal_one(tmp_path, capsys, target):
    """Every thread of the first worker runs at idle priority, every thread of the second at nice 19 (they
    take little or no CPU time the loop wants); at close() the window waiting goes to the free one, and a
    window either holds without getting CPU time (as on a machine whose cores stay busy) is taken from it
    (the process killed) and written by a worker at normal priority, started then, once: again where the
    lowered one had not committed it, not again where it had (killed between its commit and its answer)."""
    import os
    import time

    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, queue=2)
    sp.writer.target = f"window_faults:{target}"
    workers = sp.writer.processes
    assert list(workers) == ["idle", "low"]
    assert {policy for policy, _ in _threads_policy(workers["idle"].pid)} == {os.SCHED_IDLE}
    assert _threads_policy(workers["low"].pid) == {(os.SCHED_OTHER, 19)}
    _loop(sp, sp.model, 3)
    assert sp.profiled == [0, 2] and not sp.skipped
    if target == "commit_then_hold_while_lowered":  # the idle worker commits its window before it is killed
        deadline = time.monotonic() + 300  # a bound on a loaded machine, not a timing
        while not (tmp_path / "out" / "headcount.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    sp.close()
    assert workers["idle"].returncode == -9 and workers["low"].returncode == -9  # taken away, not waited for
    assert sorted(sp.writer.written) == [0, 2] and not sp.writer.failed
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert sorted(runs["run_id"].str[-7:]) == ["0000000", "0000002"]  # each once
    err = capsys.readouterr().err
    if target == "hold_while_lowered":
        assert sp.writer.written_by == {0: "normal", 2: "normal"}
    else:  # the idle one committed before it was taken back: not written again
        assert sp.writer.written_by[0] == "idle" and "step 0: written by a worker at normal priority" not in err
        # the low one commits at close(), unless taken back first (a loaded machine): once, by either
        assert sp.writer.written_by[2] == "low" or "step 2: written by a worker at normal priority" in err


def test_writer_priority_normal_shares_the_cpu_and_a_wrong_one_is_refused(tmp_path):
    import os

    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, writer_priority="normal")
    assert list(sp.writer.processes) == ["normal"]
    if hasattr(os, "SCHED_IDLE"):
        assert {policy for policy, _ in _threads_policy(sp.writer.processes["normal"].pid)} == {os.SCHED_OTHER}
    sp.close()
    with pytest.raises(ValueError, match="writer_priority='low': pass 'idle'"):
        StepProfiler(llama_model("sdpa"), tmp_path / "out", writer_priority="low")


def test_the_worker_is_a_fresh_process_that_never_imports_torch(tmp_path, capsys):
    """Not forked from the training process (whose pages a fork would make the loop copy: a forked
    child holds torch from its parent), and the window's recording unpickles without torch (a
    TorchVersion in the metadata once imported it)."""
    sp = StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2, queue=2)
    sp.writer.target = "window_faults:say_if_torch"
    workers = list(sp.writer.processes.values())
    _loop(sp, sp.model, 1)
    sp.close()
    assert sp.writer.written == [0]
    assert "step 0: torch imported in the worker: False" in capsys.readouterr().err
    assert all(worker.returncode is not None for worker in workers)  # ended by close()


@pytest.mark.parametrize("source", ["torch", "cupti-head"])
def test_a_window_written_in_the_background_equals_the_one_saved_in_the_loop(tmp_path, source):
    """The same recording, built and written by the worker and by AttentionProfiler.save: the same tables
    (torch.profiler's trace; CUPTI records of the replay fed with records of a real H100, in head mode)."""
    import dataclasses
    import shutil

    from cupti_replay import profile_replayed

    from headcount import AttentionProfiler
    from headcount.build.window_writer import WindowWriter

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    if source == "torch":
        model = llama_model("sdpa")
        prof = AttentionProfiler(model, attention_stats={"rows": 8})
        with prof:
            model(input_ids=ids, labels=ids).loss.backward()
    else:
        prof, _ = profile_replayed(llama_model("eager"), {"input_ids": ids, "labels": ids}, mode="head", tmp_path=tmp_path / "rec")
    recording = prof.recording()
    handed = tmp_path / f"handed{''.join(recording.path.suffixes)}"  # the writer takes the file it is given: a copy, for save()
    shutil.copy(recording.path, handed)
    writer = WindowWriter()
    writer.submit(0, dataclasses.replace(recording, path=handed), tmp_path / "bg", prof.run_metadata(),
                  prof.attention_statistics(), False)
    writer.close(say=lambda line: None)
    prof.save(tmp_path / "fg")
    assert writer.written == [0] and not handed.exists()  # let go once written
    tables = ("kernels", "ranges", "layers", "heads", "steps", "findings", *(("attention_stats",) if source == "torch" else ()))
    for table in tables:
        bg, fg = pd.read_parquet(tmp_path / "bg" / table), pd.read_parquet(tmp_path / "fg" / table)
        pd.testing.assert_frame_equal(bg, fg, check_like=True)
    if source != "torch":
        assert len(pd.read_parquet(tmp_path / "bg" / "heads")) and (pd.read_parquet(tmp_path / "bg" / "kernels")["kind"] == "kernel").any()


@pytest.mark.parametrize("closed_midway", [False, True])
def test_windows_queued_when_the_program_ends_without_close_are_written(tmp_path, closed_midway):
    """The documented loop without sp.close() (or a window profiled after close()): the program's exit
    waits for the windows queued."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from conftest import llama_model\n"
        "from headcount.training import StepProfiler\n"
        "model = llama_model('sdpa')\n"
        "ids = torch.randint(0, 128, (2, 16))\n"
        f"sp = StepProfiler(model, {str(tmp_path / 'out')!r}, every=2, queue=4)\n"  # room for every window: none skipped
        "for step in range(7):\n"
        f"    if step == 2 and {closed_midway}:\n"
        "        sp.close()\n"
        "        sp.writer.target = 'window_faults:wait_for_go'  # windows 4 and 6 still queued at the end\n"
        "    with sp.step(step):\n"
        "        model(input_ids=ids, labels=ids).loss.backward()\n"
        f"open({str(tmp_path / 'go')!r}, 'w').close()\n"
    )
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tests,
                          env={**__import__("os").environ, "PYTHONPATH": tests})
    assert done.returncode == 0, done.stderr[-2000:]
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert sorted(runs["run_id"].str[-7:]) == ["0000000", "0000002", "0000004", "0000006"]


def test_a_worker_that_cannot_start_is_said_before_the_loop(tmp_path, monkeypatch):
    """The worker process exits at once (as a broken environment would make it): StepProfiler()
    raises, naming the exit code and the way out, before any step runs."""
    from headcount.build import window_writer
    from headcount.common.errors import HeadcountError

    monkeypatch.setattr(window_writer, "ENTRY", "import sys; sys.exit(7)")
    with pytest.raises(HeadcountError, match=r"did not start \(exit code 7\)") as caught:
        StepProfiler(llama_model("sdpa"), tmp_path / "out", every=2)
    assert "background=False" in caught.value.hint


def test_a_worker_killed_between_windows_is_replaced(tmp_path):
    """The worker is killed while idle (as the kernel's OOM killer would): the next window goes to a
    fresh worker and is written; the loop sees nothing."""
    import os
    import signal
    import time

    model = llama_model("sdpa")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    sp = StepProfiler(model, tmp_path / "out", every=2, queue=3, writer_priority="normal")  # it must write between steps
    with sp.step(0):
        model(input_ids=ids, labels=ids).loss.backward()
    deadline = time.monotonic() + 300  # a bound on a loaded machine, not a timing
    while not sp.writer.written and time.monotonic() < deadline:
        sp.writer.poll()
        time.sleep(0.05)
    first = sp.writer.processes["normal"]
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    with sp.step(2):
        model(input_ids=ids, labels=ids).loss.backward()
    assert sp.writer.processes["normal"] is not first
    sp.close()
    assert sp.writer.written == [0, 2] and not sp.writer.failed
    assert sorted(pd.read_parquet(tmp_path / "out" / "runs")["run_id"].str[-7:]) == ["0000000", "0000002"]


def test_a_recording_that_cannot_be_handed_over_loses_its_window_not_the_run(tmp_path, capsys):
    """The recording's file is gone (a cleaner of /tmp, a full disk): submit() does not raise into the
    training loop; the window is named with its cause at close()."""
    from headcount.build.in_process import Recording
    from headcount.build.window_writer import WindowWriter

    writer = WindowWriter()
    writer.submit(7, Recording("kineto", tmp_path / "gone.json", [], "r", "sdpa", None, None), tmp_path / "out", {}, None, False)
    writer.close()
    assert writer.written == [] and [step for step, _ in writer.failed] == [7]
    assert "gone.json: cannot hand the recording to the window writer" in capsys.readouterr().err


def test_a_worker_that_cannot_be_replaced_loses_the_window_not_the_run(tmp_path, monkeypatch, capsys):
    """The worker is killed between windows and no fresh one starts (made to exit at once): the next
    window is lost with the cause, the loop goes on, close() says it once."""
    import os
    import signal

    from headcount.build import window_writer

    model = llama_model("sdpa")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    sp = StepProfiler(model, tmp_path / "out", every=2, queue=3)
    first = next(iter(sp.writer.processes.values()))  # the one that takes windows first
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    monkeypatch.setattr(window_writer, "ENTRY", "import sys; sys.exit(7)")
    with sp.step(0):
        model(input_ids=ids, labels=ids).loss.backward()
    assert sp.writer.failed and sp.writer.failed[0][0] == 0 and "exit code 7" in sp.writer.failed[0][1]
    sp.close()
    sp.close()
    err = capsys.readouterr().err
    assert err.count("the window of step 0 was not written") == 1
