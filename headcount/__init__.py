"""headcount: what attention really costs, per transformer layer and head.

Quick start::

    from headcount import AttentionProfiler
    with AttentionProfiler(model) as prof:
        out = model(**inputs, labels=labels)
        out.loss.backward()
    prof.get_stats()["attention_breakdown"]
"""

__version__ = "0.1.0"

from headcount.api import AttentionProfiler  # noqa: E402
from headcount.collector.tagging import AttentionTagger, attention_range, tag, tag_attention, untag  # noqa: E402
from headcount.errors import HeadcountError  # noqa: E402

__all__ = ["AttentionProfiler", "AttentionTagger", "HeadcountError", "attention_range", "tag", "tag_attention", "untag", "__version__"]
