"""The layers of pyscheduler's Python (docs/contributing.md, "Layout"): a shared module imports
only shared modules, a capability imports no module above the capabilities, and no import
runs in a cycle. Every import counts, those inside functions too; only those under
``if TYPE_CHECKING:`` do not, as they never run (an annotation naming its caller). And the
words: a module's docstring says what it is and owns in at most 10 lines, and a module over
600 lines says why at its top (docs/contributing.md, "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pyscheduler"
CAPABILITIES = ("tasks", "delay", "schedules", "checks")
# what assembles the capabilities: the root CLI, the dashboard (and its documented import
# path), the benches (each imports the capability it measures)
ABOVE = ("cli", "__main__", "dashboard", "web.dashboard", "bench")
# ... but the benches' measures (percentiles), which import nothing of the package and which
# the capabilities' demos print too
SHARED = ("bench.stats",)
LAYERS = ("shared", "capability", "above")
MAX_DOCSTRING = 10  # lines of a module's docstring
MAX_LINES = 600  # lines of a module that does not say why it is longer
REASON = "Over 600 lines"  # ... which it says in its first lines: a comment, or its docstring


def layer(module: str) -> int:
    """0 shared (pyscheduler/*.py, web/, bench/stats.py), 1 a capability, 2 above them."""
    name = module.partition(".")[2]
    if name in SHARED:
        return 0
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


def wordy(package: Path = PACKAGE) -> list[str]:
    """Every module of ``package`` whose docstring runs over MAX_DOCSTRING lines, or that runs
    over MAX_LINES lines without REASON in its first lines (a comment, then its docstring)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(package.parent).as_posix()
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        if len(doc.splitlines()) > MAX_DOCSTRING:
            out.append(f"{where}: a docstring of {len(doc.splitlines())} lines (at most {MAX_DOCSTRING}: "
                       "what it is and owns; the why to docs/, measurements to docs/benchmarks.md)")
        lines = text.splitlines()
        top = " ".join(" ".join(line.lstrip("#") for line in lines[:MAX_DOCSTRING + 2]).split())
        if len(lines) > MAX_LINES and REASON not in top:
            out.append(f"{where}: {len(lines)} lines, and no {REASON!r} at its top saying why")
    return out


def test_module_docstrings_are_short_and_long_modules_say_why():
    wrong = wordy()
    assert not wrong, "\n".join(wrong)


def test_the_words_test_sees_a_long_docstring_and_a_long_module(tmp_path):
    package = tmp_path / "pyscheduler"
    (package / "tasks").mkdir(parents=True)
    body = "x = 1\n" * MAX_LINES
    (package / "short.py").write_text('"""' + "a\n" * MAX_DOCSTRING + '"""\n' + body)
    (package / "tasks" / "long.py").write_text('"""' + "a\n" * (MAX_DOCSTRING + 1) + '"""\n')
    (package / "why.py").write_text("# Over 600\n# lines: one job.\n" + body)
    assert wordy(package) == [
        "pyscheduler/short.py: 611 lines, and no 'Over 600 lines' at its top saying why",
        "pyscheduler/tasks/long.py: a docstring of 11 lines (at most 10: what it is and owns; the why to "
        "docs/, measurements to docs/benchmarks.md)"]
