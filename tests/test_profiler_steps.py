"""torch.profiler's habits on AttentionProfiler (torch source, CPU): ``prof.step()``
at the end of each step, ``start()``/``stop()``, a ``schedule`` of wait /
warm-up / active steps and ``on_ready`` per active window; and the
``with prof.step(i)`` habit beside them."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import inputs_for, llama_model

from headcount import AttentionProfiler, HeadcountError


def _steps(stats, table="kernels") -> set:
    return set(stats[table]["step"].dropna().astype(int))


def test_a_schedule_records_exactly_its_active_steps():
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    windows = []
    prof = AttentionProfiler(model, schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                             on_ready=lambda p: windows.append((p.run_id, p.get_stats())))
    with prof:
        for _ in range(6):
            model(**inputs).loss.backward()
            prof.step()
    assert len(windows) == 1
    stats = windows[0][1]
    assert _steps(stats) == {2, 3}
    kernels = stats["kernels"]
    assert set(kernels["step"].dropna().astype(int)) == {2, 3}
    assert kernels["step"].notna().all()  # nothing of the wait and warm-up steps was recorded
    bd = stats["attention_breakdown"]
    assert (bd["calls"] == 2).all()  # 2 active steps, one call per layer and phase each


@pytest.mark.parametrize("repeat, steps, last", [(0, 6, {2, 3}), (2, 10, {6, 7})])
def test_after_the_block_the_last_active_window_is_read(repeat, steps, last, tmp_path, capsys):
    """torch.profiler's habit without on_ready: get_stats() and save() after the block give the last window
    that recorded. repeat=0 (repeat forever) opens a window at the loop's last prof.step() that records
    nothing: the window before it is the one read (its recording was deleted when the empty one began)."""
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    prof = AttentionProfiler(model, schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=repeat))
    with prof:
        for _ in range(steps):
            model(**inputs).loss.backward()
            prof.step()
    assert _steps(prof.get_stats()) == last
    out = prof.save(tmp_path / "r")
    assert set(pd.read_parquet(out / "kernels")["step"].dropna().astype(int)) == last
    if repeat == 2:  # the first window was recorded and never read: said once the second one recorded
        assert "recording window 1 was not read before window 2 recorded" in capsys.readouterr().err


def test_repeated_windows_are_runs_of_their_own(tmp_path):
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    ready = []

    def save(p):
        ready.append(p.run_id)
        p.save(tmp_path / "r", append=len(ready) > 1)

    prof = AttentionProfiler(model, run_id="train", schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2),
                             on_ready=save)
    prof.start()
    for _ in range(7):
        model(**inputs).loss.backward()
        prof.step()
    prof.stop()
    assert ready == ["train", "train.1"]
    kernels = pd.read_parquet(tmp_path / "r" / "kernels")
    assert dict(kernels.groupby("run_id")["step"].agg(lambda s: set(s.dropna().astype(int)))) == {"train": {2}, "train.1": {5}}
    assert set(pd.read_parquet(tmp_path / "r" / "runs")["run_id"]) == {"train", "train.1"}


def test_start_stop_and_plain_steps_count_from_zero():
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    prof = AttentionProfiler(model)
    prof.start()
    for _ in range(3):
        model(**inputs).loss.backward()
        prof.step()
    prof.stop()
    stats = prof.get_stats()
    assert _steps(stats) == {0, 1, 2}
    assert stats["kernels"]["step"].notna().all()
    assert (stats["attention_breakdown"]["calls"] == 3).all()


def test_numbered_steps_have_no_implicit_first_step():
    """``with prof.step(i)``: the steps are the user's numbers; work before the
    first of them has no step (the implicit step#0 opened at start is dropped)."""
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    prof = AttentionProfiler(model)
    with prof:
        model(**inputs).loss.backward()  # before any numbered step
        for i in (5, 6):
            with prof.step(i):
                model(**inputs).loss.backward()
    stats = prof.get_stats()
    assert set(stats["kernels"]["step"].dropna().astype(int)) == {5, 6}
    assert stats["kernels"]["step"].isna().any()  # the first, unnumbered step's work
    assert 0 not in _steps(stats)


def test_a_block_without_step_calls_is_step_zero():
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    with AttentionProfiler(model) as prof:
        model(**inputs).loss.backward()
    assert _steps(prof.get_stats()) == {0}


def test_step_outside_the_profiled_block_is_an_error():
    prof = AttentionProfiler(llama_model("sdpa"))
    with pytest.raises(HeadcountError, match="outside the profiled block"):
        prof.step()
    with pytest.raises(HeadcountError, match="outside the profiled block"):
        with prof.step(3):
            pass


def test_a_schedule_must_be_callable():
    with pytest.raises(HeadcountError, match="is not callable"):
        AttentionProfiler(llama_model("sdpa"), schedule=3)


def test_inside_your_own_torch_profiler_the_reason_is_precise_and_its_advice_works(tmp_path):
    """torch runs one profiler session at a time: inside the user's, headcount's
    torch backend cannot start. The error names that (not CUPTI, on a CPU),
    and the way it suggests — tag, export the user's trace, parse it — gives
    the layers."""
    import headcount
    from headcount.cli.main import main

    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        with pytest.raises(HeadcountError) as info:
            with AttentionProfiler(model, backend="torch", strict=True):
                pass
        tagger = headcount.tag(model)
        for _ in range(2):
            model(**inputs).loss.backward()
            theirs.step()
    headcount.untag(tagger)
    line = info.value.one_line()
    assert "torch.profiler session of yours is already recording" in line and "CUPTI" not in line
    assert "headcount.tag(model)" in line and "headcount parse trace.json" in line
    trace = tmp_path / "trace.json"
    theirs.export_chrome_trace(str(trace))
    assert main(["parse", str(trace), "-o", str(tmp_path / "r")]) == 0
    layers = pd.read_parquet(tmp_path / "r" / "layers")
    assert set(zip(layers["phase"], layers["layer"])) == {("fwd", 0), ("fwd", 1), ("bwd", 0), ("bwd", 1)}
    assert (layers["calls"] == 2).all()


def test_a_second_save_names_save_arguments_not_cli_flags(tmp_path):
    model, inputs = llama_model("sdpa"), inputs_for("llama_gqa")
    with AttentionProfiler(model) as prof:
        model(**inputs).loss.backward()
    prof.save(tmp_path / "r")
    with pytest.raises(HeadcountError) as info:
        prof.save(tmp_path / "r")
    line = info.value.one_line()
    assert "pass save(append=True) to add this run to it, or save(force=True) to replace it" in line
    assert "--append" not in line and "--force" not in line
