"""Roles: client, worker, admin; PUBLIC gets nothing; API functions follow the house rules."""

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pyscheduler import errors, migrate
from pyscheduler.db import Database


@pytest.fixture
def login(dsn, conn):
    """login(*groups) -> DSN of a fresh login role that is a member of those groups."""
    made = []

    def make(*groups: str) -> str:
        name = f"login_{uuid.uuid4().hex[:8]}"
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
        for group in groups:
            conn.execute(f'GRANT "{group}" TO "{name}"')
        made.append(name)
        return make_conninfo(dsn, user=name)

    yield make
    for name in made:
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE "{name}"')


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
        call(login(), "version")
    assert info.value.sqlstate == "42501"


def test_client_can_view_but_not_call_worker_or_admin_functions(dsn, login):
    client = login("pyscheduler_client")
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
        call(login("pyscheduler_worker"), "cleanup_tasks", retention="1 day")


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
