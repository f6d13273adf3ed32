"""Roles: client, worker, admin; PUBLIC gets nothing; API functions follow the house rules."""

import uuid
from pathlib import Path

import psycopg
import pytest

from pyscheduler import errors, migrate
from pyscheduler.db import Database


def call(dsn, function, **args):
    with Database(dsn, max_size=1) as database:
        return database.call(function, **args)


def public_functions(conn):
    return conn.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc') AS comment "
        "FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname NOT LIKE '\\_%' "
        "ORDER BY 1"
    ).fetchall()


def test_a_role_without_grants_can_call_nothing(dsn, login):
    with pytest.raises(errors.PermissionDenied) as info:
        call(login()[1], "version")
    assert info.value.sqlstate == "42501"


def test_client_can_view_but_not_call_worker_or_admin_functions(dsn, login):
    client = login("pyscheduler_client")[1]
    assert call(client, "version")[0]["migrations"]
    for function, args in [
        ("lease_task", {"queue": "q", "worker": "worker-1"}),  # worker
        ("enqueue_message", {"id": "m", "deadline": "2030-01-01T00:00:00Z"}),  # worker (relay)
        ("reset_expired_tasks", {}),  # admin
    ]:
        with pytest.raises(errors.PermissionDenied):
            call(client, function, **args)


def test_worker_cannot_call_admin_functions(dsn, login):
    with pytest.raises(errors.PermissionDenied):
        call(login("pyscheduler_worker")[1], "cleanup_tasks", retention="1 day")


def test_admin_may_call_every_public_function(conn):
    for fn in public_functions(conn):
        assert conn.execute(
            "SELECT bool_and(has_function_privilege('pyscheduler_admin', p.oid, 'EXECUTE')) "
            "FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = %s",
            (fn["proname"],)).fetchone()["bool_and"], fn["proname"]


def test_public_has_no_privilege_on_any_function_or_table(conn):
    rows = conn.execute(
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace "
        "AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a "
        "            WHERE a.grantee = 0) "
        "UNION ALL SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'pyscheduler'::regnamespace "
        "AND EXISTS (SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = 0)"
    ).fetchall()
    assert rows == []
    assert not conn.execute("SELECT has_schema_privilege('public', 'pyscheduler', 'USAGE') AS u").fetchone()["u"]


def test_api_functions_are_security_definer_with_pinned_search_path_and_documented(conn):
    functions = public_functions(conn)
    assert functions
    for fn in functions:
        assert fn["prosecdef"], f"{fn['proname']} is not SECURITY DEFINER"
        assert "search_path=pyscheduler, pg_temp" in (fn["proconfig"] or []), fn["proname"]
        assert fn["comment"], f"{fn['proname']} has no COMMENT ON FUNCTION"


def test_role_names_are_configurable(pg, empty_dsn, login):
    suffix = uuid.uuid4().hex[:6]
    names = {"client_role": f"app_client_{suffix}", "worker_role": f"app_worker_{suffix}",
             "admin_role": f"app_admin_{suffix}"}
    migrate.migrate(empty_dsn, roles=names)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        granted = c.execute(
            "SELECT has_function_privilege(%s, 'pyscheduler.version()', 'EXECUTE')",
            (names["client_role"],)).fetchone()[0]
        assert granted
        c.execute("DROP OWNED BY " + ", ".join(f'"{n}"' for n in names.values()))
        c.execute("DROP ROLE " + ", ".join(f'"{n}"' for n in names.values()))


# ---------------------------------------------------------------- the roles table

AUDIENCES = migrate.AUDIENCES


def documented_roles() -> dict[str, set[str]]:
    """docs/sql-api.md's roles table: name -> the audiences that may call or read it."""
    text = (Path(__file__).parent.parent / "docs" / "sql-api.md").read_text()
    section = text.split("\n## Roles\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            name = cells[0].strip("`").split("(")[0]
            assert name not in table, f"{name} is listed twice in the roles table"
            table[name] = {r.strip() for r in cells[2].split(",") if r.strip()}
    return table


def public_objects(conn) -> list[dict]:
    """Every public function (one row per overload) and view of the schema."""
    return conn.execute(
        "SELECT p.proname AS name, 'function' AS kind, p.oid, "
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS argtypes, p.provariadic <> 0 AS variadic "
        "  FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname NOT LIKE '\\_%' "
        "UNION ALL "
        "SELECT c.relname, 'view', c.oid, NULL, false FROM pg_class c "
        " WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind IN ('v', 'm') AND c.relname NOT LIKE '\\_%' "
        "ORDER BY 1"
    ).fetchall()


def role_of(conn, audience: str) -> str:
    return conn.execute("SELECT pyscheduler._role(%s) AS r", (audience,)).fetchone()["r"]


def test_roles_table_in_docs_matches_the_catalog(conn):
    catalog: dict[str, set[str]] = {}
    for obj in public_objects(conn):
        check = ("has_function_privilege(%s, %s::oid, 'EXECUTE')" if obj["kind"] == "function"
                 else "has_table_privilege(%s, %s::oid, 'SELECT')")
        allowed = {a for a in AUDIENCES
                   if conn.execute(f"SELECT {check} AS ok", (role_of(conn, a), obj["oid"])).fetchone()["ok"]}
        catalog.setdefault(obj["name"], allowed)
        assert catalog[obj["name"]] == allowed, f"overloads of {obj['name']} are granted differently"
    assert documented_roles() == catalog


def test_every_role_calls_every_public_function_or_is_refused(conn):
    """Walk every public function and view as every role: refused (42501) exactly
    where the roles table says no; anything else (a result, a PS error for the NULL
    arguments) means the role got through."""
    documented = documented_roles()
    for audience in AUDIENCES:
        for obj in public_objects(conn):
            if obj["kind"] == "function":
                args = [f"NULL::{t}" for t in obj["argtypes"]]
                if obj["variadic"] and args:
                    args[-1] = "VARIADIC " + args[-1]
                sql = f"SELECT * FROM pyscheduler.{obj['name']}({', '.join(args)})"
            else:
                sql = f"SELECT * FROM pyscheduler.{obj['name']} LIMIT 1"
            refused = False
            with conn.transaction(force_rollback=True):
                conn.execute(f'SET LOCAL ROLE "{role_of(conn, audience)}"')
                try:
                    with conn.transaction():
                        conn.execute(sql)
                except psycopg.errors.InsufficientPrivilege:
                    refused = True
                except psycopg.Error:
                    pass  # got in; the NULL arguments were refused on their merits
            assert refused == (audience not in documented[obj["name"]]), (audience, obj["name"])


def test_monitor_role_only_reads(conn):
    """The monitor role gets views and get/list functions, nothing that writes."""
    documented = documented_roles()
    for name, audiences in documented.items():
        if "monitor" in audiences:
            assert not name.startswith(("submit", "cancel", "lease", "heartbeat", "complete", "abort", "yield",
                                        "reset", "cleanup", "enqueue", "delete", "ready", "register",
                                        "create", "update", "pause", "resume", "trigger", "add", "finish",
                                        "due")), name
