"""``headcount profile`` end to end, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from headcount.cli.main import main

SMALL = ["--steps", "1", "--batch", "1", "--seq", "32"]


def test_profile_default_model_end_to_end(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["profile", *SMALL, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Attention per step" in printed and str(out) in printed
    layers = pd.read_parquet(out / "layers")
    assert set(layers["implementation"]) == {"eager", "sdpa"}
    assert set(layers["phase"]) == {"fwd", "bwd"}
    assert len(layers) == 2 * 2 * 4  # impls x phases x layers
    runs = pd.read_parquet(out / "runs")
    assert len(runs) == 2 and runs["run_id"].nunique() == 1 and (runs["seq"] == 32).all()
    kernels = pd.read_parquet(out / "kernels")
    assert kernels["step"].dropna().eq(0).all() and kernels["step"].notna().any()
    # the run records what the user waited for beyond the steps: the recorder's stop, then headcount's read + attribute
    timing = json.loads(next((out / "manifests").glob("*/run.json")).read_text())["timing"]
    for impl in ("eager", "sdpa"):
        t = timing[impl]
        assert t["profiled_steps_s"] > 0 and t["recorder_stop_s"] >= 0 and t["read_attribute_s"] > 0
        assert t["recorder_stop_s"] + t["read_attribute_s"] == pytest.approx(t["postprocess_s"], abs=2e-4)
    # a second invocation appends
    assert main(["profile", *SMALL, "--impl", "sdpa", "--mode", "head", "--no-backward", "-o", str(out), "--append"]) == 0
    heads = pd.read_parquet(out / "heads")
    assert heads["run_id"].nunique() == 2
    assert set(heads[heads.provenance == "measured"]["phase"]) == {"fwd"}


def test_profile_local_model_directory(tmp_path):
    from conftest import gpt2_model

    model_dir = tmp_path / "gpt2"
    gpt2_model("eager").save_pretrained(model_dir)
    out = tmp_path / "r"
    assert main(["profile", "--model", str(model_dir), "--impl", "sdpa", *SMALL, "-o", str(out)]) == 0
    runs = pd.read_parquet(out / "runs")
    assert "GPT2LMHeadModel" in runs["model"].iloc[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/nonexistent/model"], "no such directory"),
        (["--seq", "0"], "--seq 0: must be at least 1"),
        (["--batch", "-2"], "--batch -2: must be at least 1"),
        (["--impl", "warp_attention"], "unknown attention implementation"),
        (["--impl", "flash_attention_2"], "runs on a CUDA GPU only and --device is cpu"),
        (["--device", "tpu"], "--device tpu"),
        (["--device", "cuda:x"], "--device cuda:x: not a device"),
        (["--impl", "flex_attention"], "add --no-backward"),
        (["--seq", "100000"], "exceeds the model's 1024 positions"),
        (["--impl", "sdpa,sdpa"], "twice"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "r"
    code = main(["profile", *SMALL, *args, "-o", str(out)])
    err = capsys.readouterr().err
    assert code != 0
    error_lines = [line for line in err.splitlines() if line.startswith("headcount: error:")]
    assert len(error_lines) == 1 and message in error_lines[0], err
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


def test_not_a_model_directory(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    assert main(["profile", "--model", str(tmp_path / "m"), "-o", str(tmp_path / "r")]) == 2
    assert "not a model directory (no config.json)" in capsys.readouterr().err


def test_existing_report_needs_append_or_force(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["profile", *SMALL, "--impl", "sdpa", "--no-backward", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["profile", *SMALL, "--impl", "sdpa", "-o", str(out)]) == 2
    assert "already holds a headcount report (pass --append" in capsys.readouterr().err
    assert main(["profile", *SMALL, "--impl", "eager", "--no-backward", "-o", str(out), "--force"]) == 0
    assert set(pd.read_parquet(out / "layers")["implementation"]) == {"eager"}


def test_help_shows_examples_and_entry_point_works():
    top = subprocess.run([sys.executable, "-m", "headcount.cli.main", "--help"], capture_output=True, text=True, check=True)
    assert "examples:" in top.stdout and "headcount profile" in top.stdout
    sub = subprocess.run([sys.executable, "-m", "headcount.cli.main", "profile", "--help"], capture_output=True, text=True, check=True)
    assert "examples:" in sub.stdout and "--mode" in sub.stdout and "--append" in sub.stdout
    bad = subprocess.run([sys.executable, "-m", "headcount.cli.main", "profile", "--seq", "-1", "-o", "/tmp/x-headcount-never"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("headcount: error:") and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- --device
def test_device_cuda_without_a_gpu_is_one_line_exit_3_and_writes_nothing(tmp_path):
    out = tmp_path / "r"
    for device in ("cuda", "cuda:1"):
        done = subprocess.run([sys.executable, "-m", "headcount.cli.main", "profile", *SMALL, "--device", device, "-o", str(out)],
                              capture_output=True, text=True)
        assert done.returncode == 3, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines == [lines[0]] and lines[0].startswith(f"headcount: error: --device {device}: no CUDA GPU here")
        assert not out.exists()


def test_device_cpu_runs_there_and_says_so(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["profile", *SMALL, "--impl", "sdpa", "--no-backward", "--device", "cpu", "-o", str(out)]) == 0
    runs = pd.read_parquet(out / "runs")
    assert runs["device_kind"].tolist() == ["cpu"] and runs["device_name"].notna().all()
    assert pd.read_parquet(out / "layers")["roofline_class"].isna().all()  # a CPU run is never classified against a GPU


def test_options_are_checked_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    """--impl, --seq and --device are refused before anything is built (load_model is never reached)."""
    from headcount.cli import profile_cmd

    def never(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(profile_cmd, "load_model", never)
    for args, message in ((["--impl", "eager,flash_attention_2"], "runs on a CUDA GPU only"),
                          (["--model", "bert-tiny", "--seq", "513"], "exceeds the model's 512 positions"),
                          (["--device", "cuda"], "no CUDA GPU here")):
        code = main(["profile", "--steps", "1", *args, "-o", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert code in (2, 3) and message in err and "was loaded" not in err


def test_a_cpu_model_on_a_gpu_machine_is_labelled_cpu(monkeypatch, tmp_path):
    """Stands in for a machine with a GPU: torch.cuda reports an H100 (the GPU
    boundary; no GPU here). The model stays on the CPU, so the run must say
    cpu and no roofline class may come from the H100's datasheet."""
    import torch

    from headcount import AttentionProfiler
    from headcount.cli.models import load_model, make_inputs

    class Props:
        name, major, minor, multi_processor_count, total_memory = "NVIDIA H100 80GB HBM3", 9, 0, 132, 80 << 30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: Props())
    model, _ = load_model("bert-tiny", device="cpu")
    prof = AttentionProfiler(model, backend="torch")
    with prof, torch.no_grad():
        model(**make_inputs(model, 1, 16))
    meta = prof.run_metadata()
    assert meta["device"]["kind"] == "cpu" and "H100" not in str(meta["device"]["name"])
    assert prof.get_stats()["layers"]["roofline_class"].isna().all()
