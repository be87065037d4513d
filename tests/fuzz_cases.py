"""Damaged and odd inputs made from the real fixtures, and what ``headcount
parse`` made of each (the fuzz harness: ``tests/test_fuzz.py`` runs a
fixed-seed subset, ``benchmarks/fuzz.py`` a thousand cases per format).

Each mutation family is something a damaged disk, another nsys or ncu
version, or a user's own script produces: values the schema allows (NULL,
empty, invalid UTF-8, text in an integer column), rows that break physics
(end before start, negative bytes), tables and columns missing or renamed,
bytes cut, flipped or appended.

A case's outcome (:func:`run_case`):

- ``error``: a one-line ``HeadcountError``, non-zero exit;
- ``accepted``: a report was written, and every number in it passes the
  plausibility rules (:func:`implausible`) or a notice says what was dropped;
- ``crash``: anything else escaped (a traceback);
- ``hang``: no answer within the time limit;
- ``silent``: accepted with numbers that break the rules and no notice;
- ``touched``: the input's bytes changed or a file appeared beside it.
"""

from __future__ import annotations

import hashlib
import io
import random
import shutil
import signal
import sqlite3
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

FIXTURES = Path(__file__).parent / "fixtures"
NSYS_BASE = FIXTURES / "nsys" / "h200_nvfuser_nsys2024.6.sqlite"


# ---------------------------------------------------------------- nsys SQLite
def _sql(path: Path, *statements) -> None:
    """Run ``statements``; one SQLite refuses (a constraint, a damaged file) leaves the case as it is."""
    try:
        con = sqlite3.connect(path)
    except sqlite3.Error:
        return
    try:
        for st in statements:
            if isinstance(st, tuple):
                con.execute(*st)
            else:
                con.execute(st)
        con.commit()
    except sqlite3.Error:
        pass
    finally:
        con.close()


def _some(path: Path, table: str, rng: random.Random) -> str:
    """``rowid IN (…)`` for 1–5 rows of ``table`` picked by ``rng`` (deterministic per seed)."""
    try:
        con = sqlite3.connect(path)
        n = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 1
        con.close()
    except sqlite3.Error:
        n = 1
    return "rowid IN (" + ", ".join(str(rng.randint(1, n)) for _ in range(rng.randint(1, 5))) + ")"


