"""pyscheduler migrate: fresh install, upgrades, idempotence, concurrency, drift, bad input."""

import os
import re
import subprocess
import sys
import time

import psycopg
import pytest

from pyscheduler import migrate
from pyscheduler.errors import SchemaError
from tests.support import REPO

CLI = [sys.executable, "-m", "pyscheduler"]


def pyscheduler(*args, env=None, timeout=120):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def schema_dump(pg, dsn: str) -> str:
    """The catalog of schema pyscheduler as pg_dump prints it (no data)."""
    from pgserver._commands import POSTGRES_BIN_PATH

    out = subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_dump"), "--schema-only", "--schema=pyscheduler", "--no-owner", dsn],
        capture_output=True, text=True, check=True,
    ).stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith("-- Dumped"))


def test_migrations_step_by_step_equal_the_fresh_install(pg, empty_dsn, pg_db_factory):
    fresh = pg_db_factory()
    assert migrate.migrate(fresh).fresh_install
    stepped = migrate.migrate(empty_dsn, step_by_step=True)
    assert not stepped.fresh_install
    assert stepped.applied == [m.id for m in migrate._migrations()]
    assert schema_dump(pg, empty_dsn) == schema_dump(pg, fresh)


def test_upgrade_from_the_first_migration_equals_the_fresh_install(pg, empty_dsn, pg_db_factory):
    from yoyo import get_backend

    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA pyscheduler")
    backend = get_backend(migrate.yoyo_uri(empty_dsn), migration_table=migrate.MIGRATION_TABLE)
    first = migrate._migrations()[:1]
    backend.apply_migrations_only(backend.to_apply(first))
    backend.connection.close()
    report = migrate.migrate(empty_dsn)
    assert report.applied == [m.id for m in migrate._migrations()][1:]
    fresh = pg_db_factory()
    migrate.migrate(fresh)
    assert schema_dump(pg, empty_dsn) == schema_dump(pg, fresh)


