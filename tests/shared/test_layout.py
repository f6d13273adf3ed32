"""The layers of pyscheduler's Python (docs/contributing.md, "Layout"): a shared module imports
only shared modules, a capability imports no module above the capabilities, and no import
runs in a cycle. Every import counts, those inside functions too; only those under
``if TYPE_CHECKING:`` do not, as they never run (an annotation naming its caller)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pyscheduler"
CAPABILITIES = ("tasks", "delay", "schedules", "checks")
# what assembles the capabilities: the root CLI, the dashboard (and its documented import
# path), the peers' benchmark
ABOVE = ("cli", "__main__", "dashboard", "web.dashboard", "benchpeers")
LAYERS = ("shared", "capability", "above")


def layer(module: str) -> int:
    """0 shared (pyscheduler/*.py, web/), 1 a capability, 2 above them."""
    name = module.partition(".")[2]
    if any(name == a or name.startswith(a + ".") for a in ABOVE):
        return 2
    return 1 if name.partition(".")[0] in CAPABILITIES else 0


def modules(package: Path) -> dict[str, Path]:
    """Module name -> file, for every module of ``package`` (a package is its __init__.py)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = [package.name, *path.relative_to(package).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that ``module`` imports (relative or absolute, anywhere in it)."""
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known:  # `import a.b.c`: the longest part that is a module
            name = name.rpartition(".")[0]
        if name:
            out.add(name)

    tree = ast.parse(path.read_text())
    typing_only = {id(n) for guard in ast.walk(tree) if isinstance(guard, ast.If)
                   and ast.unparse(guard.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for stmt in guard.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module) if p)
            for alias in node.names:  # `from . import charts`: the module charts, else the package
                add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    out.discard(module)
    return out


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    return {m: imports(m, p, known) for m, p in known.items()}


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({LAYERS[layer(m)]}) imports {t} ({LAYERS[layer(t)]})"
            for m in sorted(edges) for t in sorted(edges[m]) if layer(t) > layer(m)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_up():
    edges = graph()
    assert "pyscheduler.web.endpoint" in edges and "pyscheduler.redisconn" in edges
    wrong = upward(edges)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_layout_test_sees_an_upward_import_and_a_cycle(tmp_path):
    package = tmp_path / "pyscheduler"
    (package / "schedules").mkdir(parents=True)
    (package / "web").mkdir()
    (package / "__init__.py").write_text("")
    (package / "web" / "__init__.py").write_text("")
    (package / "redisconn.py").write_text("import redis\n")
    (package / "web" / "endpoint.py").write_text(
        "def check():\n    from ..schedules.index import connect\n    from .. import redisconn\n")
    (package / "schedules" / "__init__.py").write_text("from .index import Shards\n")
    (package / "schedules" / "index.py").write_text("import pyscheduler.web.endpoint\nfrom . import hint\n")
    (package / "schedules" / "hint.py").write_text(  # an annotation's import never runs
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .index import Shards\n")
    edges = graph(package)
    assert edges["pyscheduler.schedules.hint"] == set()
    assert edges["pyscheduler.web.endpoint"] == {"pyscheduler.schedules.index", "pyscheduler.redisconn"}
    assert upward(edges) == ["pyscheduler.web.endpoint (shared) imports pyscheduler.schedules.index (capability)"]
    assert cycles(edges) == [["pyscheduler.schedules.index", "pyscheduler.web.endpoint"]]