def _columns(path: Path, table: str) -> list[str]:
    try:
        con = sqlite3.connect(path)
        try:
            return [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        finally:
            con.close()
    except sqlite3.Error:
        return []


SQLITE_TABLES = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds", "CUPTI_ACTIVITY_KIND_MEMCPY")


def _sqlite_mutation(path: Path, rng: random.Random) -> str:
    """Apply one mutation to the SQLite file at ``path``; returns its name."""
    family = rng.choice([
        "null_value", "empty_text", "bad_utf8", "text_in_int", "real_in_int", "blob", "negative", "end_before_start",
        "huge", "drop_table", "empty_table", "drop_column", "rename_column", "duplicate_rows", "truncate", "flip_bytes",
        "append_garbage", "stringid_odd", "rename_table",
    ])
    table = rng.choice(SQLITE_TABLES)
    cols = _columns(path, table)
    if not cols and family not in ("truncate", "flip_bytes", "append_garbage"):
        family = "flip_bytes"
    col = rng.choice(cols) if cols else None
    if family in ("null_value", "empty_text", "bad_utf8", "text_in_int", "real_in_int", "blob", "negative", "huge"):
        value = {"null_value": None, "empty_text": "", "bad_utf8": b"\xff\xfe\x80abc".decode("latin-1").encode("latin-1"),
                 "text_in_int": "12abc", "real_in_int": 3.75, "blob": b"\x00\x01\x02", "negative": -rng.randint(1, 10**12),
                 "huge": 2**63 - 1}[family]
        if family == "bad_utf8":  # bytes that are not UTF-8, stored as TEXT
            _sql(path, (f"UPDATE {table} SET \"{col}\" = CAST(? AS TEXT) WHERE {_some(path, table, rng)}", (value,)))
        else:
            _sql(path, (f"UPDATE {table} SET \"{col}\" = ? WHERE {_some(path, table, rng)}", (value,)))
        return f"{family}:{table}.{col}"
    if family == "end_before_start":
        if "start" in cols and "end" in cols:
            _sql(path, f"UPDATE {table} SET \"end\" = start - {rng.randint(1, 10**6)} WHERE {_some(path, table, rng)}")
        return f"{family}:{table}"
    schema_change = {  # SQLite refuses some (a key or indexed column): the case then stays a plain copy
        "drop_table": f"DROP TABLE IF EXISTS {table}", "empty_table": f"DELETE FROM {table}",
        "rename_table": f"ALTER TABLE {table} RENAME TO {table}_RENAMED",
        "drop_column": f"ALTER TABLE {table} DROP COLUMN \"{col}\"",
        "rename_column": f"ALTER TABLE {table} RENAME COLUMN \"{col}\" TO \"{col}_renamed\"",
        "duplicate_rows": f"INSERT INTO {table} SELECT * FROM {table} WHERE {_some(path, table, rng)}",
    }.get(family)
    if schema_change:
        _sql(path, schema_change)
        return f"{family}:{table}" + (f".{col}" if "column" in family else "")
    if family == "stringid_odd":
        kind = rng.choice(["null_id", "real_id", "blob_value", "null_value", "duplicate"])
        some = _some(path, "StringIds", rng)
        stmt = {"null_id": "INSERT INTO StringIds (id, value) VALUES ((SELECT max(id) + 1 FROM StringIds), NULL)",
                "real_id": f"UPDATE StringIds SET value = 2.5 WHERE {some}",
                "blob_value": f"UPDATE StringIds SET value = X'00FF' WHERE {some}",
                "null_value": f"UPDATE StringIds SET value = NULL WHERE {some}",
                "duplicate": "SELECT 1"}[kind]
        _sql(path, stmt)
        return f"{family}:{kind}"
    data = bytearray(path.read_bytes())
    if family == "truncate":
        cut = rng.randint(0, len(data) - 1)
        path.write_bytes(bytes(data[:cut]))
        return f"{family}:{cut}"
    if family == "flip_bytes":
        for _ in range(rng.randint(1, 16)):
            i = rng.randint(0, len(data) - 1)
            data[i] ^= 1 << rng.randint(0, 7)
        path.write_bytes(bytes(data))
        return family
    path.write_bytes(bytes(data) + bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))))
    return family


