"""The package's shape: no import cycle among headcount's modules (module-level imports)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "headcount"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """headcount modules imported at module level (not inside functions: those are deliberate lazy imports)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from pkg import submodule" needs the submodule only; "from pkg import name" needs pkg initialised
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
        for name in names:
            if name in modules:
                found.add(name)
    return found


def test_no_import_cycle():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph = {name: _imports(path, modules) - {name} for name, path in files.items()}
    seen, stack, cycles = {}, [], []

    def visit(node):
        seen[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if seen.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = "done"

    for name in sorted(graph):
        if name not in seen:
            visit(name)
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)
