"""The one way headcount writes to a terminal: a rich console that prints text
as it is.

Names that reach the terminal come from users' files and programs (NVTX
ranges, kernels, files, models): rich markup would swallow ``[rank0]``,
raise on ``[/x]`` and turn ``[link=…]`` into a hyperlink, and emoji codes
would turn ``:fire:`` into a picture. Styles are given as ``rich.text.Text``
objects instead.
"""

from __future__ import annotations

from rich.console import Console


def console(stderr: bool = False, **options) -> Console:
    """A rich ``Console`` with markup and emoji codes off (``options``: any other ``Console`` argument)."""
    return Console(stderr=stderr, markup=False, emoji=False, **options)
