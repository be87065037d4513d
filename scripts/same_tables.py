"""Every recording parsed by two versions of headcount, and their Parquet tables compared.

    python scripts/same_tables.py BASE [--out DIR] [--jobs N]

BASE is a commit (e.g. the one before a restructuring). Its tree is checked
out as a git worktree under ``DIR/base``; each recording under
``tests/fixtures/`` and ``../shared/fixtures/`` is then given to
``python -m headcount parse FILE -o …`` once with that tree first on
``PYTHONPATH`` and once with this checkout's, and the H100 CUPTI records
(``records-layer/*/cupti-records.jsonl.gz``, the in-process route, which
``parse`` does not read) are built with each version's ``tables_from_cupti``.

Compared: every table of the report, row for row and column for column with
its Arrow schema, except the columns that name the run (``run_id``) or the
moment and command it ran with (``start_time``, ``command_line``); a file
that one version refuses must be refused by the other with the same exit
status and the same message. Prints one line per recording; exits 1 when
any differs, 0 when all are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "fixtures"
IGNORED_COLUMNS = {"run_id", "start_time", "command_line"}
# the in-process route: what `headcount run --backend cupti` builds from a child's records
CUPTI_BUILD = """
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
import importlib
def first(names, attr):  # the module path of either version (module names spelled out here on purpose)
    for name in names:
        try:
            return getattr(importlib.import_module(name), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(attr)
tables_from_cupti = first(["headcount." + "build.in_process", "headcount." + "build"], "tables_from_cupti")
limits_for = first(["headcount." + "common.device", "headcount." + "device"], "limits_for")
path, impl, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
built = tables_from_cupti(path, [], "h100", impl, limits_for("9.0"))
out.mkdir(parents=True)
for name, frame in built.tables.items():
    if frame is not None:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out / f"{name}.parquet")
"""


def recordings() -> list[Path]:
    """Every fixture file that is a recording (documentation and GPU-check logs aside), as absolute paths."""
    found = []
    for top in (ROOT / "tests" / "fixtures", SHARED.resolve()):
        found += [p for p in sorted(top.rglob("*")) if p.is_file() and p.suffix not in {".md", ".txt", ".log"}]
    return found


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), COLUMNS="200")


def run_one(tree: Path, path: Path, out: Path) -> dict:
    """One recording through one version: the exit status, the last line of its errors, and where its tables are."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if path.name == "cupti-records.jsonl.gz" and path.parent.parent.name == "records-layer":
        argv = [sys.executable, "-c", CUPTI_BUILD, str(path), path.parent.name, str(out)]
    else:
        argv = [sys.executable, "-m", "headcount", "parse", str(path), "-o", str(out)]
    done = subprocess.run(argv, cwd=out.parent, env=_env(tree), capture_output=True, text=True, timeout=1800)
    error = done.stderr.strip().splitlines()[-1] if done.returncode and done.stderr.strip() else ""
    return {"rc": done.returncode, "error": error.replace(str(out), "OUT"), "out": out}


def tables(out: Path) -> dict[str, pa.Table]:
    """A report's tables (or a build's files), run-naming columns dropped, parts in file order."""
    found = {}
    for part in sorted(out.rglob("*.parquet")):
        name = part.relative_to(out).parts[0].removesuffix(".parquet")
        table = pq.read_table(part, partitioning=None)
        table = table.drop_columns([c for c in table.column_names if c in IGNORED_COLUMNS])
        found.setdefault(name, []).append(table)
    return {name: pa.concat_tables(parts) for name, parts in found.items()}


def compare(base: dict, head: dict) -> list[str]:
    """What differs between one recording's two outcomes (empty: the same)."""
    if (base["rc"], base["error"]) != (head["rc"], head["error"]):
        return [f"exit {base['rc']} → {head['rc']}: {base['error']!r} → {head['error']!r}"]
    if base["rc"]:
        return []
    old, new = tables(base["out"]), tables(head["out"])
    if set(old) != set(new):
        return [f"tables {sorted(old)} → {sorted(new)}"]
    wrong = []
    for name in sorted(old):
        if not old[name].schema.equals(new[name].schema):
            wrong.append(f"{name}: schema differs")
        elif not old[name].equals(new[name]):
            wrong.append(f"{name}: {old[name].num_rows} → {new[name].num_rows} rows, values differ")
    return wrong


def _commit(tree: Path, rev: str) -> str | None:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--verify", "--quiet", rev], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _checked_out(base: str, where: Path) -> Path:
    tree = where / "base"
    wanted = _commit(ROOT, f"{base}^{{commit}}")
    if tree.exists() and _commit(tree, "HEAD") != wanted:  # left by a comparison against another commit: not reused
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True, capture_output=True)
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base], check=True,
                       capture_output=True)
    if _commit(tree, "HEAD") != wanted:
        sys.exit(f"same_tables: {tree} is not at {base}")
    # run from a neutral folder: the current one comes first on sys.path, before PYTHONPATH
    found = subprocess.run([sys.executable, "-c", "import headcount; print(headcount.__file__)"], env=_env(tree), cwd=where,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not found.startswith(str(tree)):
        sys.exit(f"same_tables: the base tree's headcount is not the one imported ({found})")
    return tree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the commit to compare against (e.g. ebfff76)")
    parser.add_argument("--out", default="/tmp/headcount-same-tables", help="work folder (the base worktree and the reports)")
    parser.add_argument("--jobs", type=int, default=2, help="recordings parsed at once")
    args = parser.parse_args(argv)
    where = Path(args.out).resolve()
    base_tree = _checked_out(args.base, where)
    files = recordings()
    reports = where / "reports"
    shutil.rmtree(reports, ignore_errors=True)

    def both(item):
        index, path = item
        return path, [run_one(tree, path, reports / side / str(index)) for side, tree in (("base", base_tree), ("head", ROOT))]

    differing = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for path, (base, head) in pool.map(both, enumerate(files)):
            wrong = compare(base, head)
            differing += bool(wrong)
            shown = path.relative_to(ROOT.parent)
            if wrong:
                print(f"DIFFERS {shown}: " + "; ".join(wrong), flush=True)
            elif base["rc"]:
                print(f"same    {shown}: refused alike (exit {base['rc']}: {base['error'][:100]})", flush=True)
            else:
                rows = {name: t.num_rows for name, t in tables(head["out"]).items()}
                print(f"same    {shown}: " + json.dumps(rows, separators=(",", ":")), flush=True)
    print(f"{len(files) - differing} of {len(files)} recordings give equal tables; {differing} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
