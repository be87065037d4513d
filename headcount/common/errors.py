"""The one exception type users see, and how the CLI prints it.

Every error a user can cause (bad path, impossible option, unwritable output)
is raised as :class:`HeadcountError`: a one-line message that names the cause
and a hint that says what to do. The CLI prints ``error: <message> (<hint>)``
and exits with :attr:`HeadcountError.exit_code`, without a traceback unless
``--debug`` is given.
"""

from __future__ import annotations

DAMAGED = "damaged: "  # the start of every notice of a salvaged recording (what --salvage lost, with counts)


class HeadcountError(Exception):
    """A user-facing error: what went wrong, and what to do about it.

    Args:
        message: one line naming the file, option or cause.
        hint: one line saying what to do next (optional).
        exit_code: process exit status the CLI uses (default 2).
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        """The message and hint on one line, as the CLI prints it."""
        text = self.message.replace("\n", " ")
        if self.hint:
            text += f" ({self.hint.replace(chr(10), ' ')})"
        return text

    def __str__(self) -> str:  # so that pytest.raises(match=...) sees the hint too
        return self.one_line()


class NothingRecorded(HeadcountError):
    """A recording that holds nothing headcount reads (no range, no GPU work,
    no kernel): ``headcount run`` words it with the program's exit status."""


def notice(text: str) -> None:
    """Tell the user something they should know but that stops nothing
    (one line on stderr, ``headcount: `` first)."""
    import sys

    print(f"headcount: {text}", file=sys.stderr, flush=True)
