"""Migration 0057 rewrites tasks with its columns in a new order: an installed database keeps every
task and every column of it, its functions, views, grants and trigger exist again when the migration
commits (before the reload of sql/), leases survive, the sequence goes on; a Worker and a producer
working through it lose nothing and run nothing twice; the migration is all or nothing when its
backend dies mid-way; an object of the user's that depends on tasks stops it before anything
changed."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import psycopg
import pytest

from pyscheduler import errors, migrate
from pyscheduler.db import Database, Jsonb, Session, connect
from pyscheduler.tasks import TaskClient, Worker

from tests.ops.test_migrate import pyscheduler, schema_dump
from tests.support import wait_for
from tests.support.tasks import held

MIGRATION = "0057_tasks_column_order"

# the objects the rewrite drops with the old table and creates again, with their privileges
CATALOG = """
SELECT 'function ' || p.oid::regprocedure::text AS object, coalesce(p.proacl::text, '') AS acl
  FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace
UNION ALL
SELECT 'view ' || c.relname, coalesce(c.relacl::text, '') FROM pg_class c
 WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind = 'v'
UNION ALL
SELECT 'trigger ' || t.tgname, '' FROM pg_trigger t
 WHERE t.tgrelid = 'pyscheduler.tasks'::regclass AND NOT t.tgisinternal