def make_sqlite_case(dest: Path, seed: int) -> tuple[Path, str]:
    rng = random.Random(seed)
    path = dest / f"case-{seed}.sqlite"
    shutil.copy(NSYS_BASE, path)
    names = [_sqlite_mutation(path, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return path, "+".join(names)


# ---------------------------------------------------------------- ncu CSV
CSV_BASES = [FIXTURES / "ncu" / n for n in ("rtx2080ti_two_kernels.raw.C.csv", "rtx2080ti_two_kernels.raw.en_US.csv",
                                            "rtx2080ti_two_kernels.details.C.csv", "h800_flash_fwd_raw.C.csv")]


def _csv_mutation(text: str, rng: random.Random) -> tuple[str, str]:
    import csv as csv_module

    family = rng.choice(["bom", "units_moved", "unquoted", "long_id", "locale_mix", "bad_unit", "duplicate_row", "truncate",
                         "flip", "garbage", "drop_column", "empty_cell", "nan_cell", "negative", "huge", "blank_lines",
                         "prof_lines", "crlf", "header_only"])
    try:
        rows = list(csv_module.reader(io.StringIO(text, newline="")))
    except csv_module.Error:  # an earlier mutation broke the CSV: only text-level ones apply now
        rows = []
    if family == "bom":
        return "\ufeff" + text, family
    if family in ("truncate", "flip", "garbage", "blank_lines", "prof_lines", "crlf"):
        if family == "truncate":
            return text[:rng.randint(0, len(text) - 1)], family
        if family == "flip":
            chars = list(text)
            for _ in range(rng.randint(1, 20)):
                i = rng.randint(0, len(chars) - 1)
                chars[i] = chr(rng.choice([0x22, 0x2C, 0x0A, 0x41, 0xFFFD, 0x2E, 0x00]))
            return "".join(chars), family
        if family == "garbage":
            return text + "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 5000))), family
        if family == "blank_lines":
            lines = text.splitlines()
            lines.insert(rng.randint(0, len(lines)), "")
            return "\n".join(lines), family
        if family == "prof_lines":
            return "==PROF== Connected\n==WARNING== odd\n" + text, family
        return text.replace("\n", "\r\n"), family
    if len(rows) < 3 or not rows[0]:
        return text, family
    header = rows[0]
    r = rng.randint(1, len(rows) - 1)
    c = rng.randint(0, len(header) - 1)
    if family == "units_moved":
        rows.append(rows.pop(1))
    elif family == "long_id":
        if "ID" in header:
            rows[r][header.index("ID")] = "9" * 30
    elif family == "locale_mix":
        for row in rows[1:]:
            for i, cell in enumerate(row):
                if rng.random() < 0.2 and "." in cell:
                    row[i] = cell.replace(".", ",")
    elif family == "bad_unit":
        rows[1][c] = rng.choice(["furlong", "Gbyte/s", "msecond", "", "%%"])
    elif family == "duplicate_row":
        rows.append(list(rows[r]))
    elif family == "drop_column":
        rows = [row[:c] + row[c + 1:] for row in rows]
    elif family in ("empty_cell", "nan_cell", "negative", "huge", "header_only"):
        if family == "header_only":
            rows = rows[:1]
        elif c < len(rows[r]):
            rows[r][c] = {"empty_cell": "", "nan_cell": rng.choice(["nan", "inf", "-inf", "n/a", "no data"]),
                          "negative": f"-{rng.randint(1, 10**9)}", "huge": "1" + "0" * rng.randint(20, 400)}[family]
    out = io.StringIO()
    quoting = csv_module.QUOTE_MINIMAL if family == "unquoted" else csv_module.QUOTE_ALL
    csv_module.writer(out, quoting=quoting, lineterminator="\n").writerows(rows)
    return out.getvalue(), family


def make_csv_case(dest: Path, seed: int) -> tuple[Path, str]:
    rng = random.Random(seed)
    base = rng.choice(CSV_BASES)
    text = base.read_text(encoding="utf-8", errors="replace")
    names = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        text, name = _csv_mutation(text, rng)
        names.append(name)
    path = dest / f"case-{seed}.csv"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path, f"{base.name}:" + "+".join(names)


# ---------------------------------------------------------------- Kineto JSON
KINETO_BASE = FIXTURES / "kineto" / "h100_bert-small_sdpa_kineto.json.gz"


def make_kineto_case(dest: Path, seed: int) -> tuple[Path, str]:
    import gzip
    import json

    rng = random.Random(seed)
    raw = gzip.open(KINETO_BASE).read()
    family = rng.choice(["drop_key", "null_value", "string_number", "negative_dur", "huge_ts", "duplicate_events",
                         "wrong_type", "truncate", "flip", "not_json", "empty_events", "no_events", "nested_garbage",
                         "bad_utf8", "float_ts", "deep_nesting"])
    path = dest / f"case-{seed}.json"
    if family in ("truncate", "flip", "bad_utf8", "not_json"):
        data = bytearray(raw)
        if family == "truncate":
            data = data[:rng.randint(0, len(data) - 1)]
        elif family == "flip":
            for _ in range(rng.randint(1, 20)):
                data[rng.randint(0, len(data) - 1)] = rng.choice(b'{}[]",:0aZ\xff')
        elif family == "bad_utf8":
            i = raw.find(b'"name"', rng.randint(0, len(raw) - 100))
            data[i + 9:i + 11] = b"\xff\xfe"
        else:
            data = bytearray(b"not json at all " * rng.randint(1, 100))
        path.write_bytes(bytes(data))
        return path, family
    if family == "deep_nesting":  # a value nested 100,000 deep inside an event: RecursionError in the JSON reader once
        at = raw.find(b'"args": {') + len(b'"args": {')
        depth = rng.choice([2_000, 100_000])
        path.write_bytes(raw[:at] + b'"deep": ' + b"[" * depth + b"]" * depth + b", " + raw[at:])
        return path, family
    doc = json.loads(raw)
    events = doc.get("traceEvents", [])
    picks = [rng.randrange(len(events)) for _ in range(rng.randint(1, 10))] if events else []
    for i in picks:
        ev = events[i]
        key = rng.choice(list(ev)) if ev else "ts"
        if family == "drop_key":
            ev.pop(key, None)
        elif family == "null_value":
            ev[key] = None
        elif family == "string_number":
            ev[key] = str(ev.get(key))
        elif family == "negative_dur":
            ev["dur"] = -abs(float(ev.get("dur", 1) or 1))
        elif family == "huge_ts":
            ev["ts"] = 1e300
        elif family == "wrong_type":
            ev[key] = rng.choice([[], {}, True, "x"])
        elif family == "nested_garbage":
            ev["args"] = {"correlation": "x", "grid": "(a, b)", "External id": [1]}
        elif family == "float_ts":
            ev["ts"] = float(ev.get("ts", 0) or 0) + 0.123456789
    if family == "duplicate_events":
        events.extend(events[i] for i in picks)
    elif family == "empty_events":
        doc["traceEvents"] = []
    elif family == "no_events":
        doc.pop("traceEvents", None)
    path.write_text(json.dumps(doc))
    return path, family


# ---------------------------------------------------------------- .ncu-rep
NCU_REP_BASE = FIXTURES / "ncu" / "rtx2080ti_two_kernels.ncu-rep"


def make_ncurep_case(dest: Path, seed: int) -> tuple[Path, str]:
    """Byte damage to a real report: cut, a run of bytes deleted (what made
    NVIDIA's reader abort), bytes flipped, garbage appended, or a header only."""
    rng = random.Random(seed)
    data = bytearray(NCU_REP_BASE.read_bytes())
    family = rng.choice(["truncate", "delete_run", "flip", "append", "header_only"])
    if family == "truncate":
        data = data[:rng.randint(4, len(data) - 1)]
    elif family == "delete_run":
        i = rng.randint(4, len(data) - 200)
        del data[i:i + rng.choice([1, 8, 100, 1000])]
    elif family == "flip":
        for _ in range(rng.randint(1, 32)):
            i = rng.randint(4, len(data) - 1)
            data[i] ^= 1 << rng.randint(0, 7)
    elif family == "append":
        data += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096)))
    else:
        data = data[:4]
    path = dest / f"case-{seed}.ncu-rep"
    path.write_bytes(bytes(data))
    return path, family


