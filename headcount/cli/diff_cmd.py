"""``headcount diff BASE NEW``: did the change make the work faster? The whole work first, then per call and per shape,
against the noise, as a CI gate."""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.table import Table

from headcount.common.errors import HeadcountError
from headcount.reports import terminal

EXAMPLES = """\
examples:
  headcount diff before/ after/                              two reports (headcount profile/run/parse)
  headcount diff base.sqlite new.sqlite                      two recordings, parsed on the fly as headcount parse would
  headcount diff before/ after/ --fail-on-regression 5       exit 1 when the whole work (step, else repeated unit) regressed by more than 5 %
  headcount diff before/ after/ --json diff.json --markdown comment.md --html diff.html
  headcount diff report/ report/ --run 20261205T010203Z-ab12cd 20261205T020304Z-ef34ab    two runs of one report

exit status: 0 (no regression beyond the gate, or no gate), 1 (--fail-on-regression: the whole work of a
rank regressed by more than PCT), 2 (bad input, or two sides that cannot be compared: one line).
"""


def add_parser(subparsers):
    p = subparsers.add_parser(
        "diff", help="before/after: the whole work, then what changed per call, against the noise (a CI gate)",
        description="Compare two reports (or recordings), rank by rank. The verdict rests on the whole work: the time per step, "
        "else the span of a repeated unit both recordings share (a block, a layer: one FSDP::pre_forward (blocks.N…) start to the "
        "next), judged by a rank test and the least change (--min-change, 5 %); beside it GPU busy %, idle by cause and exposed "
        "communication. Then every row — attention layers and heads, kernels, ranges — per call and per shape: a row regressed "
        "or improved only when its new p10–p90 interval lies wholly beyond the base's (at least 3 calls a side) and its median "
        "moved by more than --min-change. Call counts are reported, never folded into time. Sides that cannot be compared "
        "(different programs or sources, nothing in common) are refused.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the report (or recording) before the change")
    p.add_argument("new", help="the report (or recording) after it")
    p.add_argument("--run", nargs="+", default=None, metavar="ID", help="the runs to compare (ids from either side)")
    p.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT",
                   help="exit 1 when a rank's whole work (time per step, else span per repeated unit) regressed by more than PCT %%")
    p.add_argument("--min-change", type=float, default=None, metavar="PCT",
                   help="the least change of a median that can be a regression or improvement (default 5 %%; more on a noisy machine)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the diff as JSON ('-': to stdout, instead of the table)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write a markdown summary (a pull-request comment; '-': stdout)")
    p.add_argument("--html", default=None, metavar="FILE", help="write the verdict, its evidence and the top changes as an HTML page")
    p.add_argument("--top", type=int, default=20, help="rows shown in the table and the markdown (default 20)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from headcount.derive import difference
    from headcount.reports import diff as diffing
    from headcount.reports import diff_output as output

    if args.min_change is not None and args.min_change < 0:
        raise HeadcountError(f"--min-change {args.min_change:g}: must be 0 or more", hint="e.g. --min-change 10")
    if args.fail_on_regression is not None and args.fail_on_regression < 0:
        raise HeadcountError(f"--fail-on-regression {args.fail_on_regression:g}: must be 0 or more", hint="e.g. --fail-on-regression 5")
    with ExitStack() as stack:
        base = diffing.open_report(args.base, _report_of(args.base, stack))
        new = diffing.open_report(args.new, _report_of(args.new, stack))
        result = diffing.diff(base, new, args.run, difference.MIN_CHANGE_PCT if args.min_change is None else args.min_change)
    document = output.as_json(result)
    if args.json and args.json != "-":
        _write(args.json, json.dumps(document, indent=1) + "\n")
    if args.markdown:
        text = output.as_markdown(result, args.top)
        if args.markdown == "-":
            print(text, end="")
        else:
            _write(args.markdown, text)
    if args.html:
        _write(args.html, output.as_html(result, args.top))
    if args.json == "-":
        print(json.dumps(document, indent=1))
    elif args.markdown != "-":
        _print(result, args.top)
    if args.fail_on_regression is not None:
        failed = diffing.gate(result, args.fail_on_regression)
        console = terminal.console(stderr=True)
        for line in failed:
            console.print(f"headcount: regression beyond {args.fail_on_regression:g} %: {line}", soft_wrap=True, highlight=False)
        rows = diffing.row_regressions(result, args.fail_on_regression)
        if len(rows) and not failed:
            console.print(f"headcount: the whole work held; {len(rows)} attention rows regressed by more than "
                          f"{args.fail_on_regression:g} % (listed above; not gated)", soft_wrap=True, highlight=False)
        return 1 if failed else 0
    return 0


def _write(path: str, text: str) -> None:
    """``text`` to ``path`` whole or not at all (a temporary file beside it, renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.partial")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)


def _print(result, top: int) -> None:
    from headcount.reports import diff_output as output

    console = terminal.console(width=max(terminal.console().width, 160))
    console.print(f"Verdict: {output.headline(result)}", highlight=False, soft_wrap=True)
    for o in result.overall:
        console.print(f"  {output.overall_line(o)}", soft_wrap=True, highlight=False)
        for line in output.evidence_lines(o):
            console.print(f"    {line}", soft_wrap=True, highlight=False)
    table = Table(title=f"Top changes (regressions first; {len(result.changes)} rows compared)",
                  caption="per call and per shape: median (p10–p90) over the calls of each side; "
                          "a regression/improvement holds against the spread (docs/cli.md § headcount diff)")
    for col in ("rank", "row", "verdict", "base calls", "new calls", "base p50 (p10–p90)", "new p50 (p10–p90)", "median"):
        table.add_column(col, justify="left" if col in ("rank", "row", "verdict") else "right")
    shown = output.notable(result.changes[result.changes["level"] != "work"]).head(top)
    if not len(shown):
        table.add_row("", "(no row changed beyond its spread)", "", "", "", "", "", "")
    for r in shown.to_dict("records"):
        table.add_row(str(r["rank"]), output.row_label(r), r["verdict"], str(r["base_calls"]), str(r["new_calls"]),
                      output.spread(r, "base"), output.spread(r, "new"), output.percent(r["change_pct"]))
    console.print(table)
    counts = result.changes.groupby(["level", "verdict"]).size()
    console.print("rows: " + "; ".join(f"{level} {verdict} {n}" for (level, verdict), n in counts.items()), soft_wrap=True,
                  highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", soft_wrap=True, highlight=False)


def _report_of(path: str, stack: ExitStack) -> Path:
    """``path``'s report: a report as it is; a recording parsed into a temporary report (removed with ``stack``),
    as ``headcount parse`` would (one process; its progress on stderr, where stdout may carry ``--json -``).

    Raises:
        HeadcountError: no such path; neither a report nor a recording headcount reads; the recording does not parse.
    """
    from headcount.build import batch, sources
    from headcount.cli.parse_cmd import progress
    from headcount.parsers.files import stored_bytes
    from headcount.parsers.options import ReadOptions
    from headcount.reports.progress_view import Meter
    from headcount.store.dataset import MARKER
    from headcount.store.metadata import new_run_id

    p = Path(path)
    if not p.exists():
        raise HeadcountError(f"{path}: no such file or directory", hint="pass a report directory or a recording")
    if (p / MARKER).exists():
        return p
    if p.is_dir() and not any(p.glob("*.parquet")):  # a directory that is no nsys parquetdir either
        raise HeadcountError(f"{path}: not a headcount report (no {MARKER})", hint="pass the directory headcount profile/run/parse wrote")
    try:
        names = sources.inputs([path])
    except HeadcountError as exc:
        raise HeadcountError(f"{path}: neither a headcount report (no {MARKER}) nor a recording headcount reads",
                             hint=exc.hint or "pass a report directory or a recording") from exc
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="headcount-diff-"))) / "report"
    files = [(name, new_run_id()) for name in names]
    console = terminal.console(stderr=True)
    with Meter(console, [stored_bytes(Path(name)) for name, _ in files], path) as meter:
        batch.parse_into(out, files, ReadOptions(), jobs=1, done=progress(console, files, meter))
    return out
