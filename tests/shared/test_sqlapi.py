"""The edge between Python and SQL (pyscheduler/sqlapi.py): every declared function, view and
statement exists in a migrated database as declared (the contract), and no module outside
the ``sqlapi`` modules, ``db.py`` and ``migrate.py`` names a SQL function or ``FROM
pyscheduler.`` (the boundary)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import psycopg

from pyscheduler.sqlapi import Fn, Query, View

PACKAGE = Path(__file__).resolve().parents[2] / "pyscheduler"
MODULES = ["pyscheduler.sqlapi"] + [f"pyscheduler.{p.parent.name}.sqlapi" for p in sorted(PACKAGE.glob("*/sqlapi.py"))]
ALLOWED = {"sqlapi.py", "db.py", "migrate.py"}  # where SQL may be written (sqlapi: by name)


def declarations() -> list[tuple[str, str, object]]:
    """(module, attribute, declaration) of every Fn, View and Query of the sqlapi modules."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [(name, attr, value) for attr, value in vars(module).items()
                  if isinstance(value, (Fn, View, Query)) and not attr.startswith("_")]
    return found


def problems(conn, module: str, attr: str, decl: object) -> list[str]:
    where = f"{module}.{attr}"
    if isinstance(decl, Fn):
        rows = conn.execute(  # fields: the columns of a composite it returns (SETOF future_check)
            "SELECT p.proargnames AS names, p.proargmodes AS modes, p.pronargs AS n, "
            "ARRAY(SELECT a.attname::text FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid "
            "      WHERE t.oid = p.prorettype AND a.attnum > 0 AND NOT a.attisdropped) AS fields FROM pg_proc p "
            "WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = %s", (str(decl),)).fetchall()
        if not rows:
            return [f"{where}: no function pyscheduler.{decl}"]
        out = []
        for row in rows:
            names, modes = row["names"] or [], row["modes"]
            inputs = {n for i, n in enumerate(names) if (modes[i] in ("i", "b", "v") if modes else i < row["n"])}
            outputs = ({n for i, n in enumerate(names) if modes and modes[i] in ("o", "b", "t")}
                       or set(row["fields"]) or {str(decl)})
            out += [f"{where}: pyscheduler.{decl} has no parameter {a!r}" for a in decl.args if a not in inputs]
            out += [f"{where}: pyscheduler.{decl} returns no column {c!r}" for c in decl.columns if c not in outputs]
        return out
    if isinstance(decl, View):
        columns = {r["attname"] for r in conn.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relname = %s AND c.relkind IN ('v', 'm') "
            "AND a.attnum > 0 AND NOT a.attisdropped", (str(decl),)).fetchall()}
        if not columns:
            return [f"{where}: no view pyscheduler.{decl}"]
        return [f"{where}: view pyscheduler.{decl} has no column {c!r}" for c in decl.columns if c not in columns]
    text = numbered(str(decl))
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"PREPARE sqlapi_check AS {text}")
            conn.execute("DEALLOCATE sqlapi_check")  # a session's: a rollback keeps it
    except psycopg.Error as exc:
        return [f"{where}: {exc}"]
    return []


def numbered(text: str) -> str:
    """psycopg's placeholders (%s, %b, %(name)s; %% a percent sign) as PREPARE's $1, $2, ...:
    a named one the same number each time it comes."""
    params: dict[object, int] = {}

    def number(m: re.Match) -> str:
        if m[0] == "%%":
            return "%"
        return f"${params.setdefault(m[1] or object(), len(params) + 1)}"
    return re.sub(r"%%|%(?:\((\w+)\))?[sbt]", number, text)


def test_a_statement_is_prepared_with_its_placeholders_numbered():
    assert numbered("SELECT %s, %(a)s, %(b)b, %(a)s, i %% 2, 'x%%' FROM t") == (
        "SELECT $1, $2, $3, $2, i % 2, 'x%' FROM t")


def test_every_declared_function_view_and_statement_is_in_the_catalog_as_declared(conn):
    decls = declarations()
    assert len(decls) > 3
    wrong = [p for module, attr, decl in decls for p in problems(conn, module, attr, decl)]
    assert not wrong, "\n".join(wrong)


def test_a_renamed_column_fails_the_contract_naming_the_sqlapi_entry(tx):
    tx.execute("ALTER FUNCTION pyscheduler.activity(interval, interval, integer) RENAME TO activity_renamed")
    wrong = [p for module, attr, decl in declarations() for p in problems(tx, module, attr, decl)]
    assert wrong == ["pyscheduler.sqlapi.ACTIVITY: no function pyscheduler.activity"]


CALLS = {"call", "call_one", "call_value", "call_binary", "call_tuples"}
SQL_NAMES = re.compile(r"\b(FROM|INTO|UPDATE)\s+pyscheduler\.|\bpyscheduler\.[a-z_]+\s*\(", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def crossings(path: Path) -> list[str]:
    """Where a module names SQL itself: a call of the db's call functions with a literal
    function name, or a string that reads a pyscheduler relation or calls a function."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.func.attr}({node.args[0].value!r})")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
              and SQL_NAMES.search(node.value)):
            out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:80]!r}")
    return out


def test_only_the_sqlapi_modules_name_sql():
    crossed = [c for p in sorted(PACKAGE.rglob("*.py")) if p.name not in ALLOWED for c in crossings(p)]
    assert not crossed, "name SQL in the capability's sqlapi.py:\n" + "\n".join(crossed)


def test_the_boundary_test_sees_a_literal_function_name(tmp_path):
    bad = PACKAGE / "tasks" / "_boundary_probe.py"
    bad.write_text('def f(db):\n    """pyscheduler.submit_task() in a docstring is fine."""\n'
                   '    db.call("submit_task", queue="q")\n    db.query("UPDATE pyscheduler.tasks SET spec = NULL")\n'
                   '    return "SELECT * FROM pyscheduler.task_counts"\n')
    try:
        assert [c.split(": ", 1)[1] for c in crossings(bad)] == [
            "call('submit_task')", "'SELECT * FROM pyscheduler.task_counts'",
            "'UPDATE pyscheduler.tasks SET spec = NULL'"]
    finally:
        bad.unlink()