# ---------------------------------------------------------------- plausibility
PCT = ("theoretical_occupancy_pct", "est_achieved_occupancy_pct", "achieved_occupancy_pct", "dram_throughput_pct", "tensor_pipe_pct",
       "dram_read_sampled_pct", "dram_write_sampled_pct", "sm_active_sampled_pct", "sm_warps_active_sampled_pct")
BYTES = ("dram_bytes", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "shared_memory_bytes")


def implausible(out: Path) -> list[str]:
    """The plausibility rules a written report breaks: durations < 0, end <
    start, percentages outside [0, 100], bytes < 0 (kernels and ranges); busy
    and attention shares outside [0, 100], negative idle times, idle parts
    that do not add up (steps)."""
    broken = []
    for table in ("kernels", "ranges"):
        if not (out / table).exists():
            continue
        frame = pd.read_parquet(out / table)
        if "duration_ns" in frame and (pd.to_numeric(frame["duration_ns"], errors="coerce") < 0).any():
            broken.append(f"{table}: negative duration")
        if {"start_ns", "end_ns"} <= set(frame.columns) and (frame["end_ns"] < frame["start_ns"]).any():
            broken.append(f"{table}: end before start")
        for col in PCT:
            if col in frame:
                v = pd.to_numeric(frame[col], errors="coerce")
                if ((v < 0) | (v > 100)).any():
                    broken.append(f"{table}: {col} outside [0, 100]")
        for col in BYTES:
            if col in frame and (pd.to_numeric(frame[col], errors="coerce") < 0).any():
                broken.append(f"{table}: negative {col}")
    if (out / "steps").exists():
        steps = pd.read_parquet(out / "steps")
        for col in ("gpu_busy_pct", "attention_share_pct"):
            v = pd.to_numeric(steps[col], errors="coerce")
            if ((v < 0) | (v > 100 + 1e-9)).any():
                broken.append(f"steps: {col} outside [0, 100]")
        parts = steps[[c for c in steps.columns if c.startswith("idle_") and c != "idle_ns"]]
        if (parts < 0).any().any():
            broken.append("steps: a negative idle time")
        gpu = steps[steps["basis"] == "gpu_window"]
        # to the nanosecond, or to float64's precision on a window as long as a damaged timestamp makes it
        if len(gpu) and ((parts.loc[gpu.index].sum(axis=1) - gpu["idle_ns"]).abs() > 1.0 + 1e-12 * gpu["window_ns"]).any():
            broken.append("steps: idle parts do not add up to the idle time")
    return broken