ORDER BY 1
"""
ROWS = "SELECT to_jsonb(t) AS row FROM pyscheduler.tasks t ORDER BY rn"
COLUMNS = "SELECT array_agg(attname::text ORDER BY attnum) AS cols FROM pg_attribute " \
          "WHERE attrelid = 'pyscheduler.tasks'::regclass AND attnum > 0 AND NOT attisdropped"


def rows_of(db: Session, query: str, params=None) -> list[dict]:
    return db.conn.execute(query, params).fetchall()


def install_before(dsn: str) -> None:
    """An installed database of the version before: the migrations up to 0057's, and the functions
    loaded (today's sql/, which reads the same columns by name)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA pyscheduler")
    migrations = migrate._migrations()
    ids = [m.id for m in migrations]
    backend = migrate._backend(dsn)
    backend.apply_migrations_only(backend.to_apply(migrations[:ids.index(MIGRATION)]))
    backend.connection.close()
    with psycopg.connect(dsn) as c:
        migrate.load_functions(c)


def apply_0057_only(dsn: str) -> None:
    """The migration's own transaction, without the reload of sql/ that migrate runs after it."""
    backend = migrate._backend(dsn)
    try:
        migrations = migrate._migrations()
        at = [m.id for m in migrations].index(MIGRATION)
        backend.apply_migrations_only(backend.to_apply(migrations[at:at + 1]))
    finally:
        backend.connection.close()


def every_kind_of_task(db: Session) -> dict:
    """Tasks in every state, between them a value in each column, and more than one value in each."""
    db.call("set_queue_limits", queue="mq", running_per_key=2)
    running = db.call_value("submit_task", queue="mq", spec=Jsonb({"k": "run"}), unique_key="u1",
                            concurrency_key="c1", max_attempts=5, priority=70)
    done = db.call_value("submit_task", queue="mq", spec=Jsonb({"k": "done"}), priority=60)
    failed = db.call_value("submit_task", queue="mq", spec=Jsonb({"k": "fail"}), priority=55)
    leased = {t["rn"]: t for t in (db.call_value("lease_task", queue="mq", worker="w1") for _ in range(3))}
    db.call("heartbeat_task", **held(leased[running["rn"]]), progress=0.5)
    db.call("complete_task", **held(leased[done["rn"]]), result=Jsonb({"ok": 1}))
    error = Jsonb({"code": "boom", "args": {}, "description": "it failed"})
    db.call("fail_task", **held(leased[failed["rn"]]), error=error, retry_in="1 hour")
    child = db.call_value("submit_task", queue="mq", spec=Jsonb({"k": "child"}), after=[running["rn"]],
                          on_parent_failure="run")
    watched = db.call_value("submit_task", queue="other", spec=Jsonb({"k": "watched"}))
    db.call("watch_task", rn=watched["rn"])
    db.conn.execute("SET ROLE pyscheduler_client")  # another submitter
    cancelled = db.call_value("submit_task", queue="other", spec=Jsonb({"k": "cancelled"}))
    db.call("cancel_task", rn=cancelled["rn"])
    db.conn.execute("RESET ROLE")
    # each column holds a value somewhere, and two values between the tasks (a swap would show)
    dull = rows_of(db, "SELECT c.attname::text AS col FROM pg_attribute c "
                       "WHERE c.attrelid = 'pyscheduler.tasks'::regclass AND c.attnum > 0 AND NOT c.attisdropped "
                       "AND (SELECT count(DISTINCT v.value) FROM pyscheduler.tasks t, jsonb_each(to_jsonb(t)) v "
                       "WHERE v.key = c.attname) < 2")
    assert dull == [], "columns without two values among the tasks"
    return {"running": leased[running["rn"]], "child": child}


def test_an_installed_database_keeps_every_task_and_works_the_same_after_0057(pg, empty_dsn, pg_db_factory):
    install_before(empty_dsn)
    with connect(empty_dsn) as c:
        db = Session(c)
        kept = every_kind_of_task(db)
        rows, catalog = rows_of(db, ROWS), rows_of(db, CATALOG)
        last_seq = rows_of(db, "SELECT max(seq) AS s FROM pyscheduler.tasks")[0]["s"]
        assert rows_of(db, COLUMNS)[0]["cols"][:3] == ["rn", "queue", "spec"]
    apply_0057_only(empty_dsn)
    with connect(empty_dsn) as c:
        db = Session(c)
        # in the migration's own transaction: the functions, views, grants and trigger are back
        assert rows_of(db, CATALOG) == catalog
        assert rows_of(db, ROWS) == rows
        assert rows_of(db, COLUMNS)[0]["cols"][:3] == ["rn", "priority", "created"]
    report = migrate.migrate(empty_dsn)
    assert report.applied == []  # 0057 was applied above; this run reloads the functions only
    fresh = pg_db_factory()
    migrate.migrate(fresh)
    assert schema_dump(pg, empty_dsn) == schema_dump(pg, fresh)
    with connect(empty_dsn) as c:
        db = Session(c)
        assert rows_of(db, ROWS) == rows
        # the lease taken before the rewrite is still held: its completion frees the child
        completed = db.call_value("complete_task", **held(kept["running"]), result=Jsonb({"after": 57}))
        assert completed["status"] == "completed"
        assert db.call_value("get_task", rn=kept["child"]["rn"])["status"] == "ready"
        new = db.call_value("submit_task", queue="mq", spec=Jsonb({"k": "new"}))
        assert rows_of(db, "SELECT seq FROM pyscheduler.tasks WHERE rn = %s", (new["rn"],))[0]["seq"] > last_seq
        assert db.call_value("lease_task", queue="mq", worker="w2")["rn"] in (kept["child"]["rn"], new["rn"])
        assert {r["queue"] for r in rows_of(db, "SELECT * FROM pyscheduler.queue_limits")} == {"mq"}
        db.conn.execute("TRUNCATE pyscheduler.tasks")  # the trigger clears the tallies with it
        assert rows_of(db, "SELECT * FROM pyscheduler.task_counts") == []


def test_a_view_of_the_users_on_tasks_stops_0057_before_anything_changed(empty_dsn):
    install_before(empty_dsn)
    with connect(empty_dsn) as c:
        db = Session(c)
        db.call("submit_task", queue="q", spec=Jsonb({"n": 1}))
        db.conn.execute("CREATE VIEW public.my_tasks AS SELECT rn, queue FROM pyscheduler.tasks")
    refused = pyscheduler("migrate", "--dsn", empty_dsn)
    assert refused.returncode == 1
    assert "objects outside schema pyscheduler depend on it: view public.my_tasks\n" in refused.stderr
    with connect(empty_dsn) as c:
        db = Session(c)
        assert rows_of(db, COLUMNS)[0]["cols"][:3] == ["rn", "queue", "spec"]
        assert [r["queue"] for r in rows_of(db, "SELECT queue FROM public.my_tasks")] == ["q"]
        db.conn.execute("DROP VIEW public.my_tasks")
    assert migrate.migrate(empty_dsn).applied == [MIGRATION]


def test_0057_killed_mid_way_leaves_the_database_as_it_was(empty_dsn):
    install_before(empty_dsn)
    with connect(empty_dsn) as c:
        db = Session(c)
        db.conn.execute("SELECT count(*) FROM generate_series(0, 99) b, pyscheduler.submit_tasks_lean('big', "
                        "(SELECT jsonb_agg(jsonb_build_object('i', i)) "
                        "FROM generate_series(b * 1000 + 1, b * 1000 + 1000) i))")
        rows = rows_of(db, "SELECT count(*) AS n, sum(seq) AS s FROM pyscheduler.tasks")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, connect(empty_dsn) as watcher:
        running = pool.submit(migrate.migrate, empty_dsn)
        deadline = time.monotonic() + 60
        pid = None
        while pid is None and not running.done() and time.monotonic() < deadline:
            # the rewrite under way: the copy or an index build of the new table
            found = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND state = 'active' AND query ~ 'INSERT INTO pyscheduler.tasks_0057|CREATE INDEX'").fetchall()
            pid = found[0]["pid"] if found else None
        assert pid is not None, "the migration was not seen mid-way"
        watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises((errors.SchedulerError, psycopg.OperationalError)):  # its connection ended
            running.result(timeout=60)
    with connect(empty_dsn) as c:
        db = Session(c)
        assert rows_of(db, COLUMNS)[0]["cols"][:3] == ["rn", "queue", "spec"]
        assert rows_of(db, "SELECT count(*) AS n, sum(seq) AS s FROM pyscheduler.tasks") == rows
        assert rows_of(db, "SELECT to_regclass('pyscheduler.tasks_0057') IS NULL AS gone")[0]["gone"]
    assert migrate.migrate(empty_dsn).applied == [MIGRATION]
    with connect(empty_dsn) as c:
        assert rows_of(Session(c), "SELECT count(*) AS n, sum(seq) AS s FROM pyscheduler.tasks") == rows


def test_a_worker_and_a_producer_working_through_0057_lose_nothing_and_run_nothing_twice(empty_dsn):
    """Their calls wait for the migration's lock, then find the new table and the functions made
    again (their prepared statements and cached plans are planned again): every task runs once."""
    install_before(empty_dsn)
    seen, lock, made = [], threading.Lock(), [0]

    def handle(ctx) -> None:
        with lock:
            seen.append(ctx.spec["i"])
    stop = threading.Event()

    def produce(client: TaskClient) -> None:
        while not stop.wait(0.01):
            client.submit_ids("through", [{"i": i} for i in range(made[0], made[0] + 50)])
            made[0] += 50
    with Database(empty_dsn, max_size=2) as db:
        running = Worker(empty_dsn, "through", handle, capacity=4).start()
        producer = threading.Thread(target=produce, args=(TaskClient(db),))
        try:
            producer.start()
            wait_for(lambda: len(seen) > 200, what="the first tasks run")
            assert migrate.migrate(empty_dsn).applied == [MIGRATION]
            after = made[0]
            wait_for(lambda: made[0] > after + 200, what="tasks submitted after the migration")
            stop.set()
            producer.join(30)
            wait_for(lambda: len(seen) >= made[0], timeout=60, what="every task run")
        finally:
            stop.set()
            running.stop()
    assert sorted(seen) == list(range(made[0])) and running.worker.fatal is None
