"""The coverage sweep (``scripts/attention_coverage.py``) on a fixed subset of
families: each is built from its shrunk default config and tagged the way the
sweep reports; none fails inside the user's step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import attention_coverage  # noqa: E402


@pytest.mark.parametrize("family, layer, head", [
    ("llama", "interface", "exact"), ("gpt2", "interface", "exact"), ("bert", "interface", "exact"),
    ("gpt_oss", "interface", "exact"), ("falcon", "interface", "exact"),
    ("bloom", "hooks", "refused"), ("mpt", "hooks", "refused"), ("deberta-v2", "hooks", "refused"),
])
def test_a_family_is_tagged_as_the_sweep_says(family, layer, head):
    outcome = attention_coverage.try_family(family)
    assert (outcome.layer, outcome.head) == (layer, head), outcome.detail
    assert outcome.layer_exact is True and outcome.phases == ["bwd", "fwd"]
    assert outcome.deterministic is True and outcome.nested is True
    if head == "refused":
        assert "head mode cannot compute its heads one at a time" in outcome.detail


def test_the_sweep_sees_a_range_out_of_place():
    """The nesting check itself: a backward range left open across the next
    layer's (what waiting on a shared tensor did) is caught."""
    recorder = attention_coverage._Recorder()
    for name in ("bwd", "layer.3", "bwd", "layer.2"):
        recorder.push(name)
    for _ in range(4):
        recorder.pop()
    assert not attention_coverage.ranges_nested(recorder)
    recorder = attention_coverage._Recorder()
    recorder.push2("bwd", "layer.3")
    recorder.push("head.0")
    recorder.pop()
    recorder.pop2()
    assert attention_coverage.ranges_nested(recorder)
    recorder.push("fwd")  # left open
    assert not attention_coverage.ranges_nested(recorder)
