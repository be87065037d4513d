"""SQL over a report with DuckDB: one view per table, all runs at once.

The views read ``OUT/<table>/**/*.parquet`` with hive partitioning (so
``run_id`` is a column) and ``union_by_name`` (reports appended by several
headcount versions still read together).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from headcount.common.errors import HeadcountError
from headcount.common.tables import TABLES
from headcount.store.dataset import MARKER, listed_runs, recover

if TYPE_CHECKING:
    import duckdb  # imported when a query runs: not on every command's start (0.09 s)


def connect(out: str | Path) -> "duckdb.DuckDBPyConnection":
    """An in-memory DuckDB connection with a view per table of report ``out``.

    Raises:
        HeadcountError: ``out`` is not a headcount report.
    """
    out = Path(out)
    recover(out)  # a commit a crash interrupted is completed first (where the directory can be written)
    if not (out / MARKER).exists():
        raise HeadcountError(f"{out}: not a headcount report (no {MARKER})", hint="pass the directory headcount profile/run/parse wrote")
    import duckdb

    listed = listed_runs(out)
    con = duckdb.connect()
    for name in TABLES:
        files = [p for p in (out / name).glob("run_id=*/*.parquet") if p.parent.name[len("run_id="):] in listed]
        if files:  # only the runs the marker lists: a commit under way is not seen half done
            paths = ", ".join("'" + str(p).replace("'", "''") + "'" for p in sorted(files))
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{paths}], hive_partitioning = true, union_by_name = true)")
    return con


def run_query(out: str | Path, sql: str):
    """The result of ``sql`` over report ``out`` as a pyarrow Table.

    Raises:
        HeadcountError: not a report, or DuckDB rejected the query (its message, one line).
    """
    import duckdb

    con = connect(out)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise HeadcountError(f"query failed: {first}", hint="tables: " + ", ".join(sorted(TABLES))) from exc
    except AttributeError as exc:  # a statement without a result (e.g. CREATE)
        raise HeadcountError("the query returned no table", hint="use a SELECT") from exc


def range_summary(con: "duckdb.DuckDBPyConnection", top: int = 20) -> pd.DataFrame:
    """Ranges that are not headcount's, per run and range name: a torch.profiler trace's own annotations
    (domain ``torch.profiler``) in every run, NVTX ranges in runs that have no attention layers (someone
    else's code, parsed). Names are
    grouped without the per-call counters PyTorch's ``emit_nvtx`` appends
    (``, seq = N``, ``, op_id = N``), so that ``aten::copy_`` is one row;
    nested ranges overlap, so totals of different rows must not be added.
    A range of a named NVTX domain keeps it, as nsys shows it (``TensorRT:ExecutionContext::execute``).
    Columns (the ``path`` column holds the name): ``instances``,
    ``duration_ns`` (total over the instances), ``p10_ns``/``p50_ns``/``p90_ns``
    per instance (null with fewer than two), ``gpu_op_count``,
    ``duration_basis``; at most ``top`` paths per run, by total time.
    Computed in DuckDB: a parsed export may hold millions of ranges."""
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    if "ranges" not in views:
        return pd.DataFrame(columns=["run_id", "path", "instances", "duration_ns", "p10_ns", "p50_ns", "p90_ns", "gpu_op_count"])
    without_layers = "AND run_id NOT IN (SELECT DISTINCT run_id FROM layers)" if "layers" in views else ""
    q = ", ".join(f"CASE WHEN count(duration_ns) >= 2 THEN quantile_cont(duration_ns, {p / 100}) END AS p{p}_ns" for p in (10, 50, 90))
    return con.sql(rf"""
        WITH other AS (
            SELECT run_id, CASE WHEN coalesce(domain, '') IN ('', 'torch.profiler') THEN '' ELSE domain || ':' END
                           || regexp_replace(name, ',\s*(seq|op_id)\s*=\s*\d+', '', 'g') AS label, duration_ns, gpu_op_count,
                   duration_basis
            FROM ranges
            WHERE level = 'other' AND name IS NOT NULL
              AND coalesce(domain, '') NOT IN ('headcount', 'headcount.step')
              AND (coalesce(domain, '') = 'torch.profiler' {without_layers.replace("AND ", "OR ", 1) if without_layers else "OR TRUE"}))
        SELECT * FROM (
            SELECT run_id, label AS path, count(*) AS instances, sum(duration_ns) AS duration_ns, {q},
                   sum(gpu_op_count) AS gpu_op_count, any_value(duration_basis) AS duration_basis,
                   row_number() OVER (PARTITION BY run_id ORDER BY sum(duration_ns) DESC NULLS LAST) AS rank
            FROM other GROUP BY run_id, label)
        WHERE rank <= {int(top)} ORDER BY run_id, rank""").df().drop(columns=["rank"])
