"""The delay-queue relay when PostgreSQL refuses for a while (timeouts, locks, read-only)
or the broker is away at shutdown: valid messages are never dropped, never committed
past, and the loops do not spin."""

from __future__ import annotations

import logging
import signal
import time
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql

from tests.support import wait_for
from tests.support.delay import (InProcessRelay, Output, RelayProcess, Sender, Topics, freeze, private_broker, utcnow,
                                 warm_up)
from pyscheduler.delay.relay import Relay
from pyscheduler.errors import InvalidMessage, rejects_arguments
from pyscheduler.metrics import process_registry


@pytest.fixture
def topics(topic) -> Topics:
    return Topics(input=topic("in", partitions=1), output=topic("out"), dlq=topic("dlq"))


@pytest.fixture
def io(kafka, topics):
    sender, output, dlq = Sender(kafka, topics.input), Output(kafka, topics.output), Output(kafka, topics.dlq)
    yield sender, output, dlq
    output.close()
    dlq.close()


def set_database(dsn: str, setting: str, value: str | None) -> None:
    """ALTER DATABASE <this test's> SET setting = value (RESET when None): new sessions only."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET default_transaction_read_only = off")  # this session may write whatever the setting
        name = c.execute("SELECT current_database()").fetchone()[0]
        if value is None:
            c.execute(sql.SQL("ALTER DATABASE {} RESET {}").format(sql.Identifier(name), sql.Identifier(setting)))
        else:
            c.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))


def reconnect_everyone(dsn: str) -> None:
    """End every other session on this test's database (the relay's pool reconnects)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def logged(caplog, *parts: str) -> bool:
    return any(all(p in r.getMessage() for p in parts) for r in caplog.records)


def test_deliberate_and_transient_database_errors_are_told_apart(conn):
    def error(statement: str) -> psycopg.Error:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(statement)
        return info.value

    assert rejects_arguments(InvalidMessage("bad id", sqlstate="PS101"))
    assert rejects_arguments(error("SELECT 1/0"))                                       # 22012
    assert rejects_arguments(error("SELECT E'\\\\xzz'::bytea"))                          # 22P02
    assert not rejects_arguments(error("SET statement_timeout = '1ms'; SELECT pg_sleep(1)"))  # 57014
    conn.execute("SET statement_timeout = 0")
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute("CREATE TEMP TABLE x ()")
    assert info.value.sqlstate == "25006" and not rejects_arguments(info.value)


def test_a_value_psycopg_cannot_load_is_bad_data_not_an_outage(tx):
    """A BC or year-10000 timestamp fails in psycopg (no SQLSTATE): never retried as an outage."""
    from pyscheduler.errors import is_retryable

    for value in ("0001-01-01 BC", "10000-01-01"):
        with pytest.raises(psycopg.DataError) as info:
            tx.execute("SELECT %s::timestamptz AS t", (value,)).fetchone()
        assert not is_retryable(info.value) and rejects_arguments(info.value), value


@pytest.mark.slow
def test_statement_timeouts_on_a_locked_table_delay_messages_but_drop_none(dsn, kafka, topics, io, caplog):
    """statement_timeout=500ms and the message table locked by another session for a
    while: enqueue_messages keeps timing out (57014). That is an outage, not bad data:
    the batch is retried, nothing is dead-lettered, nothing committed past, and the
    fire and detect loops (whose calls time out too) keep running."""
    sender, output, dlq = io
    set_database(dsn, "statement_timeout", "500ms")
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    relay = InProcessRelay(dsn, kafka, topics)
    try:
        warm_up(sender, output, partitions=1)
        values = [f"m{i}".encode() for i in range(3)]
        with psycopg.connect(dsn) as locker:
            locker.execute("SET statement_timeout = 0")
            locker.execute("LOCK TABLE pyscheduler.delay_messages IN ACCESS EXCLUSIVE MODE")
            for i, value in enumerate(values):
                sender.send(f"m{i}", utcnow() + timedelta(seconds=1), value=value)
            sender.flush()
            wait_for(lambda: logged(caplog, "PostgreSQL (enqueue) unavailable", "statement timeout"), 20,
                     "enqueue_messages to time out on the locked table")
            # fire and detect time out too; they must retry, not crash the node
            wait_for(lambda: logged(caplog, "PostgreSQL (fire) unavailable")
                     and logged(caplog, "PostgreSQL (detect) unavailable"), 20,
                     "the fire and detect loops to time out on the locked table")
            assert relay.thread.is_alive()
            locker.rollback()  # the lock is released
        output.wait_values(values, timeout=30)
        assert relay.thread.is_alive()
    finally:
        relay.stop()
    assert not logged(caplog, "malformed")
    assert not logged(caplog, "rejected")
    assert [m for m in dlq.fresh(0) if m.value() in values] == []


