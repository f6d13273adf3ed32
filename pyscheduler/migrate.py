"""Schema migrations (yoyo, forward-only) and the function loader.

``migrate()`` serialises concurrent callers with an advisory lock; installs an empty database
in one step from ``sql/schema/*.sql`` (every migration marked applied), else applies the pending
``migrations/``; records the configured role names in ``pyscheduler.settings``; and in yoyo's
post-apply step reloads every function file (``function_files()``) and drops the signatures
they no longer define, so the functions always match the code. For operators:
docs/operations.md, "Installing and upgrading the schema"; for a schema change:
docs/contributing.md, "Changing the schema".
"""

from __future__ import annotations

import contextlib
import logging
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg.rows
from psycopg import sql

from . import __version__
from .db import translating
from .errors import SchemaError

_HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)
LOCK_KEY = 0x7079736368  # 'pysch': pg_advisory_lock key of migrate
MIGRATION_TABLE = "_yoyo_migration"
FIRST_FILES = ("common.sql", "roles.sql")
AUDIENCES = ("client", "worker", "relay", "scheduler", "checker", "monitor", "admin")
ROLE_SETTINGS = tuple(f"{audience}_role" for audience in AUDIENCES)


def _resource(name: str) -> Path:
    """sql/ and migrations/ sit beside the package in a checkout, inside it in a wheel."""
    packaged = _HERE / f"_{name}"
    return packaged if packaged.is_dir() else _HERE.parent / name


SQL_DIR = _resource("sql")
MIGRATIONS_DIR = _resource("migrations")


def function_files() -> list[Path]:
    """The function files in load order: common.sql, roles.sql, then each capability in name
    order, as one file (``tasks.sql``) or a folder of files loaded in name order
    (``schedules/1_cron.sql``, ``schedules/2_model.sql``, ...); ``schema/`` is the fresh
    install's tables, not functions."""
    first = [SQL_DIR / name for name in FIRST_FILES]
    units = sorted(p for p in SQL_DIR.iterdir()
                   if (p.suffix == ".sql" and p.name not in FIRST_FILES) or (p.is_dir() and p.name != "schema"))
    return first + [f for unit in units for f in (sorted(unit.glob("*.sql")) if unit.is_dir() else [unit])]


def _name(path: Path) -> str:
    """A function file as sql/ names it: ``tasks.sql``, ``schedules/1_cron.sql``."""
    return path.relative_to(SQL_DIR).as_posix()


def schema_files() -> list[Path]:
    return sorted((SQL_DIR / "schema").glob("*.sql"))


# Every routine of the schema, with where its catalog row is: CREATE OR REPLACE writes the row
# anew (another ctid) even when nothing changed, so a load tells what it defined from what it left.
ROUTINES = ("SELECT p.oid, p.ctid::text AS ctid, p.proname, "
            "format('pyscheduler.%I(%s)', p.proname, pg_get_function_identity_arguments(p.oid)) AS signature, "
            "CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END AS kind "
            "FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace")


# what a function file defines: (FUNCTION | PROCEDURE | VIEW, name)
DEFINES = re.compile(r"^CREATE (?:OR REPLACE )?(FUNCTION|PROCEDURE|VIEW) pyscheduler\.([a-z_0-9]+)\b", re.M)
# the grants the files' _grant calls noted while the load deferred them (sql/roles.sql, _grant)
DEFERRED_GRANTS = ("SELECT pyscheduler._grant(g ->> 0, VARIADIC ARRAY(SELECT jsonb_array_elements_text(g -> 1))) "
                   "FROM jsonb_array_elements(coalesce(nullif(current_setting('pyscheduler.deferred_grants'), ''), "
                   "'[]')::jsonb) AS g")


