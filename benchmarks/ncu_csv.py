"""`headcount parse` of large ncu CSVs, end to end (a subprocess; wall time and
peak RSS of the whole process tree):

- a valid raw page: the H800 fixture's kernels repeated ``--kernels`` times
  (965 columns each, fresh IDs);
- a file with a valid raw-page header and units row followed by ``--garbage-gib``
  GiB of random bytes: it must be refused in seconds with a bounded peak.

Run: python benchmarks/ncu_csv.py [--kernels 10000] [--garbage-gib 2]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution import headcount_cmd, timed  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ncu" / "h800_flash_fwd_raw.C.csv"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=int, default=10_000)
    p.add_argument("--garbage-gib", type=float, default=2.0)
    args = p.parse_args()
    rows = list(csv.reader(FIXTURE.open(newline="")))
    header, units, data = rows[0], rows[1], rows[2:]
    id_col = header.index("ID")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        valid = tmp / "valid.csv"
        with valid.open("w", newline="") as fh:
            writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
            writer.writerows([header, units])
            for k in range(args.kernels):
                row = list(data[k % len(data)])
                row[id_col] = str(k)
                writer.writerow(row)
        m = timed([*headcount_cmd(), "parse", str(valid), "-o", str(tmp / "out-valid")])
        print(f"valid raw page, {args.kernels} kernels × {len(header)} columns ({valid.stat().st_size / 2**20:.0f} MiB): "
              f"exit {m.done.returncode}, {m.wall:.2f} s, {m.memory()}")
        garbage = tmp / "garbage.csv"
        with garbage.open("wb") as fh:
            fh.write(FIXTURE.read_bytes().split(b"\n", 2)[0] + b"\n" + FIXTURE.read_bytes().split(b"\n", 2)[1] + b"\n")
            block = os.urandom(1 << 20).replace(b"\x00", b"a")
            for _ in range(int(args.garbage_gib * 1024)):
                fh.write(block)
        m = timed([*headcount_cmd(), "parse", str(garbage), "-o", str(tmp / "out-garbage")])
        refused = m.done.returncode == 2 and "headcount: error:" in m.done.stderr
        print(f"valid header then {args.garbage_gib:g} GiB of random bytes: {'refused' if refused else 'NOT refused'} "
              f"(exit {m.done.returncode}) in {m.wall:.2f} s, {m.memory()}")
        return 0 if refused else 1


if __name__ == "__main__":
    sys.exit(main())
