"""The one way headcount writes to a terminal: a rich console that prints text
as it is.

Names that reach the terminal come from users' files and programs (NVTX
ranges, kernels, files, models): rich markup would swallow ``[rank0]``,
raise on ``[/x]`` and turn ``[link=…]`` into a hyperlink, and emoji codes
would turn ``:fire:`` into a picture. Styles are given as ``rich.text.Text``
objects instead.

Output that is not a terminal (a file, a pipe) is not wrapped: rich would
otherwise break every line at 80 columns, NVTX paths and error lines
included, and a line is what ``grep`` and logs keep.
"""

from __future__ import annotations

import os

from rich.console import Console

# the width of a table written to a file or pipe: never reached by headcount's own tables, so nothing is wrapped
PIPE_WIDTH = 1000


def console(stderr: bool = False, **options) -> Console:
    """A rich ``Console`` with markup and emoji codes off, not wrapping where it
    does not write to a terminal (``options``: any other ``Console`` argument)."""
    made = Console(stderr=stderr, markup=False, emoji=False, **options)
    if not made.is_terminal and "width" not in options and not os.environ.get("COLUMNS"):
        made = Console(stderr=stderr, markup=False, emoji=False, width=PIPE_WIDTH, soft_wrap=True, **options)
    return made


def heading(out: Console, title: str) -> None:
    """A section heading: a rule across a terminal, one line elsewhere."""
    if out.is_terminal:
        out.rule(title, align="left")
    else:
        out.print(f"── {title} ──")