# ---------------------------------------------------------------- one case
@dataclass
class Outcome:
    case: str
    mutation: str
    kind: str  # error, accepted, crash, hang, silent, touched
    detail: str = ""
    stderr: str = ""  # what the parse said (its notices): kept for accepted cases


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _fingerprint(path: Path) -> tuple:
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(p.name for p in path.parent.iterdir())


TIMEOUT_S = 60  # a case without an answer by then is a hang (benchmarks/fuzz.py); tests raise it to stay load-proof


_MUST_SAY = {  # a table without which a figure is missing: an accepted case must say what was not read
    "CUPTI_ACTIVITY_KIND_KERNEL": ("kernel table",),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("runtime", "CUPTI_ACTIVITY_KIND_RUNTIME"),
}


def _unsaid(mutation: str, stderr: str) -> str | None:
    """Why an accepted case is silent: its mutation removed (emptied, dropped, renamed) a table a figure needs
    and no notice names it; ``None`` otherwise."""
    family, _, table = mutation.partition(":")
    if family not in ("empty_table", "drop_table", "rename_table") or table not in _MUST_SAY:
        return None
    if any(word in stderr for word in _MUST_SAY[table]):
        return None
    return f"{mutation} accepted without a word on what was not read"


def run_case(path: Path, mutation: str, out: Path, timeout_s: int | None = None, extra: list[str] = ()) -> Outcome:
    """``headcount parse PATH -o OUT [extra…]`` in this process; see the module docstring for the outcomes."""
    timeout_s = timeout_s or TIMEOUT_S
    from headcount.cli.main import main

    before = _fingerprint(path)
    err, std = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    try:
        with redirect_stderr(err), redirect_stdout(std):
            rc = main(["parse", str(path), "-o", str(out), "--jobs", "1", *extra])
    except _Timeout:
        return Outcome(path.name, mutation, "hang", f"no answer in {timeout_s} s")
    except BaseException as exc:  # noqa: BLE001 - a crash is what is being counted
        return Outcome(path.name, mutation, "crash", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    if _fingerprint(path) != before:
        return Outcome(path.name, mutation, "touched", "the input or its directory changed")
    stderr = err.getvalue()
    if rc != 0:
        lines = [ln for ln in stderr.splitlines() if ln.startswith("headcount: error:")]
        if len(lines) != 1:
            return Outcome(path.name, mutation, "crash", f"exit {rc} without one error line: {stderr[-300:]}")
        return Outcome(path.name, mutation, "error", lines[0][:300])
    broken = implausible(out)
    if broken and "dropped" not in stderr and "implausible" not in stderr:
        return Outcome(path.name, mutation, "silent", "; ".join(broken))
    unsaid = _unsaid(mutation, stderr)
    if unsaid:
        return Outcome(path.name, mutation, "silent", unsaid)
    return Outcome(path.name, mutation, "accepted", "; ".join(broken), stderr)


def _run_cases(make, work: Path, seeds) -> list[Outcome]:
    outcomes = []
    for seed in seeds:
        case_dir = work / f"c{seed}"
        case_dir.mkdir(parents=True)
        path, mutation = make(case_dir, seed)
        outcomes.append(run_case(path, mutation, work / f"out{seed}"))
        shutil.rmtree(work / f"out{seed}", ignore_errors=True)
        shutil.rmtree(case_dir, ignore_errors=True)
    return outcomes


def run_sqlite_cases(work: Path, seeds) -> list[Outcome]:
    return _run_cases(make_sqlite_case, work, seeds)


def run_csv_cases(work: Path, seeds) -> list[Outcome]:
    return _run_cases(make_csv_case, work, seeds)


def run_kineto_cases(work: Path, seeds) -> list[Outcome]:
    return _run_cases(make_kineto_case, work, seeds)


def run_ncurep_cases(work: Path, seeds) -> list[Outcome]:
    return _run_cases(make_ncurep_case, work, seeds)


# ---------------------------------------------------------------- truncation
# A real recording of every format headcount parses, cut at evenly spaced points: what a full disk, a killed copy or
# an interrupted download leaves. Without --salvage a cut file must be refused (``error``); with it, either refused or
# read with a notice that says what was lost (``damaged:``); anything else read is a silent partial report.
SHARED = FIXTURES.parents[2] / "shared" / "fixtures"
TRUNCATION_BASES = {
    "nsys SQLite": NSYS_BASE,
    "ncu CSV": FIXTURES / "ncu" / "rtx2080ti_two_kernels.raw.C.csv",
    "ncu CSV (details)": FIXTURES / "ncu" / "rtx2080ti_two_kernels.details.C.csv",
    ".ncu-rep": NCU_REP_BASE,
    "Kineto JSON": KINETO_BASE,  # written out decompressed: the plain .json a trace is also saved as
    "Kineto JSON.gz": KINETO_BASE,
    ".nsys-rep": FIXTURES / "nsys" / "cpu_layers_base_nsys2023.4.nsys-rep",
    "cupti records": FIXTURES / "gpu" / "h100-2026-12-05" / "records-layer" / "sdpa" / "cupti-records.jsonl.gz",
}


def truncation_points(size: int, points: int = 20) -> list[int]:
    """``points`` evenly spaced cuts of a file of ``size`` bytes: k/(points+1) of it, k = 1 … points."""
    return [size * k // (points + 1) for k in range(1, points + 1)]


def _base_bytes(name: str) -> tuple[bytes, str]:
    import gzip

    base = TRUNCATION_BASES[name]
    if name == "Kineto JSON":
        return gzip.open(base).read(), ".json"
    return base.read_bytes(), "".join(base.suffixes[-2:]) if base.name.endswith((".json.gz", ".jsonl.gz")) else base.suffix


def make_truncated_case(dest: Path, name: str, cut: int) -> tuple[Path, str]:
    data, suffix = _base_bytes(name)
    path = dest / f"cut-{cut}{suffix}"
    path.write_bytes(data[:cut])
    return path, f"truncate:{cut}/{len(data)}"


def run_truncation_cases(work: Path, name: str, points: int = 20, only: list[int] | None = None,
                         salvage: bool = False) -> list[Outcome]:
    """The cuts of :func:`truncation_points` of format ``name`` (``only``: those of these indexes), each parsed."""
    size = len(_base_bytes(name)[0])
    cuts = truncation_points(size, points)
    outcomes = []
    for i, cut in enumerate(cuts):
        if only is not None and i not in only:
            continue
        case_dir = work / f"t{i}"
        case_dir.mkdir(parents=True)
        path, mutation = make_truncated_case(case_dir, name, cut)
        outcome = run_case(path, mutation, work / f"out{i}", extra=["--salvage"] if salvage else [])
        if outcome.kind == "accepted" and not salvage:
            outcome = Outcome(outcome.case, mutation, "silent", "a cut file read as whole: a silent partial report")
        elif outcome.kind == "accepted" and "damaged:" not in outcome.stderr:
            outcome = Outcome(outcome.case, mutation, "silent", "salvaged without a notice of what was lost")
        outcomes.append(outcome)
        shutil.rmtree(work / f"out{i}", ignore_errors=True)
        shutil.rmtree(case_dir, ignore_errors=True)
    return outcomes
