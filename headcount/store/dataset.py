"""Write headcount's tables as an appendable, hive-partitioned Parquet dataset.

Layout of an output directory ``OUT``::

    OUT/headcount.json                         marker: schema version, run ids
    OUT/<table>/run_id=<id>/part-0.parquet     kernels, ranges, layers, heads, runs
    OUT/manifests/run_id=<id>/run.json         the run's metadata

Readers (all runs at once)::

    pandas.read_parquet("OUT/heads")
    pyarrow.dataset.dataset("OUT/heads", partitioning="hive")
    duckdb: SELECT * FROM read_parquet('OUT/heads/**/*.parquet', hive_partitioning=true)

Writes (docs/report-format.md § Writing safely):

- every file of a run is written under ``OUT/.staging-<id>/`` (hidden, so no
  reader globs it), held by the committing process's claim
  (:class:`Claim`: a lock on ``.staging-<id>/.claim``, taken before the
  directory gets that name, so that another writer's :func:`recover` never
  sees it unclaimed);
- the commit runs under an exclusive lock on ``OUT/.headcount.lock``
  (:func:`report_lock`): one writer at a time, the others wait (and say by
  whom), and the "already holds a report" check is made under it;
- the commit's steps are written first to a journal
  (``OUT/.headcount-commit.json``): move the old report aside (``--force``),
  rename each ``run_id=<id>`` directory into place, replace
  ``headcount.json`` (listing the runs), remove what was set aside. A crash
  at any point leaves the journal, and the next headcount command on the
  directory (a write, ``query``, ``report``, ``compare``) completes the
  commit from the step it reached (:func:`recover`); staging that no live
  process claims is removed then. ``--force`` removes the old report only
  after the new one is in place.

Readers that go through headcount (:func:`listed_runs`) see only the runs
``headcount.json`` lists, so never a run half committed; a plain glob of
``OUT/<table>`` can, during a commit, see a run's tables before its ``runs``
row.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from headcount.common import stopping
from headcount.common.errors import HeadcountError, notice
from headcount.common.tables import TABLES
from headcount.store.metadata import SCHEMA_VERSION
from headcount.store.parquet_pieces import chunk_rows, file_schema, to_arrow, writer_options

MARKER = "headcount.json"
LOCK = ".headcount.lock"  # flock'ed by the process committing to the report
JOURNAL = ".headcount-commit.json"  # the steps of a commit under way (recover() finishes them)
CLAIM = ".claim"  # in a staging directory: flock'ed by the process that will commit it
CLAIMING = ".claiming-"  # a staging directory being claimed, renamed to .staging-<id> once its claim is held
CLAIMING_STALE_S = 600.0  # one left older than this (a writer died while claiming) is removed by recover()
LOCK_WAIT_S = 600.0  # how long a writer waits for another one's commit
COMMITTED: list[Path] = []  # the reports this process committed runs to (what a command stopped late has written)


def _ours(name: str) -> bool:
    """headcount's own entries of an output directory besides the report (hidden, or raw/)."""
    return name.startswith((".staging-", CLAIMING, ".trash-", ".headcount")) or name == "raw"


# how errors name the options: the CLI's flags, or save()'s arguments for a Python caller (spelled_for_python)
_SPELLING: ContextVar[dict] = ContextVar("spelling", default={"append": "--append", "force": "--force", "out": "-o"})


@contextmanager
def spelled_for_python():
    """Inside it, errors name ``save(append=True)``, ``save(force=True)`` and
    ``save(path)`` where they name ``--append``, ``--force`` and ``-o`` otherwise."""
    token = _SPELLING.set({"append": "save(append=True)", "force": "save(force=True)", "out": "save(path)"})
    try:
        yield
    finally:
        _SPELLING.reset(token)


def _opt(name: str) -> str:
    return _SPELLING.get()[name]


