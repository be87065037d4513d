"""How a kernel's name is shown to a reader: C++ templates and argument lists run to
hundreds of characters (``void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4, …>>(…)``).
Shown names keep the function's own name, with template and argument lists folded to
``<…>`` and ``(…)``, and are cut to a width; the tables keep every name whole. A range name
(whose brackets are its content: DLProf's ranges are ~500-character dicts) is only cut
(:func:`cut`), keeping its start and end.
"""

from __future__ import annotations

WIDTH = 80


def shown(name, width: int = WIDTH) -> str:
    """``name`` as a reader sees it in a report (at most ``width`` characters; the whole name is in the tables)."""
    text = str(name).replace("<unnamed>", "{anonymous}").removeprefix("void ")
    folded, depth = [], 0
    for ch in text:
        if ch in "<(":
            if depth == 0:
                folded.append(ch + "…")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                folded.append(ch)
        elif depth == 0:
            folded.append(ch)
    out = "".join(folded).strip() or text
    return out if len(out) <= width else out[:width - 1] + "…"


def cut(name: str, width: int) -> str:
    """``name`` whole up to ``width`` characters, else its start and end around ``… (N characters) …``."""
    if len(name) <= width:
        return name
    middle = f" … ({len(name):,} characters) … "
    keep = max(width - len(middle), 2)
    return name[: keep - keep // 3] + middle + name[len(name) - keep // 3:]
