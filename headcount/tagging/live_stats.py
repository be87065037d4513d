"""Collect per-head attention statistics while a tagger runs
(:mod:`headcount.tagging.attention_stats` does the math).

The tagger calls :meth:`AttentionStatsCollector.observe` with each forward
attention call's q, k and mask, outside headcount's ranges, so the extra
work is never attributed to attention; still, it launches kernels of its
own, which is why it is off by default in timing runs.
"""

from __future__ import annotations

import threading

import pandas as pd
import torch

from headcount.tagging.attention_stats import STATS, head_statistics, probabilities, sample_rows


class AttentionStatsCollector:
    """Running means of the statistics per (layer, head).

    Args:
        rows: query rows sampled per call (None: all rows).
        top_k: k of ``top_k_mass``.
        every: observe one forward call in ``every`` per layer (1: all).
    """

    def __init__(self, rows: int | None = 64, top_k: int = 5, every: int = 1):
        self.rows = rows
        self.top_k = top_k
        self.every = max(int(every), 1)
        self._lock = threading.Lock()
        self._sums: dict[tuple, dict] = {}
        self._seen: dict[str, int] = {}

    def observe(self, info, module, query, key, attention_mask, kwargs) -> None:
        if query.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # copying the statistics to the CPU would end a CUDA graph capture with an error
        count = self._seen.get(info.name, 0)
        self._seen[info.name] = count + 1
        if count % self.every:
            return
        causal = kwargs.get("is_causal")
        if causal is None:
            causal = getattr(module, "is_causal", False)
        scaling = kwargs.get("scaling", getattr(module, "scaling", None))
        with torch.no_grad():
            rows = sample_rows(query.shape[2], self.rows)
            mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
            probs, allowed = probabilities(query.detach(), key.detach(), mask, scaling, bool(causal) and mask is None,
                                           kwargs.get("sliding_window"), rows, kwargs.get("position_bias"))
            stats = head_statistics(probs, allowed, self.top_k)
            values = torch.stack([stats[s] for s in STATS]).cpu().tolist()  # one copy, read at once: (statistic, head)
        n_q, n_kv = query.shape[1], key.shape[1]
        with self._lock:
            for h in range(n_q):
                slot = self._sums.setdefault((info.name, info.index, info.model, h, h // max(n_q // max(n_kv, 1), 1)),
                                             {**{s: 0.0 for s in STATS}, "calls": 0, "rows": int(len(rows))})
                for s, per_head in zip(STATS, values):
                    slot[s] += per_head[h]
                slot["calls"] += 1

    def table(self) -> pd.DataFrame:
        """One row per layer and query head: the statistics averaged over the observed calls."""
        rows = []
        with self._lock:
            for (name, index, model, head, kv_head), slot in self._sums.items():
                calls = slot["calls"]
                rows.append({"layer_name": name, "layer": index, "head": head, "kv_head": kv_head, "model": model,
                             "calls": calls, "rows_per_call": slot["rows"], **{s: slot[s] / calls for s in STATS}})
        frame = pd.DataFrame(rows, columns=["layer_name", "layer", "head", "kv_head", "model", "calls", "rows_per_call", *STATS])
        for col in ("layer", "head", "kv_head", "calls", "rows_per_call"):
            frame[col] = pd.array(frame[col], dtype="Int64")
        return frame.sort_values(["layer", "layer_name", "head"], kind="stable").reset_index(drop=True)
