"""The package's shape (docs/architecture.md §1): which room may import which, no import up a floor, no circle of
files, no torch where it is not needed, a root with five files, nothing too long to read, no two modules of one name.

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

# The house (docs/architecture.md §1): a room is a folder of headcount/, or one of the modules the root may hold.
# room → the rooms it may import (its own always). The ground, common/, imports nothing else; _version is ground.
MAY_IMPORT = {
    "common": set(),
    "tagging": {"common"},
    "collector": {"common"},
    "parsers": {"common"},
    "attribute": {"common"},
    "derive": {"common"},
    "store": {"common"},
    "build": {"common", "parsers", "attribute", "derive", "store"},
    "reports": {"common", "derive", "store"},
    "machine": {"common", "collector"},
    "wrap": {"common", "tagging", "collector", "parsers", "build"},
    "api": {"common", "tagging", "collector", "build", "store"},
    "training": {"common", "tagging", "collector", "build", "store", "api"},
    "cli": {"common", "parsers", "attribute", "derive", "store", "build", "reports", "machine", "wrap", "api", "training", "face"},
    "face": {"common", "collector", "tagging", "api", "cli"},  # headcount/__init__.py (lazy names) and __main__.py
}
# floors, ground first: an import never runs up a floor, and within a floor only inside its own room
FLOORS = (("common",), ("tagging", "collector", "parsers", "attribute", "derive", "store"), ("build", "reports", "machine"),
          ("wrap", "api"), ("training",), ("cli",), ("face",))
ROOT_FILES = {"__init__.py", "__main__.py", "_version.py", "api.py", "training.py"}
# importing any module of these must not import torch: everything after "record" runs on any laptop
TORCH_FREE = ("common", "parsers", "attribute", "derive", "store", "build", "reports")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


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


def _room(module: str) -> str:
    """The room a module lives in: its folder under headcount/, or what a root module is."""
    parts = module.split(".")
    if len(parts) > 2:
        return parts[1]
    if module in ("headcount", "headcount.__main__"):
        return "face"
    return "common" if module == "headcount._version" else parts[1]


def _floor(room: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if room in rooms)


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


def test_every_room_is_in_the_table():
    rooms = {_room(m) for m in _files()}
    assert rooms == set(MAY_IMPORT), f"rooms without rules: {sorted(rooms - set(MAY_IMPORT))}; rules without rooms: {sorted(set(MAY_IMPORT) - rooms)}"
    assert set(MAY_IMPORT) == {room for floor in FLOORS for room in floor}


def test_each_room_imports_only_what_it_may():
    graph = _graph()
    wrong = [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
             if _room(target) != _room(module) and _room(target) not in MAY_IMPORT[_room(module)]]
    assert not wrong, "; ".join(wrong)


def test_no_import_runs_up_a_floor():
    graph = _graph()
    wrong = [f"{module} (floor {_floor(_room(module))}) imports {target} (floor {_floor(_room(target))})"
             for module, targets in sorted(graph.items()) for target in sorted(targets)
             if _floor(_room(target)) > _floor(_room(module))
             or (_floor(_room(target)) == _floor(_room(module)) and _room(target) != _room(module))]
    assert not wrong, "; ".join(wrong)


def test_the_root_holds_only_the_package_face_the_api_and_training():
    loose = sorted(p.name for p in PACKAGE.iterdir() if p.is_file() and p.suffix == ".py")
    assert set(loose) == ROOT_FILES, f"loose modules at the root: {sorted(set(loose) - ROOT_FILES)}"


def test_no_module_or_function_is_too_long_to_read():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {node.end_lineno - first + 1} lines")
    assert not long, "; ".join(long)


def test_no_two_modules_share_a_name():
    """Two modules of one name in two rooms would say the same thing for different jobs (``options``, ``tools``)."""
    names: dict[str, list[str]] = {}
    for module in _files():
        if not module.endswith(("__init__", "__main__")) and module.count(".") >= 1:
            names.setdefault(module.rsplit(".", 1)[1], []).append(module)
    shared = {name: sorted(mods) for name, mods in names.items() if len(mods) > 1}
    assert not shared, shared


def test_every_room_after_record_is_torch_free():
    modules = sorted(m for m in _files() if _room(m) in TORCH_FREE)
    assert len(modules) > 40
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        sys.exit('importing ' + name + ' imported torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.stdout


def test_only_the_store_claims_commits_and_discards():
    """One write of a report (``store.dataset.write_runs``): no command, route or facade repeats the store's
    claim, commit or discard (they stage runs; the store's one function does the rest)."""
    transaction = {"Claim", "commit", "discard"}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "headcount.store.dataset":
                wrong += [f"{path.relative_to(PACKAGE.parent)} imports {a.name}" for a in node.names if a.name in transaction]
            if isinstance(node, ast.Attribute) and node.attr in transaction and isinstance(node.value, ast.Name) \
                    and node.value.id == "dataset":
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} calls dataset.{node.attr}")
    assert not wrong, "; ".join(wrong)
