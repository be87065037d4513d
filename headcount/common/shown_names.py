"""How a kernel's name is shown to a reader: C++ templates and argument lists run to
hundreds of characters (``void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4, …>>(…)``).
Shown names keep the function's own name, with template and argument lists folded to
``<…>`` and ``(…)``, and are cut to a width; the tables keep every name whole.
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
