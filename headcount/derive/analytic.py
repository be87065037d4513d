"""The analytic model: minimum DRAM bytes and FLOPs of one attention call.

Pure functions of the shapes (:class:`~headcount.common.call_log.CallShape`
fields as DataFrame columns); nothing here is measured, and every number it
produces carries provenance ``analytic``.

Notation: B batch, Hq query heads, Hkv key/value heads, Sq queries, Sk keys,
D head dim of q/k, Dv head dim of v, e bytes per element, P the number of
(query, key) pairs the mask lets through (Sq·Sk without a mask; causal,
aligned to the end as in decoding: Sq·Sk − Sq(Sq−1)/2; a sliding window W
caps each query at W keys).

FLOPs (docs/architecture.md §6): forward 2·B·Hq·P·(D + Dv) (QKᵀ and PV; 4·B·H·P·D when
D = Dv); backward 2.5 × forward; recompute = forward.

Minimum bytes — the traffic the algorithm cannot avoid:

- fused implementations (sdpa, flash_attention_*, flex_attention):
  forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and the
  row log-sum-exp (fp32) and writes dQ, dK, dV.
- eager: the fused traffic plus the score matrix S = Bq·Hq·Sq·Sk elements
  through DRAM — forward writes S, reads it for softmax, writes P, reads P for
  PV (4 passes); backward reads P twice, writes dP, reads dP, writes dS and
  reads dS twice (7 passes) — and, under GQA, repeat_kv's copies of K and V
  (read Hkv heads, write and read Hq heads).
- a materialized mask tensor is read once per pass over the scores that uses
  it (once forward; not in backward).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

FUSED = {"sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention", "manual",
         "vllm", "sglang", "flashinfer", "xformers", "aiter"}
"""Implementations whose kernels never write the score matrix to DRAM (the serving frameworks' are fused kernels too)."""

FLOP_NEEDS = ["batch", "q_heads", "q_len", "kv_len", "head_dim", "v_head_dim", "causal"]
BYTES_NEEDS = [*FLOP_NEEDS, "kv_heads", "dtype_bytes"]
"""The shape columns :func:`flop` and :func:`min_bytes` need, every one known (else their figure is null)."""
MODEL_INPUTS = {*BYTES_NEEDS, "sliding_window", "mask_elements", "mask_dtype_bytes", "implementation", "phase"}
"""Every column :func:`flop` and :func:`min_bytes` read (with the phase they are given)."""

BACKWARD_FLOP_FACTOR = 2.5
LSE_BYTES = 4  # fp32 log-sum-exp per query row, saved by fused kernels


def attended_pairs(q_len: np.ndarray, kv_len: np.ndarray, causal: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Number of (query, key) pairs a call computes, per row (float64).

    Args:
        q_len, kv_len: sequence lengths; causal: bool; window: sliding window (0 = none).
    """
    q = q_len.astype(np.float64)
    k = kv_len.astype(np.float64)
    w = np.where(window > 0, window, np.inf).astype(np.float64)
    full = q * np.minimum(k, w)
    # causal: query i (0-based) sees keys 0 .. k-q+i, i.e. k-q+i+1 of them, capped at w
    first = k - q + 1  # keys seen by the first query
    last = k
    # sum over i of min(first + i, w): the capped part starts where first + i >= w
    n_uncapped = np.clip(np.floor(w - first), 0, q)
    n_uncapped = np.where(np.isinf(w), q, n_uncapped)
    uncapped = n_uncapped * first + n_uncapped * (n_uncapped - 1) / 2
    capped = (q - n_uncapped) * np.where(np.isinf(w), 0, w)
    causal_pairs = np.where(last >= q, uncapped + capped, np.nan)
    return np.where(causal.astype(bool), causal_pairs, full)


def flop(shapes: pd.DataFrame, phase: pd.Series) -> np.ndarray:
    """Analytic FLOPs per call.

    Args:
        shapes: columns ``batch``, ``q_heads``, ``q_len``, ``kv_len``, ``head_dim``,
            ``v_head_dim``, ``causal``, ``sliding_window``.
        phase: ``fwd``, ``bwd`` or ``recompute`` per row.
    """
    pairs = attended_pairs(
        shapes["q_len"].to_numpy(), shapes["kv_len"].to_numpy(),
        shapes["causal"].fillna(False).to_numpy(), shapes["sliding_window"].fillna(0).to_numpy(),
    )
    fwd = 2.0 * shapes["batch"].to_numpy() * shapes["q_heads"].to_numpy() * pairs * (
        shapes["head_dim"].to_numpy() + shapes["v_head_dim"].to_numpy()
    )
    factor = np.where(phase.to_numpy() == "bwd", BACKWARD_FLOP_FACTOR, 1.0)
    return fwd * factor


def min_bytes(shapes: pd.DataFrame, phase: pd.Series) -> np.ndarray:
    """Analytic minimum DRAM bytes per call (see the module docstring).

    Args:
        shapes: the columns of :func:`flop` plus ``implementation``, ``kv_heads``,
            ``dtype_bytes``, ``mask_elements``, ``mask_dtype_bytes``.
        phase: ``fwd``, ``bwd`` or ``recompute`` per row.
    """
    b = shapes["batch"].to_numpy(np.float64)
    hq = shapes["q_heads"].to_numpy(np.float64)
    hkv = shapes["kv_heads"].to_numpy(np.float64)
    sq = shapes["q_len"].to_numpy(np.float64)
    sk = shapes["kv_len"].to_numpy(np.float64)
    d = shapes["head_dim"].to_numpy(np.float64)
    dv = shapes["v_head_dim"].to_numpy(np.float64)
    e = shapes["dtype_bytes"].to_numpy(np.float64)
    mask = shapes["mask_elements"].fillna(0).to_numpy(np.float64) * shapes["mask_dtype_bytes"].fillna(0).to_numpy(np.float64)
    eager = ~shapes["implementation"].isin(FUSED).to_numpy()
    bwd = phase.to_numpy() == "bwd"

    q = b * hq * sq * d * e
    o = b * hq * sq * dv * e
    kv = b * hkv * sk * (d + dv) * e
    fwd_bytes = q + kv + o + mask
    bwd_bytes = 2 * q + 2 * kv + 2 * o + b * hq * sq * LSE_BYTES  # read Q,K,V,O,dO,lse; write dQ,dK,dV

    scores = b * hq * sq * sk * e
    gqa_copy = np.where(hq != hkv, 2 * b * hq * sk * (d + dv) * e, 0.0)
    eager_fwd = fwd_bytes + 4 * scores + gqa_copy
    eager_bwd = bwd_bytes - b * hq * sq * LSE_BYTES + 7 * scores + gqa_copy

    return np.where(eager, np.where(bwd, eager_bwd, eager_fwd), np.where(bwd, bwd_bytes, fwd_bytes))
