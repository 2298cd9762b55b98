"""The layout keeps its promises: no import cycle, no import up the floors (a backend names no
cluster, run or state code), no core module names a cloud, and every backend has the shape of
providers/base.py (what it implements, whole; no stub members; core code asks `supports`, never
probes for members).

The import rules read the source (ast), so they hold for lazy imports inside functions and for
type-level ones (`if TYPE_CHECKING:`) too: a cycle hidden in a function or an annotation is still a
cycle in the design, and its reader follows it all the same.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parents[1] / "cloudtrain"
# The floors: a module of the key on the left imports nothing of the packages on the right. A backend
# is handed what it needs of state and of SSH (providers/leak.py: the login node gc opens for Slurm);
# the cluster wing knows no run; a run knows no sweep (sweeps import run/, never the reverse).
ABOVE = {
    "providers": ("cluster", "run", "state", "sweep"),
    "state": ("providers", "remote", "cluster", "run", "sweep"),
    "remote": ("cluster", "run", "sweep"),
    "cluster": ("run", "sweep"),
    "run": ("sweep",),
}
# Where clouds may be named: the providers themselves, their fakes, their price lists, their config,
# and the node program (it reads each cloud's interruption notice from its metadata server).
CLOUD_AWARE = ("providers", "testing", "catalog", "config.py", "jobs", "node")
# The lowest floor: the node program (cloudtrain/node) is shipped alone to every node, so it imports
# nothing of the rest of cloudtrain (and only the standard library of Python 3.8).
NODE = "node"
CLOUD_WORDS = re.compile(r"\b(aws|gcp|azure|ami-[0-9a-f]*|ec2|gce|arm)\b", re.IGNORECASE)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of ours that `name` imports: at import time, in functions and in TYPE_CHECKING blocks."""
    deps: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    class Visitor(ast.NodeVisitor):
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


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: {d for d in _imports(name, path, mods) if d in mods} for name, path in mods.items()}


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_cycle_in_a_type_checking_block_counts(tmp_path: Path) -> None:
    module = tmp_path / "a.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cloudtrain.b import B\n")
    mods = {"cloudtrain.a": module, "cloudtrain.b": tmp_path / "b.py"}
    assert _imports("cloudtrain.a", module, mods) == {"cloudtrain.b"}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a module to a package above its floor (ABOVE), as `module -> imported`."""
    def wing(module: str) -> str:
        return module.split(".")[1] if module.count(".") else ""

    return [f"{name} -> {dep}" for name in sorted(graph) for dep in sorted(graph[name])
            if wing(dep) in ABOVE.get(wing(name), ())]


def test_no_import_up_the_floors() -> None:
    found = _upward(_graph())
    assert found == [], "\n".join(found)


def test_the_floor_check_finds_upward_imports() -> None:
    graph = {"cloudtrain.providers.x": {"cloudtrain.state", "cloudtrain.config"},
             "cloudtrain.run.y": {"cloudtrain.cluster.z"}, "cloudtrain.cluster.z": {"cloudtrain.run.jobs"},
             "cloudtrain.cli.w": {"cloudtrain.sweep"}}
    assert _upward(graph) == ["cloudtrain.cluster.z -> cloudtrain.run.jobs",
                              "cloudtrain.providers.x -> cloudtrain.state"]


def test_the_node_program_imports_only_itself_and_the_standard_library() -> None:
    import sys

    graph = _graph()
    found = [f"{name} -> {dep}" for name in sorted(graph) if name.startswith(f"cloudtrain.{NODE}")
             for dep in sorted(graph[name]) if not dep.startswith(f"cloudtrain.{NODE}") and dep != "cloudtrain"]
    assert found == [], "\n".join(found)
    outside = []
    for path in sorted((PACKAGE / NODE).glob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 8))  # Python 3.8's syntax: any image's python3
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            outside += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in sys.stdlib_module_names]
    assert outside == [], "\n".join(outside)


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


# The backend shape (providers/base.py): a core every backend has, capability Protocols it implements
# whole or not at all, and no stub members standing in for what it cannot do.


def _capabilities() -> tuple[type, ...]:
    from cloudtrain.providers import base

    return (base.CreatesMachines, base.StopsMachines, base.SelfStopping, base.GivenHosts, base.Schedules,
            base.FollowsCaller, base.SaysVmIdentity, base.SaysBucketIdentity, base.MarksAlive)


def _members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}


# What each backend is: the contract as the docs state it (docs/design/architecture.md).
IS = {
    "local": {"CreatesMachines", "StopsMachines", "SelfStopping"},
    "ssh": {"GivenHosts"},
    "slurm": {"GivenHosts", "Schedules"},
    "aws": {"CreatesMachines", "StopsMachines", "SelfStopping", "SaysBucketIdentity", "MarksAlive"},
    "gcp": {"CreatesMachines", "StopsMachines", "SelfStopping", "FollowsCaller", "SaysVmIdentity", "SaysBucketIdentity",
            "MarksAlive"},
    "azure": {"CreatesMachines", "StopsMachines", "SelfStopping", "FollowsCaller", "SaysBucketIdentity", "MarksAlive"},
}


@pytest.mark.parametrize("cloud", sorted(IS))
def test_each_backend_implements_what_it_is_and_whole(cloud: str) -> None:
    from cloudtrain.providers import available, provider_class
    from cloudtrain.providers.base import Traits, supports

    if cloud not in available():
        pytest.skip(f"{cloud} is not in this build")
    cls = provider_class(cloud)
    # The core (Backend): its data members make it unfit for issubclass, so they are asked one by one.
    assert isinstance(cls.traits, Traits) and all(hasattr(cls, m) for m in ("name", "default_region", "check_credentials"))
    assert not hasattr(cls, "capabilities"), "capability flags are gone: implement the Protocols instead"
    assert {c.__name__ for c in _capabilities() if supports(cls, c)} == IS[cloud]
    for capability in _capabilities():
        present = {m for m in _members(capability) if hasattr(cls, m)}
        assert present in (set(), _members(capability)), f"{cloud} implements {capability.__name__} in part: {present}"


def _stubs(path: Path) -> list[str]:
    """Methods of provider classes whose whole body (its docstring aside) is `pass`, `...`, `return`,
    `return None` or one `raise NotAvailableError(...)`: a stand-in for what the backend cannot do."""
    found = []
    for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            body = fn.body[1:] if (fn.body and isinstance(fn.body[0], ast.Expr)
                                   and isinstance(fn.body[0].value, ast.Constant) and len(fn.body) > 1) else fn.body
            if len(body) != 1:
                continue
            stmt = body[0]
            stub = (isinstance(stmt, ast.Pass)
                    or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is ...)
                    or (isinstance(stmt, ast.Return) and (stmt.value is None or (
                        isinstance(stmt.value, ast.Constant) and stmt.value.value is None)))
                    or (isinstance(stmt, ast.Raise) and "NotAvailableError" in ast.unparse(stmt)))
            if stub:
                found.append(f"{path.parent.name}/{path.name}:{fn.lineno}: {cls.name}.{fn.name}")
    return found


def test_no_provider_has_stub_members() -> None:
    offenders = []
    for package in sorted(p for p in (PACKAGE / "providers").iterdir() if (p / "__init__.py").exists()):
        offenders += _stubs(package / "__init__.py")
    assert offenders == [], "\n".join(offenders)


@pytest.mark.parametrize("source,expected", [
    ("class P:\n    def stop(self, ids):\n        raise NotAvailableError('no')\n", 1),
    ("class P:\n    def start(self, ids):\n        '''Nothing.'''\n        return None\n", 1),
    ("class P:\n    def list_tagged(self, c):\n        return []\n", 0),  # a true answer: nothing of ours
    ("class P:\n    def launch(self, spec, n):\n        return make(spec, n)\n", 0),
])
def test_the_stub_finder_finds_stubs(tmp_path: Path, source: str, expected: int) -> None:
    (tmp_path / "m.py").write_text(source)
    assert len(_stubs(tmp_path / "m.py")) == expected


def test_core_asks_what_a_backend_implements_never_probes_for_members() -> None:
    """No `.capabilities` flags, and no hasattr/getattr of a capability Protocol's member on a
    provider outside providers/: core code asks `supports(provider, X)` / `providers.implements(name, X)`."""
    names = set().union(*(_members(c) for c in _capabilities()))
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "providers":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "capabilities":
                offenders.append(f"{rel}:{node.lineno}: .capabilities")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names
                    and re.search(r"provider|scheduler|cls", ast.unparse(node.args[0]))):
                offenders.append(f"{rel}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    assert offenders == [], "\n".join(offenders)
