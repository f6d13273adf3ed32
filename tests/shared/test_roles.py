"""Roles: client, worker, admin; PUBLIC gets nothing; API functions follow the house rules."""

import uuid

import psycopg
import pytest

from pyscheduler import errors, migrate
from pyscheduler.db import Database
from tests.support import REPO


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


def test_admin_may_call_every_public_function(tx):
    for fn in public_functions(tx):
        assert tx.execute(
            "SELECT bool_and(has_function_privilege('pyscheduler_admin', p.oid, 'EXECUTE')) "
            "FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = %s",
            (fn["proname"],)).fetchone()["bool_and"], fn["proname"]


def test_public_has_no_privilege_on_any_function_or_table(tx):
    rows = tx.execute(
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace "
        "AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a "
        "            WHERE a.grantee = 0) "
        "UNION ALL SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'pyscheduler'::regnamespace "
        "AND EXISTS (SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = 0)"
    ).fetchall()
    assert rows == []
    assert not tx.execute("SELECT has_schema_privilege('public', 'pyscheduler', 'USAGE') AS u").fetchone()["u"]


def test_api_functions_are_security_definer_with_pinned_search_path_and_documented(tx):
    functions = public_functions(tx)
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


def public_objects(conn) -> list[dict]:
    """Every public function (one row per overload) and view of the schema."""
    return conn.execute(
        "SELECT p.proname AS name, 'function' AS kind, p.oid, "
        "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS argtypes, "
        "p.provariadic <> 0 AS variadic "
        "  FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname NOT LIKE '\\_%' "
        "UNION ALL "
        "SELECT c.relname, 'view', c.oid, NULL, false FROM pg_class c "
        " WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind IN ('v', 'm') AND c.relname NOT LIKE '\\_%' "
        "ORDER BY 1"
    ).fetchall()


def role_of(conn, audience: str) -> str:
    return conn.execute("SELECT pyscheduler._role(%s) AS r", (audience,)).fetchone()["r"]


def test_roles_table_in_docs_matches_the_catalog(tx):
    catalog: dict[str, set[str]] = {}
    for obj in public_objects(tx):
        check = ("has_function_privilege(%s, %s::oid, 'EXECUTE')" if obj["kind"] == "function"
                 else "has_table_privilege(%s, %s::oid, 'SELECT')")
        allowed = {a for a in AUDIENCES
                   if tx.execute(f"SELECT {check} AS ok", (role_of(tx, a), obj["oid"])).fetchone()["ok"]}
        catalog.setdefault(obj["name"], allowed)
        assert catalog[obj["name"]] == allowed, f"overloads of {obj['name']} are granted differently"
    assert documented_roles() == catalog


def test_every_role_calls_every_public_function_or_is_refused(tx):
    """Walk every public function and view as every role: refused (42501) exactly
    where the roles table says no; anything else (a result, a PS error for the NULL
    arguments) means the role got through."""
    documented = documented_roles()
    for audience in AUDIENCES:
        for obj in public_objects(tx):
            if obj["kind"] == "function":
                args = [f"NULL::{t}" for t in obj["argtypes"]]
                if obj["variadic"] and args:
                    args[-1] = "VARIADIC " + args[-1]
                sql = f"SELECT * FROM pyscheduler.{obj['name']}({', '.join(args)})"
            else:
                sql = f"SELECT * FROM pyscheduler.{obj['name']} LIMIT 1"
            refused = False
            with tx.transaction(force_rollback=True):
                tx.execute(f'SET LOCAL ROLE "{role_of(tx, audience)}"')
                try:
                    with tx.transaction():
                        tx.execute(sql)
                except psycopg.errors.InsufficientPrivilege:
                    refused = True
                except psycopg.Error:
                    pass  # got in; the NULL arguments were refused on their merits
            assert refused == (audience not in documented[obj["name"]]), (audience, obj["name"])


def test_monitor_role_only_reads(tx):
    """The monitor role gets views and get/list functions, nothing that writes."""
    documented = documented_roles()
    for name, audiences in documented.items():
        if "monitor" in audiences:
            assert not name.startswith(("submit", "cancel", "lease", "heartbeat", "complete", "abort", "yield",
                                        "reset", "cleanup", "enqueue", "delete", "ready", "register",
                                        "create", "update", "pause", "resume", "trigger", "add", "finish",
                                        "due")), name


