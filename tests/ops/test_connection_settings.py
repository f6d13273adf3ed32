"""Every daemon's database connections have a connect timeout, TCP keepalives and a
statement timeout: a partition or a stuck lock fails a call instead
of hanging a node."""

import socket
import threading
import time
import uuid

import psycopg
import pytest

from pyscheduler import db as dbmod
from pyscheduler.db import ConnectionSettings, Database, Listener
from pyscheduler.errors import DatabaseUnavailable


def in_thread(fn, timeout: float):
    """fn() in a daemon thread; its result or exception, or AssertionError if it hangs."""
    out: dict = {}

    def run():
        started = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported to the test
            out["error"] = exc
        out["seconds"] = time.monotonic() - started

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still waiting after {timeout}s: no timeout"
    return out


@pytest.mark.slow
def test_a_server_that_accepts_but_never_answers_fails_the_connect_within_the_timeout():
    with socket.socket() as silent:  # a partitioned server: TCP accepts, nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        settings = ConnectionSettings(connect_timeout=1)
        database = Database(f"host=127.0.0.1 port={port} dbname=x user=x", connection=settings, timeout=2)
        out = in_thread(lambda: database.open(wait=True, timeout=2), 30)
        database.pool.close(timeout=1)
        assert isinstance(out.get("error"), DatabaseUnavailable) and out["seconds"] < 15


def test_a_statement_stuck_on_a_lock_is_cancelled_by_the_statement_timeout(dsn, conn):
    with Database(dsn, connection=ConnectionSettings(statement_timeout=1000)) as database:
        with conn.transaction():
            conn.execute("LOCK TABLE pyscheduler.delay_messages IN ACCESS EXCLUSIVE MODE")
            out = in_thread(lambda: database.call("ready_and_claim", node=uuid.uuid4()), 30)
    assert isinstance(out.get("error"), psycopg.errors.QueryCanceled) and out["seconds"] < 10


def test_pool_and_listen_connections_get_keepalives_and_the_dsn_or_the_database_wins(dsn, conn):
    settings = ConnectionSettings(keepalives_idle=7, statement_timeout=4321)
    with Database(dsn, connection=settings) as database:
        with database.connection() as c:
            params = c.info.get_parameters()
            assert (params["keepalives"], params["keepalives_idle"], params["connect_timeout"]) == ("1", "7", "10")
            assert c.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "4321ms"
    with Database(dsn + " keepalives_idle=99 options='-c statement_timeout=5s'", connection=settings) as database:
        with database.connection() as c:
            assert c.info.get_parameters()["keepalives_idle"] == "99"
            assert c.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "5s"
    name = conn.execute("SELECT current_database() AS d").fetchone()["d"]
    conn.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 3000')  # a DBA's setting
    with Database(dsn, connection=settings) as database:
        assert database.query("SHOW statement_timeout")[0]["statement_timeout"] == "3s"
    listener = Listener(dsn, ["x"], lambda *a: None, connection=settings)
    assert listener.connection.kwargs(dsn)["keepalives_idle"] == 7


def test_the_flags_and_environment_set_every_daemons_connections(monkeypatch):
    monkeypatch.setenv("PYSCHEDULER_DB_CONNECT_TIMEOUT", "3")
    monkeypatch.setattr(dbmod, "_settings", None)
    assert dbmod.settings().connect_timeout == 3
    from click.testing import CliRunner

    from pyscheduler.delay.cli import status_cmd

    result = CliRunner().invoke(status_cmd, ["--dsn", "", "--db-keepalives-count", "5"])
    assert result.exit_code == 2 and "no database" in result.output  # the flags were taken first
    assert (dbmod.settings().connect_timeout, dbmod.settings().keepalives_count) == (3, 5)
    monkeypatch.setattr(dbmod, "_settings", None)
