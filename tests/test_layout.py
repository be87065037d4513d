"""The package's shape (docs/architecture.md §1): which stage may import which, no circle of files, no torch where it is not needed.

The import graph is read from the source (``ast``), every import counted,
also those inside functions (a lazy import is still a dependency) but not
those under ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "headcount"

# folder → folders it may not import (a stage never reaches into a later one or into the recorders)
FORBIDDEN = {
    "parsers": {"collector", "tagging", "attribute"},
    "collector": {"parsers", "tagging"},
    "cli": {"collector", "tagging"},
    "derive": {"attribute"},
}
# importing any module of these (or build.py) must not import torch: they run on any laptop
TORCH_FREE = ("parsers", "attribute", "derive", "reports")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imported(module: str, path: Path, node: ast.AST, modules: set[str]) -> list[str]:
    """The headcount modules one import statement needs."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolved against the importing module's package
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        # "from pkg import submodule" needs the submodule; "from pkg import name" needs pkg
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = []
    for name in names:
        while name and name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name != module:
            found.append(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = _files()
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges: set[str] = set()

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    edges.update(_imported(module, path, child, modules))
                visit(child)

        visit(ast.parse(path.read_text()))
        graph[module] = edges
    return graph


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def test_the_graph_is_read():
    """The reader finds imports at module level, inside functions and relative ones (else every rule passes vacuously)."""
    graph = _graph()
    assert "headcount.attribute.nesting" in graph["headcount.attribute.attribution"]
    assert "headcount.tagging.state" in graph["headcount.tagging.compiled"]
    assert "headcount.api" in graph["headcount.cli.profile_cmd"]  # imported inside a function


def test_no_circle_of_files():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def strong(node: str) -> None:  # Tarjan: a component of more than one file is a circle
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            strong(name)
    assert not circles, "files that import each other: " + "; ".join(" ↔ ".join(c) for c in circles)


def test_stages_import_only_what_they_may():
    graph = _graph()
    wrong = [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
             if _folder(target) in FORBIDDEN.get(_folder(module), ())]
    assert not wrong, "; ".join(wrong)


def test_parsing_attributing_deriving_and_reporting_do_not_import_torch():
    modules = sorted(m for m in _files() if _folder(m) in TORCH_FREE) + ["headcount.build.shared"]
    assert len(modules) > 30
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        sys.exit('importing ' + name + ' imported torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.stdout
