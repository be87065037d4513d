#!/usr/bin/env bash
# benchmarks/peers.sh — the peers the parse benchmarks measure headcount against, in an environment of their own
# (.venv-peers/), installed from this machine's package index with no internet:
#   nsys-ai 0.3.0 (`nsys-ai warm`, benchmarks/attribution.py), on DuckDB 1.5.5 with its sqlite_scanner extension from
#   PyPI (duckdb_extension_sqlite_scanner): nsys-ai reads the export through it, and DuckDB's own download of the
#   extension needs the internet (nsys-ai warm then fails: "Failed to download extension sqlite_scanner").
# Holistic Trace Analysis 0.5.0 (benchmarks/kineto_scale.py) is in .venv already (make setup).
#
#   bash benchmarks/peers.sh            then: NSYS_AI=.venv-peers/bin/nsys-ai python benchmarks/attribution.py
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=.venv-peers
test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q "nsys-ai==0.3.0" "duckdb==1.5.5" "duckdb_extension_sqlite_scanner==1.5.5" \
  "duckdb_extensions==1.5.5"
"$venv/bin/python" - <<'PY'
import duckdb
from duckdb_extensions import import_extension

import_extension("sqlite_scanner")  # into DuckDB's own extension folder, where nsys-ai's connections load it from
duckdb.connect().load_extension("sqlite_scanner")
print("nsys-ai", __import__("importlib.metadata").metadata.version("nsys-ai"), "with DuckDB", duckdb.__version__,
      "and its sqlite_scanner:", ".venv-peers/bin/nsys-ai")
PY
