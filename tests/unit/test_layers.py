"""The package map of docs/architecture.md is the rule: every import of src/ obeys it.

The map is written down once, in the doc a newcomer reads; this test parses it, so the doc and
the code cannot drift apart. Every import counts, including those under ``TYPE_CHECKING`` and
inside functions: a type-only or late import is still a dependency on that layer.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "trio_gateway"
MAP_DOC = ROOT / "docs" / "architecture.md"
# A row of the map: | `core/` | what it holds | `-` or `core`, `http1`, ... |
_ROW = re.compile(r"^\| `(?P<name>[a-z_0-9]+)(?P<pkg>/|\.py)` \| [^|]+ \| (?P<may>[^|]+) \|$")
MAX_LINES = 600


def package_map(text: str) -> dict[str, frozenset[str]]:
    """Each package (or top-level module) and what it may import, from the doc's table."""
    rules: dict[str, frozenset[str]] = {}
    section = text.partition("## The package map")[2].partition("\n## ")[0]
    for line in section.splitlines():
        row = _ROW.match(line.strip())
        if row is None:
            continue
        may = row["may"].strip()
        names = frozenset() if may == "-" else frozenset(re.findall(r"`([a-z_0-9]+)`", may))
        rules[row["name"]] = names
    return rules


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["trio_gateway", *parts])


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """Every trio_gateway module ``path`` imports, resolved to the module (not the name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # `from pkg import submodule` depends on the submodule.
            targets = [
                f"{origin}.{a.name}" if _is_module(f"{origin}.{a.name}") else origin
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "trio_gateway" or target.startswith("trio_gateway."):
                yield node.lineno, target


def _is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    return (SRC / relative).with_suffix(".py").is_file() or (SRC / relative).is_dir()


def _layer(module: str) -> str:
    """The package (first level under trio_gateway) a module belongs to; a top-level module is
    its own layer, and the package's ``__init__`` is the root every layer may read."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> dict[str, list[tuple[int, str]]]:
    graph: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        graph[module] = [(line, t) for line, t in _imports(path, module) if t != module]
    return graph


def violations(
    graph: Mapping[str, list[tuple[int, str]]], rules: Mapping[str, frozenset[str]]
) -> list[str]:
    found = []
    for module, imports in graph.items():
        layer = _layer(module)
        for line, target in imports:
            other = _layer(target)
            if other in ("", layer) or other in rules.get(layer, frozenset()):
                continue
            found.append(f"{module}:{line} imports {target} ({layer} may not import {other})")
    return found


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
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
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


RULES = package_map(MAP_DOC.read_text(encoding="utf-8"))
GRAPH = import_graph()


def test_the_map_names_every_package_and_only_those() -> None:
    present = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in SRC.glob("*.py") if p.name != "__init__.py"}
    assert set(RULES) == present
    for layer, allowed in RULES.items():
        assert allowed <= set(RULES), f"{layer} may import an unknown layer: {allowed - set(RULES)}"


def test_the_allowed_directions_have_no_cycle() -> None:
    assert cycles({layer: set(allowed) for layer, allowed in RULES.items()}) == []


def test_every_import_goes_where_the_map_allows() -> None:
    assert violations(GRAPH, RULES) == []


def test_no_module_imports_itself_back() -> None:
    edges = {module: {t for _, t in imports} for module, imports in GRAPH.items()}
    assert cycles(edges) == []


def test_the_simulator_reads_only_the_wire_and_the_vocabulary() -> None:
    """The simulator stands in for vendors: it must not borrow the gateway's behaviour."""
    assert RULES["sim"] <= {"core", "http1"}


@pytest.mark.parametrize(
    "tree", ["src", "tests", "bench", "tools"], ids=lambda tree: f"{tree}/ files"
)
def test_no_source_file_past_600_lines(tree: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / tree).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_checks_catch_what_they_are_for() -> None:
    """A layer importing upward, and a two-module cycle, are found."""
    rules = package_map(
        "## The package map\n| `core/` | vocabulary | - |\n| `ops/` | logs | `core` |\n"
        "| `client.py` | SDK | `core` |\n## Next\n| `ops/` | not the map | - |"
    )
    assert rules == {"core": frozenset(), "ops": frozenset({"core"}), "client": frozenset({"core"})}
    graph = {
        "trio_gateway.core.a": [(3, "trio_gateway.ops.b")],
        "trio_gateway.ops.b": [(1, "trio_gateway.core.a"), (2, "trio_gateway")],
    }
    assert violations(graph, rules) == [
        "trio_gateway.core.a:3 imports trio_gateway.ops.b (core may not import ops)"
    ]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
