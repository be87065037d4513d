"""What each head attends to: statistics of softmax(QKᵀ) per head.

Implementations that return no weights (sdpa, flash) are covered by
recomputing the probabilities in fp32 from q and k on a sample of query rows,
with the mask the call received (boolean, or additive float: padding, causal,
sliding window), T5's ``position_bias`` when given, else the causal flag.

Per head, averaged over batch and sampled rows:

- ``entropy_nats`` H = −Σ p log p;
- ``normalized_entropy`` H / log(n), n the row's attendable keys (1 = uniform, 0 = one key);
- ``max_attention`` the largest probability of the row;
- ``top_k_mass`` the probability on the row's k most attended keys;
- ``effective_tokens`` exp(H).

All provenance ``analytic`` in the sense that they are computed, not counted
by hardware; they describe the model, not the GPU.
"""

from __future__ import annotations

import math

import torch

STATS = ("entropy_nats", "normalized_entropy", "max_attention", "top_k_mass", "effective_tokens")


_ROWS: dict[tuple[int, int | None], torch.Tensor] = {}  # (q_len, rows) → positions: the same few shapes every step


def sample_rows(q_len: int, rows: int | None) -> torch.Tensor:
    """Query positions to evaluate: all when ``rows`` is None or ≥ the length,
    else ``rows`` positions evenly spaced, last row included (a CPU tensor,
    shared between calls: do not modify it)."""
    cached = _ROWS.get((q_len, rows))
    if cached is None:
        if len(_ROWS) > 1024:  # generation sees a new length every token
            _ROWS.clear()
        if rows is None or rows >= q_len:
            cached = torch.arange(q_len)
        else:
            cached = torch.linspace(0, q_len - 1, rows).round().long().unique()
        _ROWS[(q_len, rows)] = cached
    return cached


def probabilities(query: torch.Tensor, key: torch.Tensor, attention_mask=None, scaling: float | None = None,
                  causal: bool = False, sliding_window: int | None = None, rows: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None):
    """softmax(q·kᵀ·scaling + mask) in fp32 for the sampled rows.

    Args:
        query: (B, Hq, Q, D); key: (B, Hkv, K, D) — GQA: query head h reads key head h // (Hq/Hkv).
        attention_mask: None, boolean (True: attend) or additive float, broadcastable to (B, Hq, Q, K).
        rows: query positions to keep (default all).
        bias: an additive score bias broadcastable like the mask (T5's ``position_bias``).

    Returns:
        (probabilities (B, Hq, R, K), allowed (B, Hq, R, K) boolean; a broadcast view, not to be written to).
    """
    b, hq, q_len, d = query.shape
    hkv, k_len = key.shape[1], key.shape[2]
    rows = torch.arange(q_len, device=query.device) if rows is None else rows.to(query.device)
    q = query.index_select(2, rows).float()
    k = key.float()
    if hkv != hq:
        k = k.repeat_interleave(hq // hkv, dim=1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    allowed = None  # every key, until a mask or the causal flag says otherwise
    if bias is not None:
        b_rows = bias[..., rows, :] if bias.shape[-2] == q_len else bias
        scores = scores + b_rows[..., :k_len].float()
    if attention_mask is not None:
        mask = attention_mask[..., rows, :] if attention_mask.shape[-2] == q_len else attention_mask
        mask = mask[..., :k_len]
        if mask.dtype == torch.bool:
            allowed = mask
        else:
            mask = mask.float()
            scores = scores + mask
            allowed = mask > torch.finfo(torch.float32).min / 2
    elif causal:
        offset = k_len - q_len
        keys = torch.arange(k_len, device=query.device)
        allowed = keys[None, :] <= (rows[:, None] + offset)
        if sliding_window:
            allowed = allowed & (keys[None, :] > (rows[:, None] + offset - sliding_window))
    if allowed is None:
        allowed = torch.ones((), dtype=torch.bool, device=scores.device)
    else:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no key allowed: NaN → 0
    return probs, allowed.expand(scores.shape)


def statistics_matrix(probs: torch.Tensor, allowed: torch.Tensor, top_k: int = 5) -> torch.Tensor:
    """(len(STATS), Hq): per head, the means of :data:`STATS` over batch and rows, in that order."""
    p = probs.clamp_min(0)
    entropy = -(p * p.log()).nan_to_num_(0.0).sum(-1)  # 0 · log 0 = 0 (xlogy is several times slower on the CPU)
    n = allowed.sum(-1).clamp_min(1).float()
    normalized = torch.where(n > 1, entropy / n.log().clamp_min(1e-12), torch.zeros_like(entropy))
    top = p.topk(min(top_k, p.shape[-1]), dim=-1).values  # sorted: the first is the row's largest
    per_row = torch.stack([entropy, normalized, top[..., 0], top.sum(-1), entropy.exp()])  # the order of STATS
    return per_row.mean(dim=(1, 3))


def head_statistics(probs: torch.Tensor, allowed: torch.Tensor, top_k: int = 5) -> dict[str, torch.Tensor]:
    """Per head (Hq,) means of :data:`STATS` over batch and rows."""
    return dict(zip(STATS, statistics_matrix(probs, allowed, top_k).unbind(0)))
