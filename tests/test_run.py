"""``headcount run``: real nsys 2023.4.4 and ncu 2024.1.1 wrapping plain CPU
training scripts (one process, and two ranks under torchrun with gloo), the
cupti backend on the replayed GPU, and the pieces (command lines, ncu's log,
the child's flush on signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from nsight import nsight_bin

from headcount.cli.main import main as cli_main
from headcount.common import nsight
from headcount.parsers import child_report
from headcount.wrap import child as child_mod
from headcount.wrap import launcher, nvidia_tools

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"
TRAIN = str(WORKLOADS / "tiny_cpu_training.py")


def _run(args, capsys):
    rc = cli_main(["run", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_nsys_records_a_plain_script_per_layer_head_and_step(nsight_path, tmp_path, capsys):
    out = tmp_path / "out"
    rc, stdout, err = _run(["--backend", "nsys", "--mode", "head", "-o", str(out), "--", sys.executable, TRAIN, "--steps", "3"], capsys)
    assert rc == 0, err
    assert "trained 3 steps" in stdout  # the program's output is not swallowed
    ranges = pd.read_parquet(out / "ranges")
    heads = ranges[ranges["level"] == "head"]
    assert sorted(heads["step"].unique()) == [0, 1, 2]
    assert heads.groupby(["phase"]).size().to_dict() == {"bwd": 3 * 2 * 4, "fwd": 3 * 2 * 4}
    assert set(heads["layer_name"]) == {"layer.0", "layer.1"} and set(heads["head"]) == {0, 1, 2, 3}
    assert (heads["duration_basis"] == "cpu_range").all() and heads["duration_ns"].gt(0).all()
    assert heads["flop"].gt(0).all() and set(heads["kv_head"]) == {0, 1}  # shapes from the child's call log
    # each step range closes when the next opens: side by side, never nested in the one before (they were, under
    # nsys and ncu: step.0/step.1/step.2 in the H100's ncu report)
    steps = ranges[ranges["domain"] == "headcount.step"]
    assert steps["path"].tolist() == ["step.0", "step.1", "step.2"] and (steps["depth"] == 0).all()
    runs = pd.read_parquet(out / "runs")
    assert runs["source"].tolist() == ["nsys"] and runs["complete"].tolist() == [True]
    assert "Nsight Systems" in runs["source_version"].iloc[0] and runs["steps"].tolist() == [3]
    raw = next((out / "raw").iterdir())
    assert (raw / "run.nsys-rep").exists() and list(raw.glob("child-*.json"))
    manifest = json.loads(next((out / "manifests").glob("*/run.json")).read_text())
    assert manifest["tool_command"][1:3] == ["profile", "--trace=cuda,nvtx"]
    assert "--cuda-graph-trace=node" in manifest["tool_command"]  # graph replays recorded per node, with their node events


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nsys_records_a_compiled_script_with_the_eager_grid(nsight_path, tmp_path, capsys):
    grids = []
    for flags in ([], ["--compile"]):
        out = tmp_path / ("compiled" if flags else "eager")
        rc, stdout, err = _run(["--backend", "nsys", "--mode", "head", "-o", str(out), "--", sys.executable, TRAIN,
                                "--steps", "2", *flags], capsys)
        assert rc == 0, err
        ranges = pd.read_parquet(out / "ranges")
        ranges = ranges[ranges["level"].isin(["layer", "head"])]
        grids.append(sorted(zip(ranges["step"].astype(int), ranges["phase"], ranges["layer_name"], ranges["head"].fillna(-1).astype(int))))
    assert grids[0] == grids[1] and len(grids[0]) == 2 * 2 * 2 * (1 + 4)  # steps x phases x layers x (layer + heads)


@pytest.mark.parametrize("backend", ["nsys", "torch"])
def test_two_ranks_under_torchrun(nsight_path, backend, tmp_path, capsys):
    """One run per rank, whether one tool records every process (nsys) or each process records itself (torch)."""
    out = tmp_path / "out"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    rc, stdout, err = _run(["--backend", backend, "-o", str(out), "--", torchrun, "--nproc-per-node", "2", TRAIN, "--ddp", "--steps", "2"], capsys)
    assert rc == 0, err
    runs = pd.read_parquet(out / "runs").sort_values("rank")
    assert runs["rank"].tolist() == [0, 1] and runs["world_size"].tolist() == [2, 2]
    assert runs["pid"].nunique() == 2 and runs["run_id"].str.endswith(("-rank0", "-rank1")).all()
    ranges = pd.read_parquet(out / "ranges")
    layers = ranges[ranges["level"] == "layer"]
    # each rank: 2 steps × 2 layers × fwd/bwd, its own process only
    assert layers.groupby("run_id").size().tolist() == [8, 8]
    assert layers.groupby("run_id")["pid"].nunique().tolist() == [1, 1]
    pid_of_run = dict(zip(runs["run_id"], runs["pid"]))
    assert all(p == pid_of_run[r] for r, p in zip(layers["run_id"], layers["pid"]))  # integers in both tables


def test_steps_option_tags_only_those_steps(nsight_path, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = _run(["--backend", "nsys", "--steps", "1-2", "-o", str(out), "--", sys.executable, TRAIN, "--steps", "4"], capsys)
    assert rc == 0, err
    ranges = pd.read_parquet(out / "ranges")
    assert sorted(ranges.loc[ranges["level"] == "layer", "step"].unique()) == [1, 2]
    assert pd.read_parquet(out / "runs")["steps"].tolist() == [4]


def test_tag_sdpa_outside_transformers(nsight_path, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = _run(["--backend", "nsys", "--tag-sdpa", "-o", str(out), "--", sys.executable, TRAIN, "--steps", "2", "--sdpa-outside"], capsys)
    assert rc == 0, err
    layers = pd.read_parquet(out / "layers")
    assert set(layers["layer_name"]) == {"layer.0", "layer.1", "sdpa.0"}
    own = layers[layers["layer_name"] == "sdpa.0"]
    assert own["calls"].tolist() == [2, 2] and set(own["phase"]) == {"fwd", "bwd"}  # transformers' calls not tagged twice
    assert layers.loc[layers["layer_name"] == "layer.0", "calls"].tolist() == [2, 2]


def test_torch_backend_records_a_plain_script_per_layer_head_and_step(tmp_path, capsys):
    """``--backend torch``: torch.profiler inside the program, headcount's ranges as record_function ranges in its trace,
    from the first tagged step (``--steps 1-2`` of 4: step 0 is not recorded at all, nor is step 3), read with the
    process's call log (the shapes: FLOPs)."""
    out = tmp_path / "out"
    rc, stdout, err = _run(["--backend", "torch", "--mode", "head", "--steps", "1-2", "-o", str(out), "--", sys.executable, TRAIN,
                            "--steps", "4"], capsys)
    assert rc == 0, err
    assert "trained 4 steps" in stdout
    ranges = pd.read_parquet(out / "ranges")
    heads = ranges[ranges["level"] == "head"]
    assert sorted(heads["step"].unique()) == [1, 2]
    assert heads.groupby(["phase"]).size().to_dict() == {"bwd": 2 * 2 * 4, "fwd": 2 * 2 * 4}
    assert set(heads["layer_name"]) == {"layer.0", "layer.1"} and set(heads["head"]) == {0, 1, 2, 3}
    assert heads["flop"].gt(0).all() and set(heads["kv_head"]) == {0, 1}  # shapes from the child's call log
    assert sorted(pd.read_parquet(out / "steps")["step"]) == [1, 2]  # a Kineto trace's step ranges are the steps table
    runs = pd.read_parquet(out / "runs")
    assert runs["source"].tolist() == ["torch"] and runs["complete"].tolist() == [True] and runs["steps"].tolist() == [4]
    assert runs["source_version"].iloc[0].startswith("torch.profiler")
    raw = next((out / "raw").iterdir())
    trace = json.loads(next(raw.glob("torch-*/trace.json")).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"headcount.step@step.1", "headcount.step@step.2"} <= names and "headcount.step@step.0" not in names
    assert "headcount.step@step.3" not in names  # the profiler stopped as the selection ended
    # a directory parse of the raw folder finds the trace (no call log there: no FLOPs, the same ranges)
    again = tmp_path / "again"
    assert cli_main(["parse", str(raw), "-o", str(again)]) == 0
    parsed = pd.read_parquet(again / "ranges")
    assert sorted(parsed.loc[parsed["level"] == "head", "step"].unique()) == [1, 2]
    assert len(parsed[parsed["level"] == "head"]) == len(heads)


