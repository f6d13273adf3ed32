"""A migration under running clients: a plan cached on one of pyscheduler's connections before a
schema change (a function bound to a table's row type in flight as the change commits, a prepared
statement whose result columns changed) makes its call run once more, planned again, instead of
failing or stopping a Worker; a call that fails the same way twice is raised, not retried again
(db.py, ``_replanned``; docs/contributing.md, "Changing the schema")."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from pyscheduler.db import Database
from pyscheduler.tasks import TaskClient, Worker
from tests.support import wait_for

REPLANNED = "made before a schema change"


def waiting_on_a_lock(conn, query_like: str) -> bool:
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND query LIKE %s", (query_like,)).fetchone()[0] > 0


@pytest.mark.slow
def test_a_worker_leasing_through_a_column_added_to_tasks_goes_on(dsn, caplog):
    """Leases and completions wait on the ALTER TABLE's lock; when it commits, the lease in
    flight (``_claim_tasks``, bound to the old row type) fails with 42804 and runs again."""
    caplog.set_level(logging.WARNING, logger="pyscheduler.db")
    seen: list[int] = []
    go = threading.Event()

    def handle(ctx) -> None:
        go.wait(30)
        seen.append(ctx.spec["i"])

    with Database(dsn, max_size=2) as db, psycopg.connect(dsn, autocommit=True) as watch:
        TaskClient(db).submit_ids("sc", [{"i": i} for i in range(40)])
        running = Worker(dsn, "sc", handle, capacity=2, poll_interval=0.05).start()
        try:
            with psycopg.connect(dsn) as migration:  # a transaction: the lock held until commit
                wait_for(lambda: watch.execute("SELECT count(*) FROM pyscheduler.tasks "
                                               "WHERE status = 'running'").fetchone()[0] > 0)
                migration.execute("ALTER TABLE pyscheduler.tasks ADD COLUMN extra integer")
                go.set()  # the handlers end: completions and the next lease meet the lock
                wait_for(lambda: waiting_on_a_lock(watch, "%lease%"), what="a lease waiting on the lock")
            wait_for(lambda: len(seen) >= 40 or running.worker.fatal is not None, timeout=30)
            assert running.worker.fatal is None
            assert sorted(seen) == list(range(40))  # each once
            assert any(REPLANNED in r.getMessage() for r in caplog.records)  # the path was taken
        finally:
            running.stop()


def test_a_prepared_call_whose_result_columns_changed_runs_again(dsn, caplog):
    """A function replaced with other result columns (a migration's DROP and CREATE): the pool's
    prepared statements of it, psycopg's and pyscheduler's own, are made again."""
    caplog.set_level(logging.WARNING, logger="pyscheduler.db")
    with psycopg.connect(dsn, autocommit=True) as admin, Database(dsn, max_size=1) as db:
        admin.execute("CREATE FUNCTION pyscheduler.t_shape(x integer) RETURNS TABLE (a integer) "
                      "LANGUAGE sql AS 'SELECT x'")
        for _ in range(6):  # psycopg prepares a statement on its fifth run
            assert db.call("t_shape", x=1) == [{"a": 1}]
            assert db.call_binary("t_shape", x=1) == [{"a": 1}]
            assert db.call_tuples("t_shape", x=1) == [(1,)]
        admin.execute("DROP FUNCTION pyscheduler.t_shape(integer); CREATE FUNCTION pyscheduler.t_shape(x integer) "
                      "RETURNS TABLE (a integer, b text) LANGUAGE sql AS 'SELECT x, ''new'''")
        assert db.call("t_shape", x=2) == [{"a": 2, "b": "new"}]
        assert db.call_binary("t_shape", x=2) == [{"a": 2, "b": "new"}]
        assert db.call_tuples("t_shape", x=2) == [(2, "new")]
        with db.session() as s:  # a held connection (a Worker's)
            assert s.call("t_shape", x=3) == [{"a": 3, "b": "new"}]
    assert sum(REPLANNED in r.getMessage() for r in caplog.records) >= 1


def test_a_call_in_a_transaction_fails_once_and_the_next_transaction_is_planned_again(dsn):
    """In a transaction (the schedules recorder's, the checks runner's) a stale plan's call is not
    run again; the rollback makes psycopg forget the connection's prepared statements, so the
    caller's next transaction works on the same connection instead of failing forever."""
    with psycopg.connect(dsn, autocommit=True) as admin, Database(dsn, max_size=1) as db:
        admin.execute("CREATE FUNCTION pyscheduler.t_shape(x integer) RETURNS TABLE (a integer) "
                      "LANGUAGE sql AS 'SELECT x'")
        for _ in range(6):
            with db.session() as s, s.conn.transaction():
                assert s.call("t_shape", x=1) == [{"a": 1}]
        admin.execute("DROP FUNCTION pyscheduler.t_shape(integer); CREATE FUNCTION pyscheduler.t_shape(x integer) "
                      "RETURNS TABLE (a integer, b text) LANGUAGE sql AS 'SELECT x, ''new'''")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            with db.session() as s, s.conn.transaction():
                s.call("t_shape", x=2)
        with db.session() as s, s.conn.transaction():
            assert s.call("t_shape", x=3) == [{"a": 3, "b": "new"}]


def test_the_same_failure_twice_is_raised_and_not_retried_again(dsn):
    """A function that fails with 42804 every time (a bug, not a schema change) runs twice, then
    its error reaches the caller; in an application's transaction it runs once."""
    with psycopg.connect(dsn, autocommit=True) as admin, Database(dsn, max_size=1) as db:
        admin.execute("CREATE SEQUENCE pyscheduler.t_runs")
        admin.execute("CREATE FUNCTION pyscheduler.t_bug() RETURNS integer LANGUAGE plpgsql AS $$ BEGIN "
                      "PERFORM nextval('pyscheduler.t_runs'); "  # a sequence: not rolled back with the error
                      "RAISE EXCEPTION 'no' USING ERRCODE = '42804'; END $$")
        runs = lambda: admin.execute("SELECT last_value FROM pyscheduler.t_runs").fetchone()[0]  # noqa: E731
        with pytest.raises(psycopg.errors.DatatypeMismatch, match="no"):
            db.call_scalar("t_bug")
        assert runs() == 2
        with db.session() as s, s.conn.transaction(), pytest.raises(psycopg.errors.DatatypeMismatch, match="no"):
            s.call("t_bug")
        assert runs() == 3