def load_functions(conn: psycopg.Connection) -> None:
    """Run every function file, drop the stale signatures of the routines they define, make the
    grants the files asked for, then take PUBLIC's privileges away again."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        before = {r["oid"]: r["ctid"] for r in cur.execute(ROUTINES)}
    conn.execute("SELECT set_config('pyscheduler.grants', 'deferred', false), "
                 "set_config('pyscheduler.deferred_grants', '', false)")
    for path in function_files():
        text = path.read_text()
        try:
            try:
                with conn.transaction():  # a savepoint: the load runs in yoyo's transaction
                    conn.execute(text)
            except (psycopg.errors.InvalidFunctionDefinition, psycopg.errors.InvalidTableDefinition):
                # 42P13, 42P16: CREATE OR REPLACE cannot replace an earlier version's routine of the
                # same arguments (another result type, renamed parameters, defaults removed) or
                # view (a column renamed, dropped or retyped)
                with conn.transaction():
                    _drop_defined_by(conn, text, before)
                    conn.execute(text)
        except psycopg.Error as exc:
            raise SchemaError(f"{_name(path)}: {exc}") from exc
    _drop_stale_signatures(conn, before)
    conn.execute("SELECT set_config('pyscheduler.grants', '', false)")  # (a failure: the connection is closed)
    conn.execute(DEFERRED_GRANTS)
    conn.execute("SELECT pyscheduler._finish_grants()")
    conn.execute(
        "INSERT INTO pyscheduler.settings (name, value) VALUES ('code_version', %s) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        (__version__,),
    )


def _drop_routine(routine: dict[str, Any]) -> sql.Composed:
    """DROP of a ROUTINES row (never CASCADE)."""
    return sql.SQL("DROP {} {}").format(sql.SQL(routine["kind"]), sql.SQL(routine["signature"]))


def _drop_defined_by(conn: psycopg.Connection, text: str, before: dict[int, str]) -> None:
    """Drop the views a function file defines, and the routines of every name it defines that the
    load has not defined yet (another file's overload of the name, loaded before, stays), when
    nothing uses them, so that the file defines them afresh: what they carry besides their
    definition comes back with the load (comments from the file, grants after it). One something
    uses (a view, a domain, an index) is left, and the file's error stands."""
    defines = DEFINES.findall(text)
    names = {name for kind, name in defines if kind != "VIEW"}
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        routines = [r for r in cur.execute(ROUTINES) if r["proname"] in names and before.get(r["oid"]) == r["ctid"]]
    drops = [(r["signature"], _drop_routine(r)) for r in routines]
    drops += [(f"pyscheduler.{name}", sql.SQL("DROP VIEW IF EXISTS pyscheduler.{}").format(sql.Identifier(name)))
              for name in sorted({name for kind, name in defines if kind == "VIEW"})]
    for what, statement in drops:
        try:
            with conn.transaction():
                conn.execute(statement)
        except psycopg.errors.DependentObjectsStillExist:
            continue
        log.info("dropped %s to define it afresh: CREATE OR REPLACE could not replace it", what)


def _drop_stale_signatures(conn: psycopg.Connection, before: dict[int, str]) -> None:
    """Drop every routine of the schema the load left as it was whose name the load defined: a
    signature sql/ defines no more (a parameter added, removed or retyped makes a new overload
    beside the old one, which would live on in every database migrated while it existed, with
    its grants). A name sql/ no longer defines at all is a migration's DROP (docs/contributing.md).
    Never CASCADE: a stale signature something still uses (a domain, an index, a view) stops the
    migration, naming both."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        routines = cur.execute(ROUTINES).fetchall()
    defined = {r["proname"] for r in routines if before.get(r["oid"]) != r["ctid"]}
    for r in routines:
        if r["proname"] in defined and before.get(r["oid"]) == r["ctid"]:
            try:
                conn.execute(_drop_routine(r))
            except psycopg.errors.DependentObjectsStillExist as exc:
                raise SchemaError(f"{r['signature']} is a signature sql/ no longer defines, but "
                                  f"{exc.diag.message_detail}: drop or change that in a migration") from exc
            log.info("dropped %s: a signature sql/ no longer defines", r["signature"])


def yoyo_uri(dsn: str) -> str:
    """A yoyo URI for a libpq DSN (URI or key=value); yoyo's tables go in schema pyscheduler.

    Every connection parameter travels in the query string, which yoyo decodes and
    hands to psycopg.connect() unchanged: a Unix-socket directory (``host=/run/postgresql``),
    several hosts (``host=a,b port=5432,5433``), a password with ``@ / %`` and any other
    libpq keyword survive. (The URL's host part cannot hold them: yoyo lower-cases it and
    does not percent-decode it.)"""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items() if v is not None}
    params["schema"] = "pyscheduler"
    return "postgresql+psycopg:///?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


@dataclass
class Report:
    fresh_install: bool = False
    applied: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _locked(dsn: str) -> Iterator[psycopg.Connection]:
    with translating(), psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


def _backend(dsn: str):
    from yoyo import get_backend

    return get_backend(yoyo_uri(dsn), migration_table=MIGRATION_TABLE)


def _migrations():
    from yoyo import read_migrations

    return read_migrations(str(MIGRATIONS_DIR))


def _applied_ids(conn: psycopg.Connection) -> list[str] | None:
    """Applied migration ids, or None when yoyo has never run here."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"pyscheduler.{MIGRATION_TABLE}",)).fetchone()[0]
    if not exists:
        return None
    rows = conn.execute(
        sql.SQL("SELECT migration_id FROM pyscheduler.{} ORDER BY applied_at_utc, migration_id")
        .format(sql.Identifier(MIGRATION_TABLE))
    ).fetchall()
    return [r[0] for r in rows]


def _check_not_newer(applied: list[str], known: list[str]) -> None:
    unknown = [m for m in applied if m not in set(known)]
    if unknown:
        raise SchemaError(
            f"the database schema is newer than this pyscheduler {__version__}: it has migrations "
            f"this version does not know ({', '.join(unknown)}); upgrade pyscheduler"
        )


def status(dsn: str) -> Report:
    """What is applied and what is pending, without changing anything."""
    migrations = _migrations()
    known = [m.id for m in migrations]
    with translating(), psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        applied = _applied_ids(conn) or []
    _check_not_newer(applied, known)
    return Report(
        fresh_install=not applied,
        applied=applied,
        pending=[m for m in known if m not in applied],
        functions=[_name(f) for f in function_files()],
    )


def migrate(dsn: str, *, dry_run: bool = False, roles: dict[str, str] | None = None,
            step_by_step: bool = False) -> Report:
    """Bring the database to this version's schema and functions (idempotent).

    ``step_by_step`` applies every migration even on an empty database instead
    of the one-step fresh install (the drift test builds both ways).
    """
    if dry_run:
        return status(dsn)
    migrations = _migrations()
    known = [m.id for m in migrations]
    report = Report(functions=[_name(f) for f in function_files()])
    with _locked(dsn) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS pyscheduler")
        applied = _applied_ids(conn)
        _check_not_newer(applied or [], known)
        backend = _backend(dsn)
        try:
            with translating():
                if not applied and not step_by_step and not _has_tables(conn):
                    with conn.transaction():
                        for path in schema_files():
                            conn.execute(path.read_text())
                    backend.mark_migrations(migrations)
                    report.fresh_install = True
                    report.applied = known
                else:
                    pending = backend.to_apply(migrations)
                    backend.apply_migrations_only(pending)
                    report.applied = [m.id for m in pending]
                if roles:
                    _set_roles(conn, roles)
                backend.run_post_apply(migrations)
        finally:
            backend.connection.close()
    return report


def _has_tables(conn: psycopg.Connection) -> bool:
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = 'pyscheduler'::regnamespace "
        "AND relkind IN ('r', 'p') AND relname NOT LIKE %s AND relname <> 'yoyo_lock')",
        ("\\_yoyo%",),
    ).fetchone()[0]


