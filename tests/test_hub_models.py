"""``headcount profile --model org/name``: Hugging Face hub ids, read offline
from a hub cache laid out as huggingface_hub lays it out (``refs/``,
``blobs/`` named by hash, ``snapshots/<commit>/`` links), checked by
huggingface_hub's own cache scanner before headcount reads it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SMALL = ["--impl", "sdpa", "--steps", "1", "--batch", "1", "--seq", "16", "--no-backward"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT, ref: str = "main") -> None:
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache with ``org/tiny-llama`` (config and weights) and
    ``org/config-only`` (a config alone)."""
    from conftest import llama_model
    from huggingface_hub import scan_cache_dir

    saved = tmp_path_factory.mktemp("saved")
    llama_model("sdpa", layers=2).save_pretrained(saved)
    cache = tmp_path_factory.mktemp("hub")
    files = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    assert "model.safetensors" in files and "config.json" in files
    _cache_repo(cache, "org/tiny-llama", files)
    _cache_repo(cache, "org/config-only", {"config.json": files["config.json"]})
    seen = {r.repo_id: {f.file_name for rev in r.revisions for f in rev.files} for r in scan_cache_dir(cache).repos}
    assert seen == {"org/tiny-llama": set(files), "org/config-only": {"config.json"}}  # the real library reads the layout
    return cache


def _profile_command(cache: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home")}
    return subprocess.run([sys.executable, "-m", "headcount", "profile", *args, *SMALL, "-o", str(out)],
                          capture_output=True, text=True, env=env)


def test_a_hub_id_runs_offline_from_the_cache_with_its_weights(hub_cache, tmp_path):
    done = _profile_command(hub_cache, tmp_path / "r", "--model", "org/tiny-llama")
    assert done.returncode == 0, done.stderr
    model = pd.read_parquet(tmp_path / "r" / "runs")["model"].iloc[0]
    assert model == "org/tiny-llama (LlamaForCausalLM, from the Hugging Face hub)"
    layers = pd.read_parquet(tmp_path / "r" / "layers")
    assert sorted(layers["layer"].unique()) == [0, 1]  # the cached config's 2 layers, not the default's 4


def test_a_revision_is_a_ref_of_the_cache(hub_cache, tmp_path):
    done = _profile_command(hub_cache, tmp_path / "r", "--model", "org/tiny-llama", "--revision", COMMIT)
    assert done.returncode == 0, done.stderr
    assert pd.read_parquet(tmp_path / "r" / "runs")["model"].iloc[0].startswith(f"org/tiny-llama@{COMMIT} (")


def test_a_config_only_repository_gets_random_weights_and_says_so(hub_cache, tmp_path):
    done = _profile_command(hub_cache, tmp_path / "r", "--model", "org/config-only")
    assert done.returncode == 0, done.stderr
    model = pd.read_parquet(tmp_path / "r" / "runs")["model"].iloc[0]
    assert model == "org/config-only (LlamaForCausalLM, no weights in the hub repository: random weights)"


@pytest.mark.parametrize("args, message", [
    (["--model", "org/unknown"], "--model org/unknown: no such local directory, and not in the Hugging Face cache"),
    (["--model", "org/tiny-llama", "--revision", "v9"], "--model org/tiny-llama@v9: no such local directory, and not in"),
])
def test_an_id_missing_from_the_cache_is_one_line(hub_cache, tmp_path, args, message):
    done = _profile_command(hub_cache, tmp_path / "r", *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headcount: error: ") and message in lines[0], done.stderr
    assert "HF_HUB_OFFLINE is set" in lines[0] and "hf download" in lines[0]
    assert not (tmp_path / "r").exists()


def test_revision_with_a_local_directory_is_refused(tmp_path, capsys):
    from headcount.cli.main import main

    (tmp_path / "m").mkdir()
    assert main(["profile", "--model", str(tmp_path / "m"), "--revision", "main", "-o", str(tmp_path / "r")]) == 2
    assert "is a local directory, not a hub id" in capsys.readouterr().err
