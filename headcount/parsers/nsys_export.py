"""An nsys export behind one interface, whichever its format: SQLite (a file)
or ``parquetdir`` (a directory of ``<TABLE>.parquet``), and its queries read
into columns.

:class:`ExportSource` is what :mod:`headcount.parsers.nsys_sqlite` reads
through (:func:`open_export` opens one): SQL in the engine's dialect
(sqlite3 and the ADBC SQLite driver for a file, DuckDB for a directory), the
export's tables and columns, and a count of what could not be read as the
schema says. :func:`query_columns` runs a query into numpy arrays and
Categoricals: SQLite columns have no fixed type, so NULLs travel as values
no nsys column holds, and text that is not UTF-8 is read again as bytes.
An engine's error becomes headcount's in one place (:func:`_damaged`).
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from headcount.common.errors import HeadcountError
from headcount.parsers.files import head_bytes
from headcount.parsers.options import ReadOptions

# the GPU-activity tables, each with the kind of its rows (a parquetdir export holds one of them or NVTX_EVENTS)
GPU_TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL": "kernel", "CUPTI_ACTIVITY_KIND_MEMCPY": "memcpy", "CUPTI_ACTIVITY_KIND_MEMSET": "memset"}

_SQLITE_MAGIC = b"SQLite format 3\x00"

NULL_INT = -1  # no timestamp, id, count or size in an nsys export is negative
ABSENT = np.iinfo(np.int64).min  # NULL of an ``int~`` column (a raw value: -1 is a value there)

BATCH_ROWS = 262_144  # rows per Arrow batch from the database: what is held in Arrow form at a time


class NotPlain(Exception):
    """A plain read (:func:`query_columns` ``plain=True``) met a value that is not an integer in an integer column:
    the caller reads the strict way instead."""


class ExportSource(ABC):
    """One open export, whatever its format: SQL in its dialect, and what could not be read as the schema says.

    Attributes:
        path: the export.
        threads: threads its large tables are read with (:class:`~headcount.parsers.options.ReadOptions`).
        bad_text: strings that were not UTF-8 (read with U+FFFD in their place).
        odd_values: values where the schema has integers that were not integers (read as missing).
        strings: ``StringIds`` (ids, strings), read once (:func:`~headcount.parsers.nsys_sqlite._string_ids`).
    """

    errors: tuple[type[BaseException], ...] = ()  # what the engine raises for a query it cannot answer

    def __init__(self, path: Path, threads: int):
        self.path, self.threads = path, threads
        self.bad_text = self.odd_values = 0
        self.strings: tuple[np.ndarray, list[str]] | None = None

    def rows(self, sql: str) -> list[tuple]:
        """The query's rows; the one place an engine's error becomes headcount's (:func:`_damaged`)."""
        try:
            return self._execute(sql)
        except self.errors as exc:
            raise _damaged(self.path, exc) from exc

    def notices(self) -> list[str]:
        """What the reader should know of the values read so far."""
        out = []
        if self.bad_text:
            out.append(f"{self.bad_text} strings were not UTF-8: shown with U+FFFD where their bytes were")
        if self.odd_values:
            out.append(f"{self.odd_values} values where the schema has integers were not integers (text, blobs, "
                       "StringIds rows without an integer id): read as missing")
        return out

    @abstractmethod
    def _execute(self, sql: str) -> list[tuple]:
        """Run ``sql`` and fetch every row (the engine's own errors: :attr:`errors`)."""

    @abstractmethod
    def int_expr(self, col: str) -> str:
        """``col`` as an integer, NULL as :data:`NULL_INT`."""

    @abstractmethod
    def least(self, expr: str, bound: int) -> str:
        """The smaller of ``expr`` and ``bound`` (a row's value, not an aggregate)."""

    @abstractmethod
    def strict_int(self, col: str) -> str:
        """``col`` where it holds an integer, else NULL."""

    @abstractmethod
    def tables(self) -> set[str]:
        """The export's table names."""

    @abstractmethod
    def columns(self, table: str) -> set[str]:
        """A table's column names."""

    @abstractmethod
    def batches(self, sql: str):
        """The result as Arrow record batches, read as they are consumed."""

    @abstractmethod
    def close(self) -> None:
        """Let the export go."""


