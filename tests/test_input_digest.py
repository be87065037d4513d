"""The runs row's SHA-256 of a recording (issue 60: hashed ahead of the parse, on a thread stopped before the
workers fork): the same hash whether it was hashed whole, ahead, or ahead in part and then on from there; a
directory by its files; no thread left once a parse is done."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from headcount.build import batch
from headcount.parsers.options import ReadOptions
from headcount.store import input_digest
from headcount.store.metadata import input_facts, new_run_id

FIXTURES = Path(__file__).resolve().parent / "fixtures"



@pytest.fixture
def recording(tmp_path):
    data = bytes(range(256)) * (5 * 4096 + 17)  # 5 MiB and a bit: several chunks, the last one short
    path = tmp_path / "trace.json"
    path.write_bytes(data)
    return path, data


def test_a_hash_stopped_part_way_goes_on_to_the_whole_files_hash(recording):
    path, data = recording
    stamp = input_digest.stamp_of(path)
    part = hashlib.sha256(data[: 3 << 20])
    input_digest._PARTIAL[(str(path), stamp)] = (part, 3 << 20)  # as a thread stopped after three chunks leaves it
    assert input_digest.digest(str(path), stamp) == (len(data), hashlib.sha256(data).hexdigest())
    assert (str(path), stamp) not in input_digest._PARTIAL


def test_hashing_ahead_then_stopping_gives_the_files_hash(recording, monkeypatch):
    path, data = recording
    monkeypatch.setattr(input_digest, "AHEAD_CHUNK_BYTES", 4096)  # many chunks: the stop likely falls part way
    input_digest.hash_ahead([str(path)])
    input_digest.pause()
    assert not [t for t in threading.enumerate() if t.name == "headcount-hash-ahead"]
    facts = input_facts(path)
    assert facts["size_bytes"] == len(data) and facts["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_changed_file_is_hashed_again(recording):
    path, data = recording
    first = input_facts(path)["sha256"]
    path.write_bytes(data + b"more")
    again = input_facts(path)
    assert again["sha256"] == hashlib.sha256(data + b"more").hexdigest() != first


def test_a_directory_is_hashed_by_its_files_in_order(tmp_path):
    folder = tmp_path / "export"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "KERNEL.parquet").write_bytes(b"kernels")
    (folder / "NVTX_EVENTS.parquet").write_bytes(b"ranges!")
    expected = hashlib.sha256(b"NVTX_EVENTS.parquet\x007\x00ranges!" + b"b/KERNEL.parquet\x007\x00kernels").hexdigest()
    input_digest.hash_ahead([str(folder)])  # a directory is left to digest()
    assert input_facts(folder) == {"path": str(folder), "size_bytes": 14, "sha256": expected}


def test_an_unreadable_file_has_no_hash(tmp_path):
    assert input_facts(tmp_path / "gone.json") == {"path": str(tmp_path / "gone.json"), "size_bytes": None, "sha256": None}


def test_no_hashing_thread_outlives_a_parse(tmp_path):
    trace = FIXTURES / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"
    results = batch.parse_into(tmp_path / "out", [(str(trace), new_run_id())], ReadOptions(), jobs=1)
    assert not [r for r in results if r.error]
    assert not [t for t in threading.enumerate() if t.name == "headcount-hash-ahead"]
    assert input_facts(trace)["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
