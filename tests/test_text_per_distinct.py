"""The per-distinct-value helpers of the hot paths give what the per-row pandas idioms they replace give."""

import numpy as np
import pandas as pd
import pytest

from headcount.attribute.nesting import _runs
from headcount.common import communication
from headcount.common.arrays import distinct_text, equals, per_text

NAMES = ["ncclDevKernel_AllReduce_Sum_f32", None, "ampere_sgemm_128x64", "ncclKernel_SendRecv", "ampere_sgemm_128x64"]


@pytest.mark.parametrize("make", [lambda v: pd.Series(pd.Categorical(v)), lambda v: pd.Series(v, dtype=object), lambda v: pd.Series(v)],
                         ids=["categorical", "object", "str"])
def test_per_text_and_distinct_text_match_astype_str(make):
    values = make(NAMES)
    text = values.astype(str)
    want = text.map({n: communication.kind_of(n) for n in pd.unique(text)})
    got = per_text(values, communication.kind_of)
    assert list(pd.isna(got)) == list(want.isna())
    assert list(got[pd.notna(got)]) == list(want.dropna())
    assert sorted(map(str, distinct_text(values))) == sorted(map(str, pd.unique(text)))
    assert list(equals(values, "ampere_sgemm_128x64")) == [False, False, True, False, True]


def test_per_text_calls_once_per_distinct_value_and_never_for_a_missing_one_unless_there_is_one():
    calls = []
    per_text(pd.Series(pd.Categorical(["a", "b", "a", "a"])), lambda n: calls.append(n))
    assert sorted(calls) == ["a", "b"]
    calls.clear()
    per_text(pd.Series(["a", None]), lambda n: calls.append(n))
    assert calls[0] == "a" and len(calls) == 2 and pd.isna(calls[1])


def test_runs_number_the_groups_of_a_sorted_frame_as_groupby_ngroup_does():
    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(0, 50))
        frame = pd.DataFrame({"pid": pd.Categorical(rng.choice(["1", "2", None], n)),
                              "tid": pd.Series(rng.choice([5, 6, None], n).tolist(), dtype=object),
                              "domain": pd.Series(rng.choice(["a", "b", None], n)),
                              "start_ns": rng.integers(0, 9, n), "end_ns": rng.integers(0, 9, n)})
        keys = ["pid", "tid", "domain"][:int(rng.integers(1, 4))]
        out = frame.sort_values(keys + ["start_ns", "end_ns"], ascending=[True] * (len(keys) + 1) + [False], kind="stable")
        out = out.reset_index(drop=True)
        want = out.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
        assert (_runs(out, keys) == want).all()