class _SqliteSource(ExportSource):
    """An nsys SQLite export: metadata queries through sqlite3, bulk reads
    through the ADBC SQLite driver (columnar, ~6× faster than sqlite3 + pandas
    on millions of rows)."""

    errors = (sqlite3.Error, UnicodeDecodeError)  # a damaged schema can make SQLite's own message undecodable

    def __init__(self, path: Path, threads: int):
        super().__init__(path, threads)
        magic = head_bytes(path, 16)
        if magic != _SQLITE_MAGIC:
            raise HeadcountError(f"{path}: not an SQLite file", hint="export the report with `nsys export --type sqlite`")
        # immutable: no lock, no -shm/-wal file beside an export (a WAL-mode file in a read-only directory reads too)
        self.con = sqlite3.connect(_uri(path), uri=True)
        self.con.text_factory = self._decode
        try:
            self.con.execute("PRAGMA schema_version").fetchone()
            self.con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except self.errors as exc:
            self.con.close()
            raise HeadcountError(f"{path}: damaged or truncated SQLite export ({exc})", hint="export the report again") from exc

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.bad_text += 1
            return raw.decode("utf-8", errors="replace")

    def int_expr(self, col: str) -> str:
        return f"IFNULL({col}, {NULL_INT})"  # a CAST would cost a third of the read

    def least(self, expr: str, bound: int) -> str:
        return f"MIN({expr}, {bound})"

    def strict_int(self, col: str) -> str:
        """``col`` where it holds an integer, else NULL: SQLite's CAST would read '12abc' as 12."""
        return f"(CASE WHEN typeof({col}) = 'integer' THEN {col} END)"

    def tables(self) -> set[str]:
        return {r[0] for r in self.rows("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.rows(f"PRAGMA table_info({table})")}

    def _execute(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()

    def batches(self, sql: str):
        import adbc_driver_sqlite.dbapi as adbc

        with adbc.connect(_uri(self.path)) as con, con.cursor() as cur:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})  # the driver's default: 1024
            cur.execute(sql)
            yield from cur.fetch_record_batch()

    def close(self) -> None:
        self.con.close()


class _ParquetDirSource(ExportSource):
    """An nsys ``parquetdir`` export (one ``<TABLE>.parquet`` per table), queried
    with DuckDB through views named like the SQLite tables; ``rowid`` is the
    row's position in its file, counted from 1 as SQLite counts rowids."""

    def __init__(self, path: Path, threads: int):
        import duckdb

        super().__init__(path, threads)
        self.errors = (duckdb.Error,)
        files = sorted(path.glob("*.parquet"))
        if not files:
            raise HeadcountError(f"{path}: not an nsys parquetdir export (no .parquet files)",
                                 hint="export with `nsys export --type parquetdir`, or pass a .sqlite export")
        self.con = duckdb.connect()
        self._tables = set()
        for file in files:
            name = file.stem
            if not name.replace("_", "").isalnum():
                continue
            try:
                self.con.execute(f"CREATE VIEW {name} AS SELECT *, file_row_number + 1 AS rowid "
                                 f"FROM read_parquet('{file.as_posix()}', file_row_number = true)")
                self.con.execute(f"SELECT * FROM {name} LIMIT 0")
            except duckdb.Error as exc:
                raise HeadcountError(f"{file}: unreadable Parquet ({str(exc).splitlines()[0]})", hint="export the report again") from exc
            self._tables.add(name)
        if not self._tables & {"NVTX_EVENTS", *GPU_TABLES}:
            raise HeadcountError(f"{path}: not an nsys parquetdir export (no NVTX_EVENTS or CUPTI tables)",
                                 hint="export with `nsys export --type parquetdir`")

    def int_expr(self, col: str) -> str:
        return f"IFNULL(CAST({col} AS BIGINT), {NULL_INT})"  # Parquet ids are unsigned

    def least(self, expr: str, bound: int) -> str:  # MIN(a, b) is DuckDB's top-n aggregate
        return f"LEAST(CAST({expr} AS BIGINT), {bound})"

    def strict_int(self, col: str) -> str:  # Parquet columns are typed
        return f"CAST({col} AS BIGINT)"

    def tables(self) -> set[str]:
        return set(self._tables)

    def columns(self, table: str) -> set[str]:
        return {r[0] for r in self.rows(f"SELECT column_name FROM (DESCRIBE {table})")}

    def _execute(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()

    def batches(self, sql: str):
        yield from self.con.cursor().sql(sql).to_arrow_reader(BATCH_ROWS)

    def close(self) -> None:
        self.con.close()


def _uri(path: Path) -> str:
    """The read-only, immutable SQLite URI of ``path`` (any character in its name quoted)."""
    from urllib.parse import quote

    return f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"


def open_export(path: Path, options: ReadOptions = ReadOptions()) -> ExportSource:
    """The export at ``path``: a ``parquetdir`` export where it is a directory, else an SQLite file."""
    return _ParquetDirSource(path, options.threads) if path.is_dir() else _SqliteSource(path, options.threads)


def _damaged(path: Path, exc: BaseException) -> HeadcountError:
    """The one error for a file the database engine cannot read as asked: a
    schema headcount does not know (a table or column missing or renamed), or damage."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(k in first.lower() for k in ("no such column", "no such table", "not found in from clause", "does not exist")):
        return HeadcountError(f"{path}: an export schema headcount does not know ({first})",
                              hint="export it with the nsys that recorded it; if it is that nsys's own schema, report it")
    return HeadcountError(f"{path}: damaged or truncated export ({first})", hint="export the report again")


def query_frame(src, sql: str | list[str], types: dict[str, str]) -> pd.DataFrame:
    """:func:`query_columns` as a DataFrame."""
    return pd.DataFrame(query_columns(src, sql, types))


def query_columns(src, sql: str | list[str], types: dict[str, str], plain: bool = False) -> dict:
    """Run ``sql`` and return the columns of ``types`` (a dict of arrays): ``int`` (NULL comes
    back as ``<NA>``), ``int?`` (NULL comes back as -1, a plain int64 column),
    ``int!`` (a column the schema declares NOT NULL, read as is), ``int~`` (``plain`` only: a raw
    value, NULL as :data:`ABSENT`) or ``text`` (NULL or empty comes back as ``None``; a Categorical).

    SQLite columns have no fixed type and the ADBC driver infers one from the
    first rows, so NULLs are replaced in SQL (integers by -1, which no nsys
    value can be; text by '') and restored here. Several ``sql`` (parts of
    one table) run on as many threads: the driver releases the GIL.

    ``plain``: the integer columns are read as they are (NULLs replaced here, in Arrow: no SQL per row), for a
    caller that checks their values in numpy.

    Raises:
        NotPlain: (``plain``) a value of an integer column is not an integer (the driver's type mismatch), or
            anything else went wrong (the strict read names it).
        HeadcountError: the export is damaged.
    """
    cols = []
    for col, kind in types.items():
        if kind == "int!" or (plain and kind != "text"):
            cols.append(col)
        elif kind in ("int", "int?"):
            cols.append(f"{src.int_expr(col)} AS {col}")
        else:
            cols.append(f"CAST(IFNULL({col}, '') AS TEXT) AS {col}")
    selects = [f"SELECT {', '.join(cols)} FROM ({part})" for part in ([sql] if isinstance(sql, str) else sql)]
    try:
        if len(selects) > 1:
            with ThreadPoolExecutor(max_workers=len(selects)) as pool:
                parts = list(pool.map(lambda one: _arrays_of(src.batches(one), types, plain), selects))
        else:
            parts = [_arrays_of(src.batches(selects[0]), types, plain)]
    except NotPlain:
        raise
    except Exception as exc:  # noqa: BLE001 - sqlite3, ADBC and DuckDB raise different types for a damaged file
        if plain:  # a type mismatch, text that is not UTF-8, a damaged file: the strict read says which
            raise NotPlain(str(exc)) from exc
        if "utf-8" not in str(exc).lower() and "utf8" not in str(exc).lower():
            raise _damaged(src.path, exc) from exc
        parts = _text_as_bytes(src, sql, types)  # text that is not UTF-8: read as bytes, decoded with U+FFFD
    src.odd_values += sum(part.pop("__odd__") for part in parts)
    columns = {}
    for col, kind in types.items():
        if kind == "text":
            # one dictionary for all parts: the first part's, extended by the others' new strings
            words: dict[str, int] = {}
            codes = []
            for part in parts:
                own, local = part[col]
                remap = np.array([words.setdefault(w, len(words)) for w in local] + [-1], dtype=np.int64)
                codes.append(remap[own])  # own == -1 picks the trailing -1
            codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
            empty = words.get("")  # '' stands for NULL (see above)
            if empty is not None:
                codes = np.where(codes == empty, -1, codes)
            columns[col] = pd.Categorical.from_codes(codes, categories=pd.Index(list(words), dtype=object))
            continue
        pieces = [part.pop(col) for part in parts]  # each part's column is let go once joined
        values = pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        del pieces
        if kind == "int":
            null = values == NULL_INT
            if null.any():
                columns[col] = pd.arrays.IntegerArray(np.where(null, 0, values), null)
                continue
        columns[col] = values
    return columns


def _text_as_bytes(src, sql: str | list[str], types: dict[str, str]) -> list[dict]:
    """:func:`_arrays_of` of a query whose text is not all UTF-8: text columns read
    as bytes and decoded with U+FFFD for what is not UTF-8 (counted in
    ``src.bad_text``). The slow path, taken only for such files."""
    cols = [f"{src.int_expr(col)} AS {col}" if kind != "text" else f"CAST(IFNULL({col}, '') AS BLOB) AS {col}"
            for col, kind in types.items()]
    parts = []
    for part in [sql] if isinstance(sql, str) else sql:
        try:
            batches = list(src.batches(f"SELECT {', '.join(cols)} FROM ({part})"))
        except Exception as exc:  # noqa: BLE001 - as in query_columns
            raise _damaged(src.path, exc) from exc
        decoded = []
        for batch in batches:
            arrays = []
            for name in batch.schema.names:
                column = batch.column(name)
                if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                    text = []
                    for raw in column.to_pylist():
                        try:
                            text.append(None if raw is None else raw.decode("utf-8"))
                        except UnicodeDecodeError:
                            src.bad_text += 1
                            text.append(raw.decode("utf-8", errors="replace"))
                    column = pa.array(text, type=pa.string())
                arrays.append(column)
            decoded.append(pa.RecordBatch.from_arrays(arrays, names=batch.schema.names))
        parts.append(_arrays_of(iter(decoded), types))
    return parts


def _arrays_of(batches, types: dict[str, str], plain: bool = False) -> dict:
    """Record batches → per column an int64 array (``int``), or ``(codes, words)``
    (``text``: dictionary-encoded batch by batch; codes index ``words``, -1 for null).
    ``plain``: integer columns as read, their NULLs replaced here (see :func:`query_columns`).

    Raises:
        NotPlain: (``plain``) an integer column came back as another type."""
    ints = {col: [] for col, kind in types.items() if kind != "text"}
    texts = {col: ([], {}) for col, kind in types.items() if kind == "text"}
    odd = 0  # values of an integer column that are not integers (text, blobs): read as missing
    for batch in batches:
        for col in ints:
            column = batch.column(col)
            if plain:
                if not (pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
                    raise NotPlain(f"{col}: {column.type}")
                if column.null_count:
                    column = pc.fill_null(column.cast(pa.int64()), ABSENT if types[col] == "int~" else NULL_INT)
            if not (pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):  # bytes: they may not be UTF-8
                    column = column.cast(pa.binary())
                values = pd.to_numeric(pd.Series([v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
                                                  for v in column.to_pylist()], dtype=object), errors="coerce")
                bad = values.isna() & pd.Series(column.is_valid().to_pylist())
                odd += int(bad.sum())
                ints[col].append(values.fillna(NULL_INT).to_numpy(np.float64).astype(np.int64))
                continue
            ints[col].append(column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
        for col, (codes, words) in texts.items():
            encoded = pc.dictionary_encode(batch.column(col).cast(pa.string()))  # an empty batch can come typed as integers
            remap = np.array([words.setdefault(w, len(words)) for w in encoded.dictionary.to_pylist()] + [-1], dtype=np.int64)
            codes.append(remap[encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)].astype(np.int32))
    out = {"__odd__": odd}
    for col in list(ints):  # column by column, each list let go once joined: never two copies of every column
        parts = ints.pop(col)
        out[col] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        del parts
    for col, (codes, words) in texts.items():
        out[col] = (np.concatenate(codes) if codes else np.zeros(0, np.int32), list(words))
    return out
