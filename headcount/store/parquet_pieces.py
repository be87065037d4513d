"""How a table's pieces become Parquet: Arrow conversion of a DataFrame piece to its
fixed schema (text dictionary-encoded), row-group sizes, writer options.

Used by :class:`headcount.store.dataset.StagedRun`, which writes them; no file is
opened here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from headcount.common import process_ids
from headcount.common.errors import HeadcountError

CHUNK_BYTES = 48 << 20  # Arrow bytes converted and written at a time (one Parquet row group): bounds the copy
CHUNK_ROWS = 262_144  # at most this many rows per row group
TEXT = pa.dictionary(pa.int32(), pa.string())  # how text columns travel to the Parquet writer


def file_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a table's pieces are converted to: text columns dictionary-encoded.

    The files are written without Arrow's own schema (``store_schema=False``),
    so every reader sees plain Parquet strings (pandas ``str``, DuckDB
    ``VARCHAR``) whatever the encoding on the way; a name that repeats on
    millions of rows is never expanded in memory."""
    return pa.schema([pa.field(f.name, TEXT) if pa.types.is_string(f.type) else f for f in schema])


# columns readers filter on: min/max statistics let DuckDB, polars and pyarrow skip row groups
STATISTICS = ("run_id", "step", "layer", "head", "phase", "level", "layer_name", "name", "kind", "device",
              "start_ns", "end_ns", "range_id", "implementation")


def chunk_rows(schema: pa.Schema) -> int:
    """Rows per row group of a table: :data:`CHUNK_BYTES` of its columns (8 bytes
    a number, 4 a text code), at most :data:`CHUNK_ROWS`."""
    width = sum(4 if pa.types.is_dictionary(f.type) else 8 for f in schema) or 8
    return max(1 << 14, min(CHUNK_ROWS, CHUNK_BYTES // width))


def writer_options(schema: pa.Schema) -> dict:
    """Parquet writer options for a :func:`file_schema`: dictionary pages for the
    text columns only (numbers are written plainly: trying a dictionary on every
    integer column cost more than half of the write time and made files larger),
    statistics for the columns readers filter on (:data:`STATISTICS`)."""
    return {"use_dictionary": [f.name for f in schema if pa.types.is_dictionary(f.type)],
            "write_statistics": [f.name for f in schema if f.name in STATISTICS]}


def text_array(values: pd.Series, words_of: dict | None = None) -> pa.DictionaryArray:
    """A text column as an Arrow dictionary array, without a Python call per value.
    ``words_of``: a Categorical's categories as Arrow strings, by ``id`` of the
    categories (the chunks of one piece share them: converted once)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        categories = values.cat.categories
        words = (words_of or {}).get(id(categories))
        if words is None:
            words = pa.array([c if isinstance(c, str) else str(c) for c in categories], type=pa.string())
            if words_of is not None:
                words_of[id(categories)] = words
        codes = values.cat.codes.to_numpy()
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0), words)
    if isinstance(values.array, pd.arrays.ArrowExtensionArray) or str(values.dtype) in ("string", "str"):
        return pc.dictionary_encode(pc.cast(pa.array(values.array), pa.string()))
    try:
        plain = pa.array(values, type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # objects that are not strings (ints, paths): their str()
        mixed = values.astype(object).where(values.notna(), None)
        plain = pa.array([v if v is None or isinstance(v, str) else str(v) for v in mixed], type=pa.string())
    return pc.dictionary_encode(plain)


def to_arrow(frame: pd.DataFrame, schema: pa.Schema, table: str, words_of: dict | None = None) -> pa.Table:
    """``frame`` as an Arrow table of ``schema`` (:func:`file_schema`); missing columns null
    (``words_of``: see :func:`text_array`).

    Raises:
        HeadcountError: a column's values do not fit its type.
    """
    frame = process_ids.as_integers(frame, table)
    columns = {}
    for field in schema:
        if field.name in frame.columns:
            values = frame[field.name]
            try:
                if pa.types.is_dictionary(field.type):
                    columns[field.name] = text_array(values, words_of)
                    continue
                numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                if numeric and not pd.api.types.is_numeric_dtype(values.dtype):
                    values = pd.to_numeric(values, errors="raise")
                columns[field.name] = pa.array(values, type=field.type, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError) as exc:
                raise HeadcountError(f"table {table}: column {field.name} does not fit its schema ({exc})") from exc
        else:
            columns[field.name] = pa.nulls(len(frame), type=field.type)
    return pa.table(columns, schema=schema)