@pytest.mark.slow
def test_a_read_only_database_delays_messages_but_drops_none(dsn, kafka, topics, io, caplog):
    """default_transaction_read_only (as on a standby after a mistaken failover): every
    write fails with 25006 until it is turned off; messages wait, none is dropped."""
    sender, output, dlq = io
    caplog.set_level(logging.WARNING, logger="pyscheduler.delay")
    relay = InProcessRelay(dsn, kafka, topics)
    try:
        warm_up(sender, output, partitions=1)
        set_database(dsn, "default_transaction_read_only", "on")
        reconnect_everyone(dsn)
        values = [f"r{i}".encode() for i in range(3)]
        for i, value in enumerate(values):
            sender.send(f"r{i}", utcnow() + timedelta(seconds=1), value=value)
        sender.flush()
        wait_for(lambda: logged(caplog, "PostgreSQL (enqueue) unavailable", "read-only"), 20,
                 "enqueue_messages to fail on the read-only database")
        # one warning per outage: when the fire loop met the reconnect first (its connection
        # closed, or its session terminated mid-call: the text depends on the moment), its
        # read-only failures belong to that outage (logged once, not again)
        wait_for(lambda: logged(caplog, "PostgreSQL (fire) unavailable", "read-only")
                 or (logged(caplog, "PostgreSQL (fire) unavailable")
                     and not logged(caplog, "PostgreSQL (fire) back")), 20,
                 "ready_and_claim to fail on the read-only database")
        assert relay.thread.is_alive()
        set_database(dsn, "default_transaction_read_only", None)
        reconnect_everyone(dsn)
        output.wait_values(values, timeout=30)
        assert relay.thread.is_alive()
    finally:
        relay.stop()
    assert not logged(caplog, "malformed")
    assert [m for m in dlq.fresh(0) if m.value() in values] == []


# the relay's series, as a process that runs a relay exports them (pyscheduler.metrics)
REGISTRY = process_registry([Relay], registry=CollectorRegistry())


def claims() -> float:
    return REGISTRY.get_sample_value("pyscheduler_delay_claims_total") or 0.0


@pytest.mark.slow
def test_a_due_message_row_locked_by_another_session_does_not_make_the_fire_loop_spin(dsn, kafka, db, topics):
    """ready_and_claim skips a locked row (SKIP LOCKED) while next_deadline still returns
    its past deadline: the loop must then sleep the poll interval, not 0."""
    relay = InProcessRelay(dsn, kafka, topics, poll_ms=50)
    try:
        wait_for(lambda: claims() > 0, 30, "the fire loop to start")
        deadline = utcnow() + timedelta(milliseconds=500)
        db.call("enqueue_messages", ids=["locked"], deadlines=[deadline], keys=None, vals=None,
                header_lists=None, advance=timedelta(0))
        with psycopg.connect(dsn) as locker:
            locker.execute("SELECT 1 FROM pyscheduler.delay_messages WHERE id = 'locked' FOR UPDATE")
            wait_for(lambda: utcnow() > deadline + timedelta(milliseconds=100), 5, "the deadline to pass")
            before, start = claims(), time.monotonic()
            # a measuring window (not synchronisation): how often the loop claims while the row is locked
            wait_for(lambda: time.monotonic() - start >= 2.0, 5, "a 2 s window")
            rate = (claims() - before) / (time.monotonic() - start)
            assert relay.thread.is_alive()
            locker.rollback()
        # 50 ms poll (+20% jitter): about 17-20 claims a second; spinning made it thousands
        assert rate < 40, f"{rate:.0f} ready_and_claim calls per second while the due row was locked"
        wait_for(lambda: db.query("SELECT count(*) AS n FROM pyscheduler.delay_messages")[0]["n"] == 0, 10,
                 "the message to fire once unlocked")
    finally:
        relay.stop()


