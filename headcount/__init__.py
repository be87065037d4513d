"""headcount: what attention really costs, per transformer layer and head.

Quick start::

    from headcount import AttentionProfiler
    with AttentionProfiler(model) as prof:
        out = model(**inputs, labels=labels)
        out.loss.backward()
    prof.get_stats()["attention_breakdown"]
"""

from headcount._version import __version__
from headcount.api import AttentionProfiler
from headcount.errors import HeadcountError
from headcount.tagging.tagger import AttentionTagger, attention_range, tag, tag_attention, untag

__all__ = ["AttentionProfiler", "AttentionTagger", "HeadcountError", "attention_range", "tag", "tag_attention", "untag", "__version__"]
