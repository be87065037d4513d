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
    ("bloom", "hooks", "refused"), ("mpt", "hooks", "refused"), ("deberta-v2", "hooks", "refused"),
])
def test_a_family_is_tagged_as_the_sweep_says(family, layer, head):
    outcome = attention_coverage.try_family(family)
    assert (outcome.layer, outcome.head) == (layer, head), outcome.detail
    assert outcome.layer_exact is True and outcome.phases == ["bwd", "fwd"]
    if head == "refused":
        assert "head mode cannot compute its heads one at a time" in outcome.detail