def test_migrate_twice_changes_nothing(pg, empty_dsn):
    first = pyscheduler("migrate", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    assert "fresh install" in first.stdout
    before = schema_dump(pg, empty_dsn)
    second = pyscheduler("migrate", "--dsn", empty_dsn)
    assert second.returncode == 0, second.stderr
    assert "schema up to date" in second.stdout
    assert schema_dump(pg, empty_dsn) == before


def test_two_processes_migrating_at_once_both_succeed(pg, empty_dsn, pg_db_factory):
    # Hold migrate's lock, start two migrations, wait until both queue on the
    # lock, then let them race for it.
    with psycopg.connect(empty_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (migrate.LOCK_KEY,))
        procs = [subprocess.Popen(CLI + ["migrate", "--dsn", empty_dsn], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        deadline = time.monotonic() + 60
        while holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0] < 2:
            assert time.monotonic() < deadline, "migrations never queued on the lock"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        holder.execute("SELECT pg_advisory_unlock(%s)", (migrate.LOCK_KEY,))
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    outputs = sorted(r[0] for r in results)
    assert "fresh install" in outputs[0] and "schema up to date" in outputs[1]
    fresh = pg_db_factory()
    migrate.migrate(fresh)
    assert schema_dump(pg, empty_dsn) == schema_dump(pg, fresh)


def test_list_and_dry_run_change_nothing(empty_dsn):
    dry = pyscheduler("migrate", "--dsn", empty_dsn, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "pending  0001_foundation" in dry.stdout
    assert "would run: fresh install" in dry.stdout
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regnamespace('pyscheduler')").fetchone()[0] is None
    pyscheduler("migrate", "--dsn", empty_dsn)
    listed = pyscheduler("migrate", "--dsn", empty_dsn, "--list")
    assert listed.returncode == 0
    assert "applied  0001_foundation" in listed.stdout and "pending" not in listed.stdout


def test_functions_are_reloaded_on_every_migrate(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE OR REPLACE FUNCTION pyscheduler.version(OUT code_version text, OUT migrations text[])"
                  " LANGUAGE sql AS $$ SELECT 'tampered', ARRAY[]::text[] $$")
        migrate.migrate(dsn)
        assert c.execute("SELECT code_version FROM pyscheduler.version()").fetchone()[0] != "tampered"


# private helpers of earlier versions, which sql/ dropped on every migrate before migration 0033
OLD_HELPERS = ("_delay_check_headers(jsonb)", "_due_checks(timestamptz, integer, integer, integer, timestamptz)",
               "_catch_up_checks(integer, integer, integer, timestamptz)", "_check_take(integer, integer, integer)",
               "_sql_job(text)", "_check_job(text, text)", "_leases(uuid[], uuid[])", "_spec_index_on()",
               "_check_caller()", "_check_may_act(name)", "_check_name(text)", "_check_note(text, text)",
               "_claim_due_critical_shards(integer[], integer, integer, interval, timestamptz)",
               "_limits_row(text, timestamptz)")


def test_an_upgrade_drops_the_private_helpers_of_earlier_versions(empty_dsn):
    from yoyo import get_backend

    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA pyscheduler")
        backend = get_backend(migrate.yoyo_uri(empty_dsn), migration_table=migrate.MIGRATION_TABLE)
        migrations = migrate._migrations()
        before = migrations[:[m.id for m in migrations].index("0033_delay_checks_current_code")]
        backend.apply_migrations_only(backend.to_apply(before))
        backend.connection.close()
        for helper in OLD_HELPERS:
            c.execute(f"CREATE FUNCTION pyscheduler.{helper} RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        migrate.migrate(empty_dsn)
        left = [h for h in OLD_HELPERS
                if c.execute("SELECT to_regprocedure(%s) IS NOT NULL", (f"pyscheduler.{h}",)).fetchone()[0]]
    assert left == []


def test_every_function_view_and_trigger_sql_stopped_defining_is_dropped_by_a_migration():
    """A function, view or trigger sql/ once defined (its git history) and defines no more lives on
    in every database migrated while it existed, unless a migration drops it: each one is named in
    a migration's DROP FUNCTION, DROP VIEW or DROP TRIGGER. Seven functions had slipped through by
    hand (migration 0058); OLD_HELPERS' test runs the drops. (A name sql/ still defines with
    another parameter list: migrate drops the old signature itself, the tests below.)"""
    history = subprocess.run(["git", "log", "-p", "--format=", "--", "sql/"], cwd=REPO, capture_output=True,
                             text=True)
    if history.returncode != 0 or not history.stdout:
        pytest.skip("no git history of sql/ here (not a clone)")
    # a trigger's name is its table's, not the schema's
    defined = re.compile(r"CREATE (?:OR REPLACE )?((?:FUNCTION|VIEW) pyscheduler\.|TRIGGER )([a-z_0-9]+)\b")
    ever = set(re.findall(r"^\+" + defined.pattern, history.stdout, re.M))
    now = {found for path in (REPO / "sql").rglob("*.sql") for found in defined.findall(path.read_text())}
    drops = "".join(path.read_text() for path in (REPO / "migrations").glob("*.sql"))
    left = []
    for kind, name in sorted(ever - now):
        what, _, prefix = kind.partition(" ")  # FUNCTION, pyscheduler.
        if not re.search(rf"DROP {what} IF EXISTS {re.escape(prefix)}{name}\b", drops):
            left.append(f"{what} {name}")
    assert ever >= now and left == [], f"dropped from sql/ but never by a migration: {left}"


# Migrations changed on main after a later one was there, before the rule below (found by its test).
CHANGED_BEFORE_THE_RULE = ("0012_hardening.sql", "0013_checks_hardening.sql", "0031_input_domains.sql")


def _statements(sql: str) -> str:
    """A migration's SQL without its comments and with its white space collapsed."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def test_a_migration_is_never_changed_once_main_has_a_later_one():
    """A database that applied a migration keeps what it applied: a later edit never reaches it
    (bench/upgrade_walk found indexes and storage options missing after edits on branches). So
    once main's first-parent history holds a later migration, a migration's statements (comments
    and white space aside) stay those of that commit; a fix is a new migration."""
    log = subprocess.run(["git", "log", "--reverse", "--first-parent", "-m", "--no-renames", "--format=@%H",
                          "--name-status", "--", "migrations"], cwd=REPO, capture_output=True, text=True)
    if log.returncode != 0 or not log.stdout:
        pytest.skip("no git history of migrations/ here (not a clone)")
    present: set[str] = set()
    frozen: dict[str, str] = {}  # migration -> the first commit whose tree also holds a later one
    commit = None
    for line in log.stdout.splitlines() + ["@"]:
        if line.startswith("@"):
            for name in present - frozen.keys():
                if any(other[:4] > name[:4] for other in present):
                    frozen[name] = commit
            commit = line[1:]
            continue
        status, _, path = line.partition("\t")
        if re.fullmatch(r"migrations/\d{4}_\w+\.sql", path):
            (present.discard if status.startswith("D") else present.add)(path.split("/")[1])
    changed = []
    for path in sorted((REPO / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")):
        if path.name in frozen and path.name not in CHANGED_BEFORE_THE_RULE:
            then = subprocess.run(["git", "show", f"{frozen[path.name]}:migrations/{path.name}"], cwd=REPO,
                                  capture_output=True, text=True)
            if then.returncode != 0 or _statements(then.stdout) != _statements(path.read_text()):
                changed.append(path.name)
    assert len(frozen) >= 50 and changed == [], f"changed after a later migration was on main: {changed}"


# Signatures earlier versions defined beside today's, which upgraded databases kept until migrate
# dropped them (found by migrating databases made at 944b400 and fa52deb): and a public one with
# a grant, as a changed parameter list would leave behind.
STALE = ("_check_spec(p_spec jsonb, p_what text)", "_live_task(p_queue text, p_key text)",
         "submit_task(queue text, spec jsonb)")


def test_migrate_drops_the_signatures_sql_no_longer_defines_and_nothing_else(dsn, caplog):
    """A parameter list changed makes a second routine of the name (CREATE OR REPLACE matches on
    the arguments), which would outlive the version that defined it in every upgraded database,
    grants and all. Migrate drops each routine of a name sql/ defines that its load left as it
    was; a routine of another name in the schema is not its to drop."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for signature in STALE:
            c.execute(f"CREATE FUNCTION pyscheduler.{signature} RETURNS jsonb LANGUAGE sql AS 'SELECT NULL::jsonb'")
        c.execute("GRANT EXECUTE ON FUNCTION pyscheduler.submit_task(text, jsonb) TO pyscheduler_client")
        c.execute("CREATE FUNCTION pyscheduler.an_operators_own(integer) RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        current = c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'pyscheduler'::regnamespace "
                            "AND proname IN ('_check_spec', '_live_task', 'submit_task')").fetchone()[0]
        with caplog.at_level("INFO", logger="pyscheduler.migrate"):
            migrate.migrate(dsn)
        routines = {r[0] for r in c.execute(
            "SELECT format('%s(%s)', proname, pg_get_function_identity_arguments(oid)) FROM pg_proc "
            "WHERE pronamespace = 'pyscheduler'::regnamespace")}
        assert routines & set(STALE) == set()
        assert c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'pyscheduler'::regnamespace "
                         "AND proname IN ('_check_spec', '_live_task', 'submit_task')").fetchone()[0] == current - 3
        assert c.execute("SELECT to_regprocedure('pyscheduler.an_operators_own(integer)') IS NOT NULL").fetchone()[0]
        dropped = sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped "))
        assert len(dropped) == 3 and all(m.endswith(": a signature sql/ no longer defines") for m in dropped), dropped
        caplog.clear()
        with caplog.at_level("INFO", logger="pyscheduler.migrate"):
            migrate.migrate(dsn)  # the current signatures are all reloaded: nothing more to drop
        assert not [r for r in caplog.records if r.getMessage().startswith("dropped ")]


def test_a_stale_signature_something_uses_stops_migrate_naming_both(dsn):
    """Never CASCADE: what uses a stale signature (here a view) is the operator's, so migrate stops
    with an error naming the signature and the object, and goes through once that is gone."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE FUNCTION pyscheduler._live_rn(text, text) RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid'")
        c.execute("CREATE VIEW public.uses_stale AS SELECT pyscheduler._live_rn('q', 'k') AS rn")
        with pytest.raises(SchemaError) as refused:
            migrate.migrate(dsn)
        assert "pyscheduler._live_rn(text, text) is a signature sql/ no longer defines" in str(refused.value)
        assert "view public.uses_stale depends on" in str(refused.value)
        c.execute("DROP VIEW public.uses_stale")
        migrate.migrate(dsn)
        assert c.execute("SELECT to_regprocedure('pyscheduler._live_rn(text, text)')").fetchone()[0] is None


@pytest.mark.parametrize("earlier", [
    "_live_rn(p_queue text, p_by name, p_key text) RETURNS SETOF uuid",  # another result type
    "_live_rn(queue text, by name, key text) RETURNS uuid",  # renamed parameters
], ids=["result type", "parameter names"])
def test_a_routine_create_or_replace_cannot_replace_is_defined_afresh(dsn, earlier):
    """An earlier version's routine of the same arguments that CREATE OR REPLACE refuses to replace
    (42P13) stopped the upgrade of every database made while it existed (_lease_tasks_lean's result
    columns, from ad0f1f4 and c15cf4c on): migrate drops the routines of that file's names that
    nothing uses and loads the file again; their grants come back."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION pyscheduler._live_rn(text, name, text)")
        c.execute(f"CREATE FUNCTION pyscheduler.{earlier} LANGUAGE sql AS 'SELECT NULL::uuid'")
        migrate.migrate(dsn)
        assert c.execute("SELECT pg_get_function_result('pyscheduler._live_rn(text, name, text)'::regprocedure), "
                         "pg_get_function_identity_arguments('pyscheduler._live_rn(text, name, text)'::regprocedure)"
                         ).fetchone() == ("uuid", "p_queue text, p_by name, p_key text")
        # a public function of the same file kept its grants (made after the load)
        assert c.execute("SELECT bool_and(has_function_privilege('pyscheduler_client', oid, 'EXECUTE')) FROM pg_proc "
                         "WHERE proname IN ('submit_task', 'submit_tasks_lean')").fetchone()[0]


def test_a_routine_defined_afresh_leaves_another_files_overload_of_its_name(dsn):
    """_task_rn has an overload in sql/schedules (loaded before sql/tasks): when tasks/1_model.sql
    meets an earlier _task_rn(bigint, bigint) it cannot replace, the one schedules defined in this
    load stays."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION pyscheduler._task_rn(bigint, bigint)")
        c.execute("CREATE FUNCTION pyscheduler._task_rn(p_prefix bigint, p_seq bigint) RETURNS text "
                  "LANGUAGE sql AS 'SELECT NULL::text'")
        migrate.migrate(dsn)
        got = c.execute("SELECT pg_get_function_identity_arguments(oid), pg_get_function_result(oid) FROM pg_proc "
                        "WHERE proname = '_task_rn' ORDER BY 1").fetchall()
        assert got == [("p_prefix bigint, p_seq bigint", "uuid"), ("p_result jsonb", "uuid")]


def test_a_view_create_or_replace_cannot_replace_is_defined_afresh(dsn):
    """An earlier version's view with other columns (CREATE OR REPLACE VIEW refuses a renamed or
    dropped column: 42P16) is dropped and defined again, its grants with it."""
    columns = ("SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute "
               "WHERE attrelid = 'pyscheduler.workers'::regclass AND attnum > 0")
    acl = "SELECT relacl::text FROM pg_class WHERE oid = 'pyscheduler.workers'::regclass"
    with psycopg.connect(dsn, autocommit=True) as c:
        fresh = c.execute(columns).fetchone()[0], c.execute(acl).fetchone()[0]
        c.execute("DROP VIEW pyscheduler.workers")
        c.execute("CREATE VIEW pyscheduler.workers AS SELECT 'w' AS an_earlier_column")
        migrate.migrate(dsn)
        assert (c.execute(columns).fetchone()[0], c.execute(acl).fetchone()[0]) == fresh


def test_a_routine_create_or_replace_cannot_replace_and_something_uses_stops_migrate(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION pyscheduler._live_rn(text, name, text)")
        c.execute("CREATE FUNCTION pyscheduler._live_rn(p_queue text, p_by name, p_key text) RETURNS text "
                  "LANGUAGE sql AS 'SELECT NULL'")
        c.execute("CREATE VIEW public.uses_earlier AS SELECT pyscheduler._live_rn('q', 'r', 'k') AS rn")
        with pytest.raises(SchemaError, match=r"tasks/2_client.sql: cannot change return type of existing function"):
            migrate.migrate(dsn)
        c.execute("DROP VIEW public.uses_earlier")
        migrate.migrate(dsn)


def one_line_error(result) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_unreachable_database_is_one_line():
    line = one_line_error(pyscheduler("migrate", "--dsn", "postgresql://postgres@127.0.0.1:1/none"))
    assert "Connection refused" in line


def test_wrong_password_is_one_line(pg, dsn):
    if pg.server is None:
        pytest.skip("needs the embedded server to require a password")
    hba = pg.server.pgdata / "pg_hba.conf"
    original = hba.read_text()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE ROLE pw_user LOGIN PASSWORD 'right'")
        try:
            hba.write_text("host all pw_user 127.0.0.1/32 scram-sha-256\n" + original)
            c.execute("SELECT pg_reload_conf()")
            wrong = dsn.replace("user=postgres", "user=pw_user password=wrong")
            line = one_line_error(pyscheduler("migrate", "--dsn", wrong))
            assert "password authentication failed" in line
        finally:
            hba.write_text(original)
            c.execute("SELECT pg_reload_conf()")
            c.execute("DROP ROLE pw_user")


def test_schema_from_a_newer_version_is_refused(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO pyscheduler._yoyo_migration (migration_hash, migration_id, applied_at_utc) "
                  "VALUES ('f00', '9999_from_the_future', now())")
    line = one_line_error(pyscheduler("migrate", "--dsn", dsn))
    assert "newer" in line and "9999_from_the_future" in line


def test_unknown_flag_is_a_usage_error():
    result = pyscheduler("migrate", "--no-such-flag")
    assert result.returncode == 2 and "No such option" in result.stderr


def test_bad_environment_value_is_a_usage_error():
    result = pyscheduler("migrate", "--list", env={"PYSCHEDULER_LOG_LEVEL": "LOUD"})
    assert result.returncode == 2
    assert "LOUD" in result.stderr and "log-level" in result.stderr


def test_missing_dsn_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k != "PYSCHEDULER_DSN"}
    result = subprocess.run(CLI + ["migrate"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "PYSCHEDULER_DSN" in result.stderr


def test_a_flag_wins_over_the_environment(dsn):
    result = pyscheduler("migrate", "--dsn", dsn, "--list",
                         env={"PYSCHEDULER_DSN": "postgresql://postgres@127.0.0.1:1/none"})
    assert result.returncode == 0, result.stderr
    assert "applied  0001_foundation" in result.stdout
