"""Write headcount's tables as an appendable, hive-partitioned Parquet dataset.

Layout of an output directory ``OUT``::

    OUT/headcount.json                         marker: schema version, run ids
    OUT/<table>/run_id=<id>/part-0.parquet     kernels, ranges, layers, heads, runs
    OUT/manifests/run_id=<id>/run.json         the run's metadata

Readers (all runs at once)::

    pandas.read_parquet("OUT/heads")
    pyarrow.dataset.dataset("OUT/heads", partitioning="hive")
    duckdb: SELECT * FROM read_parquet('OUT/heads/**/*.parquet', hive_partitioning=true)

Atomic: every file of a run is written under ``OUT/.staging-<id>/`` (hidden,
so no reader globs it), then each ``run_id=<id>`` directory is renamed into
place, and ``headcount.json`` is replaced last. A crash leaves either the
previous report or the new run, never a half-written file a reader picks up.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headcount.errors import HeadcountError
from headcount.reports.metadata import SCHEMA_VERSION
from headcount.tables import TABLES

MARKER = "headcount.json"


def _to_arrow(frame: pd.DataFrame, schema: pa.Schema, table: str) -> pa.Table:
    columns = {}
    for field in schema:
        if field.name in frame.columns:
            values = frame[field.name]
            if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
                values = pd.to_numeric(values, errors="raise")
            elif pa.types.is_string(field.type):
                values = values.astype(object).where(values.notna(), None)
                values = values.map(lambda v: v if v is None or isinstance(v, str) else str(v))
            try:
                columns[field.name] = pa.array(values, type=field.type, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise HeadcountError(f"table {table}: column {field.name} does not fit its schema ({exc})") from exc
        else:
            columns[field.name] = pa.nulls(len(frame), type=field.type)
    return pa.table(columns, schema=schema)


def check_output(out: str | Path, append: bool = False, force: bool = False) -> Path:
    """Validate an output directory before any work is done.

    Raises:
        HeadcountError: the directory cannot be written, holds a report and
            neither ``append`` nor ``force`` was given, or holds other files.
    """
    out = Path(out)
    if append and force:
        raise HeadcountError("--append and --force contradict each other", hint="pass one of them")
    if out.exists() and not out.is_dir():
        raise HeadcountError(f"{out}: exists and is not a directory", hint="choose another output path with -o")
    if out.exists():
        # raw/: the tools' own files that `headcount run` keeps beside the report
        entries = [p for p in out.iterdir() if not p.name.startswith(".staging-") and p.name != "raw"]
        is_report = (out / MARKER).exists()
        if entries and not is_report:
            raise HeadcountError(
                f"{out}: directory is not empty and holds no headcount report",
                hint="choose an empty or new directory with -o",
            )
        if is_report and not (append or force):
            raise HeadcountError(
                f"{out}: already holds a headcount report",
                hint="pass --append to add this run to it, or --force to replace it",
            )
    probe_dir = out if out.exists() else _first_existing_parent(out)
    if not os.access(probe_dir, os.W_OK | os.X_OK):
        raise HeadcountError(f"{probe_dir}: permission denied, cannot write the report", hint="choose a writable directory with -o")
    return out


def _first_existing_parent(path: Path) -> Path:
    path = path.absolute()
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise HeadcountError(f"{parent}: is not a directory", hint="choose another output path with -o")
            return parent
    return Path("/")


def read_marker(out: Path) -> dict:
    """The report marker (``headcount.json``) of ``out``; empty when absent."""
    path = out / MARKER
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HeadcountError(f"{path}: unreadable report marker ({exc})", hint="repair or remove it, or use --force") from exc


def _write_json_atomic(path: Path, doc: dict) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def write_run(
    out: str | Path,
    run_id: str,
    tables: dict[str, pd.DataFrame],
    metadata: dict,
    append: bool = False,
    force: bool = False,
) -> Path:
    """Write one run's tables into ``out`` (see the module docstring).

    Args:
        tables: table name → DataFrame; names must be in :data:`~headcount.tables.TABLES`.
        metadata: run metadata (stored in every file and in ``run.json``).
        append: add to an existing report; force: replace an existing report.

    Returns:
        The output directory.

    Raises:
        HeadcountError: see :func:`check_output`; a table that does not fit its schema;
            an I/O error (the report is left as it was).
    """
    out = check_output(out, append=append, force=force)
    if append and not force:
        existing = read_marker(out).get("schema_version")
        if existing and existing != SCHEMA_VERSION:
            raise HeadcountError(f"{out}: holds a report of schema {existing}, this headcount writes {SCHEMA_VERSION}",
                                 hint="write to a new directory, or --force to replace the old report")
    staging = out / f".staging-{run_id}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        meta_json = json.dumps(metadata, sort_keys=True, default=str).encode()
        for name, frame in tables.items():
            schema = TABLES[name]
            table = _to_arrow(frame.drop(columns=["run_id"], errors="ignore"), schema, name)
            table = table.replace_schema_metadata({b"headcount": meta_json, b"headcount.table": name.encode()})
            part_dir = staging / name / f"run_id={run_id}"
            part_dir.mkdir(parents=True)
            pq.write_table(table, part_dir / "part-0.parquet")
        manifest_dir = staging / "manifests" / f"run_id={run_id}"
        manifest_dir.mkdir(parents=True)
        (manifest_dir / "run.json").write_text(json.dumps(metadata, indent=2, sort_keys=True, default=str))

        previous = read_marker(out)
        trash = None
        if force and previous:
            trash = out / f".trash-{run_id}"
            trash.mkdir()
            for entry in out.iterdir():
                if entry.name in (*TABLES, "manifests", MARKER):
                    entry.rename(trash / entry.name)
            previous = {}
        for entry in staging.iterdir():
            target_parent = out / entry.name
            target_parent.mkdir(exist_ok=True)
            for part in entry.iterdir():
                part.rename(target_parent / part.name)
        runs = [*previous.get("runs", []), run_id]
        _write_json_atomic(out / MARKER, {
            "schema_version": SCHEMA_VERSION,
            "tool": "headcount",
            "tables": sorted(TABLES),
            "runs": runs,
        })
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except OSError as exc:
        raise HeadcountError(f"{out}: cannot write the report ({exc.strerror or exc})", hint="check free space and permissions") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
