"""Collect per-head attention statistics while a tagger runs
(:mod:`headcount.tagging.attention_stats` does the math).

The tagger calls :meth:`AttentionStatsCollector.observe` with each forward
attention call's q, k and mask, outside headcount's ranges, so the extra
work is never attributed to attention. Its operators are not recorded
either: ``record_function`` is off on the calling thread while it runs, so
a torch.profiler window holds none of them (about 100 operators a call that
the window's build would otherwise read). Still, on a GPU it launches
kernels of its own, which is why it is off by default in timing runs.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import torch

from headcount.tagging.attention_stats import STATS, probabilities, sample_rows, statistics_matrix


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
        # keep these operators out of a recording profiler's trace; the profiler needs record_function on again after
        unrecorded = torch.autograd._profiler_enabled()
        if unrecorded:
            torch.autograd._enable_record_function(False)
        try:
            with torch.no_grad():
                rows = sample_rows(query.shape[2], self.rows)
                mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
                probs, allowed = probabilities(query.detach(), key.detach(), mask, scaling, bool(causal) and mask is None,
                                               kwargs.get("sliding_window"), rows, kwargs.get("position_bias"))
                values = statistics_matrix(probs, allowed, self.top_k).cpu().tolist()  # one copy: (statistic, head)
        finally:
            if unrecorded:
                torch.autograd._enable_record_function(True)
        n_q, n_kv = query.shape[1], key.shape[1]
        with self._lock:
            for h in range(n_q):
                slot = self._sums.setdefault((info.name, info.index, info.model, h, h // max(n_q // max(n_kv, 1), 1)),
                                             {**{s: 0.0 for s in STATS}, "calls": 0, "rows": int(len(rows))})
                for s, per_head in zip(STATS, values):
                    slot[s] += per_head[h]
                slot["calls"] += 1

    def table(self, **leading) -> pd.DataFrame:
        """One row per layer and query head: the statistics averaged over the observed calls, ordered by
        layer, layer name and head; ``leading`` (name → value) are constant columns put first.

        Built column by column: this runs in the training loop, once a profiled step.
        """
        with self._lock:
            items = sorted(self._sums.items(), key=lambda item: (item[0][1] is None, item[0][1] or 0, item[0][0], item[0][3]))
        keys = [key for key, _ in items]
        slots = [slot for _, slot in items]
        calls = [slot["calls"] for slot in slots]
        columns = {name: [value] * len(items) for name, value in leading.items()}
        columns["layer_name"] = [key[0] for key in keys]
        for col, values in (("layer", [key[1] for key in keys]), ("head", [key[3] for key in keys]),
                            ("kv_head", [key[4] for key in keys])):
            columns[col] = pd.array(values, dtype="Int64")
        columns["model"] = [key[2] for key in keys]
        columns["calls"] = pd.array(calls, dtype="Int64")
        columns["rows_per_call"] = pd.array([slot["rows"] for slot in slots], dtype="Int64")
        for stat in STATS:
            columns[stat] = np.array([slot[stat] / n for slot, n in zip(slots, calls)], dtype=float)
        return pd.DataFrame(columns)
