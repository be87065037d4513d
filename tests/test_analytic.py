"""The analytic model against brute-force counting on explicit masks."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.derive import analytic
from headcount.tagging.shapes import from_call


def _brute_pairs(q: int, k: int, causal: bool, window: int) -> int:
    """Count allowed (query, key) pairs on an explicit mask. Causal queries are
    aligned to the end of the keys (decoding); a window keeps the last W keys
    of each causal query; without causality a window caps each query at W keys."""
    if not causal:
        return q * (min(k, window) if window else k)
    qi = np.arange(q)[:, None] + (k - q)
    kj = np.arange(k)[None, :]
    allowed = kj <= qi
    if window:
        allowed &= kj > qi - window
    return int(allowed.sum())


@settings(max_examples=200, deadline=None)
@given(q=st.integers(1, 64), extra=st.integers(0, 64), causal=st.booleans(), window=st.integers(0, 80))
def test_attended_pairs_match_brute_force(q, extra, causal, window):
    k = q + extra
    got = analytic.attended_pairs(np.array([q]), np.array([k]), np.array([causal]), np.array([window]))[0]
    assert got == _brute_pairs(q, k, causal, window)


def _shape_frame(**kw):
    base = dict(implementation="sdpa", batch=2, q_heads=8, kv_heads=2, q_len=128, kv_len=128, head_dim=64, v_head_dim=64,
                dtype_bytes=2, causal=False, sliding_window=None, mask_elements=0, mask_dtype_bytes=0)
    base.update(kw)
    return pd.DataFrame([base])


def test_flop_formula_and_factors():
    f = _shape_frame()
    fwd = analytic.flop(f, pd.Series(["fwd"]))[0]
    assert fwd == 4 * 2 * 8 * 128 * 128 * 64
    assert analytic.flop(f, pd.Series(["bwd"]))[0] == 2.5 * fwd
    assert analytic.flop(f, pd.Series(["recompute"]))[0] == fwd
    causal = analytic.flop(_shape_frame(causal=True), pd.Series(["fwd"]))[0]
    assert causal == 4 * 2 * 8 * (128 * 129 // 2) * 64  # "halved", exactly


def test_min_bytes_fused_eager_gqa_mask():
    fwd = pd.Series(["fwd"])
    fused = analytic.min_bytes(_shape_frame(), fwd)[0]
    e = 2
    q = 2 * 8 * 128 * 64 * e
    kv = 2 * 2 * 128 * 128 * e
    assert fused == 2 * q + kv  # Q + O + K + V
    eager = analytic.min_bytes(_shape_frame(implementation="eager"), fwd)[0]
    scores = 2 * 8 * 128 * 128 * e
    gqa_copy = 2 * (2 * 8 * 128 * (64 + 64)) * e  # repeat_kv writes and re-reads K and V for 8 heads
    assert eager == fused + 4 * scores + gqa_copy
    mha = analytic.min_bytes(_shape_frame(kv_heads=8), fwd)[0]
    assert mha > fused  # GQA reads fewer key/value bytes
    masked = analytic.min_bytes(_shape_frame(mask_elements=2 * 128 * 128, mask_dtype_bytes=1), fwd)[0]
    assert masked == fused + 2 * 128 * 128
    bwd = analytic.min_bytes(_shape_frame(), pd.Series(["bwd"]))[0]
    assert bwd == 2 * fused + 2 * 8 * 128 * analytic.LSE_BYTES


def test_one_head_shape():
    import torch

    q = torch.zeros(2, 8, 16, 4)
    k = torch.zeros(2, 2, 16, 4)
    mask = torch.zeros(2, 8, 16, 16)
    shape = from_call("eager", q, k, k, mask, causal=True)
    one = shape.one_head()
    assert (one.q_heads, one.kv_heads, one.mask_elements) == (1, 1, 2 * 16 * 16)
    shared = from_call("eager", q, k, k, torch.zeros(2, 1, 16, 16), causal=True).one_head()
    assert shared.mask_elements == 2 * 16 * 16
    assert not from_call("sdpa", q[:, :, :1], k, k, None, causal=True).causal  # one query: nothing to mask
