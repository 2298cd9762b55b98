"""The layout keeps its promises: no import cycle, and no core module names a cloud.

Both read the source (ast), so they hold for lazy imports inside functions too: a cycle hidden in a
function is still a cycle in the design.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cloudtrain"
# Where clouds may be named: the providers themselves, their fakes, their price lists, their config.
CLOUD_AWARE = ("providers", "testing", "catalog", "config.py", "jobs")
CLOUD_WORDS = re.compile(r"\b(aws|gcp|azure|ami-[0-9a-f]*|ec2|gce|arm)\b", re.IGNORECASE)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of ours that importing `name` runs, TYPE_CHECKING blocks excluded."""
    deps: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            for alias in node.names:
                if alias.name.startswith("cloudtrain"):
                    deps.add(resolve(alias.name) or "")

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            module = node.module or ""
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                module = ".".join(base[: len(base) - node.level + 1] + ([module] if module else []))
            if module.startswith("cloudtrain"):
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    deps.add(full if full in mods else resolve(module) or "")

    Visitor().visit(ast.parse(path.read_text()))
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    for dep in list(deps):
        parts = dep.split(".")
        for k in range(2, len(parts)):
            parent = ".".join(parts[:k])
            if parent in mods and not name.startswith(parent + "."):
                deps.add(parent)
    deps.discard(name)
    deps.discard("")
    return deps


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    mods = _modules()
    graph = {name: {d for d in _imports(name, path, mods) if d in mods} for name, path in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _cloud_mentions(path: Path) -> list[str]:
    """String literals (docstrings excluded) that name a cloud, or compare with a cloud's name."""
    from cloudtrain.providers import KNOWN

    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if CLOUD_WORDS.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in KNOWN:
                        found.append(f"{path.name}:{node.lineno}: compares with cloud {value.value!r}")
    return found


def test_no_core_module_names_a_cloud() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in CLOUD_AWARE:
            continue
        offenders += [f"{rel}: {m}" for m in _cloud_mentions(path)]
    assert offenders == [], "\n".join(offenders)


@pytest.mark.parametrize("source,expected", [
    ('x = "aws"\n', 1),
    ('if cloud == "ssh":\n    pass\n', 1),
    ('if cloud in ("local", "gcp"):\n    pass\n', 2),
    ('"""Docstrings may explain aws."""\nx = 1\n', 0),
    ('x = "amazonaws.com checkip"\n', 0),
])
def test_the_cloud_name_check_sees_names(tmp_path: Path, source: str, expected: int) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert len(_cloud_mentions(module)) >= expected and (expected or not _cloud_mentions(module))