def check_output(out: str | Path, append: bool = False, force: bool = False) -> Path:
    """Validate an output directory before any work is done.

    Raises:
        HeadcountError: the directory cannot be written, holds a report and
            neither ``append`` nor ``force`` was given, holds a report of
            another schema version and ``append`` was given, or holds other files.
    """
    out = Path(out)
    if append and force:
        raise HeadcountError(f"{_opt('append')} and {_opt('force')} contradict each other", hint="pass one of them")
    if out.exists() and not out.is_dir():
        raise HeadcountError(f"{out}: exists and is not a directory", hint=f"choose another output path with {_opt('out')}")
    if out.exists():
        recover(out)  # a commit a crash interrupted is completed first
        # raw/: the tools' own files that `headcount run` keeps beside the report
        entries = [p for p in out.iterdir() if not _ours(p.name)]
        is_report = (out / MARKER).exists()
        if entries and not is_report:
            raise HeadcountError(
                f"{out}: directory is not empty and holds no headcount report",
                hint=f"choose an empty or new directory with {_opt('out')}",
            )
        if is_report and not (append or force):
            raise HeadcountError(
                f"{out}: already holds a headcount report",
                hint=f"pass {_opt('append')} to add this run to it, or {_opt('force')} to replace it",
            )
        schema = read_marker(out).get("schema_version") if is_report and append else None
        if schema not in (None, SCHEMA_VERSION):
            raise HeadcountError(f"{out}: holds a report of schema {schema}, this headcount writes {SCHEMA_VERSION}",
                                 hint=f"write to a new directory, or {_opt('force')} to replace the old report")
    probe_dir = out if out.exists() else _first_existing_parent(out)
    if not os.access(probe_dir, os.W_OK | os.X_OK):
        raise HeadcountError(f"{probe_dir}: permission denied, cannot write the report", hint=f"choose a writable directory with {_opt('out')}")
    return out


def _first_existing_parent(path: Path) -> Path:
    path = path.absolute()
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise HeadcountError(f"{parent}: is not a directory", hint=f"choose another output path with {_opt('out')}")
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
        raise HeadcountError(f"{path}: unreadable report marker ({exc})", hint=f"repair or remove it, or use {_opt('force')}") from exc


