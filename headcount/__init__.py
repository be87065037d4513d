"""headcount: what attention really costs, per transformer layer and head.

Quick start::

    from headcount import AttentionProfiler
    with AttentionProfiler(model) as prof:
        out = model(**inputs, labels=labels)
        out.loss.backward()
    prof.get_stats()["attention_breakdown"]
"""

from importlib import import_module

from headcount._version import __version__
from headcount.collector import cupti_home as _cupti_home
from headcount.common.errors import HeadcountError

# before torch is imported: a CUDA torch then loads the cupti source's libcupti, not its own older one
_cupti_home.put_first()

# imported on first use: the profiler pulls in torch (~2 s), which `headcount parse`,
# `report`, `query` and the wrapped tools never need
_LAZY = {
    "AttentionProfiler": "headcount.api",
    "AttentionTagger": "headcount.tagging.tagger",
    "attention_range": "headcount.tagging.tagger",
    "tag": "headcount.tagging.tagger",
    "tag_attention": "headcount.tagging.tagger",
    "untag": "headcount.tagging.tagger",
}

__all__ = ["AttentionProfiler", "AttentionTagger", "HeadcountError", "attention_range", "tag", "tag_attention", "untag", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")
