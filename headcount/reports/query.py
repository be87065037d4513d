"""SQL over a report with DuckDB: one view per table, all runs at once.

The views read ``OUT/<table>/**/*.parquet`` with hive partitioning (so
``run_id`` is a column) and ``union_by_name`` (reports appended by several
headcount versions still read together).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from headcount.errors import HeadcountError
from headcount.reports.dataset import MARKER
from headcount.reports.schema import TABLES


def connect(out: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table of report ``out``.

    Raises:
        HeadcountError: ``out`` is not a headcount report.
    """
    out = Path(out)
    if not (out / MARKER).exists():
        raise HeadcountError(f"{out}: not a headcount report (no {MARKER})", hint="pass the directory headcount profile/run/parse wrote")
    con = duckdb.connect()
    for name in TABLES:
        if list((out / name).glob("**/*.parquet")):
            pattern = str(out / name / "**" / "*.parquet").replace("'", "''")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, union_by_name = true)")
    return con


def run_query(out: str | Path, sql: str):
    """The result of ``sql`` over report ``out`` as a pyarrow Table.

    Raises:
        HeadcountError: not a report, or DuckDB rejected the query (its message, one line).
    """
    con = connect(out)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise HeadcountError(f"query failed: {first}", hint="tables: " + ", ".join(sorted(TABLES))) from exc
    except AttributeError as exc:  # a statement without a result (e.g. CREATE)
        raise HeadcountError("the query returned no table", hint="use a SELECT") from exc