def test_the_programs_exit_status_is_passed_through(nsight_path, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = _run(["--backend", "nsys", "-o", str(out), "--", sys.executable, TRAIN, "--steps", "1", "--fail"], capsys)
    assert rc == 1 and "exited with status 1" in err and "RuntimeError: the program failed on purpose" in err
    runs = pd.read_parquet(out / "runs")
    assert runs["complete"].tolist() == [False] and runs["program_exit_status"].tolist() == [1]
    assert len(pd.read_parquet(out / "layers"))  # what was recorded is reported
    rc, _, _ = _run(["--backend", "nsys", "-o", str(tmp_path / "out7"), "--", sys.executable, TRAIN, "--steps", "1", "--exit", "7"], capsys)
    assert rc == 7


def test_cupti_backend_on_the_replayed_gpu(tmp_path, capsys, monkeypatch):
    """The child records with cupti_replay's stand-in for the GPU (see its docstring)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("HEADCOUNT_CUPTI_FACTORY", "cupti_replay:factory")
    out = tmp_path / "out"
    rc, stdout, err = _run(["--backend", "cupti", "-o", str(out), "--", sys.executable, str(WORKLOADS / "replayed_gpu_training.py"), "3"], capsys)
    assert rc == 0, err
    assert "launched" in stdout
    layers = pd.read_parquet(out / "layers")
    assert (layers["kernels_per_call"] > 0).all() and (layers["dram_bytes_provenance"] == "sampled").all()
    kernels = pd.read_parquet(out / "kernels")
    assert (kernels["source"] == "cupti").all() and kernels["launch_latency_ns"].notna().all()
    assert sorted(kernels["step"].dropna().unique()) == [0, 1, 2]
    raw = next((out / "raw").iterdir())
    assert list(raw.glob("cupti-*/cupti-records.jsonl.gz"))


@pytest.mark.parametrize("backend", ["cupti", "ncu"])
def test_a_gpu_backend_without_gpu_is_refused_before_the_program_starts(nsight_path, backend, tmp_path, capsys):
    from headcount.common import env

    if env.driver_present():
        pytest.skip("an NVIDIA driver is present: the backend can run here")
    marker = tmp_path / "ran"
    out = tmp_path / "out"
    rc, stdout, err = _run(["--backend", backend, "-o", str(out), "--", sys.executable, "-c",
                            f"open({str(marker)!r}, 'w').write('x')"], capsys)
    assert rc == 3
    assert err.strip().splitlines() == [err.strip()]  # one line
    assert err.startswith(f"headcount: error: --backend {backend} cannot run here: no NVIDIA driver on this machine")
    if backend == "cupti":  # the in-process route that runs anywhere is offered
        assert "use --backend torch here (torch.profiler, any machine), or --backend nsys" in err and "auto" not in err
    else:
        assert "--backend nsys records NVTX ranges anywhere" in err
    assert not marker.exists() and not out.exists()  # the program never ran, nothing was written


@pytest.mark.parametrize("status", [3, 5])
def test_a_program_that_exits_before_recording_anything_keeps_its_status(nsight_path, status, tmp_path, capsys):
    out = tmp_path / "out"
    rc, stdout, err = _run(["--backend", "nsys", "-o", str(out), "--", sys.executable, "-c",
                            f"print('the program'); import sys; sys.exit({status})"], capsys)
    assert rc == status
    errors = [line for line in err.splitlines() if line.startswith("headcount: error:")]
    assert errors == [next(line for line in errors)]
    assert f"the program exited with status {status} and nothing tagged was recorded" in errors[0]
    assert "nsys profile --trace" not in err  # the hint for files recorded by hand does not apply
    assert stdout == "the program\n"  # nsys's progress bars and messages are not on stdout


def test_nothing_recorded_by_a_program_that_succeeds_is_exit_4(nsight_path, tmp_path, capsys):
    rc, stdout, err = _run(["--backend", "nsys", "-o", str(tmp_path / "out"), "--", sys.executable, "-c", "print('ok')"], capsys)
    assert rc == 4 and stdout == "ok\n"
    assert "headcount: error: nothing tagged was recorded" in err and "nsys profile --trace" not in err


@pytest.mark.parametrize("args,expect", [
    ([], "no command to run"),
    (["--steps", "x", "--", "python"], "--steps x: not a step"),
    (["--", "/no/such/program"], "command not found"),
])
def test_usage_errors(args, expect, tmp_path, capsys):
    rc, _, err = _run(["-o", str(tmp_path / "o"), *args], capsys)
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1


def test_missing_tool(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    rc, _, err = _run(["--backend", "nsys", "-o", str(tmp_path / "o"), "--", sys.executable, "-c", "pass"], capsys)
    assert rc == 3 and "no nsys on PATH" in err


# ------------------------------------------------------------------ pieces
def test_ncu_command_line():
    opt = nvidia_tools.NcuOptions(launch_count=100, capture=True)
    argv = nvidia_tools.ncu_argv("ncu", "/o/run", ["python", "t.py", "--x"], opt, log_file="/o/ncu.log")
    assert argv[:8] == ["ncu", "--nvtx", "--nvtx-include", "headcount@fwd/", "--nvtx-include", "headcount@bwd/",
                        "--nvtx-include", "headcount@recompute/"]
    joined = " ".join(argv)
    assert "--target-processes all --clock-control none --cache-control all" in joined
    assert "--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum" in joined
    assert "--launch-count 100" in joined and "--profile-from-start off" in joined and "--log-file /o/ncu.log" in joined
    assert argv[-6:] == ["--force-overwrite", "--export", "/o/run", "python", "t.py", "--x"]
    one = nvidia_tools.ncu_argv("ncu", "/o/r", ["p"], nvidia_tools.NcuOptions(nvtx_includes=("headcount@fwd/layer.3/",), metrics=(),
                                                                            section_set="full", launch_count=None))
    assert one[:4] == ["ncu", "--nvtx", "--nvtx-include", "headcount@fwd/layer.3/"] and "--set" in one and "--metrics" not in one


def test_ncu_command_line_is_accepted_by_the_real_ncu(nsight_path, tmp_path):
    """ncu parses every option headcount passes (it stops at the missing driver, after parsing)."""
    argv = nvidia_tools.ncu_argv(nsight_bin("ncu"), str(tmp_path / "r"), [sys.executable, "-c", "pass"], nvidia_tools.NcuOptions(),
                                 log_file=str(tmp_path / "log"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    text = done.stdout + done.stderr + (tmp_path / "log").read_text()
    assert "unrecognised option" not in text.lower() and "unrecognized option" not in text.lower()
    assert "failed to connect to the CUDA driver" in text


@pytest.mark.parametrize("line,expect", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0.",
     "not permitted for this user (ERR_NVGPUCTRPERM)"),
    ("==ERROR== Nsight Compute failed to connect to the CUDA driver (stub libcuda.so[.1] on path?).", "could not reach an NVIDIA driver"),
    ("==ERROR== Profiling is not supported on this device", "cannot profile this GPU"),
    ("==ERROR== Failed to prepare kernel for profiling", "ncu failed: Failed to prepare kernel for profiling"),
])
def test_ncu_log_reading(line, expect):
    error, warnings = nvidia_tools.read_ncu_log(["==PROF== Connected to process 1", line, "==WARNING== No kernels were profiled."])
    assert expect in error.one_line() and error.exit_code == 3 and warnings == ["No kernels were profiled."]
    assert nvidia_tools.read_ncu_log(["==ERROR== The application returned an error code (1)."])[0] is None


def test_tool_versions_and_gates(nsight_path):
    text, numbers = nsight.version(nsight_bin("nsys"))
    assert numbers[:2] == (2023, 4)
    nsight.check_version("nsys", numbers, text)
    with pytest.raises(Exception, match="too old for headcount run"):
        nsight.check_version("ncu", (2021, 3, 1), "Version 2021.3.1")
    help_text = subprocess.run([nsight_bin("nsys"), "profile", "--help"], capture_output=True, text=True).stdout
    assert nvidia_tools.nsys_gpu_metrics_flag(help_text) == "--gpu-metrics-device"  # the 2023.x spelling
    assert nvidia_tools.nsys_gpu_metrics_flag("  --gpu-metrics-devices=<arg>") == "--gpu-metrics-devices"
    argv = nvidia_tools.nsys_argv("nsys", "/o/run", ["python", "x.py"], gpu_metrics_flag="--gpu-metrics-device", capture=True)
    assert "--gpu-metrics-device=all" in argv and "--capture-range=cudaProfilerApi" in argv and argv[-2:] == ["python", "x.py"]


def test_the_child_flushes_on_sigterm(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(
        "import os, signal, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,\n"
        "                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)\n"
        "m = LlamaForCausalLM(cfg)\n"
        "ids = torch.randint(0, 64, (1, 8))\n"
        "m(input_ids=ids, labels=ids).loss.backward()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('not reached')\n")
    env = launcher.child_env(tmp_path, "nsys", "layer")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM and "not reached" not in done.stdout
    child_file = next(tmp_path.glob("child-*.json"))
    doc = child_report.read_report(child_file)
    assert doc["complete"] is False and doc["ended_by"] == "signal SIGTERM" and doc["steps_seen"] == 1
    assert {(c.phase, c.layer_name) for c in doc["calls"]} == {("fwd", "layer.0"), ("bwd", "layer.0")}


def test_the_hidden_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    env = launcher.child_env(tmp_path, "nsys", "layer", base={**os.environ, "PYTHONPATH": str(theirs)})
    done = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('THEIR_SITECUSTOMIZE'))"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ran" and done.returncode == 0


def test_a_process_that_builds_no_model_is_left_alone(tmp_path):
    env = launcher.child_env(tmp_path, "nsys", "layer")
    done = subprocess.run([sys.executable, "-c", "import sys; print('transformers' in sys.modules)"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False" and not list(tmp_path.glob("child-*.json"))


def test_steps_parsing():
    assert child_mod.parse_steps("") is None
    assert child_mod.parse_steps("5") == (5, 5) and child_mod.parse_steps("10-12") == (10, 12)
    for bad in ("x", "3-1", "-2"):
        with pytest.raises(ValueError):
            child_mod.parse_steps(bad)


def test_cupti_children_get_nvtx_injection(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CUPTI_HOME", str(tmp_path / "no-folder"))  # the wheel's library, not headcount's
    lib_dir = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libcupti.so.13").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    base = {k: v for k, v in os.environ.items() if k not in ("NVTX_INJECTION64_PATH", "HEADCOUNT_NVTX_INJECTION")}
    assert launcher.child_env(tmp_path, "cupti", "layer", base=base)["NVTX_INJECTION64_PATH"] == str(lib_dir / "libcupti.so.13")
    assert "NVTX_INJECTION64_PATH" not in launcher.child_env(tmp_path, "nsys", "layer", base=base)
    assert "NVTX_INJECTION64_PATH" not in launcher.child_env(tmp_path, "cupti", "layer", base={**base, "HEADCOUNT_NVTX_INJECTION": "0"})


def test_cupti_program_that_exits_before_recording_keeps_its_status(tmp_path, capsys, monkeypatch):
    """The cupti backend (cupti_replay stands in for the GPU, see its docstring):
    a program that exits 3 before building a model makes headcount run exit 3."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("HEADCOUNT_CUPTI_FACTORY", "cupti_replay:factory")
    rc, stdout, err = _run(["--backend", "cupti", "-o", str(tmp_path / "out"), "--", sys.executable, "-c",
                            "print('the program'); import sys; sys.exit(3)"], capsys)
    assert rc == 3 and stdout == "the program\n"
    errors = [line for line in err.splitlines() if line.startswith("headcount: error:")]
    assert len(errors) == 1 and "the program exited with status 3 and nothing tagged was recorded" in errors[0]
