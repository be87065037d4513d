"""The GPU activity tables of an nsys export read the fast way (integers read as they are, checked in numpy) give
the columns of the strict way (checked in SQL), on odd integers too; a value that is not an integer sends the
read the strict way (issue 60)."""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from headcount.parsers import nsys_gpu_query
from headcount.parsers.nsys_export import open_export
from tests import fuzz_cases

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
ODD_INTEGERS = [  # every check of the packing at its edges: negative, too wide, NULL (where the schema allows it), limits
    "deviceId = -3, streamId = -2, registersPerThread = 16383, staticSharedMemory = -1, dynamicSharedMemory = 5",
    "gridX = 2147483647, gridY = 65535, gridZ = 0, blockX = -1, sharedMemoryExecuted = 16777214",
    "gridY = 65536, registersPerThread = 16382, sharedMemoryExecuted = NULL, deviceId = 1048574, streamId = 1099511627774",
    "gridX = 2147483648, blockZ = -9, sharedMemoryExecuted = 16777215, dynamicSharedMemory = 4611686018427387904",
    "deviceId = 1048575, streamId = 1099511627775, correlationId = NULL, graphNodeId = -7, staticSharedMemory = 16777214",
]


def _both(path):
    src = open_export(path)
    try:
        have = src.columns(KERNELS)
        fast = nsys_gpu_query.gpu_columns(src, KERNELS, have, "shortName")
        strict = nsys_gpu_query._strict(src, KERNELS, have, "shortName", "")
    finally:
        src.close()
    return fast, strict


@pytest.fixture
def export(tmp_path):
    path = tmp_path / "odd.sqlite"
    shutil.copy(fuzz_cases.NSYS_BASE, path)
    return path


def test_odd_integers_read_fast_as_the_strict_read_gives_them(export):
    with sqlite3.connect(export) as con:
        for k, change in enumerate(ODD_INTEGERS, start=1):
            con.execute(f"UPDATE {KERNELS} SET {change} WHERE rowid = {k}")
    fast, strict = _both(export)
    assert len(fast) > len(ODD_INTEGERS)
    pd.testing.assert_frame_equal(fast, strict)
    assert (fast["grid"].to_numpy()[:5] == -1).sum() >= 2  # the edges above do reach the unknown value


def test_a_value_that_is_not_an_integer_is_read_the_strict_way(export, monkeypatch):
    with sqlite3.connect(export) as con:
        con.execute(f"UPDATE {KERNELS} SET gridX = '3z', registersPerThread = 2.5 WHERE rowid = (SELECT max(rowid) FROM {KERNELS})")
    strict_calls = []
    real = nsys_gpu_query._strict
    monkeypatch.setattr(nsys_gpu_query, "_strict", lambda *a: strict_calls.append(a) or real(*a))
    fast, strict = _both(export)
    assert len(strict_calls) == 2  # the fast read gave up, and the comparison's own
    pd.testing.assert_frame_equal(fast, strict)
    last = fast.iloc[-1]
    assert last["grid"] == -1 and (int(last["resources"]) >> (2 * nsys_gpu_query.SHARED_BITS)) == 0
    assert np.all(fast["grid"].to_numpy()[:-1] >= 0)