# ---------------------------------------------------------------- the ownership walk
#
# docs/sql-api.md's matrix says, per public function and view and per audience, what that
# audience may do with work another role owns:
#   -      not granted (42501)
#   own    acts on its own work only: another role's is refused (42501) or left alone, unread
#   meta   reads another role's work without its contents, changes none of it
#   lease  acts on a task only with its lease's token: without it, changes and reads nothing
#   all    no per-role restriction (admin; a daemon's role for the work it processes; counts)
# The walk calls every public function and view of the catalog as every audience (and as a
# login with no pyscheduler role) on a first application's work, whose contents carry SECRET,
# each call in a rolled-back transaction, and checks the answer against the matrix: whether it
# was refused, whether SECRET came back (in the answer or an error), and whether the first
# application's rows changed.

SECRET = "walk-4111-1111-1111-1111"
CELLS = {"-", "own", "meta", "lease", "all"}


def documented_matrix() -> dict[str, dict[str, str]]:
    """docs/sql-api.md's matrix: name -> audience -> cell."""
    text = (REPO / "docs" / "sql-api.md").read_text()
    section = text.split("\n## Roles\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| name | kind |")]
    assert len(lines) == 1, "the matrix's header row: | name | kind | client | worker | ..."
    header = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    assert header[2:] == list(AUDIENCES), header
    matrix: dict[str, dict[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(header) and cells[0].startswith("`"):
            name = cells[0].strip("`").split("(")[0]
            assert name not in matrix, f"{name} is listed twice in the matrix"
            assert set(cells[2:]) <= CELLS, (name, cells)
            matrix[name] = dict(zip(AUDIENCES, cells[2:]))
    return matrix


def documented_roles() -> dict[str, set[str]]:
    """The audiences that may call or read each name (the matrix's cells that are not "-")."""
    return {name: {a for a, cell in row.items() if cell != "-"} for name, row in documented_matrix().items()}


def base_type(conn, oid: int) -> str:
    """A parameter's type as the walk's values are keyed: a domain as its base type."""
    return conn.execute(
        "SELECT CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, NULL) "
        "            WHEN e.typtype = 'd' THEN format_type(e.typbasetype, NULL) || '[]' "
        "            ELSE format_type(t.oid, NULL) END AS t "
        "FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A' WHERE t.oid = %s",
        (oid,)).fetchone()["t"]


def owned_work(dsn: str, app_dsn: str) -> dict[tuple[str, ...], str]:
    """The first application's work, committed, its contents carrying SECRET: SQL literals by
    (parameter name, base type) for the walk's calls."""
    from psycopg.rows import dict_row

    with psycopg.connect(app_dsn, autocommit=True, row_factory=dict_row) as app:
        done = app.execute("SELECT (pyscheduler.submit_task(queue => 'walk-q', spec => %s::jsonb, "
                           "unique_key => 'walk-key')) ->> 'rn' AS rn", (f'{{"card": "{SECRET}"}}',)).fetchone()["rn"]
        ready = app.execute("SELECT (pyscheduler.submit_task(queue => 'walk-q', spec => %s::jsonb, priority => 0)) "
                            "->> 'rn' AS rn", (f'{{"card": "{SECRET}"}}',)).fetchone()["rn"]
        app.execute("SELECT pyscheduler.create_schedule(name => 'walk-s', target => 'walk-q', target_kind => 'task', "
                    "every => '1 hour', payload => %s::jsonb)", (f'{{"card": "{SECRET}"}}',))
        check = app.execute("SELECT id FROM pyscheduler.add_check(entity_name => 'walk', entity_key => 'e1', "
                            "job => 'walk-q', kind => 'task', check_after => '1 hour', payload => %s::jsonb)",
                            (f'{{"card": "{SECRET}"}}',)).fetchone()["id"]
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as admin:
        worker = admin.execute("SELECT pyscheduler.register_worker() AS w").fetchone()["w"]
        leased = admin.execute("SELECT * FROM pyscheduler.lease_task(queue => 'walk-q', worker => %s)",
                               (worker,)).fetchone()["lease_task"]
        assert leased["rn"] == done
        admin.execute("SELECT pyscheduler.complete_task(rn => %s, token => %s, result => %s::jsonb)",
                      (done, leased["token"], f'{{"charged": "{SECRET}"}}'))
        admin.execute("SELECT pyscheduler.enqueue_message(id => 'walk-m', deadline => now() + interval '1 hour', "
                      "value => convert_to(%s, 'UTF8'))", (SECRET,))
        schedule = admin.execute("SELECT id FROM pyscheduler.schedules WHERE name = 'walk-s'").fetchone()["id"]
    errors = f'[{{"code": "declined", "args": {{"card": "{SECRET}"}}}}]'
    return {
        ("rn", "uuid"): f"'{ready}'", ("rns", "uuid[]"): f"ARRAY['{ready}']::uuid[]",
        ("token", "uuid"): "gen_random_uuid()", ("tokens", "uuid[]"): "ARRAY[gen_random_uuid()]",
        ("queue", "text"): "'walk-q'", ("worker", "text"): f"'{worker}'", ("owner", "name"): "current_user",
        ("spec", "jsonb"): "'{}'", ("specs", "jsonb"): "'[{}]'",
        ("workflow", "jsonb"): """'[{"name": "a", "queue": "walk-q", "spec": {}}]'""",
        ("error", "jsonb"): f"'{errors}'::jsonb -> 0", ("errors", "jsonb"): f"'{errors}'",
        ("starts", "integer"): "10", ("keep", "boolean"): "true",
        ("name", "text"): "'walk-s'",
        ("expected", "timestamp with time zone[]"): "ARRAY[now()]", ("outcomes", "text[]"): "ARRAY['ok']",
        ("attempts", "integer[]"): "ARRAY[1]", ("errors", "text[]"): "ARRAY[NULL::text]",
        ("shards", "integer[]"): "ARRAY[0]", ("shard_count", "integer"): "1",
        ("sync_id", "text"): "'walk-sync'", ("owner", "text"): "'walk-node'",
        ("entity_name", "text"): "'walk'", ("entity_key", "text"): "'e1'", ("job", "text"): "'walk-q'",
        ("id", "bigint"): str(check), ("ids", "bigint[]"): f"ARRAY[{check}]::bigint[]",
        # the schedules' functions take ids too: the schedule's (by function, name and type)
        **{(f, "ids", "bigint[]"): f"ARRAY[{schedule}]::bigint[]"
           for f in ("index_entries", "fire_details", "record_executions", "fire_task_schedules", "stop_schedules")},
        ("slot", "timestamp with time zone"): "pyscheduler.slot_round(now())", ("kind", "text"): "'task'",
        ("check_after", "interval"): "'1 hour'",
        ("id", "text"): "'walk-m'", ("ids", "text[]"): "ARRAY['walk-m']",
        ("deadline", "timestamp with time zone"): "now() + interval '2 hours'",
        ("deadlines", "timestamp with time zone[]"): "ARRAY[now() + interval '2 hours']",
        ("node", "uuid"): "gen_random_uuid()", ("expr", "text"): "'* * * * *'",
        ("target_prefix", "text"): "'walk-'",
        ("ts", "timestamp with time zone"): "now()",
        ("allow", "cidr[]"): "'{}'::cidr[]",
        ("step", "text"): "'walk-step'", ("payload", "jsonb"): "'{}'",
    }


def parameters(conn, oid: int) -> list[tuple[str, str, bool]]:
    """(name, base type, required) of a function's parameters."""
    row = conn.execute("SELECT p.proargnames, p.proargtypes::oid[] AS types, p.pronargs, p.pronargdefaults "
                       "FROM pg_proc p WHERE p.oid = %s", (oid,)).fetchone()
    return [(row["proargnames"][i], base_type(conn, row["types"][i]), i < row["pronargs"] - row["pronargdefaults"])
            for i in range(row["pronargs"])]


def walk_statement(conn, obj: dict, values: dict) -> str:
    """The call of a function on the first application's work: every parameter the walk has a
    value for (by function, name and type, else by name and type), every required one."""
    if obj["kind"] == "view":
        return f"SELECT * FROM pyscheduler.{obj['name']} LIMIT 1000"
    args = []
    for name, typ, required in parameters(conn, obj["oid"]):
        key = (obj["name"], name, typ) if (obj["name"], name, typ) in values else (name, typ)
        assert key in values or not required, (
            f"{obj['name']}: give the ownership walk a value for parameter {name} {typ} "
            "(owned_work in tests/shared/test_roles.py)")
        if key in values:
            args.append(f"{name} => {values[key]}")
    return f"SELECT * FROM pyscheduler.{obj['name']}({', '.join(args)})"


FINGERPRINT = (
    "SELECT md5(concat_ws('|',"
    " (SELECT string_agg(t::text, ',' ORDER BY t.rn) FROM pyscheduler.tasks t WHERE t.submitted_by = %(app)s),"
    " (SELECT q::text FROM pyscheduler.task_queues q WHERE q.queue = 'walk-q'),"
    " (SELECT s::text FROM pyscheduler.schedules s WHERE s.name = 'walk-s'),"
    " (SELECT string_agg(c::text, ',' ORDER BY c.id) FROM pyscheduler.checks c WHERE c.owner = %(app)s),"
    " (SELECT m::text FROM pyscheduler.delay_messages m WHERE m.id = 'walk-m'))) AS f")


def outcome(conn, role: str, statement: str, app: str) -> tuple[str, str]:
    """(what happened, what came back) of statement run as role, rolled back: 'denied' (42501),
    else 'changed' (the first application's rows), 'secret' (its contents came back), 'clean'."""
    with conn.transaction(force_rollback=True):
        before = conn.execute(FINGERPRINT, {"app": app}).fetchone()["f"]
        conn.execute(f'SET LOCAL ROLE "{role}"')
        conn.execute("SET LOCAL statement_timeout = '10s'")
        try:
            with conn.transaction():
                answer = str(conn.execute(statement).fetchall())
        except psycopg.errors.InsufficientPrivilege as exc:
            return "denied", str(exc)
        except psycopg.Error as exc:  # got in; refused on the arguments' merits
            answer = f"{exc.sqlstate}: {exc}"
        conn.execute("RESET ROLE")
        if conn.execute(FINGERPRINT, {"app": app}).fetchone()["f"] != before:
            return "changed", answer
    return ("secret" if SECRET in answer else "clean"), answer


ALLOWED = {"-": {"denied"}, "own": {"denied", "clean"}, "meta": {"clean"}, "lease": {"clean"},
           "all": {"denied", "changed", "secret", "clean"}}


def test_the_ownership_walk_matches_the_matrix_for_every_public_function(conn, dsn, login):
    matrix = documented_matrix()
    app, app_dsn = login("pyscheduler_client")
    nobody, _ = login()
    values = owned_work(dsn, app_dsn)
    wrong = []
    for obj in public_objects(conn):
        assert obj["name"] in matrix, f"{obj['name']} has no row in docs/sql-api.md's matrix"
        statement = walk_statement(conn, obj, values)
        grants = public_grants(conn, obj)
        for audience, cell in list(matrix[obj["name"]].items()) + [("nobody", "-")]:
            role = nobody if audience == "nobody" else role_of(conn, audience)
            got, answer = outcome(conn, role, statement, app)
            ok = got in ALLOWED[cell] and (cell == "-") == (audience not in grants)
            if cell == "all" and audience in grants:
                ok = got != "denied"
            if not ok:
                wrong.append(f"{obj['name']} as {audience}: matrix says {cell!r}, got {got}: {answer[:300]}")
    assert not wrong, "\n".join(wrong)


def public_grants(conn, obj: dict) -> set[str]:
    check = ("has_function_privilege(%s, %s::oid, 'EXECUTE')" if obj["kind"] == "function"
             else "has_table_privilege(%s, %s::oid, 'SELECT')")
    return {a for a in AUDIENCES
            if conn.execute(f"SELECT {check} AS ok", (role_of(conn, a), obj["oid"])).fetchone()["ok"]}


def test_a_new_public_function_without_a_matrix_row_fails_the_walk(conn, dsn, login):
    conn.execute("CREATE FUNCTION pyscheduler.walk_throwaway(queue text) RETURNS int LANGUAGE sql "
                 "SECURITY DEFINER SET search_path = pyscheduler, pg_temp AS $$ SELECT 1 $$")
    with pytest.raises(AssertionError, match="walk_throwaway has no row"):
        test_the_ownership_walk_matches_the_matrix_for_every_public_function(conn, dsn, login)