def freeze_with_a_late_message_read(dsn: str, db, sender: Sender, broker) -> None:
    """Send a late message and hold the relay in enqueue_messages (a table lock)
    while the broker is frozen (SIGSTOP), so the relay reads the message before
    the freeze and publishes it after; then let enqueue_messages return 'late'."""
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE pyscheduler.delay_messages IN ACCESS EXCLUSIVE MODE")
        sender.send("late", utcnow() - timedelta(seconds=1), value=b"late")
        sender.flush()
        wait_for(lambda: db.query(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%%enqueue_messages%%'"), 20, "the relay to wait in enqueue_messages")
        freeze(broker)
        locker.rollback()


@pytest.mark.slow
def test_sigterm_during_a_broker_outage_keeps_an_unpublished_late_message(dsn, db, tmp_path):
    """A late message is consumed, then the broker freezes (SIGSTOP) before it could be
    published, and the node gets SIGTERM. The node exits 0 in bounded time without
    committing the message's offset (or after storing it): once the broker is back, a
    successor publishes it. Before: the in-flight message counted as delivered, its
    offset was committed and it was lost with the producer."""
    with private_broker(tmp_path) as (broker, topics, sender, output):
        bootstrap = broker.bootstrap
        proc = RelayProcess(dsn, bootstrap, topics, tmp_path / "relay.log", hold_ms=10_000)
        try:
            proc.node()
            warm_up(sender, output, partitions=1)
            freeze_with_a_late_message_read(dsn, db, sender, broker)
            # enqueue_messages returned 'late': the relay is publishing to the frozen broker
            wait_for(lambda: not db.query(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE '%%enqueue_messages%%' AND state = 'active'"), 20, "enqueue_messages to return")
            proc.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            assert proc.proc.wait(30) == 0, proc.text()
            assert time.monotonic() - started < 30
        finally:
            broker.proc.send_signal(signal.SIGCONT)  # no-op unless still frozen
            proc.close()
        stored = [r["id"] for r in db.query("SELECT id FROM pyscheduler.delay_messages")]
        successor = InProcessRelay(dsn, bootstrap, topics)
        try:
            # stored and fired from the table, or read again (offset not committed) and published
            output.wait_values([b"late"], timeout=60)
        finally:
            successor.stop()
            output.close()
        assert stored in ([], ["late"])


@pytest.mark.slow
def test_a_late_message_the_frozen_broker_does_not_take_is_stored_after_half_the_hold_time(dsn, db, tmp_path):
    """The broker freezes (SIGSTOP) between reading a late message and publishing it:
    after half the hold time the relay stores it (store_late) instead of blocking on the
    producer for minutes, and fires it from the table once the broker is back."""
    with private_broker(tmp_path) as (broker, topics, sender, output):
        bootstrap = broker.bootstrap
        relay = InProcessRelay(dsn, bootstrap, topics, hold_ms=4000)
        try:
            warm_up(sender, output, partitions=1)
            freeze_with_a_late_message_read(dsn, db, sender, broker)
            started = time.monotonic()
            wait_for(lambda: db.query("SELECT 1 FROM pyscheduler.delay_messages WHERE id = 'late'"), 15,
                     "the unpublished late message to be stored")
            assert time.monotonic() - started < 2.0 + 3.0  # half the hold time, plus slack for a busy machine
            broker.proc.send_signal(signal.SIGCONT)
            output.wait_values([b"late"], timeout=60)
            wait_for(lambda: not db.query("SELECT 1 FROM pyscheduler.delay_messages WHERE id = 'late'"), 20,
                     "the fired message to be deleted")
            assert relay.thread.is_alive()
        finally:
            broker.proc.send_signal(signal.SIGCONT)  # no-op unless still frozen
            relay.stop()
            output.close()
