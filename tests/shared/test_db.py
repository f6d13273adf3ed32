"""pyscheduler.db: calling functions, error translation, LISTEN."""

import queue

import psycopg
import pytest
from psycopg.rows import dict_row

from pyscheduler import errors
from pyscheduler.db import Database, Listener


def test_call_with_named_arguments_returns_rows(tx):
    row = tx.call_one("version")
    assert row["code_version"]
    assert row["migrations"][0] == "0001_foundation"


def test_sqlstate_is_translated_to_the_registered_exception(tx):
    with pytest.raises(errors.SchemaError) as info:
        tx.call("_setting", p_name="no_such_setting")
    assert info.value.sqlstate == "PS002"
    assert info.value.hint == "Run pyscheduler migrate."


def test_unregistered_errors_pass_through(tx):
    with pytest.raises(psycopg.errors.UndefinedFunction):
        tx.call("no_such_function")


def test_function_names_are_checked_before_reaching_sql(tx):
    with pytest.raises(ValueError):
        tx.call("version(); drop table x; --")


def test_unreachable_database_is_one_clear_error():
    database = Database("postgresql://nobody@127.0.0.1:1/none", timeout=1)
    with pytest.raises(errors.DatabaseUnavailable):
        database.open(timeout=1)
    database.close()


def test_listener_delivers_notifications(dsn, db):
    got: queue.Queue = queue.Queue()
    listener = Listener(dsn, ["pyscheduler_test"], lambda ch, payload: got.put((ch, payload))).start()
    try:
        assert listener.ready.wait(10)
        assert db.call_value("_notify_throttled", p_channel="pyscheduler_test", p_payload="hello",
                             p_min_gap="1 hour") is True
        assert got.get(timeout=10) == ("pyscheduler_test", "hello")
        # within min_gap the second one is swallowed
        assert db.call_value("_notify_throttled", p_channel="pyscheduler_test", p_payload="again",
                             p_min_gap="1 hour") is False
    finally:
        listener.stop()


def test_a_stop_wakes_the_listener_instead_of_waiting_out_its_poll(dsn, conn):
    """The listener's wait is woken by stop() (it waited out a 0.5 s poll: every Worker's stop,
    every daemon's, paid it). Stopped just after it listens, at the start of a wait, its thread
    has ended within 0.25 s; it delivered what came before, and its sockets are closed."""
    got: queue.Queue = queue.Queue()
    listener = Listener(dsn, ["pyscheduler_test"], lambda ch, payload: got.put(payload)).start()
    assert listener.ready.wait(10)
    conn.execute("SELECT pg_notify('pyscheduler_test', 'before')")
    assert got.get(timeout=10) == "before"
    listener.stop(timeout=0.25)
    assert not listener._thread.is_alive()
    assert listener._wake_w.fileno() == -1
    listener.stop()  # a second stop does nothing


def test_a_call_gives_its_connection_back_to_the_pool_itself(dsn, monkeypatch):
    """Issue 31: a reset hook had the pool give every returned connection back from a worker
    thread (a thread switch per call, on the single submit's path); the stamp that spares a
    healthy connection its check is taken by the caller instead."""
    from psycopg_pool import ConnectionPool

    tasks: list[str] = []
    run_task = ConnectionPool.run_task
    monkeypatch.setattr(ConnectionPool, "run_task", lambda pool, task: tasks.append(type(task).__name__)
                        or run_task(pool, task))
    with Database(dsn, min_size=1, max_size=2) as database:
        for _ in range(5):
            assert database.call_value("version")
        assert database.pool.get_stats()["pool_size"] == 1
    assert "ReturnConnection" not in tasks


def test_a_checkout_translates_errors_and_ends_an_open_transaction_as_psycopg_does(dsn):
    """Database.connection() is psycopg_pool's connection() and translating() in one class (issue
    31): an error in the block comes out translated; a transaction left open is committed, or
    rolled back when the block raised; an empty pool past its timeout is DatabaseUnavailable."""
    with Database(dsn, min_size=1, max_size=1, timeout=0.3) as database:
        with pytest.raises(errors.SchemaError), database.connection() as conn:
            conn.execute("SELECT pyscheduler._setting('no_such_setting')")
        with database.connection() as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT set_config('pyscheduler_test.k', 'kept', false)")
        with pytest.raises(ZeroDivisionError), database.connection() as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT set_config('pyscheduler_test.k', 'dropped', false)")
            raise ZeroDivisionError
        with database.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SELECT current_setting('pyscheduler_test.k') AS k").fetchone()["k"] == "kept"
            with pytest.raises(errors.DatabaseUnavailable):
                database.call_value("version")  # the only connection is this one
        assert database.call_value("version")


def throttled(conn, channel: str) -> bool:
    """_notify_throttled(channel) with a gap no test outlives."""
    return conn.execute("SELECT pyscheduler._notify_throttled(%s, '', '1 hour') AS sent", (channel,)).fetchone()["sent"]


def forget_the_slots(conn) -> None:
    conn.execute("UPDATE pyscheduler._notify_throttle SET channel = '', last_at = '-infinity'")


def test_a_session_that_notified_a_channel_lately_skips_it_without_reading_the_slot(dsn, conn):
    """Issue 31: a single submitter's every call read the throttle's slot; its own notification of
    the channel within the gap (the setting pyscheduler.notified) answers first. Another session
    still reads the slot, and another channel is not this one."""
    assert throttled(conn, "pyscheduler_memo") is True
    forget_the_slots(conn)
    assert throttled(conn, "pyscheduler_memo") is False  # the slot says nothing; the session knows
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as other:
        assert throttled(other, "pyscheduler_memo") is True
    assert throttled(conn, "pyscheduler_other") is True


def test_a_rolled_back_notification_is_not_remembered(conn):
    """The notification of a transaction that rolled back was never sent: the next call sends one
    (the setting is rolled back with it). A setting of another shape matches nothing."""
    with pytest.raises(ZeroDivisionError), conn.transaction():
        assert throttled(conn, "pyscheduler_memo") is True
        raise ZeroDivisionError
    forget_the_slots(conn)
    assert throttled(conn, "pyscheduler_memo") is True
    for odd in ("", "x", "9999999999999999 ", "nonsense pyscheduler_memo", "9999999999999999pyscheduler_memo"):
        conn.execute("SELECT set_config('pyscheduler.notified', %s, false)", (odd,))
        forget_the_slots(conn)
        assert throttled(conn, "pyscheduler_memo") is True, odd


def test_a_notification_the_callback_cannot_handle_does_not_end_the_listener(dsn, conn):
    """Any role that may LISTEN may NOTIFY the same channel with any payload."""
    got: queue.Queue = queue.Queue()

    def callback(channel: str, payload: str) -> None:
        got.put(int(payload))  # ValueError on a payload that is not a number

    listener = Listener(dsn, ["pyscheduler_test"], callback).start()
    try:
        assert listener.ready.wait(10)
        conn.execute("SELECT pg_notify('pyscheduler_test', '²'), pg_notify('pyscheduler_test', '')")
        conn.execute("SELECT pg_notify('pyscheduler_test', '7')")
        assert got.get(timeout=10) == 7
    finally:
        listener.stop()