def umask() -> int:
    """This process's file mode creation mask (read, not changed: ``os.umask`` can only be read by setting it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_json_atomic(path: Path, doc: dict) -> None:
    """Write ``path`` through a temporary file of this writer's own, then replace it. The file gets the mode
    any file the user creates gets (0666 less the umask), not ``mkstemp``'s private 0600: readers of a shared
    report directory list its runs from the marker."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".headcount-{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def listed_runs(out: str | Path) -> list[str]:
    """The runs ``headcount.json`` lists: those fully committed (what readers
    going through headcount see)."""
    return [str(r) for r in read_marker(Path(out)).get("runs", [])]


@contextmanager
def report_lock(out: Path, wait_s: float | None = None):
    """Hold the report's exclusive lock (``OUT/.headcount.lock``, ``flock``):
    one commit at a time. A writer that finds it held says so on stderr, once,
    and waits up to ``wait_s`` (default :data:`LOCK_WAIT_S`). The holder removes
    the file before it lets go (no lock file stays in a report); a writer that
    locked a file so removed sees that it is no longer the one at the path, and
    locks the one there now.

    Raises:
        HeadcountError: still held after ``wait_s``; the lock file cannot be made.
    """
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    key = str(out.absolute())
    held = _HELD.__dict__.setdefault("paths", set())
    if key in held:  # this process holds it already (a commit recovering first): re-entrant
        yield
        return
    deadline, holder = time.monotonic() + wait_s, None
    while True:
        fd = _open_lock(out)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if holder is None:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                sys.stderr.write(f"headcount: {out}: the report is being written by PID {holder}, waiting…\n")
            os.close(fd)
            if time.monotonic() > deadline:
                raise HeadcountError(f"{out}: still being written by PID {holder} after {wait_s:.0f} s",
                                     hint=f"wait for that writer to finish, or write to another directory with {_opt('out')}") from None
            time.sleep(0.05)
            continue
        if _same_file(fd, out / LOCK):
            break
        os.close(fd)  # its holder removed it before we locked it: lock the file that is there now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        held.add(key)
        yield
    finally:
        held.discard(key)
        try:
            (out / LOCK).unlink(missing_ok=True)  # removed while held: a writer waiting on it locks it, sees it gone, retries
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the lock, whatever stopped the removal


def _remove_stale_lock(out: Path) -> str | None:
    """Remove a lock file no process holds (a writer killed before it could remove it: SIGKILL, power loss);
    returns the PID written in it, or ``None`` where there is none or a live writer holds it."""
    try:
        fd = os.open(out / LOCK, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError (an OSError): held by a live writer
        if not _same_file(fd, out / LOCK):
            return None
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        (out / LOCK).unlink(missing_ok=True)  # while locked: a writer that opened it meanwhile sees it gone and retries
        return holder
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_lock(out: Path) -> int:
    try:
        out.mkdir(parents=True, exist_ok=True)
        return os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask: a colleague in the group may write too
    except OSError as exc:
        raise HeadcountError(f"{out}: cannot write the report ({exc.strerror or exc})", hint="check free space and permissions") from exc


def _same_file(fd: int, path: Path) -> bool:
    """The open ``fd`` is the file at ``path`` still (not one its last holder removed)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


_HELD = threading.local()  # .paths: reports whose lock this thread holds


class Claim:
    """Held by the process that will commit ``run_ids``: their staging directories
    are live while it holds them (an ``flock`` on ``.staging-<id>/.claim``; a
    process that dies releases it, and :func:`recover` then removes its staging).
    Staging written by worker processes or Ray tasks is claimed by their parent."""

    def __init__(self, out: str | Path, run_ids: list[str]):
        self.out, self.run_ids, self._fds = Path(out), list(run_ids), []

    def __enter__(self) -> "Claim":
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            with stopping.deferred():  # a signal waits until every run is claimed, then finds them all to remove
                for run_id in self.run_ids:
                    self._claim(run_id)
        except OSError as exc:
            self.__exit__(None, None, None)
            raise HeadcountError(f"{self.out}: cannot write the report ({exc.strerror or exc})",
                                 hint="check free space and permissions") from exc
        except BaseException:  # stopped while claiming (a signal the moment the block ends): nothing claimed stays
            self.__exit__(None, None, None)
            raise
        return self

    def _claim(self, run_id: str) -> None:
        """Make ``.staging-<run_id>`` claimed from its first moment: the directory is made under a name
        :func:`recover` leaves alone, its claim locked, then renamed (a staging directory that existed
        for a moment before its claim was another writer's recover() to remove, files and all).

        Raises:
            OSError: the directory cannot be made; a live process claims this run id already.
        """
        staging = self.out / f".staging-{run_id}"
        ready = Path(tempfile.mkdtemp(prefix=CLAIMING, dir=self.out))
        fd = os.open(ready / CLAIM, os.O_RDWR | os.O_CREAT, 0o666)
        self._fds.append(fd)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a directory nobody else knows: never held
        try:
            os.rename(ready, staging)
        except OSError:
            if not staging.is_dir():
                shutil.rmtree(ready, ignore_errors=True)
                raise
            if _claimed(staging):  # run ids are fresh: only a second claim of one in a process would meet this
                shutil.rmtree(ready, ignore_errors=True)
                raise BlockingIOError(f"{staging} is claimed by a live process") from None
            shutil.rmtree(staging)  # a dead writer's staging of this run (a window taken back): begun again
            os.rename(ready, staging)

    def __exit__(self, *exc) -> None:
        """Release the claim and remove what is still staged for these runs
        (runs that were not committed), unless a commit's journal needs it."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        discard(self.out, self.run_ids)


def _claimed(staging: Path) -> bool:
    """A live process holds this staging directory's claim."""
    try:
        fd = os.open(staging / CLAIM, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class StagedRun:
    """One run's files, written under ``OUT/.staging-<run_id>/`` (hidden from
    readers; made and claimed by the committing process's :class:`Claim`) until
    :func:`commit` moves them into place.

    Tables are appended in pieces (:meth:`write`), each piece converted and
    written as Parquet row groups, so a run larger than memory never exists
    as one table. Use as a context manager: an exception removes the staging
    directory.

    Raises:
        HeadcountError: the staging folder is not there (no :class:`Claim` made it, or it was discarded);
            a piece does not fit its table's schema; an I/O error.
    """

    def __init__(self, out: str | Path, run_id: str, metadata: dict, part: str = "0", manifest: bool = True,
                 staging: str | None = None):
        """``part``: this writer's file name (``part-<part>.parquet``); several
        writers (worker processes) stage pieces of one run side by side, and the
        one with ``manifest`` writes ``run.json``. ``staging``: the staging
        directory's id where it is not ``run_id`` (the runs of one file's
        processes are staged side by side, under the file's id)."""
        self.out, self.run_id, self.metadata = Path(out), run_id, metadata
        self.part, self.manifest = part, manifest
        self.staging = self.out / f".staging-{staging or run_id}"
        self.rows: dict[str, int] = {}
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._meta_json = json.dumps(metadata, sort_keys=True, default=str).encode()
        # the committing process made and claimed the staging folder (Claim): one that is gone was discarded (the
        # command was stopped, its recover() removed it): a worker that outlived it writes nothing there
        if not self.staging.is_dir():
            raise HeadcountError(f"{self.staging}: the staging folder is gone: the command writing this report was "
                                 "stopped, or it was never claimed", hint="run the command again")

    def write(self, name: str, frame: pd.DataFrame) -> None:
        """Append ``frame``'s rows to table ``name`` (columns outside the schema are dropped, missing ones null)."""
        schema = file_schema(TABLES[name])
        try:
            writer = self._writers.get(name)
            if writer is None:
                part_dir = self.staging / name / f"run_id={self.run_id}"
                part_dir.mkdir(parents=True, exist_ok=True)
                writer = self._writers[name] = pq.ParquetWriter(part_dir / f"part-{self.part}.parquet", schema, store_schema=False,
                                                                **writer_options(schema))
                writer.add_key_value_metadata({"headcount": self._meta_json.decode(), "headcount.table": name})
            # a table's first piece is written even when empty: every table of a run has its file
            step, words_of = chunk_rows(schema), {}
            for lo in range(0, len(frame) if name in self.rows else max(len(frame), 1), step):
                writer.write_table(to_arrow(frame.iloc[lo:lo + step], schema, name, words_of))
        except OSError as exc:
            raise HeadcountError(f"{self.out}: cannot write the report ({exc.strerror or exc})",
                                 hint="check free space and permissions") from exc
        self.rows[name] = self.rows.get(name, 0) + len(frame)

    def close(self) -> None:
        """Finish every table file and the run's manifest (the run is then ready to :func:`commit`)."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if not self.manifest:
            return
        manifest_dir = self.staging / "manifests" / f"run_id={self.run_id}"
        manifest_dir.mkdir(parents=True, exist_ok=True)
        (manifest_dir / "run.json").write_text(json.dumps(self.metadata, indent=2, sort_keys=True, default=str))

    def discard(self) -> None:
        """Drop everything staged for this run (every writer's pieces)."""
        for writer in self._writers.values():
            try:
                writer.close()
            except (OSError, pa.ArrowException):
                pass
        self._writers.clear()
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> "StagedRun":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


def commit(out: str | Path, run_ids: list[str], append: bool = False, force: bool = False, staged: list[str] | None = None) -> Path:
    """Move staged runs (:class:`StagedRun`, closed) into the report at ``out``
    and list them in ``headcount.json``: under the report's lock, through a
    journal (see the module docstring). ``staged``: the staging directories'
    ids where they are not ``run_ids`` (one file's runs staged side by side).

    Raises:
        HeadcountError: see :func:`check_output` (checked again under the lock:
            of two first writers, the second is refused); a schema-version
            mismatch on ``append``; an I/O error before the journal was written
            (the staged runs are removed, the report is as it was) or after it
            (the next headcount command on ``out`` completes the commit).
    """
    out, journal, staged = Path(out), None, list(staged or run_ids)
    with report_lock(out):
        try:
            check_output(out, append=append, force=force)  # completes an interrupted commit first (recover)
            previous = read_marker(out)
            replace = bool(force and previous)
            journal = {
                "runs": list(run_ids),
                "staged": staged,
                "keep_runs": [] if replace else [str(r) for r in previous.get("runs", [])],
                "set_aside": sorted(e.name for e in out.iterdir() if e.name in (*TABLES, "manifests", MARKER)) if replace else [],
                "trash": f".trash-{run_ids[0]}" if replace else None,
                "step": "set_aside" if replace else "place",
            }
            with stopping.deferred():  # a signal now waits for the commit's end: never a report half moved
                _write_json_atomic(out / JOURNAL, journal)
                _run_journal(out, journal)
                COMMITTED.append(out)
        except OSError as exc:
            if journal is None:
                discard(out, staged)
            raise HeadcountError(f"{out}: cannot write the report ({exc.strerror or exc})" +
                                 ("; the next headcount command on it completes the commit" if journal else ""),
                                 hint="check free space and permissions") from exc
        except HeadcountError:
            if journal is None:
                discard(out, staged)
            raise
    return out


_STEPS = ("set_aside", "place", "mark", "clean")


def _run_journal(out: Path, journal: dict) -> None:
    """Carry out a commit's steps from the one the journal names; each step can
    be repeated after a crash (it does only what is left of it)."""
    for step in _STEPS[_STEPS.index(journal["step"]):]:
        if journal["step"] != step:
            journal["step"] = step
            _write_json_atomic(out / JOURNAL, journal)
        if step == "set_aside":
            trash = out / journal["trash"]
            trash.mkdir(exist_ok=True)
            for name in journal["set_aside"]:
                if (out / name).exists() and not (trash / name).exists():
                    (out / name).rename(trash / name)
        elif step == "place":
            for run_id in journal.get("staged", journal["runs"]):
                staging = out / f".staging-{run_id}"
                if not staging.exists():
                    continue
                for entry in staging.iterdir():
                    if not entry.is_dir():  # the claim file
                        continue
                    (out / entry.name).mkdir(exist_ok=True)
                    for part in entry.iterdir():
                        if not (out / entry.name / part.name).exists():
                            part.rename(out / entry.name / part.name)
        elif step == "mark":
            runs = list(dict.fromkeys([*journal["keep_runs"], *journal["runs"]]))
            _write_json_atomic(out / MARKER, {"schema_version": SCHEMA_VERSION, "tool": "headcount", "tables": sorted(TABLES),
                                              "runs": runs})
        else:
            if journal["trash"]:
                shutil.rmtree(out / journal["trash"], ignore_errors=True)
            _remove_staging(out, journal.get("staged", journal["runs"]))
    (out / JOURNAL).unlink(missing_ok=True)


def recover(out: str | Path) -> bool:
    """Finish a commit a crash interrupted (its journal), and remove staging
    no live process claims, ``.trash-*`` left behind and temporary files,
    under the report's lock. Does nothing where the directory cannot be
    written (a reader then sees the runs ``headcount.json`` lists).

    Returns:
        Whether an interrupted commit was completed.
    """
    out = Path(out)
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        return False
    if str(out.absolute()) not in _HELD.__dict__.get("paths", ()) and (holder := _remove_stale_lock(out)):
        notice(f"{out}: removed the lock a stopped headcount left (PID {holder}, no longer holding it)")
    stale = [e for e in out.iterdir() if e.name.startswith((".staging-", CLAIMING, ".trash-", f".headcount-{MARKER}.",
                                                            f".headcount-{JOURNAL}."))]
    if not (out / JOURNAL).exists() and not stale:
        return False
    with report_lock(out):  # re-entrant: a commit that holds it recovers first
        completed = False
        if (out / JOURNAL).exists():
            try:
                journal = json.loads((out / JOURNAL).read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise HeadcountError(f"{out / JOURNAL}: unreadable commit journal ({exc})",
                                     hint=f"a commit was interrupted; remove the journal and check the report, or use {_opt('force')}") from exc
            _run_journal(out, journal)
            completed = True
        left = []
        for entry in out.iterdir():
            if entry.name.startswith(".staging-") and not _claimed(entry):
                shutil.rmtree(entry, ignore_errors=True)
                left.append(entry.name)
            elif entry.name.startswith(CLAIMING) and not _claimed(entry) and _age_s(entry) > CLAIMING_STALE_S:
                shutil.rmtree(entry, ignore_errors=True)  # a young one is being claimed right now
            elif entry.name.startswith(".trash-"):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith((f".headcount-{MARKER}.", f".headcount-{JOURNAL}.")):
                entry.unlink(missing_ok=True)
        if left:  # a writer killed before it could clean up (SIGKILL, power loss): what it staged was never a report
            notice(f"{out}: removed {len(left)} staging folder{'s' if len(left) > 1 else ''} a stopped headcount left "
                   f"({', '.join(sorted(left)[:3])}{', …' if len(left) > 3 else ''}); the report is as it was")
        if completed:
            notice(f"{out}: completed a commit a stopped headcount had begun")
        return completed


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def discard(out: str | Path, run_ids: list[str]) -> None:
    """Remove what is staged for ``run_ids`` under ``out`` (every writer's
    pieces); nothing else, and nothing an interrupted commit's journal still
    needs (:func:`recover` completes that commit)."""
    pending = set()
    try:
        journal = json.loads((Path(out) / JOURNAL).read_text())
        pending = set(journal.get("staged", journal.get("runs", [])))
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    _remove_staging(out, [r for r in run_ids if r not in pending])


def _remove_staging(out: str | Path, run_ids: list[str]) -> None:
    for run_id in run_ids:
        shutil.rmtree(Path(out) / f".staging-{run_id}", ignore_errors=True)


@dataclass
class Staged:
    """What a :func:`write_runs` staging step leaves to commit.

    Attributes:
        runs: the runs to list in the report, in order.
        staging: the staging directories' ids where they are not ``runs`` (one file's processes staged side by side).
    """

    runs: list[str]
    staging: list[str] | None = None


def write_runs(out: str | Path, claimed: list[str], stage: Callable[[], Staged | None], append: bool = False,
               force: bool = False) -> Staged | None:
    """The one write of a report: claims the staging of ``claimed`` run ids (:class:`Claim`), lets ``stage``
    stage them (:class:`StagedRun`, here, in worker processes or on Ray), commits what it returns
    (:func:`commit`) and discards everything else claimed: on an exception (Ctrl-C included), on ``None``
    (nothing to commit), and the runs ``stage`` left out. A directory this call created is removed again
    when nothing was committed. Every command and the API write through here.

    Returns:
        What ``stage`` returned (committed), or None.

    Raises:
        HeadcountError: see :func:`check_output` and :func:`commit`; whatever ``stage`` raises (nothing is written).
    """
    out = Path(out)
    created, committed = not out.exists(), None
    try:
        with Claim(out, claimed):
            done = stage()
            if done is not None and done.runs:
                commit(out, done.runs, append=append, force=force, staged=done.staging)
                committed = done
    finally:
        if committed is None and created:
            _remove_if_unused(out)
    return committed


def _remove_if_unused(out: Path) -> None:
    """Remove ``out`` (and its lock file) where it holds nothing else: a directory another writer uses (its
    staging, its committed report, its lock held while it commits beside them) is left as it is."""
    try:
        if {p.name for p in out.iterdir()} <= {LOCK}:
            (out / LOCK).unlink(missing_ok=True)
            out.rmdir()
    except OSError:
        pass


def write_run(
    out: str | Path,
    run_id: str,
    tables: dict[str, pd.DataFrame],
    metadata: dict,
    append: bool = False,
    force: bool = False,
) -> Path:
    """Write one run's tables into ``out`` (see the module docstring): staged, then committed (:func:`write_runs`).

    Args:
        tables: table name → DataFrame; names must be in :data:`~headcount.common.tables.TABLES`.
        metadata: run metadata (stored in every file and in ``run.json``).
        append: add to an existing report; force: replace an existing report.

    Returns:
        The output directory.

    Raises:
        HeadcountError: see :func:`check_output`; a table that does not fit its schema;
            an I/O error (the report is left as it was).
    """
    check_output(out, append=append, force=force)

    def stage() -> Staged:
        with StagedRun(out, run_id, metadata) as staged:
            for name, frame in tables.items():
                staged.write(name, frame)
        return Staged([run_id])

    write_runs(out, [run_id], stage, append=append, force=force)
    return Path(out)


def write_stats(out: str | Path, run_id: str, stats: dict[str, pd.DataFrame], metadata: dict, append: bool = False,
                force: bool = False) -> Path:
    """What ``AttentionProfiler.save`` writes: the written tables of ``stats`` (and
    ``attention_stats``), a ``runs`` row from ``metadata``, errors spelled for Python.

    Raises:
        HeadcountError: as :func:`write_run`.
    """
    from headcount.common.tables import WRITTEN
    from headcount.store.metadata import runs_row

    tables = {name: stats[name] for name in (*WRITTEN, "attention_stats") if name in stats}
    tables["runs"] = runs_row(metadata)
    with spelled_for_python():
        return write_run(out, run_id, tables, metadata, append=append, force=force)
