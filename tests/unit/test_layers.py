"""The package's layers, read from the source: no import cycles, and a relay that stands alone.

Imports inside functions count as much as those at the top of a module: a lazy import that
closes a cycle still ties the two modules together. Only imports under ``TYPE_CHECKING`` are
left out, since they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

import agentcall

PACKAGE_DIR = Path(agentcall.__file__).parent


@attrs.frozen
class Edge:
    source: str
    target: str
    line: int


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name; a package is named by its ``__init__``."""
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join([*base, node.module] if node.module else base)
        else:
            stem = node.module or ""
        # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module.
        yield from (f"{stem}.{alias.name}" for alias in node.names)
        yield stem


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield from (n for branch in child.orelse for n in [branch, *_walk(branch)])
            continue
        yield child
        yield from _walk(child)


def import_edges() -> list[Edge]:
    """Every import from one module of the package to another, wherever it is written."""
    modules = module_names()
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = list(_imported_names(node, module, path.name == "__init__.py"))
            targets = {name for name in names if name in modules}
            if isinstance(node, ast.ImportFrom) and len(targets) > 1:
                # ``from pkg import mod``: the submodule is the edge, not the package too.
                targets.discard(names[-1])
            edges.extend(Edge(module, target, node.lineno) for target in targets - {module})
    return edges


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(edges: list[Edge], start: str) -> dict[str, list[str]]:
    """Every module imported, directly or not, by ``start`` or its submodules, with one path."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge.target)
    paths = {m: [m] for m in graph if m == start or m.startswith(start + ".")}
    queue = list(paths)
    while queue:
        current = queue.pop()
        for target in graph.get(current, []):
            if target not in paths:
                paths[target] = [*paths[current], target]
                queue.append(target)
    return paths


def test_the_graph_sees_top_level_and_function_local_imports() -> None:
    """The checks below are only as good as the graph; it must see both kinds of import."""
    edges = {(e.source, e.target) for e in import_edges()}
    assert ("agentcall.relay.tap", "agentcall.limits") in edges  # at the top of the module
    assert ("agentcall.relay.tap", "agentcall.relayurl") in edges  # inside Options.postOptions
    assert ("agentcall.guard.main", "agentcall.guard.scope") in edges  # from pkg.mod import x
    assert cycles([Edge("a", "b", 1), Edge("b", "a", 2), Edge("b", "c", 3)]) == [["a", "b"]]


def test_no_import_cycles() -> None:
    """No two modules import each other, directly or through others, even lazily."""
    assert cycles(import_edges()) == []


def test_the_relay_imports_neither_the_client_nor_the_listener() -> None:
    """The relay runs on a server with none of the agent-side code; not even a lazy import of
    the client or listener packages (or anything that pulls them in) is allowed."""
    forbidden = ("agentcall.client", "agentcall.listener", "agentcall.caller", "agentcall.cli")
    leaks = [
        " -> ".join(path)
        for module, path in sorted(reachable(import_edges(), "agentcall.relay").items())
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert leaks == []


def test_the_three_roles_are_peers() -> None:
    """No module of caller/, listener/ or relay/ imports one of another role, even lazily: a
    program that needs two of them is composed above them (compose/, cli/). (local/statedb.py,
    which opens every store of state.sqlite, is below all three and reaches both clients.)"""
    roles = ("agentcall.caller", "agentcall.listener", "agentcall.relay")

    def role(module: str) -> str | None:
        return next((r for r in roles if module == r or module.startswith(r + ".")), None)

    leaks = [
        f"{e.source} -> {e.target} (line {e.line})"
        for e in import_edges()
        if role(e.source) is not None and role(e.target) not in (None, role(e.source))
    ]
    assert leaks == []


def test_the_thin_call_path_reaches_no_twisted_module_of_ours() -> None:
    """The thin client of `agentcall call` reaches none of the modules that pull in Twisted,
    autobahn or crypto (a subprocess test checks sys.modules of the real thing)."""
    heavy = ("agentcall.client", "agentcall.crypto", "agentcall.caller", "agentcall.listener")
    leaks = [
        " -> ".join(path)
        for module, path in sorted(reachable(import_edges(), "agentcall.cli.viaservice").items())
        if any(module == h or module.startswith(h + ".") for h in heavy)
    ]
    assert leaks == []