def _set_roles(conn: psycopg.Connection, roles: dict[str, str]) -> None:
    for key, value in roles.items():
        if key not in ROLE_SETTINGS:
            raise ValueError(f"unknown role setting {key!r}")
        conn.execute("UPDATE pyscheduler.settings SET value = %s WHERE name = %s", (value, key))


# -- the spec search index (tasks_spec_idx), which a deployment may drop and build again ----------
# (`pyscheduler tasks spec-index`, issue 31). DDL run CONCURRENTLY, which no SQL function may run:
# by the role that owns the schema, under the migrations' lock (a migration or a second switch
# waits), without a statement timeout (a build at 10 million tasks takes minutes). The definition
# is migrations 0048 and 0051's (tests/tasks/test_spec_index.py compares the two).
SPEC_INDEX = "pyscheduler.tasks_spec_idx"
CREATE_SPEC_INDEX = ("CREATE INDEX CONCURRENTLY tasks_spec_idx ON pyscheduler.tasks USING gin (spec jsonb_path_ops) "
                     "WITH (gin_pending_list_limit = 4096) WHERE status <> 'running'")
SPEC_INDEX_STATE = "SELECT pyscheduler._spec_index_state() AS state"


def spec_index(dsn: str) -> str:
    """'on', 'off', or 'invalid' (a build that failed or is under way: find_tasks reads as if off)."""
    with translating(), psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(SPEC_INDEX_STATE).fetchone()[0]


def set_spec_index(dsn: str, on: bool) -> str:
    """Build the spec search index (``on``; an invalid one is dropped first) or drop it; the state after."""
    with _locked(dsn) as conn:
        conn.execute("SET statement_timeout = 0")
        state = conn.execute(SPEC_INDEX_STATE).fetchone()[0]
        if state == "invalid" or (state == "on" and not on):
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SPEC_INDEX}")
        if on and state != "on":
            conn.execute(CREATE_SPEC_INDEX)
        return conn.execute(SPEC_INDEX_STATE).fetchone()[0]
