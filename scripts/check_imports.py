"""Fails when the package `timeslice` has an import cycle.

Reads every module's imports from its source (the generated code under
timeslice/api/gen aside), including those inside functions and under
`if TYPE_CHECKING:` (a cycle hidden there is still a cycle in the design), and
prints each cycle found: `python scripts/check_imports.py`, exit 1 if any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "timeslice"
SKIP = PACKAGE / "api" / "gen"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if SKIP in path.parents:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # `from a import b` imports module a.b when there is one, else a
            for alias in node.names:
                out.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    for component in found:
        print("import cycle:", " <-> ".join(component))
    if not found:
        print(f"no import cycle in {len(known)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
