"""Process and thread ids as the tables hold them: whole numbers (``int64``), so that a join with another tool's
integer pids (nsys's, a scheduler's, ``os.getpid()``) works, and a graph replay's lane in a column of its own.

Inside a build ids stay as the recording gave them (text: a key that pandas groups and merges alike whatever the
source), and a graph replay's call ranges sit on a lane of their own, the launching thread's id then
:data:`REPLAY_LANE`, so that no range of the thread re-attributes their kernels. On the way out (the Parquet
tables, the API's DataFrames) :func:`as_integers` turns ``"144"`` into 144 and ``"144 (graph replay)"`` into tid
144 with ``lane`` ``graph replay``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.common.arrays import codes_of
from headcount.common.errors import HeadcountError

REPLAY_LANE = " (graph replay)"
"""Suffix of the ``tid`` of a graph replay's call ranges inside a build: the launching thread's id, then this."""
ID_COLUMNS = ("pid", "tid")


def as_integers(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """``frame`` with ``pid`` and ``tid`` as nullable ``Int64``, a replay lane's suffix moved from ``tid`` to ``lane``
    (``graph replay``; null elsewhere). Columns already numeric, or absent, are left as they are.

    Raises:
        HeadcountError: an id that is not a whole number (naming the table, the column and the value).
    """
    present = [c for c in ID_COLUMNS if c in frame.columns and not pd.api.types.is_numeric_dtype(frame[c].dtype)]
    if not present:
        return frame
    frame = frame.copy(deep=False)
    for column in present:
        # a table holds few distinct ids over many rows: each worked out once (a Kineto ×100 trace: 600,000 tids, ~10 distinct)
        codes, uniques = codes_of(frame[column])
        texts = [str(u) for u in uniques]
        if column == "tid":
            replay = np.array([t.endswith(REPLAY_LANE) for t in texts], dtype=bool)
            if replay.any():
                texts = [t[:-len(REPLAY_LANE)] if r else t for t, r in zip(texts, replay)]
                lane = np.append(np.where(replay, "graph replay", None).astype(object), None)[codes]  # code -1 (null): None
                frame["lane"] = pd.Series(lane, index=frame.index, dtype=object)
        numbers = pd.to_numeric(pd.Series(texts, dtype=object), errors="coerce")
        bad = numbers.isna() | (numbers.fillna(0) % 1 != 0)
        if bad.any():
            first = texts[int(np.flatnonzero(bad.to_numpy())[0])]
            rows = int(np.isin(codes, np.flatnonzero(bad.to_numpy())).sum())
            raise HeadcountError(f"table {table}: {column} {first!r} is not a whole number "
                                 f"({rows} rows): process and thread ids are integers in headcount's tables",
                                 hint="report the recording that gave it (its ids are not a process's)")
        lookup = pd.array([int(v) for v in numbers] + [pd.NA], dtype="Int64")  # exact integers; the last: code -1, null
        frame[column] = lookup[codes]
    return frame
