"""The notices of an export whose processes are runs of their own, said once for all the processes
they apply to (:func:`merged`): each run keeps its own notices in its metadata; what the user reads
at parse time is one line per notice, naming its processes (``processes 144, 145: …``), not the
same sentence once per rank.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def merged(said: list[tuple[object, str]]) -> list[str]:
    """One line per notice of ``said`` (``(process id, notice)`` pairs, in the order said), in the order first said.

    Notices that read alike but for their figures (``33 attention calls …`` in one process, ``34 …`` in
    another) are one line: a figure that differs between the processes is given as its range over them
    (``33–34``) and the line says the figures are each process's (``processes 144, 145, each: …``).

    Returns:
        ``process 144: …`` for a notice of one process; ``processes 144, 145: …`` for one of several.
    """
    groups: dict[str, list[tuple[object, list[str]]]] = {}
    for pid, text in said:
        template = _NUMBER.sub("\0", text)
        mine = groups.setdefault(template, [])
        if not any(p == pid for p, _ in mine):  # a process's notice said twice counts once
            mine.append((pid, _NUMBER.findall(text)))
    lines = []
    for template, members in groups.items():
        pids = ", ".join(str(p) for p, _ in members)
        figures = [_span([f[k] for _, f in members]) for k in range(len(members[0][1]))]
        pieces = template.split("\0")
        text = pieces[0] + "".join(f + piece for f, piece in zip(figures, pieces[1:]))
        if len(members) == 1:
            lines.append(f"process {pids}: {text}")
        else:
            each = ", each" if any("–" in f for f in figures) else ""
            lines.append(f"processes {pids}{each}: {text}")
    return lines


def _span(values: list[str]) -> str:
    """One figure of several processes: itself where they agree, else ``lowest–highest``."""
    distinct = sorted(set(values), key=float)
    return distinct[0] if len(distinct) == 1 else f"{distinct[0]}–{distinct[-1]}"
